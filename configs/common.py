"""Helpers shared by config files: variant parsing and the base trainer config.

A config file (big_vision style) is a module with

* a docstring whose first line describes the default setting,
* ``VARIANTS``: ``{name: one-line description}`` of the named variants, and
* ``get_config(arg=None)``, where ``arg`` is the variant from ``path.py:variant``.

Every key the trainer reads is defined in :func:`base_config`, so ``--config.key=value``
can override any of them and a misspelled key is an error.
"""

import ml_collections


def parse_variant(arg, variants):
    """Returns the variant name in ``arg`` (``None`` for the default setting).

    Raises ``ValueError`` naming the known variants when ``arg`` is not one of them.
    """
    if arg is None or arg == "":
        return None
    if arg not in variants:
        known = ", ".join(sorted(variants)) or "none"
        raise ValueError(f"unknown config variant {arg!r} (known variants: {known})")
    return arg


def base_config():
    """The trainer's keys with their defaults; task configs override what they need.

    Sizes are global: ``batch_size`` is the number of examples per optimizer step over all
    devices and gradient-accumulation micro-batches.
    """
    c = ml_collections.ConfigDict()
    c.task = "classification"  # module in experiments/tasks/
    c.seed = 0  # parameter init, dropout and data order
    c.batch_size = 32
    c.eval_batch_size = 32
    c.grad_accum_steps = 1  # micro-batches per optimizer step (manual loop in the train step)
    c.num_train_steps = 1000

    c.optim = ml_collections.ConfigDict()
    c.optim.learning_rate = 1e-3  # peak learning rate
    c.optim.schedule = "cosine"  # cosine | linear | rsqrt | constant (after linear warmup)
    c.optim.warmup_steps = 0
    c.optim.end_lr_factor = 0.0  # cosine/linear end at learning_rate * end_lr_factor
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.0  # decoupled (AdamW); see experiments/optim.py for the mask
    c.optim.clip_norm = 1.0  # global gradient-norm clipping; 0 disables
    c.optim.ema_decay = 0.0  # EMA of parameters used for evaluation; 0 disables

    c.log_every = 50  # train metrics averaged over this many steps
    c.eval_every = 1000  # also at the last step; 0 = only at the last step
    c.eval_splits = ("val", "test")
    c.best_metric = "val/accuracy"  # higher is better; selects the `best` checkpoint
    c.checkpoint_every = 1000  # also at the last step
    c.keep_checkpoints = 2  # periodic checkpoints kept besides the best one
    c.progress_bar = True

    # Devices: mesh axis sizes (-1 fills the remaining devices) and flax logical-axis rules.
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, model=1))
    c.logical_axis_rules = (
        ("vocab", None),
        ("embed", "fsdp"),
        ("heads", "model"),
        ("mlp", "model"),
        ("classes", None),
    )
    c.distributed = False  # jax.distributed.initialize(); also when JAX_COORDINATOR_ADDRESS is set
    return c
