"""TNL (TransNormerLLM / Lightning Attention) token mixer: GLA with a fixed per-layer,
per-head decay, SRMSNorm, an output gate and LRPE-d on the first layer ("Mix").

Equations (digests: ``lightning-attention-tnl.md`` = [TNL], ``scaling-laws-linear-lms.md`` =
[SL]; conventions of ARCHITECTURE.md section 3, ``a <= 0`` log-decays, ``[B, L, H, K]``)::

    q, k, v, u = split(x W_qkvu)                      # one fused D -> 4 * H*K projection
    q, k = phi(q), phi(k)                             # phi = silu (Swish)
    q, k = LRPE(q, p), LRPE(k, p)                     # LRPE layers only: [.., K] -> [.., 2K]
    o_t = sum_{s<=t} lambda_h^(t-s) (q_t . k_s) v_s   # causal_linear_attention, not normalised
    y = (SRMSNorm(concat_heads(o)) * u) W_o           # norm over the whole hidden width

Choices (each default is the official code's as the digest reports it; the paper's, or an
ablation, is behind the attribute named):

1. Decay (:func:`tnl_decay`; [TNL] 2.5, [SL] 1.2): ``log lambda = -s``,
   ``s_{h,l} = slope_h (1 - l / (L - 1) + 1e-5)`` with ALiBi slopes ``slope_h = 2^(-8h/H)``,
   ``h = 1..H`` (1-based: the first slope is ``2^(-8/H)``), and for ``H`` not a power of two the
   ALiBi rule ``slopes(p) ++ slopes(2p)[0::2][:H - p]``, ``p = 2^floor(log2 H)``; ``l`` is the
   0-based layer index. Decay is strongest in layer 0 and almost 1 in the last layer.
   ``decay_formula="paper"``: Eq. 10 as printed, ``s = (8h/H)(1 - l/L)``; the paper does not
   say whether h and l are 0- or 1-based ([TNL] 6.2); we index as the code does (h 1-based,
   so no head is left without decay; l 0-based). ``decay_formula="paper_alibi"``: the digest's
   "best reconstruction" of Eq. 10, ``s = slope_h (1 - l/L)``. ``decay_temperature=False``
   (Table 4 "without") drops the layer factor (factor 1). A single-layer model
   (``num_layers=1``) takes ``l / (L - 1) = 0`` for the official formula (the code divides by
   zero). The decay is fixed, never learned ([TNL] 2.5, 4.3).
2. SRMSNorm ([TNL] 2.4): ``x / (||x||_2 / sqrt(d) + eps)`` with ``eps = 1e-8`` *outside* the
   root, no gain, no bias, computed in float32. The digest takes this from OpenNLPLab's
   ``SimpleRMSNorm`` (it did not open TNL's own ``norm.py``). Applied over the full hidden
   width ``H*K``, across heads jointly, not per head ([TNL] 2.2, 6.3). Our own addition: at
   an all-zero row the norm's gradient is taken as 0 (its subgradient), so the gradient there
   is finite (``1/eps``) rather than NaN; the forward is unchanged.
3. LRPE-d ([TNL] 2.5 "Lrpe", Eq. 9): ``theta = 10000^(-2 j / D)``, ``j = 0..D-1`` with
   ``D = H*K`` (the hidden width, not the head dim, [SL] 9.3), reshaped ``[H, K]`` so each head
   owns its slice; learnable (Eq. 9 says so; ``lrpe_learnable=False`` freezes it); kept in
   float32 whatever ``param_dtype`` (in bf16, ``theta p`` would be off by radians at
   ``p ~ 10^3``). With 0-based positions ``p = offset + arange(L)``:
   ``x~ = concat([x cos(theta p), x sin(theta p)], -1)`` on q and k, so **the q/k width
   doubles to 2K** on LRPE layers (v stays K; the state is ``[B, H, 2K, K]`` there) and
   ``q~_t . k~_s = sum_j q_j k_j cos(theta_j (t - s))``. Because cos and sin are concatenated
   rather than rotating pairs, an odd ``head_dim`` is fine. Order: phi, then LRPE, then the
   attention ([TNL] 2.2). "Mix" (LRPE on the first layer only, decay everywhere) is the
   model's business: it sets ``use_lrpe=True`` on layer 0.
4. Output gate ([TNL] 2.2, Eq. 11): ``u = x W_u`` from the fused projection, **no
   activation** (``gate="linear"``). ``gate="none"`` is Table 5's "without gate";
   ``gate="lowrank_sigmoid"`` is [SL] 1.2's TNL: a fused QKV projection and
   ``G = sigmoid(x W_down W_up)`` with rank ``t = gate_rank`` (default ``head_dim``, i.e.
   ``d/h`` as [SL] 1.0 sets it), computed from the mixer input (the normed ``X-bar``).
5. No 1/sqrt(d) scaling and no softmax; no biases anywhere; all kernels ``N(0, 0.02^2)``
   (``init_std``; None = lecun normal) ([TNL] 2.2, 2.6).
6. Ablation switches, official defaults first: ``feature_map`` in ("silu", "identity",
   "elu1") (Table 7); ``activate_v`` (phi on v too, as MiniMax's TNL-derived code does; [SL]
   1.2; the [TNL] digest warns this is not TNL) off; ``norm_type`` in ("srmsnorm",
   "rmsnorm", "layernorm") (Table 6; the latter two have a learnable scale (and bias) over
   the hidden width); ``use_decay`` (Table 3: False for the "LRPE" and "APE" rows; APE itself
   is an embedding, the model's business); ``use_lrpe``; ``decay_temperature`` (Table 4);
   ``decay_formula``; ``gate`` (Table 5).

Not here: padding masks (the official code zero-fills v at padded positions; the shared LM
mixer interface has none), the GLU channel mixer (:mod:`lion_jax.layers.glu`).
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lion_jax import ops
from lion_jax.layers.feature_maps import elu1

DECAY_FORMULAS = ("official", "paper", "paper_alibi")
FEATURE_MAPS = {"silu": jax.nn.silu, "identity": lambda x: x, "elu1": elu1}
GATES = ("linear", "lowrank_sigmoid", "none")
NORM_TYPES = ("srmsnorm", "rmsnorm", "layernorm")
SRMSNORM_EPS = 1e-8
LRPE_BASE = 10000.0


# ----------------------------------------------------------------------------------------------
# decay schedule


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi head slopes, float64 ``[H]``: ``2^(-8h/H)``, ``h = 1..H``, for ``H`` a power of
    two; otherwise those of the largest power of two ``p < H`` followed by the slopes of ``2p``
    at odd ``h`` (``slopes(2p)[0::2][:H - p]``), as ALiBi and TNL's code define them."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be positive, got {num_heads}")

    def power_of_two(n):
        return 2.0 ** (-8.0 * np.arange(1, n + 1, dtype=np.float64) / n)

    p = 2 ** int(math.floor(math.log2(num_heads)))
    if p == num_heads:
        return power_of_two(num_heads)
    return np.concatenate([power_of_two(p), power_of_two(2 * p)[0::2][:num_heads - p]])


def tnl_decay(num_heads: int, layer_index: int, num_layers: int, *, formula: str = "official",
              temperature: bool = True) -> np.ndarray:
    """TNL's fixed log-decays ``log lambda_h <= 0`` of one layer, float32 ``[H]``.

    ``formula="official"``: ``-slope_h (1 - l/(L-1) + 1e-5)`` (:func:`alibi_slopes`);
    ``"paper"``: Eq. 10 as printed, ``-(8h/H)(1 - l/L)`` with ``h = 1..H``;
    ``"paper_alibi"``: ``-slope_h (1 - l/L)``. ``l = layer_index`` is 0-based, ``L =
    num_layers``. ``temperature=False`` drops the layer factor (Table 4). See the module
    docstring, choice 1.
    """
    if formula not in DECAY_FORMULAS:
        raise ValueError(f"unknown decay formula {formula!r}; valid: {list(DECAY_FORMULAS)}")
    if num_layers < 1 or not 0 <= layer_index < num_layers:
        raise ValueError(f"need 0 <= layer_index < num_layers, got layer_index={layer_index}, "
                         f"num_layers={num_layers}")
    if formula == "paper":
        if num_heads < 1:
            raise ValueError(f"num_heads must be positive, got {num_heads}")
        base = 8.0 * np.arange(1, num_heads + 1, dtype=np.float64) / num_heads
    else:
        base = alibi_slopes(num_heads)
    if not temperature:
        factor = 1.0
    elif formula == "official":
        depth = layer_index / (num_layers - 1) if num_layers > 1 else 0.0
        factor = 1.0 - depth + 1e-5
    else:
        factor = 1.0 - layer_index / num_layers
    return (-base * factor).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# SRMSNorm


def srms_norm(x: jnp.ndarray, eps: float = SRMSNORM_EPS) -> jnp.ndarray:
    """``x / (sqrt(mean(x^2)) + eps)`` over the last axis, in (at least) float32.

    ``sqrt(mean(x^2)) = ||x||_2 / sqrt(d)``. An all-zero row maps to 0, with a finite
    gradient (the root's subgradient at 0 taken as 0) rather than NaN.
    """
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    positive = ms > 0
    rms = jnp.where(positive, jnp.sqrt(jnp.where(positive, ms, 1.0)), 0.0)
    return x / (rms + eps)


class SRMSNorm(nn.Module):
    """Simple RMSNorm ``[..., d] -> [..., d]``: ``x / (||x||_2 / sqrt(d) + eps)``, no
    parameters ([TNL] 2.4). Computed in float32; returns ``dtype`` (None = ``x.dtype``).

    Attributes:
      epsilon: added to the RMS, outside the root (1e-8 as in the official code).
      dtype: output dtype.
    """

    epsilon: float = SRMSNORM_EPS
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return srms_norm(x, self.epsilon).astype(self.dtype or x.dtype)


# ----------------------------------------------------------------------------------------------
# LRPE-d


def lrpe_theta(num_heads: int, head_dim: int) -> np.ndarray:
    """The LRPE frequencies at init, float32 ``[H, K]``: ``10000^(-2 j / D)``, ``j = 0..D-1``,
    ``D = H*K``, head ``h`` taking ``j = hK .. hK + K - 1``."""
    d = num_heads * head_dim
    return (LRPE_BASE ** (-2.0 * np.arange(d, dtype=np.float64) / d)).reshape(
        num_heads, head_dim).astype(np.float32)


def lrpe(x: jnp.ndarray, theta: jnp.ndarray, offset=0) -> jnp.ndarray:
    """LRPE-d's q/k transform: ``x [B, L, H, K] -> [B, L, H, 2K]`` (float32 or wider),
    ``concat([x cos(theta p), x sin(theta p)], -1)`` with positions ``p = offset + arange(L)``.

    Args:
      x: queries or keys after the feature map.
      theta: ``[H, K]`` frequencies.
      offset: position of ``x[:, 0]``: an int or a traced int32 scalar.
    """
    L = x.shape[1]
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    positions = (jnp.asarray(offset, jnp.int32) + jnp.arange(L, dtype=jnp.int32)).astype(dtype)
    angle = positions[:, None, None] * theta.astype(dtype)[None]  # [L, H, K]
    x = x.astype(dtype)
    return jnp.concatenate([x * jnp.cos(angle), x * jnp.sin(angle)], axis=-1)


def _constant_init(values: np.ndarray):
    def init(key, shape, dtype=jnp.float32):
        del key
        return jnp.asarray(values, dtype).reshape(shape)
    return init


class Lrpe(nn.Module):
    """LRPE-d positional transform of queries or keys, ``[B, L, H, K] -> [B, L, H, 2K]``
    (:func:`lrpe`), holding ``theta [H, K]`` (param ``"theta"``, float32, init
    :func:`lrpe_theta`). Call the same instance on q and on k so they share ``theta``.

    Attributes:
      num_heads, head_dim: ``H``, ``K``.
      learnable: ``theta`` is a parameter (True, as in TNL) or the fixed init.
    """

    num_heads: int
    head_dim: int
    learnable: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray, offset=0) -> jnp.ndarray:
        H, K = self.num_heads, self.head_dim
        if x.shape[2:] != (H, K):
            raise ValueError(f"Lrpe: x must be [B, L, H, K] with H, K = {H}, {K}, got {x.shape}")
        init = lrpe_theta(H, K)
        if self.learnable:
            theta = self.param("theta", nn.with_logical_partitioning(
                _constant_init(init), (None, None)), (H, K), jnp.float32)
        else:
            theta = jnp.asarray(init)
        return lrpe(x, theta, offset)


# ----------------------------------------------------------------------------------------------
# the token mixer


class TnlAttention(nn.Module):
    """TNL's GLA token mixer, causal, ``[B, L, D] -> [B, L, D]`` (see the module docstring).

    ``__call__(x, *, state=None, offset=0, return_state=False)`` is the interface of the
    project's causal LM mixers: ``state`` is None or what a previous call returned (here the
    attention state ``S [B, H, K', K]``, float32, ``K' = 2K`` with LRPE, else ``K``; with
    ``kv_cache_len > 0`` a :class:`lion_jax.ops.KVCache` of the keys (after LRPE), values and
    decays seen), ``offset`` the position of ``x[:, 0]`` (an int or a traced int32 scalar;
    only LRPE reads it). A prefill with ``return_state=True`` followed by calls with
    ``state=..., offset=P`` gives the full forward.

    Attributes:
      num_heads: ``H``. head_dim: ``K``; the hidden width is ``H*K``, the input/output width
        ``D`` is ``x``'s.
      layer_index, num_layers: this layer's 0-based index and the model's depth (the decay).
      use_lrpe: LRPE-d on q and k (the model sets it on layer 0 only: "Mix").
      lrpe_learnable: LRPE's ``theta`` is learned.
      use_decay: the fixed exponential decay (False: plain causal linear attention).
      decay_formula: one of :data:`DECAY_FORMULAS` (:func:`tnl_decay`).
      decay_temperature: the layer factor of the decay (Table 4).
      feature_map: phi on q and k, one of ``FEATURE_MAPS`` ("silu", "identity", "elu1").
      activate_v: apply phi to v too (not TNL; [SL] 1.2's flag).
      gate: one of :data:`GATES`. gate_rank: the low-rank gate's ``t`` (None = ``head_dim``).
      norm_type: one of :data:`NORM_TYPES`. norm_eps: its epsilon.
      impl, chunk_size: passed to :func:`lion_jax.ops.causal_linear_attention`.
      kv_cache_len: > 0: a call with ``return_state`` and no ``state`` starts a KV cache of
        this capacity (:func:`lion_jax.ops.empty_kv_cache`) instead of the recurrent state,
        so decoding attends to every token seen (the LION paper's Figure 5); 0: the state.
      init_std: std of the Gaussian kernel init (None = lecun normal).
      dtype: compute dtype of the projections and op inputs. param_dtype: parameter dtype.
    """

    num_heads: int
    head_dim: int
    layer_index: int
    num_layers: int
    use_lrpe: bool = False
    lrpe_learnable: bool = True
    use_decay: bool = True
    decay_formula: str = "official"
    decay_temperature: bool = True
    feature_map: str = "silu"
    activate_v: bool = False
    gate: str = "linear"
    gate_rank: int | None = None
    norm_type: str = "srmsnorm"
    norm_eps: float = SRMSNORM_EPS
    impl: str = "auto"
    chunk_size: int = 64
    kv_cache_len: int = 0
    init_std: float | None = 0.02
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        for name in ("num_heads", "head_dim", "num_layers", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0 <= self.layer_index < self.num_layers:
            raise ValueError(f"need 0 <= layer_index < num_layers, got layer_index="
                             f"{self.layer_index}, num_layers={self.num_layers}")
        for name, value, valid in (("decay_formula", self.decay_formula, DECAY_FORMULAS),
                                   ("feature_map", self.feature_map, tuple(FEATURE_MAPS)),
                                   ("gate", self.gate, GATES),
                                   ("norm_type", self.norm_type, NORM_TYPES),
                                   ("impl", self.impl, ops.IMPLS)):
            if value not in valid:
                raise ValueError(f"unknown {name} {value!r}; valid: {list(valid)}")
        if self.gate_rank is not None and (self.gate != "lowrank_sigmoid" or self.gate_rank <= 0):
            raise ValueError(f"gate_rank must be a positive int and needs gate='lowrank_sigmoid'; "
                             f"got gate_rank={self.gate_rank!r}, gate={self.gate!r}")
        if not self.norm_eps >= 0:
            raise ValueError(f"norm_eps must be >= 0, got {self.norm_eps!r}")
        if self.kv_cache_len < 0:
            raise ValueError(f"kv_cache_len must be >= 0, got {self.kv_cache_len!r}")
        if self.init_std is not None and not self.init_std > 0:
            raise ValueError(f"init_std must be positive or None, got {self.init_std!r}")
        super().__post_init__()

    @property
    def hidden_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def key_dim(self) -> int:
        """The q/k width the op sees: ``2K`` with LRPE, else ``K``."""
        return 2 * self.head_dim if self.use_lrpe else self.head_dim

    def state_shape(self, batch_size: int) -> tuple[int, int, int, int]:
        """Shape of the state, ``(B, H, K', K)`` (float32; zeros = the empty context)."""
        return (batch_size, self.num_heads, self.key_dim, self.head_dim)

    def log_decay(self) -> np.ndarray | None:
        """This layer's fixed log-decays ``[H]`` (float32), or None without decay."""
        if not self.use_decay:
            return None
        return tnl_decay(self.num_heads, self.layer_index, self.num_layers,
                         formula=self.decay_formula, temperature=self.decay_temperature)

    def _kernel_init(self, names):
        init = (nn.initializers.normal(self.init_std) if self.init_std is not None
                else nn.initializers.lecun_normal())
        return nn.with_logical_partitioning(init, names)

    def _dense(self, features, names, name):
        return nn.Dense(features, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                        kernel_init=self._kernel_init(names), name=name)

    def _norm(self, y):
        """The output norm over the hidden width, float32 ``[B, L, H*K]``."""
        if self.norm_type == "srmsnorm":
            return srms_norm(y, self.norm_eps)
        y = y.astype(jnp.promote_types(y.dtype, jnp.float32))
        scale_init = nn.with_logical_partitioning(nn.initializers.ones, ("heads",))
        if self.norm_type == "rmsnorm":
            return nn.RMSNorm(epsilon=self.norm_eps, dtype=y.dtype, param_dtype=self.param_dtype,
                              scale_init=scale_init, name="norm")(y)
        return nn.LayerNorm(epsilon=self.norm_eps, dtype=y.dtype, param_dtype=self.param_dtype,
                            scale_init=scale_init,
                            bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                                   ("heads",)),
                            name="norm")(y)

    @nn.compact
    def __call__(self, x: jnp.ndarray, *, state=None, offset=0, return_state: bool = False):
        """``x [B, L, D]`` -> ``y [B, L, D]``, or ``(y, new_state)`` with ``return_state``.

        Args:
          x: the (normed) tokens.
          state: None (empty context) or what a previous call returned: ``S [B, H, K', K]``,
            or a :class:`lion_jax.ops.KVCache` (``kv_cache_len > 0``).
          offset: position of ``x[:, 0]`` in the sequence (int >= 0 or traced int32 scalar).
          return_state: also return the state after the last token (``S`` in float32, or the
            KV cache).
        """
        if x.ndim != 3:
            raise ValueError(f"TnlAttention: x must be [B, L, D], got shape {x.shape}")
        if isinstance(offset, (int, np.integer)) and offset < 0:
            raise ValueError(f"TnlAttention: offset must be >= 0, got {offset}")
        B, L, D = x.shape
        H, K = self.num_heads, self.head_dim
        hidden = self.hidden_dim
        n_proj = 4 if self.gate == "linear" else 3
        # one kernel [D, n_proj * H*K] (q | k | v | u), annotated as a 2-D Dense: flax's
        # DenseGeneral with several output axes applies a 3-axis sharding constraint to its
        # flat kernel under a mesh and fails
        proj = nn.Dense(n_proj * hidden, use_bias=False, dtype=self.dtype,
                        param_dtype=self.param_dtype,
                        kernel_init=self._kernel_init(("embed", "heads")),
                        name="qkvu_proj")(x).reshape(B, L, n_proj, hidden)
        compute_dtype = proj.dtype
        float_dtype = jnp.promote_types(compute_dtype, jnp.float32)

        def heads(i):
            return proj[:, :, i].reshape(B, L, H, K)

        phi = FEATURE_MAPS[self.feature_map]
        q = phi(heads(0).astype(float_dtype))
        k = phi(heads(1).astype(float_dtype))
        v = heads(2)
        if self.activate_v:
            v = phi(v.astype(float_dtype)).astype(compute_dtype)
        if self.use_lrpe:
            pe = Lrpe(H, K, learnable=self.lrpe_learnable, name="lrpe")
            q, k = pe(q, offset), pe(k, offset)

        log_decay = self.log_decay()
        if log_decay is not None:
            log_decay = jnp.broadcast_to(jnp.asarray(log_decay), (B, L, H))
        if state is None and return_state and self.kv_cache_len:
            state = ops.empty_kv_cache(B, self.kv_cache_len, H, self.key_dim, K,
                                       decay=None if log_decay is None else "scalar",
                                       dtype=compute_dtype)
        y, new_state = ops.causal_linear_attention(
            q.astype(compute_dtype), k.astype(compute_dtype), v, log_decay, normalize=False,
            impl=self.impl, chunk_size=self.chunk_size, initial_state=state,
            return_final_state=True)

        y = self._norm(y.reshape(B, L, hidden))
        if self.gate == "linear":
            y = y * proj[:, :, 3].astype(float_dtype)
        elif self.gate == "lowrank_sigmoid":
            t = self.gate_rank or K
            g = self._dense(t, ("embed", None), "gate_down")(x)
            g = self._dense(hidden, (None, "heads"), "gate_up")(g)
            y = y * jax.nn.sigmoid(g.astype(float_dtype))
        out = self._dense(D, ("heads", "embed"), "out_proj")(y.astype(compute_dtype))
        return (out, new_state) if return_state else out
