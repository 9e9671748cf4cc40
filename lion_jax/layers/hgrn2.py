"""HGRN2's token mixer: a gated linear RNN with a per-channel forget gate, a learned
layer-wise lower bound and state expansion (Scaling Laws for Linear Complexity LMs, digest
``papers/digests/scaling-laws-linear-lms.md`` section 1.3; parameters section 2.2).

Per head ``i`` (``K = head_dim`` channels, default 128, the paper's ``d/h``)::

    og, z, h = x W_og, x W_fg, x W_h                   (each D -> H*K, no bias)
    f_t   = lb + (1 - lb) * sigmoid(z_t)               forget gate in (lb, 1), per channel
    S_t   = diag(f_t) S_{t-1} + (1 - f_t) h_t^T        S in R^{K x K} (state expansion)
    o_t   = swish(og_t)^T S_t
    y     = RMSNorm(concat_i o_i) W_o                  (W_o: H*K -> D, no bias)

i.e. gated linear attention with query ``swish(og)``, key ``1 - f``, value ``h`` and the
per-key-feature log-decay ``log f`` (``[B, L, H, K]``), computed by
:func:`lion_jax.ops.causal_linear_attention` (ARCHITECTURE.md section 3).

Lower bound (digest 1.3): a learnable table ``LR [num_layers, H*K]`` shared by all layers,
``p = softmax(LR, axis=0)`` over layers, and layer ``s`` takes

- ``mode="fla"`` (default, [EXT] FLA's reference): ``lb_s = cumsum(p)[s] - p[0]``, so layer 0
  has no bound and the top layer stays below 1 (computed as ``sum_{j=1..s} p_j``: no
  cancellation);
- ``mode="paper"`` (the literal equation): ``lb_s = cumsum(p)[s]`` (computed as
  ``1 - sum_{j>s} p_j``), which is exactly 1 at the top layer (forget gate 1, key 0: that
  layer's mixer outputs zeros from a zero state).

Because the softmax runs over layers, the table belongs to the model, not to a layer: the model
builds one :class:`Hgrn2LowerBounds` and passes its output (all layers' bounds) to every
layer's mixer as ``lower_bounds=``; the mixer takes row ``layer_index``. Its parameters are
the paper's ``l * d`` lower-bound parameters (section 2.2); the mixer itself holds ``4 d^2``
(``W_og, W_fg, W_h, W_o``) plus the output norm's scale (``d``, a subleading term the paper
does not count; ``output_norm="srmsnorm"``, TNL's parameter-free norm, drops it).

Choices where the paper is silent (digest 1.3, 9.3), defaults from the [EXT] FLA reference:

- query activation swish (``query_activation="identity"`` for none), no activation on ``h``;
- the output norm is an RMSNorm with a learnable scale over the whole ``H*K`` concat (the
  paper's ``Norm(Concat[O_1..O_h])``), then ``W_o``, which the printed equation omits but the
  parameter and FLOPs counts include (digest 1.3 [INCONSISTENT]); no output gate (the
  ``W_gdown, W_gup`` of the printed HGRN2 block are a copy-paste artefact, digest 1.3);
- no bias anywhere (the ``4 d^2`` count); no short convolution; no ``K**-0.5`` query scale
  (a constant factor on ``o`` is removed by the RMSNorm up to its ``eps``);
- lower-bound logits start at zero (uniform softmax: ``lb_s = s / num_layers`` for "fla");
  the digest does not give an init.

Numerics: the forget gate, its log and the key are computed in float32 whatever ``dtype``:
``k = 1 - f = (1 - lb) sigmoid(-z)`` (no cancellation), ``log f = log1p(-k)`` where
``k <= 1/2`` (precise for the long-memory channels, ``f`` near 1) and
``log(sigmoid(z) + lb sigmoid(-z))`` (a ``logaddexp``) elsewhere, clipped to ``<= 0``; finite
with finite gradients for any ``z`` and ``lb`` in ``[0, 1]``.

Decoding: the state is the op's ``S [B, H, K, K]`` (float32), nothing else (no short conv),
or with ``kv_cache_len > 0`` a :class:`lion_jax.ops.KVCache` of every key, value and forget
gate seen; ``offset`` does not enter (HGRN2 has no positional encoding; the decay is the position
information).
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lion_jax import ops
from lion_jax.layers.tnl import srms_norm

LOWER_BOUND_MODES = ("fla", "paper")
OUTPUT_NORMS = ("rmsnorm", "srmsnorm")
QUERY_ACTIVATIONS = ("swish", "identity")


def lower_bounds_from_logits(logits: jnp.ndarray, mode: str = "fla") -> jnp.ndarray:
    """All layers' lower bounds ``[num_layers, W]`` (float32, in ``[0, 1]``) from the logits
    ``LR [num_layers, W]``: ``p = softmax(LR, axis=0)``, then ``cumsum(p)[s] - p[0]``
    (``mode="fla"``) or ``cumsum(p)[s]`` (``mode="paper"``); see the module docstring."""
    if mode not in LOWER_BOUND_MODES:
        raise ValueError(f"unknown lower-bound mode {mode!r}; valid: {list(LOWER_BOUND_MODES)}")
    p = jax.nn.softmax(logits.astype(jnp.float32), axis=0)
    if mode == "paper":  # 1 - sum_{j > s} p_j: exactly 1 at the top layer
        above = jnp.cumsum(p[::-1], axis=0)[::-1]  # sum_{j >= s} p_j
        bounds = 1.0 - jnp.concatenate([above[1:], jnp.zeros_like(p[:1])], axis=0)
    else:  # sum_{j=1..s} p_j: exactly 0 at layer 0
        bounds = jnp.concatenate([jnp.zeros_like(p[:1]), jnp.cumsum(p[1:], axis=0)], axis=0)
    return jnp.clip(bounds, 0.0, 1.0)  # a float sum of a softmax may pass 1 by an ulp


def forget_gate(z: jnp.ndarray, lower_bound: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(log f, 1 - f)`` for ``f = lb + (1 - lb) sigmoid(z)``, in float32.

    Args:
      z: forget-gate logits ``[..., W]``.
      lower_bound: ``lb`` in ``[0, 1]``, broadcastable to ``z``.
    Returns:
      ``log f <= 0`` and the key ``1 - f = (1 - lb) sigmoid(-z) >= 0``, both like ``z``.
    """
    z = z.astype(jnp.float32)
    lb = jnp.asarray(lower_bound, jnp.float32)
    key = (1.0 - lb) * jax.nn.sigmoid(-z)
    near_one = key <= 0.5
    log_f_near_one = jnp.log1p(-jnp.where(near_one, key, 0.0))
    positive = lb > 0
    log_lb = jnp.where(positive, jnp.log(jnp.where(positive, lb, 1.0)), -jnp.inf)
    log_f_far = jnp.logaddexp(jax.nn.log_sigmoid(z), log_lb + jax.nn.log_sigmoid(-z))
    log_f = jnp.minimum(jnp.where(near_one, log_f_near_one, log_f_far), 0.0)
    return log_f, key


