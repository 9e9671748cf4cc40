"""GLUE fine-tuning (LION paper App. D.5, Table 8), M2-BASE recipe for MNLI; one variant a task.

Run (pre-train first, then MNLI, then the rest; RTE, STS-B and MRPC start from MNLI):

    python -m experiments.train --config configs/mlm/c4.py --workdir runs/mlm
    python -m experiments.train --config configs/glue/glue.py:mnli \\
        --config.init_from=runs/mlm --workdir runs/glue_mnli
    python -m experiments.train --config configs/glue/glue.py:rte \\
        --config.init_from=runs/glue_mnli --workdir runs/glue_rte
    python -m experiments.glue_table runs/mlm runs/glue_*

Variants: ``<task>`` (M2-BASE recipe), ``<task>_m2_large``, ``<task>_bert24``,
``<task>_modified`` for task in mnli, rte, qqp, qnli, sst2, stsb, mrpc, cola; ``tiny`` and
``tiny_stsb`` for tests. The recipe depends on the task, so pick the task by the variant, not
by ``--config.data.task`` (the task checks that the two agree through ``config.recipe``).

Table 8 per task: learning rate, weight decay, epochs, optimizer ("D. AdamW": Composer's
DecoupledAdamW, whose step decays ``p -= (lr_t / peak_lr) * wd * p``; optax's AdamW does
``p -= lr_t * weight_decay * p``, so ``weight_decay = wd / peak_lr``; "AdamW": PyTorch's
AdamW, ``p -= lr_t * wd * p``, so ``weight_decay = wd``). Sequence length 128 (BERT24: 256).
Schedule: linear warmup over 6% of the steps, linear decay to 0 (M2's
``linear_decay_with_warmup``, ``t_warmup: 0.06dur``, ``alpha_f: 0``). Not in the paper and
not checked against M2's job definitions: batch size 32, betas 0.9 / 0.98, eps 1e-6, dropout
0.1, gradient clipping at 1.0 (the project's default), one evaluation per epoch. The M2-BASE
yaml the paper links differs from Table 8 in QNLI's weight decay (1e-6 there) and CoLA's
optimizer (AdamW there, D. AdamW in the table; the table gives STS-B AdamW); we follow
Table 8.

The encoder's architecture and vocabulary come from ``config.init_from`` (its config.json);
``config.model`` keys override them (default: dropout only).
"""

import ml_collections

from configs import common
from configs.mlm import c4
from experiments.data import glue

D, A = "decoupled_adamw", "adamw"
# recipe -> task -> (learning rate, weight decay, epochs, optimizer), LION paper Table 8.
RECIPES = {
    "bert24": dict(
        mnli=(5e-5, 5e-6, 3, D), qnli=(1e-5, 1e-5, 10, D), qqp=(3e-5, 3e-6, 5, D),
        rte=(1e-5, 1e-6, 3, D), sst2=(3e-5, 3e-6, 3, D), mrpc=(8e-5, 8e-5, 10, D),
        cola=(5e-5, 5e-6, 10, D), stsb=(3e-5, 3e-6, 10, D)),
    "m2_base": dict(
        mnli=(5e-5, 5e-6, 3, D), qnli=(5e-5, 1e-5, 10, D), qqp=(3e-5, 3e-6, 5, D),
        rte=(1e-5, 1e-6, 3, D), sst2=(3e-5, 3e-6, 3, D), mrpc=(8e-5, 8e-5, 10, D),
        cola=(8e-5, 5e-6, 10, D), stsb=(8e-5, 3e-6, 10, A)),
    "m2_large": dict(
        mnli=(5e-5, 5e-6, 3, D), qnli=(5e-5, 1e-6, 10, D), qqp=(3e-5, 3e-6, 5, D),
        rte=(5e-5, 1e-6, 2, A), sst2=(3e-5, 3e-6, 3, D), mrpc=(8e-5, 8e-6, 10, D),
        cola=(5e-5, 1e-6, 10, D), stsb=(8e-5, 3e-5, 8, D)),
}
# "Modified (Ours)": M2-LARGE with every learning rate 1e-5.
RECIPES["modified"] = {t: (1e-5, *rest) for t, (_, *rest) in RECIPES["m2_large"].items()}
RECIPE_TITLES = {"bert24": "BERT24", "m2_base": "M2-BASE", "m2_large": "M2-LARGE",
                 "modified": "Modified"}
