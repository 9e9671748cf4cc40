"""Public ops: input checks, the ``impl`` dispatcher, normalisation and dtype handling.

Every form (``attention``, ``recurrent``, ``chunk``) computes the *non-normalised* output
``sum_j s_ij M_ij v_j`` (and, for causal, the final state). Normalisation (the paper's SCALE)
is done here, once, for all forms: a column of ones is appended to ``v`` so the same pass also
yields the denominator ``sum_j s_ij M_ij`` (for the recurrent form this column carries exactly
the paper's ``z`` states and ``c`` scalars), then ``y = num / (den + eps)``. The KV-cache
form (a causal call from a :class:`~lion_jax.ops.kv_cache.KVCache`) takes the denominator as
the row sums of its masked scores instead, so its cache holds ``v`` as given.

Math runs in float32 (float64 for float64 inputs) whatever the input dtype; outputs are cast
back to ``v.dtype``; states are kept in the compute dtype (a KV cache's keys and values in the
dtype it was made with).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lion_jax.ops import attention, chunk, kv_cache, recurrent
from lion_jax.ops import orders as orders_lib

IMPLS = ("attention", "recurrent", "chunk", "pallas", "auto")

# impl="auto" without usable kernels: the materialized form up to this length, chunked beyond.
AUTO_ATTENTION_MAX_LEN = 256
# impl="auto" with a decay per key feature: chunks of at most this many tokens. The chunked
# form holds K masks of C x C; at C = 64 XLA's GPU compile of an HGRN2 train or eval step
# took 3 minutes (d = 96) to over 7 (d = 192, stopped), at C = 16 each whole 400-step run
# took 26-41 s (one H100, experiments.scaling_sweep --archs hgrn2 --chunk_size 16,
# 2026-11-26).
AUTO_PER_KEY_CHUNK = 16

_CAUSAL_FORMS = {"attention": attention.causal, "recurrent": recurrent.causal}
_BIDIRECTIONAL_FORMS = {"attention": attention.bidirectional, "recurrent": recurrent.bidirectional}


def lion_attention(q, k, v, log_decay=None, *, normalize=True, eps=1e-6, impl="auto",
                   chunk_size=64, centre_values=False, orders=None):
    """LION bidirectional masked linear attention ``SCALE(Q K^T * M) V`` (paper Eq. 28).

    ``M_ij = exp(-|A_i - A_j|)`` with ``A = cumsum(log_decay)`` over the sequence.

    Args:
      q, k: ``[B, L, H, K]`` queries and keys (already feature-mapped).
      v: ``[B, L, H, V]`` values.
      log_decay: None (no decay, LION-LIT), ``[B, L, H]``, or ``[B, L, H, V]``: one decay per
        value feature (paper C.7, Eq. 136), where the mask ``M_ijv`` multiplies value column
        ``v`` and SCALE divides each column by its own ``sum_j s_ij M_ijv``. Entries ``<= 0``.
        Per value feature, "pallas" is ``pallas_kernels.lion_value_decay`` (chunks of 16,
        whatever ``chunk_size``; ``centre_values`` does not apply).
      normalize: divide each row by ``sum_j s_ij M_ij + eps`` (SCALE); False gives the
        non-normalised form (LION-RETNET).
      eps: added to the denominator.
      impl: "attention" (materialized L x L), "recurrent" (Theorem 3.3 scans, O(L d) memory;
        on a GPU, when no gradient is taken, the Pallas token walk ``pallas_kernels.lion_walk``,
        whose memory beyond the input and the output is one float32 numerator),
        "chunk" (chunked XLA), "pallas" (fused GPU kernels: up to
        ``pallas_kernels.lion_dense.MAX_LEN`` = 256 tokens with a decay per token or none,
        ``pallas_kernels.lion_dense``, the masked product built tile by tile as flash
        attention does; else the chunked kernels), or "auto".
      chunk_size: chunk length for "chunk" and "pallas".
      centre_values: normalize only. The kernels ("pallas", or "auto" routed to them) then
        run on v less its mean over L and add it back
        (``pallas_kernels.bidirectional_linear_attention(centre_values=True)``): the output
        is the same, and with 16-bit inputs whose values are far from zero mean and little
        decay the gradients keep their precision (bf16, no decay, v = |N(0, 1)| + 2, L = 4K:
        dq's relative error 5.2e-1 -> 3.3e-3), for ~5 % more time. The XLA forms compute in
        float32 and do not need it; they ignore it.
      orders: None, or a sequence of token permutations (int arrays ``[L]``, e.g. the patch
        orders of LION-S v2, paper C.8): ``M`` is then the average of the masks of the decays
        accumulated along each order (:mod:`lion_jax.ops.orders`), in numerator and
        denominator. "attention" averages the masks, and so does ``lion_dense`` ("pallas" up
        to 256 tokens, all orders in one launch); the other forms run once per order on the
        permuted tokens and average numerators and denominators before SCALE (16-bit inputs:
        each rounded to the input dtype first). "auto" picks the form as without orders.
    Returns:
      ``[B, L, H, V]`` in ``v.dtype``.
    """
    name = "lion_attention"
    _check_qkv(name, q, k, v)
    _check_log_decay(name, log_decay, q, per_value=v.shape[-1])
    _check_options(name, impl, chunk_size, eps)
    if centre_values and not normalize:
        raise ValueError(f"{name}: centre_values=True needs normalize=True (without the "
                         "normaliser the output is linear in v and nothing cancels)")
    value_decay = log_decay is not None and log_decay.ndim == 4
    if orders is not None:
        orders = orders_lib.check_orders(name, orders, q.shape[1])
    impl, chunk_size = _resolve_impl(impl, q, k, v, log_decay, chunk_size, normalize,
                                     value_decay=value_decay)
    if impl == "pallas" and value_decay and orders is None:
        return _value_decay_kernel(name, q, k, v, log_decay, normalize, eps)
    if impl == "pallas" and not value_decay and not centre_values:
        kernels = _kernels(name)
        if kernels.lion_dense_unsupported_reason(q, k, v, log_decay) is None:
            # orders too: every order's mask in the one launch (LION-S v2)
            return kernels.lion_dense(q, k, v, log_decay, normalize=normalize, eps=eps,
                                      orders=orders)
    if orders is not None and impl != "attention":
        return _lion_in_orders(q, k, v, log_decay, orders, impl, normalize, eps, chunk_size)
    if impl == "pallas":
        return _kernels(name).bidirectional_linear_attention(
            q, k, v, log_decay, normalize=normalize, eps=eps, chunk_size=chunk_size,
            centre_values=centre_values)

    if impl == "recurrent" and _walk_kernel(q, k, v, log_decay) is not None:
        return _recurrent_walk(q, k, v, log_decay, normalize, float(eps))
    return _xla_lion(q, k, v, log_decay, impl, normalize, eps, chunk_size, orders)


def _lion_in_orders(q, k, v, log_decay, orders, impl, normalize, eps, chunk_size):
    """lion_attention with several orders on a form other than the materialized one: the
    numerators (and the denominators, with the decays of their own columns) of each order's
    permuted tokens, averaged, then SCALE."""
    def numerator(v, log_decay):
        form = functools.partial(lion_attention, normalize=False, impl=impl,
                                 chunk_size=chunk_size)
        return orders_lib.average_in_orders(form, orders, q, k, v, log_decay).astype(
            _compute_dtype(v.dtype))

    if not normalize:
        return numerator(v, log_decay).astype(v.dtype)
    if log_decay is not None and log_decay.ndim == 4:  # a ones column per value column
        out = numerator(jnp.concatenate([v, jnp.ones_like(v)], axis=-1),
                        jnp.concatenate([log_decay, log_decay], axis=-1))
        num, den = jnp.split(out, 2, axis=-1)
    else:  # the kernels would pad V + 1 columns to 2 V: the denominator as its own call, on
        # the kernels' narrowest value block (16 columns) or one column
        ones = jnp.ones(v.shape[:-1] + (16 if impl == "pallas" else 1,), v.dtype)
        num, den = numerator(v, log_decay), numerator(ones, log_decay)[..., :1]
    return (num / (den + eps)).astype(v.dtype)


def _xla_lion(q, k, v, log_decay, impl, normalize, eps, chunk_size=64, orders=None):
    """lion_attention on the XLA form ``impl`` ("attention", "recurrent" or "chunk"); orders
    (the materialized form only) as in :func:`lion_attention`."""
    value_decay = log_decay is not None and log_decay.ndim == 4
    out_dtype = v.dtype
    dtype = _compute_dtype(out_dtype)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    log_decay = None if log_decay is None else log_decay.astype(dtype)
    if normalize and value_decay:  # a column of ones per value column, with its decay
        v = jnp.concatenate([v, jnp.ones_like(v)], axis=-1)
        log_decay = jnp.concatenate([log_decay, log_decay], axis=-1)
    elif normalize:
        v = _append_ones(v)
    if impl == "chunk":
        y = chunk.bidirectional(q, k, v, log_decay, chunk_size=chunk_size, value_decay=value_decay)
    elif impl == "attention":
        y = attention.bidirectional(q, k, v, log_decay, value_decay=value_decay, orders=orders)
    else:
        y = _BIDIRECTIONAL_FORMS[impl](q, k, v, log_decay, value_decay=value_decay)
    if normalize:
        y = _divide_by_last_columns(y, eps, y.shape[-1] // 2 if value_decay else 1)
    return y.astype(out_dtype)


def _walk_kernel(q, k, v, log_decay):
    """``pallas_kernels.lion_walk`` when impl="recurrent" runs it (on a GPU, for inputs it
    takes; float64 stays in XLA), else None."""
    kernels = _kernels_module()
    if (kernels is None or jax.default_backend() != "gpu" or q.dtype == jnp.float64
            or kernels.lion_walk_unsupported_reason(q, k, v, log_decay) is not None):
        return None
    return kernels.lion_walk


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _recurrent_walk(q, k, v, log_decay, normalize, eps):
    """impl="recurrent" on a GPU. Without a gradient: the Pallas token walk
    (``pallas_kernels.lion_walk``), whose memory is the input, the output, one float32 copy of
    the numerator and the ``K x V`` states (the XLA scan keeps per-token float32 outputs of
    both directions and the ones column). Differentiated: the XLA recurrence and its VJP."""
    return _walk_kernel(q, k, v, log_decay)(q, k, v, log_decay, normalize=normalize, eps=eps)


def _recurrent_walk_fwd(q, k, v, log_decay, normalize, eps):
    return jax.vjp(lambda *a: _xla_lion(*a, "recurrent", normalize, eps), q, k, v, log_decay)


def _recurrent_walk_bwd(normalize, eps, vjp, dy):
    return vjp(dy)


_recurrent_walk.defvjp(_recurrent_walk_fwd, _recurrent_walk_bwd)


def causal_linear_attention(q, k, v, log_decay=None, *, normalize=False, eps=1e-6, impl="auto",
                            chunk_size=64, initial_state=None, return_final_state=False):
    """Causal (decayed) linear attention.

    ``y_i = sum_{j<=i} q_i^T diag(exp(A_i - A_j)) k_j v_j^T`` with ``A = cumsum(log_decay)``,
    i.e. the recurrence ``S_t = diag(exp(a_t)) S_{t-1} + k_t v_t^T``, ``y_t = q_t^T S_t``.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``.
      log_decay: None, ``[B, L, H]`` (scalar per token and head: RetNet, TNL, LION halves,
        Mamba-2) or ``[B, L, H, K]`` (per key feature: GLA, HGRN2), entries ``<= 0``.
      normalize: divide by ``sum_j s_ij M_ij + eps``.
      eps: added to the denominator.
      impl: see :func:`lion_attention`.
      chunk_size: chunk length for "chunk" and "pallas".
      initial_state: the state before the first token: ``S [B, H, K, V]``, or with
        ``normalize=True`` the pair ``(S, z [B, H, K])``; or a
        :class:`~lion_jax.ops.kv_cache.KVCache` (e.g. :func:`empty_kv_cache`), whatever
        ``impl``: the new tokens then attend to the cached and new keys and values
        (:mod:`lion_jax.ops.kv_cache`, ``O(L C)``; ``L`` may not pass the capacity ``C``).
      return_final_state: also return the state after the last token (same structure; a
        cache with the new tokens appended).
    Returns:
      ``y [B, L, H, V]`` in ``v.dtype``, or ``(y, final_state)``.
    """
    name = "causal_linear_attention"
    _check_qkv(name, q, k, v)
    _check_log_decay(name, log_decay, q, per_key=True)
    _check_options(name, impl, chunk_size, eps)
    if isinstance(initial_state, kv_cache.KVCache):
        return _causal_from_kv_cache(name, q, k, v, log_decay, initial_state, normalize, eps,
                                     return_final_state)
    B, L, H, K = q.shape
    _check_state(name, initial_state, normalize, (B, H, K, v.shape[-1]))
    impl, chunk_size = _resolve_impl(impl, q, k, v, log_decay, chunk_size, normalize)

    out_dtype = v.dtype
    state = initial_state
    if normalize:
        v = _append_ones(v)
        if state is not None:
            state = jnp.concatenate([state[0], state[1][..., None]], axis=-1)
    if impl == "pallas":
        y, final_state = _kernels(name).causal_linear_attention(
            q, k, v, log_decay, chunk_size=chunk_size, initial_state=state, return_final_state=True)
    else:
        dtype = _compute_dtype(out_dtype)
        q, k, v = (x.astype(dtype) for x in (q, k, v))
        log_decay = None if log_decay is None else log_decay.astype(dtype)
        state = None if state is None else state.astype(dtype)
        if impl == "chunk":
            y, final_state = chunk.causal(q, k, v, log_decay, state, chunk_size=chunk_size)
        else:
            y, final_state = _CAUSAL_FORMS[impl](q, k, v, log_decay, state)

    if normalize:
        y = _divide_by_last_columns(y, eps)
        final_state = (final_state[..., :-1], final_state[..., -1])
    y = y.astype(out_dtype)
    return (y, final_state) if return_final_state else y


def causal_linear_attention_step(q, k, v, state=None, log_decay=None, *, normalize=False,
                                 eps=1e-6):
    """One decoding step of :func:`causal_linear_attention` (the recurrent form's update).

    Args:
      q, k: ``[B, H, K]``; v: ``[B, H, V]`` for the new token.
      state: None (empty) or the state so far: ``S [B, H, K, V]``, or ``(S, z [B, H, K])``
        with ``normalize=True``; e.g. the ``final_state`` of a prefill call.
      log_decay: None, ``[B, H]`` or ``[B, H, K]`` for the new token.
      normalize, eps: as in :func:`causal_linear_attention`.
    Returns:
      ``(y [B, H, V] in v.dtype, new_state)`` with the structure of ``state``.
    """
    name = "causal_linear_attention_step"
    # Reuse the sequence checks on a length-1 view.
    q1, k1, v1 = q[:, None], k[:, None], v[:, None]
    a1 = None if log_decay is None else log_decay[:, None]
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"{name}: q, k must have shape [B, H, K] and v [B, H, V] (one token); "
                         f"got q {q.shape}, k {k.shape}, v {v.shape}")
    _check_qkv(name, q1, k1, v1)
    _check_log_decay(name, a1, q1, per_key=True)
    B, H, K = q.shape
    _check_state(name, state, normalize, (B, H, K, v.shape[-1]))

    dtype = _compute_dtype(v.dtype)
    q_, k_, v_ = (x.astype(dtype) for x in (q, k, v))
    if state is None:
        state = jnp.zeros((B, H, K, v.shape[-1]), dtype)
        if normalize:
            state = (state, jnp.zeros((B, H, K), dtype))
    if normalize:
        v_ = _append_ones(v_)
        state = jnp.concatenate([state[0], state[1][..., None]], axis=-1)
    new_state, y = recurrent.step(state.astype(dtype), q_, k_, v_,
                                  None if log_decay is None else log_decay.astype(dtype))
    if normalize:
        y = _divide_by_last_columns(y, eps)
        new_state = (new_state[..., :-1], new_state[..., -1])
    return y.astype(v.dtype), new_state


def _causal_from_kv_cache(name, q, k, v, log_decay, cache, normalize, eps, return_final_state):
    """:func:`causal_linear_attention` with a :class:`~lion_jax.ops.kv_cache.KVCache`."""
    _check_kv_cache(name, cache, q, v, log_decay)
    out_dtype = v.dtype
    dtype = _compute_dtype(out_dtype)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    log_decay = None if log_decay is None else log_decay.astype(dtype)
    y, cache = kv_cache.causal(q, k, v, log_decay, cache, row_sums=normalize)
    if normalize:
        y = _divide_by_last_columns(y, eps)
    y = y.astype(out_dtype)
    return (y, cache) if return_final_state else y


# ----------------------------------------------------------------------------------------------
# helpers


def _compute_dtype(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _append_ones(v):
    return jnp.concatenate([v, jnp.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)


def _divide_by_last_columns(y, eps, n=1):
    """Numerator columns ``y[..., :-n]`` over the denominators ``y[..., -n:]`` (1 or one each)."""
    return y[..., :-n] / (y[..., -n:] + eps)


@functools.cache
def _kernels_module():
    try:
        import pallas_kernels
    except ImportError:
        return None
    return pallas_kernels


def _kernels(name):
    module = _kernels_module()
    if module is None:
        raise ValueError(f"{name}: impl='pallas' needs the pallas_kernels package, which could "
                         "not be imported; use impl='chunk' (XLA) instead.")
    return module


def _resolve_impl(impl, q, k, v, log_decay, chunk_size, normalize, *, value_decay=False):
    """The form and chunk size for impl="auto": the Pallas kernels on a GPU when they take
    these inputs (``v`` as the kernels see it: one column wider when normalising, or twice as
    wide with a decay per value feature; never the per-key-feature ones), else the
    materialized form for short sequences and the chunked one beyond; with a decay per key
    feature, chunks of at most :data:`AUTO_PER_KEY_CHUNK` (the materialized form up to one
    such chunk). Any other ``impl`` keeps ``chunk_size``. Returns ``(impl, chunk_size)``."""
    if impl != "auto":
        return impl, chunk_size
    kernels = _kernels_module()
    per_key = log_decay is not None and log_decay.ndim == 4 and not value_decay
    # Not the per-key-feature kernels: on an H100 the XLA compile of their backward was still
    # running after 5 minutes at L = 4K. impl="pallas" still takes them.
    if jax.default_backend() == "gpu" and kernels is not None and not per_key:
        if value_decay:
            width = v.shape[-1] * (2 if normalize else 1)
            v_seen = jax.ShapeDtypeStruct(v.shape[:-1] + (width,), v.dtype)
            a_seen = jax.ShapeDtypeStruct(v_seen.shape, log_decay.dtype)
            reason = kernels.value_decay_unsupported_reason(q, k, v_seen, a_seen)
        else:
            v_seen = jax.ShapeDtypeStruct(v.shape[:-1] + (v.shape[-1] + int(normalize),),
                                          v.dtype)
            reason = kernels.unsupported_reason(q, k, v_seen, log_decay, chunk_size=chunk_size)
        if reason is None:
            return "pallas", chunk_size
    if per_key:
        chunk_size = min(chunk_size, AUTO_PER_KEY_CHUNK)
        return ("attention" if q.shape[1] <= chunk_size else "chunk"), chunk_size
    return ("attention" if q.shape[1] <= AUTO_ATTENTION_MAX_LEN else "chunk"), chunk_size


def _value_decay_kernel(name, q, k, v, log_decay, normalize, eps):
    """lion_attention with a decay per value feature on ``pallas_kernels.lion_value_decay``:
    the numerator of ``[v | 1]`` with the decays doubled, then SCALE per column."""
    kernels = _kernels(name)
    if normalize:
        v = jnp.concatenate([v, jnp.ones_like(v)], axis=-1)
        log_decay = jnp.concatenate([log_decay, log_decay], axis=-1)
    reason = kernels.value_decay_unsupported_reason(q, k, v, log_decay)
    if reason is not None:
        raise ValueError(f"{name}: impl='pallas' cannot run these inputs: {reason}; use "
                         "impl='chunk' (XLA) instead")
    y = kernels.lion_value_decay(q, k, v, log_decay)
    if normalize:
        y = _divide_by_last_columns(y, eps, y.shape[-1] // 2)
    return y.astype(v.dtype)


def _is_concrete(x):
    return not isinstance(x, jax.core.Tracer)


def _check_qkv(name, q, k, v):
    for arg, x, dims in (("q", q, "[B, L, H, K]"), ("k", k, "[B, L, H, K]"),
                         ("v", v, "[B, L, H, V]")):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name}: {arg} must have shape {dims}, got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    if k.shape != q.shape:
        raise ValueError(f"{name}: k must have the shape of q [B, L, H, K] = {q.shape}, "
                         f"got {k.shape}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"{name}: v must have shape [B, L, H, V] with B, L, H = {q.shape[:3]} "
                         f"as in q, got {v.shape}")
    if q.shape[1] < 1:
        raise ValueError(f"{name}: the sequence length L (axis 1) must be >= 1, got {q.shape}")
    dtypes = {arg: jnp.dtype(x.dtype) for arg, x in (("q", q), ("k", k), ("v", v))}
    if len(set(dtypes.values())) != 1 or not jnp.issubdtype(dtypes["q"], jnp.floating):
        got = ", ".join(f"{a} {d}" for a, d in dtypes.items())
        raise ValueError(f"{name}: q, k and v must share one floating dtype (float32, bfloat16, "
                         f"float16 or float64), got {got}; cast them to one dtype")


def _check_log_decay(name, log_decay, q, *, per_key=False, per_value=None):
    """Checks ``log_decay``: ``[B, L, H]``, or per key feature ``[B, L, H, K]`` (``per_key``),
    or per value feature ``[B, L, H, V]`` (``per_value=V``); finite and ``<= 0`` if concrete."""
    if log_decay is None:
        return
    B, L, H, K = q.shape
    allowed, names = [(B, L, H)], ["[B, L, H]"]
    if per_key:
        allowed.append((B, L, H, K))
        names.append("[B, L, H, K] (per key feature)")
    if per_value is not None:
        allowed.append((B, L, H, per_value))
        names.append("[B, L, H, V] (per value feature)")
    if tuple(getattr(log_decay, "shape", ())) not in allowed:
        expected = " or ".join(str(list(s)) for s in allowed)
        raise ValueError(f"{name}: log_decay must have shape {' or '.join(names)} = {expected}, "
                         f"got {getattr(log_decay, 'shape', type(log_decay).__name__)}")
    if not jnp.issubdtype(log_decay.dtype, jnp.floating):
        raise ValueError(f"{name}: log_decay must be a floating array, got {log_decay.dtype}")
    if _is_concrete(log_decay):
        top = float(np.max(np.asarray(log_decay, dtype=np.float64)))
        if not top <= 0.0:  # also catches NaN
            raise ValueError(
                f"{name}: log_decay must be <= 0 everywhere (the log of a decay in (0, 1]), got "
                f"max {top}; map real parameters with jax.nn.log_sigmoid")


def _check_options(name, impl, chunk_size, eps):
    if impl not in IMPLS:
        raise ValueError(f"{name}: impl must be one of {IMPLS}, got {impl!r}")
    if (not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool)
            or chunk_size < 1):
        raise ValueError(f"{name}: chunk_size must be a positive int, got {chunk_size!r}")
    if not eps >= 0:
        raise ValueError(f"{name}: eps must be >= 0, got {eps!r}")


def _check_state(name, state, normalize, shape):
    if state is None:
        return
    B, H, K, V = shape
    if normalize:
        ok = (isinstance(state, (tuple, list)) and len(state) == 2
              and tuple(state[0].shape) == shape and tuple(state[1].shape) == (B, H, K))
        if not ok:
            raise ValueError(f"{name}: with normalize=True the state must be a pair (S, z) with "
                             f"S [B, H, K, V] = {list(shape)} and z [B, H, K] = {[B, H, K]}")
        arrays = state
    else:
        if getattr(state, "shape", None) != shape:
            raise ValueError(f"{name}: the state must have shape [B, H, K, V] = {list(shape)}, "
                             f"got {getattr(state, 'shape', type(state).__name__)}")
        arrays = (state,)
    for x in arrays:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name}: the state must be floating (float32), got {x.dtype}")


def _check_kv_cache(name, cache, q, v, log_decay):
    """The cache's shapes match ``q, v, log_decay`` and the new tokens fit its capacity."""
    B, L, H, K = q.shape
    C = cache.k.shape[1] if getattr(cache.k, "ndim", 0) == 4 else 0
    want = ((B, C, H, K), (B, C, H, v.shape[-1]),
            None if log_decay is None else (B, C) + tuple(log_decay.shape[2:]), ())
    got = tuple(None if x is None else tuple(jnp.shape(x)) for x in cache)
    if got != want or not jnp.issubdtype(jnp.result_type(cache.length), jnp.integer):
        raise ValueError(f"{name}: the KV cache (k, v, log_decay_cum, length) must have shapes "
                         f"{want} for these inputs (log_decay_cum None without decay) and an "
                         f"integer length, got {got}")
    n = int(cache.length) if _is_concrete(cache.length) else 0
    if n + L > C:
        raise ValueError(f"{name}: {L} new tokens after the {n} cached pass the KV cache's "
                         f"capacity C={C}; make the cache larger")
