"""Pure-JAX linear-attention math: LION (bidirectional) and causal decayed linear attention.

Each op has interchangeable implementations chosen by ``impl``:
``attention`` (materialized L x L mask; the reference), ``recurrent`` (``lax.scan``),
``chunk`` (chunked XLA) and ``pallas`` (fused GPU kernels in :mod:`pallas_kernels`). A causal
call started from a :class:`KVCache` (:func:`empty_kv_cache`) runs the KV-cache form
(:mod:`lion_jax.ops.kv_cache`): attention against every cached key, for decoding.
:func:`linear_scan` is the diagonal linear recurrence ``x_t = d_t x_{t-1} + u_t`` as an
associative scan (the chunk form's state carry, S5's walks).
"""

from lion_jax.ops._utils import linear_scan
from lion_jax.ops.api import (IMPLS, causal_linear_attention, causal_linear_attention_step,
                              lion_attention)
from lion_jax.ops.kv_cache import KVCache, empty_kv_cache
from lion_jax.ops.masks import bidirectional_mask, causal_mask

__all__ = [
    "IMPLS",
    "KVCache",
    "bidirectional_mask",
    "causal_linear_attention",
    "causal_linear_attention_step",
    "causal_mask",
    "empty_kv_cache",
    "linear_scan",
    "lion_attention",
]
