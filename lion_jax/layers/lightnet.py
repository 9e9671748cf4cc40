"""LightNet Attention (LNA): the additive-decay linear attention of LightNet ("You Only Scan
Once", digest ``papers/digests/lightnet.md`` sections 1.3 and 2).

Per head (``K = head_dim = D / H``; ``phi = SiLU`` on q only; no ``1/sqrt(K)`` scale)::

    q, k, v = x W_q, x W_k, x W_v                      (D -> D each; bias optional)
    u       = x W_u1 W_u2                              (low-rank gate, rank gate_rank)

    non-causal (causal=False, digest 2.4, "one scan"):
      o = phi(Q) (softmax_seq(K)^T V)                  softmax over the SEQUENCE axis, per
                                                       head and key feature: two matmuls
    causal (causal=True, digest 2.2, the additive recurrence):
      z_t   = logcumsumexp_{s<=t} k_s                  per feature (z_0 = -inf)
      kbar_t = exp(k_t - z_t),  log a_t = z_{t-1} - z_t
      S_t   = diag(a_t) S_{t-1} + kbar_t v_t^T,   o_t = S_t^T phi(q_t)

    y = W_o( Norm(concat_heads(o)) * sigmoid(u) )      paper order: Norm -> gate -> W_o

``S_t[i] = sum_{s<=t} exp(k_si) v_s / sum_{s<=t} exp(k_si)``: each state row is a causal
softmax-over-time mean of the values, and the final causal state is exactly the non-causal
``softmax_seq(K)^T V`` (digest 2.4's identity), so the non-causal output at every token is the
causal final state read by that token's query.

The causal form runs on :func:`lion_jax.ops.causal_linear_attention` (per-key-feature
log-decay ``[B, L, H, K]``, ``impl`` and ``chunk_size`` passed through) with ``q = phi(q)`` and
keys ``kbar``. Numerics (:func:`additive_decay`): with ``d_t = k_t - z_{t-1}``,
``kbar_t = sigmoid(d_t)`` and ``log a_t = log_sigmoid(-d_t)``, computed in float32 (float64
for float64 inputs), finite with finite gradients for any logits (tested at +-50). The first
token of an empty context has ``a_1 = 0`` (``z_0 = -inf``); since it multiplies the zero
state it is passed as ``log a_1 = 0`` exactly (no ``-inf``, no huge finite stand-in that would
cost the chunked form's cumulative sums their precision).

Choices where the paper is silent (digest 2.1, 2.6, 7):

- ``norm="layernorm"`` (default): LayerNorm without scale or bias, ``eps = 1e-6``, over the
  concatenated heads (the vision reference snippet); ``"rmsnorm"`` (learnable scale, the LM
  reference code) and ``"srmsnorm"`` (TNL's parameter-free :func:`lion_jax.layers.tnl.srms_norm`)
  are the alternatives. Computed in float32.
- ``gate_rank`` default ``head_dim`` (the vision snippet's; xmixers uses H, fla 128).
- ``use_bias`` (default False, the LM code; the vision snippet uses True) applies to every
  projection: q, k, v, the decay projections, the gate's two and ``W_o``.
- ``share_decay=False`` (Table 4's "no share"; its form is unspecified, this is our reading):
  a separate low-rank decay projection ``f = x W_f1 W_f2`` (rank ``decay_rank``, default
  ``head_dim``; ``2 d r`` parameters a layer) gives ``delta = exp(f)``,
  and ``k`` stays the key: the key input becomes ``k_t * exp(f_t - z_t)`` with
  ``z = logcumsumexp(f)`` (causal) and ``k * softmax_seq(F)`` (non-causal), so the identity
  above still holds.

Padding: the non-causal form takes ``mask [B, L]`` (bool, True = real token); padded tokens
get zero softmax weight, so they change no real token's output (their own outputs are
meaningless). The causal form refuses a mask (right padding needs none: real tokens never see
later ones).

Decoding (causal): ``state`` is ``(S [B, H, K, K], z [B, H, K])`` float32, the op's state and
the running log-normaliser; a prefill with ``return_state=True`` and single-token calls give
the full forward. ``offset`` is the position of ``x[:, 0]`` for 1-D ``lrpe`` (the LM-mixer
interface); MD-TPE is applied once after the embedding by the model, not here.
With ``kv_cache_len`` the state is ``(KVCache, z)`` instead (the same outputs by attention
to every token seen: :mod:`lion_jax.ops.kv_cache`).
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lion_jax import ops
from lion_jax.layers.md_pe import GRID_ORDERS, grid_positions, md_lrpe, md_lrpe_thetas
from lion_jax.layers.tnl import srms_norm

NORMS = ("layernorm", "rmsnorm", "srmsnorm")


def additive_decay(logits: jnp.ndarray, z0: jnp.ndarray | None = None):
    """The additive recurrence's key weights and log-decays from decay logits (digest 2.2).

    Args:
      logits: ``[B, L, H, K]`` decay logits (``delta = exp(logits)``), float.
      z0: None (empty context) or the running ``z [B, H, K]`` before the first token.
    Returns:
      ``(w, log_decay, z_last)``: ``w = exp(logits_t - z_t)`` in ``(0, 1]`` and
      ``log_decay = z_{t-1} - z_t <= 0`` (both ``[B, L, H, K]``; 0 for the first token of an
      empty context, whose decay multiplies the zero state), and ``z`` after the last token
      ``[B, H, K]``.
    """
    z = jax.lax.cumlogsumexp(logits, axis=1)
    if z0 is None:
        z_prev = jnp.concatenate([jnp.full_like(z[:, :1], -jnp.inf), z[:, :-1]], axis=1)
    else:
        z0 = z0.astype(logits.dtype)[:, None]
        z = jnp.logaddexp(z0, z)
        z_prev = jnp.concatenate([z0, z[:, :-1]], axis=1)
    valid = jnp.isfinite(z_prev)
    d = logits - jnp.where(valid, z_prev, 0.0)
    w = jnp.where(valid, jax.nn.sigmoid(d), 1.0)
    log_decay = jnp.where(valid, jax.nn.log_sigmoid(-d), 0.0)
    return w, log_decay, z[:, -1]


def softmax_over_sequence(logits: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
    """``softmax(logits, axis=1)`` of ``[B, L, H, K]`` over the real tokens of ``mask [B, L]``
    (padded tokens get weight 0; an all-padded row gets all zeros)."""
    if mask is None:
        return jax.nn.softmax(logits, axis=1)
    m = mask[:, :, None, None]
    top = jax.lax.stop_gradient(jnp.max(jnp.where(m, logits, -jnp.inf), axis=1, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    e = jnp.where(m, jnp.exp(jnp.where(m, logits, top) - top), 0.0)
    total = jnp.sum(e, axis=1, keepdims=True)
    return e / jnp.where(total > 0, total, 1.0)


def one_scan(q: jnp.ndarray, kbar: jnp.ndarray, v: jnp.ndarray) -> jnp.ndarray:
    """The non-causal LNA core ``q (kbar^T v)`` per head: one reduction over the sequence and
    two matmuls, no scan (digest 2.4). ``kbar`` is ``softmax_seq(K)``
    (:func:`softmax_over_sequence`), times the keys for ``share_decay=False``, MD-LRPE-rotated
    with the queries when the layer has ``lrpe``.

    The state ``kbar^T v`` is accumulated and kept in float32 (float64 for float64 inputs),
    as the op convention asks; ``kbar`` and ``v`` enter its matmul in their own dtype (bf16 in
    a bf16 model: half the memory traffic of the sequence-long operands; forward + backward
    15-16% faster than all-float32 on an H200 at L = 4K-64K, ``experiments.bench_scan``).

    Args:
      q: ``[B, L, H, K]`` (``phi`` applied); kbar: ``[B, L, H, K]``; v: ``[B, L, H, V]``.
    Returns:
      ``[B, L, H, V]`` in float32 (float64 for float64 inputs).
    """
    acc = jnp.promote_types(jnp.result_type(q, kbar, v), jnp.float32)
    kv = jnp.einsum("blhk,blhv->bhkv", kbar, v.astype(kbar.dtype), preferred_element_type=acc)
    return jnp.einsum("blhk,bhkv->blhv", q.astype(acc), kv)


class LightNetAttention(nn.Module):
    """LightNet Attention ``[B, L, D] -> [B, L, D]``; see the module docstring.

    Call: ``mixer(x, mask=None, *, state=None, offset=0, return_state=False)``:

    - ``x [B, L, D]``; ``mask [B, L]`` bool (True = real token), non-causal only;
    - causal only: ``state`` None or ``(S [B, H, K, K], z [B, H, K])`` from a previous call,
      ``return_state`` returns ``(y, state)``; ``offset``: the position of ``x[:, 0]`` (1-D
      ``lrpe`` only).

    Attributes:
      num_heads: ``H``; ``head_dim = D / H`` (None = ``D / num_heads``; if given it must match).
      head_dim: checked against ``D / num_heads`` when given (the models pass it).
      causal: False (default, the one-scan non-causal form) or True (the additive recurrence).
      norm: one of :data:`NORMS` (default ``"layernorm"``, no affine). norm_eps: its epsilon.
      gate_rank: rank of the sigmoid output gate (None = ``head_dim``).
      share_decay: True (default): the decay comes from the key logits; False: a separate
        low-rank decay projection of rank ``decay_rank`` (None = ``head_dim``).
      use_bias: biases on every projection (default False).
      lrpe: MD-LRPE on the queries and the normalised keys (digest 2.7;
        :func:`lion_jax.layers.md_pe.md_lrpe`, fixed frequencies): the key width doubles to
        ``2K`` and a causal state is ``S [B, H, 2K, K]``.
      kv_cache_len: > 0 (causal): a prefill with ``return_state`` starts from an empty
        :class:`lion_jax.ops.KVCache` of this capacity instead of the recurrent ``S``, so
        decoding attends to every token seen (the state is ``(cache, z)``).
      grid_shape, num_prefix: the tokens' grid for ``lrpe`` (``num_prefix`` unrotated tokens,
        then the grid); ``()`` = a 1-D sequence at positions ``offset + t``.
      grid_order: how the grid was flattened, ``"C"`` (default, row-major: the last axis
        fastest) or ``"F"`` (column-major); see :func:`lion_jax.layers.md_pe.grid_positions`.
      impl, chunk_size: passed to :func:`lion_jax.ops.causal_linear_attention` (causal only).
      dtype, param_dtype: compute and parameter dtypes.
    """

    num_heads: int = 1
    head_dim: int | None = None
    causal: bool = False
    norm: str = "layernorm"
    norm_eps: float = 1e-6
    gate_rank: int | None = None
    share_decay: bool = True
    decay_rank: int | None = None
    use_bias: bool = False
    lrpe: bool = False
    kv_cache_len: int = 0
    grid_shape: tuple[int, ...] = ()
    num_prefix: int = 0
    grid_order: str = "C"
    impl: str = "auto"
    chunk_size: int = 64
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.impl not in ops.IMPLS:
            raise ValueError(f"unknown impl {self.impl!r}; valid: {list(ops.IMPLS)}")
        if self.grid_order not in GRID_ORDERS:
            raise ValueError(f"unknown grid_order {self.grid_order!r}; valid: {list(GRID_ORDERS)}")
        if self.norm not in NORMS:
            raise ValueError(f"unknown norm {self.norm!r}; valid: {list(NORMS)}")
        for name in ("num_heads", "head_dim", "gate_rank", "decay_rank", "chunk_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps}")
        if self.kv_cache_len < 0 or (self.kv_cache_len and not self.causal):
            raise ValueError(f"kv_cache_len={self.kv_cache_len} needs causal=True and a "
                             "non-negative value (it is the causal decoding cache's capacity)")
        super().__post_init__()

    def _dense(self, features, names, name):
        return nn.Dense(features, use_bias=self.use_bias, dtype=self.dtype,
                        param_dtype=self.param_dtype,
                        kernel_init=nn.with_logical_partitioning(
                            nn.initializers.lecun_normal(), names),
                        bias_init=nn.with_logical_partitioning(
                            nn.initializers.zeros, (names[1],)),
                        name=name)

    def _norm(self, y):
        if self.norm == "srmsnorm":
            return srms_norm(y, self.norm_eps)
        if self.norm == "rmsnorm":
            return nn.RMSNorm(epsilon=self.norm_eps, dtype=y.dtype, param_dtype=self.param_dtype,
                              scale_init=nn.with_logical_partitioning(nn.initializers.ones,
                                                                      ("heads",)),
                              name="norm")(y)
        return nn.LayerNorm(epsilon=self.norm_eps, use_scale=False, use_bias=False,
                            dtype=y.dtype, name="norm")(y)

    def _check(self, x, mask, state, return_state):
        name = "LightNetAttention"
        if x.ndim != 3:
            raise ValueError(f"{name}: x must be [B, L, D], got shape {x.shape}")
        B, L, D = x.shape
        if D % self.num_heads:
            raise ValueError(f"{name}: width D={D} is not divisible by num_heads={self.num_heads}")
        K = D // self.num_heads
        if self.head_dim is not None and self.head_dim != K:
            raise ValueError(f"{name}: head_dim={self.head_dim} != D / num_heads = {K}")
        if mask is not None:
            if self.causal:
                raise ValueError(f"{name}: mask is for causal=False only (causal outputs of "
                                 "real tokens never see right padding)")
            if tuple(mask.shape) != (B, L) or mask.dtype != jnp.bool_:
                raise ValueError(f"{name}: mask must be bool [B, L] = {[B, L]}, got "
                                 f"{mask.dtype} {list(mask.shape)}")
        if not self.causal and (state is not None or return_state):
            raise ValueError(f"{name}: state / return_state need causal=True")
        if self.lrpe and self.grid_shape and math.prod(self.grid_shape) + self.num_prefix != L:
            raise ValueError(f"{name}: {L} tokens, but num_prefix + prod(grid_shape) = "
                             f"{self.num_prefix} + {math.prod(self.grid_shape)}")
        if self.lrpe and K % max(1, len(self.grid_shape)):
            raise ValueError(f"{name}: head_dim={K} is not divisible into "
                             f"{len(self.grid_shape)} MD-LRPE axis groups")
        if state is not None and not isinstance(state[0], ops.KVCache):
            Ks = 2 * K if self.lrpe else K
            shapes = ((B, self.num_heads, Ks, K), (B, self.num_heads, K))
            if (not isinstance(state, (tuple, list)) or len(state) != 2
                    or tuple(tuple(getattr(s, "shape", ())) for s in state) != shapes):
                raise ValueError(f"{name}: state must be (S {list(shapes[0])}, z "
                                 f"{list(shapes[1])}), got "
                                 f"{jax.tree_util.tree_map(jnp.shape, state)}")
        return B, L, D, self.num_heads, K

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray | None = None, *, state=None,
                 offset: Any = 0, return_state: bool = False):
        """``x [B, L, D]`` -> ``y [B, L, D]`` or ``(y, state)``; see the class."""
        B, L, D, H, K = self._check(x, mask, state, return_state)
        if self.lrpe:
            theta = md_lrpe_thetas(H, K, max(1, len(self.grid_shape)))
            positions = (grid_positions(self.grid_shape, self.num_prefix, self.grid_order)
                         if self.grid_shape
                         else (offset + jnp.arange(L, dtype=jnp.int32))[:, None])
        names = ("embed", "heads")
        q = self._dense(D, names, "query")(x)
        k = self._dense(D, names, "key")(x)
        v = self._dense(D, names, "value")(x)
        compute_dtype = v.dtype
        f32 = jnp.promote_types(compute_dtype, jnp.float32)
        shape = (B, L, H, K)
        q = jax.nn.silu(q.astype(f32)).reshape(shape)
        k = k.astype(f32).reshape(shape)
        v = v.reshape(shape)
        if self.share_decay:
            logits, key = k, None
        else:
            r = self.decay_rank or K
            f = self._dense(r, ("embed", None), "decay_down")(x)
            logits = self._dense(D, (None, "heads"), "decay_up")(f).astype(f32).reshape(shape)
            key = k

        new_state = None
        if self.causal:
            S0, z0 = (None, None) if state is None else state
            if S0 is None and self.kv_cache_len and return_state:
                S0 = ops.empty_kv_cache(B, self.kv_cache_len, H, 2 * K if self.lrpe else K, K,
                                        decay="per_key", dtype=compute_dtype)
            w, log_decay, z_last = additive_decay(logits, z0)
            kbar = w if key is None else key * w
            if self.lrpe:  # [x cos, x sin] halves: each feature's decay on both (digest 2.7)
                q, kbar = (md_lrpe(x_, theta, positions) for x_ in (q, kbar))
                log_decay = jnp.concatenate([log_decay, log_decay], axis=-1)
            out = ops.causal_linear_attention(
                q.astype(compute_dtype), kbar.astype(compute_dtype), v, log_decay,
                normalize=False, impl=self.impl, chunk_size=self.chunk_size,
                initial_state=S0, return_final_state=return_state)
            y, S = out if return_state else (out, None)
            if return_state:
                new_state = (S, z_last)
            y = y.astype(f32)
        else:
            w = softmax_over_sequence(logits, mask)
            kbar = w if key is None else key * w
            if self.lrpe:
                q, kbar = (md_lrpe(x_, theta, positions) for x_ in (q, kbar))
            y = one_scan(q, kbar.astype(compute_dtype), v)

        y = self._norm(y.reshape(B, L, D).astype(f32))
        g = self._dense(self.gate_rank or K, ("embed", None), "gate_down")(x)
        g = self._dense(D, (None, "heads"), "gate_up")(g)
        y = y * jax.nn.sigmoid(g.astype(f32))
        out = self._dense(D, ("heads", "embed"), "out")(y.astype(compute_dtype))
        return (out, new_state) if return_state else out
