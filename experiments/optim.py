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

EMA of parameters (``ema_decay > 0``) is kept by the trainer beside the parameters and used
for evaluation: ``ema = d * ema + (1 - d) * params`` after each update, with the warm-up
``d = min(ema_decay, (1 + t) / (10 + t))`` so early averages are not dominated by the init.
"""

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("cosine", "linear", "rsqrt", "constant")


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


def weight_decay_mask(params):
    """Pytree of bools like ``params``: True where weight decay applies (see module docstring)."""

    def decays(path, leaf):
        name = str(getattr(path[-1], "key", path[-1])).lower() if path else ""
        return leaf.ndim >= 2 and "embed" not in name

    return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(optim_config, total_steps):
    """Returns ``(optax transformation, schedule)`` for ``config.optim``."""
    schedule = make_schedule(optim_config, total_steps)
    adamw = optax.adamw(
        schedule,
        b1=optim_config.b1,
        b2=optim_config.b2,
        eps=optim_config.eps,
        weight_decay=optim_config.weight_decay,
        mask=weight_decay_mask,
    )
    if optim_config.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(optim_config.clip_norm), adamw), schedule
    return adamw, schedule


def ema_update(ema_params, params, ema_decay, step):
    """One EMA step after optimizer update number ``step`` (0-based; module docstring)."""
    step = jnp.asarray(step, jnp.float32)
    d = jnp.minimum(ema_decay, (1.0 + step) / (10.0 + step))
    return jax.tree.map(lambda e, p: d * e + (1.0 - d) * p, ema_params, params)
