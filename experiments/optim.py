"""Optimizer: AdamW with a weight-decay mask, learning-rate schedules, clipping, parameter EMA.

Schedules (``config.optim.schedule``; ``t`` is the optimizer step, counted from 0):

* linear warmup from 0 to ``learning_rate`` over ``warmup_steps`` (none when 0), then
* ``cosine``:   half-cosine from ``learning_rate`` down to ``learning_rate * end_lr_factor``
  at ``total_steps``;
* ``linear``:   straight line to ``learning_rate * end_lr_factor`` at ``total_steps``;
* ``rsqrt``:    inverse square root, ``learning_rate * sqrt(w / (t - warmup_steps + w))`` with
  ``w = max(warmup_steps, 1)``: equal to the peak right after warmup and to
  ``learning_rate * sqrt(warmup_steps / t)`` for ``t >= warmup_steps > 0`` (T5 / LRA style);
* ``constant``: ``learning_rate``.

Weight decay is decoupled (AdamW: ``p -= lr * weight_decay * p``, so it follows the schedule)
and applies only to **matrices that are not embeddings**: leaves with ``ndim >= 2`` whose
name does not contain ``"embed"``. Biases, norm scales and offsets and 1-D per-head decay
parameters (e.g. LION's decay logits) are never decayed, nor are token or position
embedding tables, which sparse gradients would otherwise shrink towards zero.

The gradient is clipped to ``clip_norm`` global L2 norm before AdamW (0 disables clipping).

``decay_lr_factor`` scales the learning rate of the decay-rate parameters (leaves named in
:data:`DECAY_PARAMS`: LION's non-selective decay and learned rotation frequencies, S5's
eigenvalues and steps, cosFormer2's and LightNet's decay logits), as S5 trains its SSM
parameters (eigenvalues, step sizes) at their own, lower rate: S5's Pathfinder script uses
9e-4 for those and 5x that for the rest (lindermanlab/S5
``bin/run_experiments/run_lra_pathfinder.sh``), i.e. ``decay_lr_factor = 0.2``. These leaves
are 1-D or small and never weight-decayed, so the factor is exactly their learning rate's.

``lr_factors`` (``"name=factor,name=factor"``, e.g. ``"query=0.1,key=0.1,decay_gate=0.1"``)
scales the learning rate of every leaf whose path holds a module or parameter called
``name`` (a leaf under several names takes the product), as ``decay_lr_factor`` does for the
decay rates: the whole AdamW update is scaled, the decoupled weight decay with it, so the
factor is exactly the leaf's learning rate relative to the schedule's. Empty: none.

EMA of parameters (``ema_decay > 0``) is kept by the trainer beside the parameters and used
for evaluation: ``ema = d * ema + (1 - d) * params`` after each update, with the warm-up
``d = min(ema_decay, (1 + t) / (10 + t))`` so early averages are not dominated by the init.
"""

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("cosine", "linear", "rsqrt", "constant")
# the decay rates' leaves (module docstring); S5's eigenvalues and steps (lion_jax/layers/s5.py)
DECAY_PARAMS = ("decay_log_rate", "decay_logit", "lambda_log_re", "lambda_im", "log_step",
                "rope_freq")


def make_schedule(optim_config, total_steps):
    """The learning-rate schedule (see the module docstring) as an optax schedule."""
    peak = optim_config.learning_rate
    warmup = optim_config.warmup_steps
    end = peak * optim_config.end_lr_factor
    decay_steps = max(total_steps - warmup, 1)
    kind = optim_config.schedule
    if kind == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=optim_config.end_lr_factor)
    elif kind == "linear":
        decay = optax.linear_schedule(peak, end, decay_steps)
    elif kind == "rsqrt":
        w = max(warmup, 1)
        decay = lambda t: peak * jnp.sqrt(w / (jnp.maximum(t, 0) + w))  # noqa: E731
    elif kind == "constant":
        decay = optax.constant_schedule(peak)
    else:
        raise ValueError(f"unknown schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    if warmup <= 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def _path_names(path):
    """The module and parameter names on a leaf's path, outermost first."""
    return [str(getattr(p, "key", p)) for p in path]


def _leaf_name(path):
    return _path_names(path)[-1] if path else ""


def weight_decay_mask(params):
    """Pytree of bools like ``params``: True where weight decay applies (see module docstring)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: leaf.ndim >= 2 and "embed" not in _leaf_name(path).lower(), params)


def decay_param_mask(params):
    """Pytree of bools like ``params``: True on the leaves named in :data:`DECAY_PARAMS`."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: _leaf_name(path) in DECAY_PARAMS, params)


def parse_lr_factors(text):
    """``optim.lr_factors`` (module docstring) as ``{name: factor}``.

    Raises:
      ValueError: for an entry that is not ``NAME=FACTOR`` with ``FACTOR > 0``.
    """
    factors = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, _, value = (part.strip() for part in entry.partition("="))
        try:
            factor = float(value)
        except ValueError:
            factor = 0.0
        if not name or not factor > 0:
            raise ValueError(f"config.optim.lr_factors entry {entry!r} is not NAME=FACTOR with "
                             f"FACTOR > 0 (e.g. 'query=0.1,key=0.1')")
        factors[name] = factor
    return factors


def lr_factor_tree(optim_config, params):
    """Pytree of floats like ``params``: each leaf's learning rate relative to the schedule's,
    ``decay_lr_factor`` on the leaves of :data:`DECAY_PARAMS` times the ``lr_factors`` of the
    names on its path (module docstring)."""
    named = parse_lr_factors(optim_config.lr_factors)

    def factor(path, leaf):
        f = optim_config.decay_lr_factor if _leaf_name(path) in DECAY_PARAMS else 1.0
        for name in _path_names(path):
            f *= named.get(name, 1.0)
        return f

    return jax.tree_util.tree_map_with_path(factor, params)


def param_names(params):
    """Every module and parameter name on the leaf paths of ``params``, sorted."""
    return sorted({n for path, _ in jax.tree_util.tree_leaves_with_path(params)
                   for n in _path_names(path)})


def make_optimizer(optim_config, total_steps):
    """Returns ``(optax transformation, schedule)`` for ``config.optim``."""
    schedule = make_schedule(optim_config, total_steps)
    steps = [optax.adamw(
        schedule,
        b1=optim_config.b1,
        b2=optim_config.b2,
        eps=optim_config.eps,
        weight_decay=optim_config.weight_decay,
        mask=weight_decay_mask,
    )]
    if optim_config.decay_lr_factor != 1.0 or parse_lr_factors(optim_config.lr_factors):
        # one stateless step, so that checkpoints keep their arrays' paths whatever the factors
        steps.append(optax.stateless(lambda updates, params: jax.tree.map(
            lambda u, f: u * f, updates, lr_factor_tree(optim_config, updates))))
    if optim_config.clip_norm > 0:
        steps.insert(0, optax.clip_by_global_norm(optim_config.clip_norm))
    # AdamW alone is not wrapped in a chain: the optimizer state keeps the layout that existing
    # checkpoints hold
    return (steps[0] if len(steps) == 1 else optax.chain(*steps)), schedule


def ema_update(ema_params, params, ema_decay, step):
    """One EMA step after optimizer update number ``step`` (0-based; module docstring)."""
    step = jnp.asarray(step, jnp.float32)
    d = jnp.minimum(ema_decay, (1.0 + step) / (10.0 + step))
    return jax.tree.map(lambda e, p: d * e + (1.0 - d) * p, ema_params, params)
