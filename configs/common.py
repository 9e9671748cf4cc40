"""Helpers shared by config files: variant parsing and the base trainer config.

A config file (big_vision style) is a module with

* a docstring whose first line describes the default setting,
* ``VARIANTS``: ``{name: one-line description}`` of the named variants, and
* ``get_config(arg=None)``, where ``arg`` is the variant from ``path.py:variant``.

Every key the trainer reads is defined in :func:`base_config`, so ``--config.key=value``
can override any of them and a misspelled key is an error.
"""

import ml_collections
from ml_collections import config_dict


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
    c.label = ""  # the run's name in tables (the LRA leaderboard); "" = derived from the model
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
    c.optim.decay_lr_factor = 1.0  # learning rate of the decay parameters, relative (S5: 0.2)
    c.optim.lr_factors = ""  # "name=factor,...": relative learning rates by module/parameter name

    c.log_every = 50  # train metrics averaged over this many steps
    c.eval_every = 1000  # also at the last step; 0 = only at the last step
    c.eval_splits = ("val", "test")
    c.best_metric = "val/accuracy"  # higher is better; selects the `best` checkpoint
    c.checkpoint_every = 1000  # also at the last step
    c.keep_checkpoints = 2  # periodic checkpoints kept besides the best one
    c.max_run_seconds = 0.0  # stop at the first checkpoint after this long (resume later); 0: off
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


# ------------------------------------------------------------------------------------------------
# Long Range Arena: the model, its mixer variants and the ablations of LION paper Table 6
# ------------------------------------------------------------------------------------------------

LRA_VARIANTS = {
    "lit": "LION-LIT (no decay, elu+1 features, SCALE), otherwise the default setting",
    "d": "LION-D (a learned fixed decay per head), otherwise the default setting",
    "transformer": "softmax Transformer baseline (jax.nn.dot_product_attention, cuDNN on GPU; "
                   "learned positions)",
    "sigmoid_unscaled": "Table 6 [1]: sigmoid features, no SCALE",
    "relu": "Table 6 [2]: ReLU features with SCALE",
    "scalar_decay": "Table 6 [3]: one decay per head instead of one per value feature",
    "unscaled": "Table 6 [4]: no SCALE",
    "unmasked_scale": "Table 6 [5]: SCALE by the unmasked row sum",
    "no_selectivity": "Table 6 [6]: the HiPPO decay alone (LION-D with a per-feature decay)",
    "softplus": "Table 6 [7]: a_i = -softplus(w^T x_i + b)",
    "s5_block": "LION-S in S5's layer (the repository paper D.2 follows): BatchNorm, "
                "GELU + half-GLU (S5's half_glu2 on ListOps and Text), no MLP",
    "s5_complex": "s5_block with S5's complex HiPPO eigenvalues as LION-S's non-selective decays "
                  "and S5's complex B_bar as its values (decay_init='hippo_complex')",
    "s5_complex_sigmoid": "s5_complex with Table 6 [1]'s sigmoid features and no SCALE, the "
                          "selective gate's biases at e in (10, 16), so that it starts near 1 "
                          "(the model starts as its LION-D): the LION-S that learns Pathfinder "
                          "(docs/pathfinder.md)",
    "s5": "S5 itself (lion_jax/layers/s5.py, the reference the recipe comes from) in S5's "
          "layer; its eigenvalues and steps train at optim.decay_lr_factor",
}
LRA_IMAGE_VARIANTS = {  # the tasks whose sequences are images: Image, Pathfinder, Path-X
    "v2": "LION-S (v2, paper C.8) on the image: its row-snake and column-snake orders, their "
          "masks averaged (the paper's LRA model walks the raster order alone)",
}


