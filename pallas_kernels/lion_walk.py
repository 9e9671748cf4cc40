"""LION's recurrent form as a forward-only Triton kernel: memory of the input, the output and
the states.

    y_i = sum_j (q_i . k_j) M_ij v_j / (sum_j (q_i . k_j) M_ij + eps),   M_ij = exp(-|A_i - A_j|)

(without the division when not normalised), ``A = cumsum(log_decay)`` over L, with
``log_decay`` None (LION-LIT), one decay per head ``[B, L, H]`` or one per value feature
``[B, L, H, V]`` (paper C.7; each column then has its own mask and its own denominator).

Two launches, each one program per (batch, head, block of 16 value columns) walking the tokens
with the state ``S [K, 16]`` and the normaliser's ``z`` (``[K]``, or ``[K, 16]`` per value
feature) in float32 registers, the paper's Theorem 3.3 recurrence:

1. reverse walk (``t = L-1 .. 0``; the state takes ``a_{t+1}`` on arriving at t): the strict
   backward parts ``num_B_t = q_t^T S``, ``den_B_t = q_t^T z``, written in float32;
2. forward walk (the state takes ``a_t``): ``num_F_t``, ``den_F_t`` inclusive of the diagonal,
   and the output ``(num_F + num_B) / (den_F + den_B + eps)`` written in v's dtype.

So the memory beyond the input and the output is one float32 copy of the numerator (and the
denominators), with nothing per chunk: the chunked kernels (``bidirectional.py``) store every
chunk's states in both directions for their output kernels, 2 K / C times the output (with
head dims of 64 and chunks of 64, twice the output). Every decay factor is in [0, 1], taken
once per token and column. It has no VJP: ``lion_jax.ops.lion_attention(impl="recurrent")``
runs it when no gradient is taken and the XLA recurrence when one is.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import _next_pow2, _pad_axis
from pallas_kernels.value_decay import UNROLL, walk_inputs_reason

BLOCK_V = 16


def unsupported_reason(q, k, v, log_decay):
    """Why :func:`lion_walk` cannot take these inputs, or None when it can."""
    reason = walk_inputs_reason(q, k, v, max_k=256)
    if reason is not None:
        return reason
    if log_decay is not None and log_decay.shape not in (q.shape[:3], v.shape):
        return (f"log_decay must be None, [B, L, H] = {q.shape[:3]} or [B, L, H, V] = "
                f"{v.shape}; got {log_decay.shape}")
    return None


def _layout(q, v):
    kp = _next_pow2(max(q.shape[-1], 4))
    bv = min(BLOCK_V, _next_pow2(max(v.shape[-1], 4)))
    return kp, bv, -(-v.shape[-1] // bv) * bv


def _loads(q_ref, k_ref, v_ref, g_ref, t, g_t):
    f32 = jnp.float32
    return (q_ref[t, :].astype(f32), k_ref[t, :].astype(f32), v_ref[t, :].astype(f32),
            jnp.exp(g_ref[g_t, :])[None, :])


def _walk_kernel(q_ref, k_ref, v_ref, g_ref, *refs, length, normalize, eps):
    """One (b, h, V-block) of launch 1 (the reverse walk: refs num, den, written in float32)
    or launch 2 (the forward walk: refs num, den read, y written). Refs: q, k ``[L, Kp]``;
    v, y, num ``[L, BV]``; g, den ``[L, BV]`` (a decay per value feature) or ``[L, 1]``."""
    f32 = jnp.float32
    refs = list(refs)
    num_ref, den_ref = refs.pop(0), (refs.pop(0) if normalize else None)
    y_ref = refs.pop(0) if refs else None  # forward launch only
    kp, bv, dv = k_ref.shape[-1], v_ref.shape[-1], g_ref.shape[-1]
    reverse = y_ref is None

    def tokens(ts, carry):
        """Walks the tokens ``ts`` (their loads issued first) from ``carry = (S, z)``."""
        s, z = carry
        # the state takes a_t arriving at t walking forward, a_{t+1} in reverse (clamped at
        # the end, where the state is still zero)
        loaded = [_loads(q_ref, k_ref, v_ref, g_ref, t,
                         jnp.minimum(t + 1, length - 1) if reverse else t) for t in ts]
        for t, (q, k, v, decay) in zip(ts, loaded):
            s = s * decay
            z = z * decay if normalize else z
            if not reverse:  # inclusive
                s = s + k[:, None] * v[None, :]
                num = jnp.sum(q[:, None] * s, axis=0) + num_ref[t, :]
                if normalize:
                    z = z + k[:, None]
                    den = jnp.sum(q[:, None] * z, axis=0) + den_ref[t, :]
                    num = num / (den + eps)
                y_ref[t, :] = num.astype(y_ref.dtype)
            else:  # strict
                num_ref[t, :] = jnp.sum(q[:, None] * s, axis=0)
                if normalize:
                    den_ref[t, :] = jnp.sum(q[:, None] * z, axis=0)
                    z = z + k[:, None]
                s = s + k[:, None] * v[None, :]
        return s, z

    def token(step):
        return length - 1 - step if reverse else step

    def step(i, carry):
        return tokens([token(i * UNROLL + u) for u in range(UNROLL)], carry)

    z0 = jnp.zeros((kp, dv), f32) if normalize else None
    full = length // UNROLL
    carry = jax.lax.fori_loop(0, full, step, (jnp.zeros((kp, bv), f32), z0))
    tokens([token(i) for i in range(full * UNROLL, length)], carry)  # the last L % UNROLL


def _call(q, k, v, g, parts, *, normalize, eps, interpret):
    """Launch 1 (``parts`` None: returns ``[num_B, den_B]``) or launch 2 (returns y)."""
    B, L, H, kp = q.shape
    _, bv, vp = _layout(q, v)
    dv = g.shape[-1]
    blocks = vp // bv
    rows = pl.BlockSpec((None, L, None, kp), lambda b, h, j: (b, 0, h, 0))
    cols = pl.BlockSpec((None, L, None, bv), lambda b, h, j: (b, 0, h, j))
    g_spec = cols if dv > 1 else pl.BlockSpec((None, L, None, 1), lambda b, h, j: (b, 0, h, 0))
    den_spec = cols if dv > 1 else pl.BlockSpec((None, L, None, 1),
                                                lambda b, h, j: (b, 0, h, j))
    den_shape = (B, L, H, vp if dv > 1 else blocks)
    part_specs = [cols] + ([den_spec] if normalize else [])
    part_shapes = [jax.ShapeDtypeStruct((B, L, H, vp), jnp.float32)] + (
        [jax.ShapeDtypeStruct(den_shape, jnp.float32)] if normalize else [])
    kernel = functools.partial(_walk_kernel, length=L, normalize=normalize, eps=eps)
    params = pltriton.CompilerParams(num_warps=max(1, min(4, kp * bv // 256)), num_stages=2)
    if parts is None:
        return pl.pallas_call(
            kernel, grid=(B, H, blocks), in_specs=[rows, rows, cols, g_spec],
            out_specs=part_specs, out_shape=part_shapes, compiler_params=params,
            interpret=interpret, name="lion_walk_reverse",
        )(q, k, v, g)
    return pl.pallas_call(
        kernel, grid=(B, H, blocks), in_specs=[rows, rows, cols, g_spec] + part_specs,
        out_specs=cols, out_shape=jax.ShapeDtypeStruct((B, L, H, vp), v.dtype),
        compiler_params=params, interpret=interpret, name="lion_walk_forward",
    )(q, k, v, g, *parts)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _two_walks(q, k, v, g, normalize, eps, interpret):
    run = functools.partial(_call, q, k, v, g, normalize=normalize, eps=eps,
                            interpret=interpret)
    return run(run(None))


def _two_walks_fwd(*args):
    raise ValueError("pallas_kernels.lion_walk has no gradient; differentiate "
                     "lion_jax.ops.lion_attention(impl='recurrent'), which takes its gradient "
                     "from the XLA recurrence")


_two_walks.defvjp(_two_walks_fwd, lambda *args: None)  # the forward rule raises
# jitted with its static layout, so that a model's layers of one shape share one trace and
# one lowering of the kernels (pallas_kernels/__init__.py, "Lowered once")
_two_walks_once = jax.jit(_two_walks, static_argnums=(4, 5, 6))


def lion_walk(q, k, v, log_decay=None, *, normalize=True, eps=1e-6, interpret=None):
    """LION's output by the token recurrence, forward only (see the module docstring).

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``, float32, bfloat16 or float16; K <= 256.
      log_decay: None, ``[B, L, H]`` or ``[B, L, H, V]``, entries ``<= 0`` (used in float32).
      normalize: divide by the masked row sums (SCALE; per column with a decay per value
        feature); eps is added to the denominator.
      interpret: run the Pallas interpreter; None means "when the default backend is CPU".
    Returns:
      ``[B, L, H, V]`` in v.dtype. Not differentiable (a ValueError says so).
    """
    reason = unsupported_reason(q, k, v, log_decay)
    if reason is not None:
        raise ValueError(f"lion_walk: {reason}")
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    B, L, H, _ = q.shape
    kp, _, vp = _layout(q, v)
    if log_decay is None:
        g = jnp.zeros((B, L, H, 1), jnp.float32)
    elif log_decay.ndim == 3:
        g = log_decay.astype(jnp.float32)[..., None]
    else:
        g = _pad_axis(log_decay.astype(jnp.float32), 3, vp)
    # no copies along L (the walks take any length); head dims padded only when not aligned
    y = _two_walks_once(_pad_axis(q, 3, kp), _pad_axis(k, 3, kp), _pad_axis(v, 3, vp), g,
                        bool(normalize), float(eps), bool(interpret))
    return y if vp == v.shape[-1] else y[..., :v.shape[-1]]