SEQ_LEN = {"bert24": 256}  # others: 128
FROM_MNLI = ("rte", "stsb", "mrpc")  # Table 8: fine-tuned from the MNLI-fine-tuned weights
BATCH_SIZE = 32
WARMUP_FRACTION = 0.06

VARIANTS = {}
for _task in glue.TASK_NAMES:
    VARIANTS[_task] = f"{glue.TASKS[_task].title}, M2-BASE recipe"
    for _recipe in ("m2_large", "bert24", "modified"):
        VARIANTS[f"{_task}_{_recipe}"] = (f"{glue.TASKS[_task].title}, "
                                          f"{RECIPE_TITLES[_recipe]} recipe")
VARIANTS["tiny"] = ("seconds-long test run: SST-2 layout, 1-layer width-16 encoder (the MLM "
                    "tiny one), 32-token rows, 16 steps")
VARIANTS["tiny_stsb"] = "the tiny run on STS-B (regression)"


def optimizer_weight_decay(lr, wd, optimizer):
    """optax AdamW's ``weight_decay`` for Table 8's (lr, wd, optimizer) (module docstring)."""
    return wd / lr if optimizer == D else wd


def apply_recipe(c, recipe, task):
    lr, wd, epochs, optimizer = RECIPES[recipe][task]
    c.recipe = f"{recipe}:{task}"
    c.optim.learning_rate = lr
    c.optim.weight_decay = optimizer_weight_decay(lr, wd, optimizer)
    c.num_epochs = epochs
    c.data.max_len = SEQ_LEN.get(recipe, 128)
    return c


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = common.base_config()
    c.task = "glue"
    c.init_from = ""  # MLM workdir (or, for RTE / STS-B / MRPC, a GLUE MNLI workdir); "none"
    c.from_mnli = False
    c.recipe = ""
    c.num_epochs = 0.0  # > 0: sets num_train_steps (experiments/tasks/glue.py)
    c.warmup_fraction = WARMUP_FRACTION
    c.evals_per_epoch = 1
    c.data = ml_collections.ConfigDict(dict(
        name="glue", task="mnli", source="tfds", data_dir="", max_len=128, vocab_file="",
        lowercase=True, cache_dir="~/.cache/lion_jax/glue"))
    c.model = ml_collections.ConfigDict(dict(dropout=0.1))
    c.batch_size = c.eval_batch_size = BATCH_SIZE
    c.optim.schedule = "linear"
    c.optim.end_lr_factor = 0.0
    c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.98, 1e-6
    c.log_every = 100

    if variant in ("tiny", "tiny_stsb"):
        task, recipe = ("stsb" if variant == "tiny_stsb" else "sst2"), None
    else:
        task, _, recipe = (variant or "mnli").partition("_")
        recipe = recipe or "m2_base"
    c.data.task = task
    c.eval_splits = glue.TASKS[task].eval_splits
    c.best_metric = "val/neg_mse" if task == "stsb" else "val/accuracy"
    c.from_mnli = task in FROM_MNLI
    if recipe:
        apply_recipe(c, recipe, task)
        return c
    return tiny(c)


def tiny(c):
    """The ``tiny`` setting: no recipe, no epochs, 16 steps of 8 rows of 32 tokens, evaluation
    and a checkpoint every 8 steps; ``config.model`` is the MLM tiny encoder (used as is with
    ``init_from="none"``, equal to the tiny MLM run's otherwise); not from MNLI."""
    mlm = c4.get_config("tiny")
    c.model = ml_collections.ConfigDict(mlm.model.to_dict())
    c.data.max_len = 32
    c.from_mnli = False
    c.num_epochs = 0.0
    c.optim.learning_rate = 1e-2
    c.optim.weight_decay = 0.0
    c = common.tiny_training(c)
    c.num_train_steps = 16
    c.log_every = c.eval_every = c.checkpoint_every = 8
    return c