def lra_lion_s_mixer():
    """The LION-S mixer of the LRA recipe (paper App. D.2): a decay per value feature (C.7; the
    scalar one of Table 6 [3] fails on ListOps, Pathfinder and Path-X), selective on top of a
    HiPPO-initialised non-selective part, ZOH-initialised W_v, N(0, 0.1^2) query, key and gate
    kernels, SCALE.

    ``impl="auto"`` runs ``pallas_kernels.lion_value_decay`` on a GPU; ``chunk_size`` is the
    XLA form's (CPU), 16 because its within-chunk masks take ``L * C * V`` numbers per head.
    """
    return ml_collections.ConfigDict(dict(
        variant="s", impl="auto", chunk_size=16, feature_map="silu_l2", normalize=True,
        decay_shape="vector", decay_init="hippo", hippo_dt_range=(0.001, 0.1),
        decay_activation="log_sigmoid", selective_timescales="spread",
        decay_init_exponents=(5.0, 12.0), value_init="zoh",
        normalize_unmasked=False, init_std=0.1,
        # None unless set (placeholders, so the command line can set them): a LayerNorm per
        # head's outputs (None: the variant's default), RoPE's base for rotated scores
        output_norm=config_dict.placeholder(bool), rope_base=config_dict.placeholder(float),
        rope_learned=False, feedthrough=False))


def lra_model(*, d_model, num_layers, num_heads=8, dropout=0.0, max_len,
              input_encoding="embed", image_shape=None):
    """The LRA classifier of every task: pre-norm LION-S blocks, MLP width ``2 * d_model``,
    LayerNorm, mean pooling, no positions (LION-S orders tokens by its decay), bf16 compute.
    ``channel_mixer="half_glu"`` (or ``"half_glu2"``) swaps each block's MLP for S5's
    one-branch GELU + half-GLU; ``norm="batchnorm"`` takes S5's BatchNorm (running statistics
    with momentum ``bn_momentum``, S5's default 0.95) for every norm. ``image_shape``: the
    ``(rows, cols)`` of the image tasks' sequences (raster order), for ``orders`` other than
    ``("raster",)`` (the ``v2`` variant)."""
    image = {} if image_shape is None else dict(orders=("raster",), image_shape=image_shape)
    return ml_collections.ConfigDict(dict(
        d_model=d_model, num_layers=num_layers, num_heads=num_heads, mlp_dim=2 * d_model,
        channel_mixer="mlp", dropout=dropout, pooling="mean", pos_emb="none", max_len=max_len,
        norm="layernorm", bn_momentum=0.95, input_encoding=input_encoding, mixer_kind="lion",
        mixer=lra_lion_s_mixer(), dtype="bfloat16", param_dtype="float32", **image))


def apply_lra_variant(c, variant, s5_channel_mixer="half_glu"):
    """Applies one of :data:`LRA_VARIANTS` to config ``c`` (in place); sets ``c.label``, the
    name the leaderboard shows for ablations. Other variants are left to the config file.
    ``s5_channel_mixer``: the channel mixer of ``s5_block`` and ``s5``, S5's activation for the
    task (``"half_glu2"`` in its ListOps and IMDb scripts, ``"half_glu"``, its ``half_glu1``,
    in the others; lindermanlab/S5 ``bin/run_experiments``)."""
    mixer = c.model.mixer
    plain = dict(decay_shape="scalar", decay_init="exponents", value_init="lecun", chunk_size=64)
    changes = {
        "lit": dict(variant="lit", feature_map="elu1", **plain),
        "d": dict(variant="d", **plain),
        "sigmoid_unscaled": dict(feature_map="sigmoid", normalize=False),
        "relu": dict(feature_map="relu"),
        "scalar_decay": dict(decay_shape="scalar", chunk_size=64),
        "unscaled": dict(normalize=False),
        "unmasked_scale": dict(normalize_unmasked=True),
        "no_selectivity": dict(variant="d"),
        "softplus": dict(decay_activation="softplus"),
    }
    if variant in ("s5_block", "s5_complex", "s5_complex_sigmoid", "s5"):  # S5's layer
        c.model.update(channel_mixer=s5_channel_mixer, norm="batchnorm")
    if variant == "s5_block":
        c.label = "LION-S, S5 block"
    elif variant in ("s5_complex", "s5_complex_sigmoid"):
        mixer.decay_init = "hippo_complex"
        c.label = "LION-S complex, S5 block"
        if variant == "s5_complex_sigmoid":
            mixer.update(feature_map="sigmoid", normalize=False, decay_init_exponents=(10.0, 16.0))
            c.label = "LION-S complex, sigmoid, no SCALE, S5 block"
    elif variant == "s5":
        c.model.mixer_kind = "s5"
        c.model.mixer = ml_collections.ConfigDict(dict(dt_range=(0.001, 0.1),
                                                        real_eigenvalues=False,
                                                        tied_readout=False,
                                                        feedthrough=True))
        c.label = "S5"
    elif variant == "v2":
        c.model.orders = ("row_snake", "col_snake")
        c.label = "LION-S (v2)"
    elif variant == "transformer":
        c.model.mixer_kind = "softmax"
        c.model.mixer = ml_collections.ConfigDict(dict(impl="auto"))
        c.model.pos_emb = "learned"
    elif variant in changes:
        mixer.update(changes[variant])
        if variant not in ("lit", "d"):
            c.label = f"LION-S {variant}"
    return c