class Hgrn2LowerBounds(nn.Module):
    """The shared lower-bound table of an HGRN2 model: ``() -> [num_layers, width]`` bounds.

    Holds ``lower_bound_logits [num_layers, width]`` (logical axes ``(None, "heads")``, init
    zeros) and returns :func:`lower_bounds_from_logits` of it. The model owns one and passes
    its output to every :class:`Hgrn2Attention` as ``lower_bounds=`` (``width`` = the mixers'
    ``H * K``).

    Attributes:
      num_layers: ``l``. width: ``H * K`` of the mixers. mode: ``"fla"`` or ``"paper"``.
      param_dtype: parameter dtype.
    """

    num_layers: int
    width: int
    mode: str = "fla"
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.mode not in LOWER_BOUND_MODES:
            raise ValueError(f"unknown lower-bound mode {self.mode!r}; valid: "
                             f"{list(LOWER_BOUND_MODES)}")
        for name in ("num_layers", "width"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        super().__post_init__()

    @nn.compact
    def __call__(self) -> jnp.ndarray:
        init = nn.with_logical_partitioning(nn.initializers.zeros, (None, "heads"))
        logits = self.param("lower_bound_logits", init, (self.num_layers, self.width),
                            self.param_dtype)
        return lower_bounds_from_logits(logits, self.mode)


class Hgrn2Attention(nn.Module):
    """HGRN2 token mixer ``[B, L, D] -> [B, L, D]`` (causal); see the module docstring.

    Call: ``mixer(x, lower_bounds=table, state=None, offset=0, return_state=False)``:

    - ``x [B, L, D]``;
    - ``lower_bounds``: ``[num_layers, H*K]``, the output of the model's
      :class:`Hgrn2LowerBounds` (required unless ``use_lower_bound=False``);
    - ``state``: None or the state a previous call returned, ``S [B, H, K, K]`` float32 (with
      ``kv_cache_len > 0``: a :class:`lion_jax.ops.KVCache`);
    - ``offset``: position of ``x[:, 0]`` (accepted for the shared LM-mixer interface; unused);
    - returns ``y [B, L, D]``, or ``(y, new_state)`` with ``return_state=True``.

    A prefill with ``return_state=True`` then calls on the following tokens with that state
    give the full forward's outputs.

    Attributes:
      num_heads: ``H``; None = ``D // head_dim``. head_dim: ``K`` (default 128, the paper's).
      layer_index, num_layers: this layer's index (0-based) in the model and the model's depth;
        pick the row of ``lower_bounds``.
      use_lower_bound: False = no bound (``lb = 0``: plain HGRN2 gating, ``lower_bounds``
        must then be None).
      query_activation: ``"swish"`` (default) or ``"identity"`` on ``og``.
      output_norm: ``"rmsnorm"`` (learnable scale, default) or ``"srmsnorm"`` (TNL's
        parameter-free :func:`lion_jax.layers.tnl.srms_norm`).
      norm_eps: the RMSNorm's epsilon.
      impl, chunk_size: passed to :func:`lion_jax.ops.causal_linear_attention`.
      kv_cache_len: > 0: a call with ``return_state`` and no ``state`` starts a KV cache of
        this capacity (:func:`lion_jax.ops.empty_kv_cache`) instead of the recurrent state;
        0: the state.
      dtype, param_dtype: compute and parameter dtypes.
    """

    num_heads: int | None = None
    head_dim: int = 128
    layer_index: int = 0
    num_layers: int = 1
    use_lower_bound: bool = True
    query_activation: str = "swish"
    output_norm: str = "rmsnorm"
    norm_eps: float = 1e-6
    impl: str = "auto"
    chunk_size: int = 64
    kv_cache_len: int = 0
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.impl not in ops.IMPLS:
            raise ValueError(f"unknown impl {self.impl!r}; valid: {list(ops.IMPLS)}")
        if self.kv_cache_len < 0:
            raise ValueError(f"kv_cache_len must be >= 0, got {self.kv_cache_len}")
        for name, valid in (("query_activation", QUERY_ACTIVATIONS),
                            ("output_norm", OUTPUT_NORMS)):
            if getattr(self, name) not in valid:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: {list(valid)}")
        for name in ("num_heads", "head_dim", "num_layers", "chunk_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0 <= self.layer_index < self.num_layers:
            raise ValueError(f"layer_index must be in [0, num_layers={self.num_layers}), got "
                             f"{self.layer_index}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps}")
        super().__post_init__()

    def _heads(self, width: int) -> int:
        if self.num_heads is not None:
            return self.num_heads
        if width % self.head_dim:
            raise ValueError(f"the input width {width} is not a multiple of head_dim="
                             f"{self.head_dim}; set num_heads or head_dim")
        return width // self.head_dim

    def _dense(self, features, names, name, dtype=None):
        return nn.Dense(features, use_bias=False, dtype=dtype or self.dtype,
                        param_dtype=self.param_dtype,
                        kernel_init=nn.with_logical_partitioning(
                            nn.initializers.lecun_normal(), names),
                        name=name)

    def _lower_bound(self, lower_bounds, width):
        """This layer's bound ``[H*K]`` (float32), or 0.0 without one."""
        if not self.use_lower_bound:
            if lower_bounds is not None:
                raise ValueError("use_lower_bound=False but lower_bounds were passed")
            return 0.0
        if lower_bounds is None:
            raise ValueError("Hgrn2Attention needs lower_bounds [num_layers, H*K] from the "
                             "model's Hgrn2LowerBounds (or use_lower_bound=False)")
        if tuple(lower_bounds.shape) != (self.num_layers, width):
            raise ValueError(f"lower_bounds must have shape [num_layers, H*K] = "
                             f"{[self.num_layers, width]}, got {list(lower_bounds.shape)}")
        return lower_bounds[self.layer_index].astype(jnp.float32)

    @nn.compact
    def __call__(self, x: jnp.ndarray, *, lower_bounds: jnp.ndarray | None = None,
                 state: jnp.ndarray | None = None, offset: Any = 0,
                 return_state: bool = False):
        """``x [B, L, D]`` -> ``y [B, L, D]`` or ``(y, state)``; see the class."""
        del offset  # no positional encoding in HGRN2
        B, L, D = x.shape
        H, K = self._heads(D), self.head_dim
        lb = self._lower_bound(lower_bounds, H * K)

        q = self._dense(H * K, ("embed", "heads"), "query")(x)
        if self.query_activation == "swish":
            q = nn.swish(q)
        v = self._dense(H * K, ("embed", "heads"), "value")(x)
        z = self._dense(H * K, ("embed", "heads"), "forget_gate", dtype=jnp.float32)(
            x.astype(jnp.float32))
        log_f, key = forget_gate(z, lb)

        shape = (B, L, H, K)
        if state is None and return_state and self.kv_cache_len:
            state = ops.empty_kv_cache(B, self.kv_cache_len, H, K, K, decay="per_key",
                                       dtype=q.dtype)
        out = ops.causal_linear_attention(
            q.reshape(shape), key.astype(q.dtype).reshape(shape), v.reshape(shape).astype(q.dtype),
            log_f.reshape(shape), normalize=False, impl=self.impl, chunk_size=self.chunk_size,
            initial_state=state, return_final_state=return_state)
        y, new_state = out if return_state else (out, None)

        y = y.reshape(B, L, H * K)
        if self.output_norm == "srmsnorm":
            y = srms_norm(y).astype(y.dtype)
        else:
            y = nn.RMSNorm(epsilon=self.norm_eps, dtype=self.dtype, param_dtype=self.param_dtype,
                           scale_init=nn.with_logical_partitioning(nn.initializers.ones,
                                                                   ("heads",)),
                           name="output_norm")(y)
        y = self._dense(D, ("heads", "embed"), "out")(y)
        return (y, new_state) if return_state else y