def lra_training(c, *, train_size, batch_size, epochs, weight_decay, warmup_epochs=1,
                 eval_batch_size=None, batch_length_multiple=0):
    """The LRA schedule of paper D.2 with S5's sizes: AdamW at 5e-4, cosine decay after
    ``warmup_epochs`` of linear warmup, ``epochs`` over ``train_size`` examples in batches of
    ``batch_size``; evaluation and a checkpoint every epoch; ``init_from`` empty (a fresh
    start; experiments/tasks/classification.py). ``batch_length_multiple`` > 0:
    training batches of similar lengths, each cut to its longest example rounded up to that
    multiple (``pipeline.LengthBucketIterator``; token tasks only); 0: every batch full length."""
    steps_per_epoch = train_size // batch_size
    c.batch_size = batch_size
    c.eval_batch_size = eval_batch_size or 4 * batch_size
    c.batch_length_multiple = batch_length_multiple
    c.num_train_steps = epochs * steps_per_epoch
    c.optim.learning_rate = 5e-4
    c.optim.schedule = "cosine"
    c.optim.warmup_steps = warmup_epochs * steps_per_epoch
    c.optim.weight_decay = weight_decay
    c.log_every = 100
    c.eval_every = steps_per_epoch
    c.checkpoint_every = steps_per_epoch
    # A classification run's workdir whose best checkpoint's weights (and BatchNorm statistics)
    # start this run, e.g. Pathfinder's easiest set before LRA's (docs/pathfinder.md); "" = none
    c.init_from = ""
    return c


def lra_tiny(c):
    """The ``tiny`` variant of an LRA config: a 1-layer width-16 model, 4 steps of 8 examples,
    evaluation and a checkpoint every 2 steps (seconds on a CPU; the data is the config's, made
    small by the config)."""
    c.model.update(d_model=16, num_layers=1, num_heads=2, mlp_dim=32, dtype="float32")
    c.model.mixer.chunk_size = 8
    return tiny_training(c)


def tiny_training(c):
    """The training part of every ``tiny`` variant: 4 steps of 8 examples, evaluation and a
    checkpoint every 2 steps, no progress bar."""
    c.batch_size = c.eval_batch_size = 8
    c.num_train_steps = 4
    c.optim.warmup_steps = 1
    c.log_every = c.eval_every = c.checkpoint_every = 2
    c.progress_bar = False
    return c


def lra_variant(c, variant, s5_channel_mixer="half_glu"):
    """``tiny`` or one of :data:`LRA_VARIANTS` applied to ``c``; the default (None) keeps it.
    ``s5_channel_mixer``: as :func:`apply_lra_variant`."""
    if variant == "tiny":
        return lra_tiny(c)
    return apply_lra_variant(c, variant, s5_channel_mixer)
