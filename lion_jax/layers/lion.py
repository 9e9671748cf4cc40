"""LION token mixers (paper Sec. 3-4, Appendix C.5 and C.7).

All the math of the mask, the scan and the chunking lives in :mod:`lion_jax.ops`; the module
here only builds ``q, k, v`` and log-decays from the input and picks the output normalisation.

Conventions (ARCHITECTURE.md section 3): ``a_i = log_decay_i <= 0``, ``A = cumsum(a)`` over the
sequence, bidirectional mask ``M_ij = exp(-|A_i - A_j|)`` (causal: ``exp(A_i - A_j)``, ``i >= j``),
scores ``s_ij = phi(q_i) . phi(k_j)``.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lion_jax import ops
from lion_jax.layers.feature_maps import get_feature_map, kernel_feature_map, kernel_qkv_map
from lion_jax.layers.rotary import rope, rope_frequencies
from lion_jax.layers.hippo import (complex_value_init, hippo_log_decays, hippo_normal,
                                   zoh_value_scales)

VARIANTS = ("lit", "d", "retnet", "s", "grfa", "xlstm")
FIXED_DECAY_VARIANTS = ("d", "retnet")
SELECTIVE_VARIANTS = ("s", "grfa", "xlstm")
DECAY_SHAPES = ("scalar", "vector")
DECAY_INITS = ("exponents", "hippo", "hippo_complex")
DECAY_ACTIVATIONS = ("log_sigmoid", "softplus")
SELECTIVE_TIMESCALES = ("spread", "hippo")
VALUE_INITS = ("lecun", "zoh")
GATE_PRODUCTS = ("float32", "compute")

DEFAULT_FEATURE_MAP = {
    "lit": "elu1",        # Katharopoulos et al.; paper Sec. 5.3, Table 13
    "d": "silu_l2",       # Table 13 (LION-S); the same map for the fixed-decay LION-D
    "retnet": "identity",  # RetNet has no feature map
    "s": "silu_l2",       # Table 13
    "grfa": "elu1",       # positive features keep SCALE well defined
    "xlstm": "identity",  # mLSTM has no feature map
}
DEFAULT_NORMALIZE = {"lit": True, "d": True, "retnet": False, "s": True, "grfa": True}
DEFAULT_OUTPUT_NORM = ("retnet", "xlstm")  # both originals norm each head after the mixer


def decay_logits(n: int, exponents: tuple[float, float]) -> np.ndarray:
    """Initial decay logits: ``sigmoid(logit_c) = 1 - 2**-e_c``, ``e_c = linspace(*exponents, n)``.

    With the default exponents ``(5, 12)`` and 8 heads this is RetNet's per-head schedule
    ``gamma_h = 1 - 2**(-5 - h)``: decays from 0.969 (memory ~32 tokens) to 0.99976 (~4096
    tokens), spread evenly in log-timescale for any number of channels.
    """
    e = np.linspace(exponents[0], exponents[1], n, dtype=np.float64)
    return np.log1p(-np.exp2(-e)) + e * np.log(2.0)  # log(lam / (1 - lam))


def _constant_init(values: np.ndarray):
    """An initializer returning ``values`` (reshaped to the requested shape)."""
    def init(key, shape, dtype=jnp.float32):
        del key
        return jnp.asarray(values, dtype).reshape(shape)
    return init


def _rounded_products(x, w, dimension_numbers, precision=None, *, dtype):
    """``lax.dot_general`` of ``x`` and ``w`` rounded to ``dtype``, accumulated and returned
    in float32 (``gate_products="compute"``); the backward's products as
    :func:`_float32_products` says."""
    return _float32_products(x.astype(dtype), w.astype(dtype), dimension_numbers, precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _float32_products(a, b, dimension_numbers, precision):
    """``lax.dot_general(a, b)`` of two operands in one 16-bit dtype, returned in float32.
    Its backward rounds the float32 cotangent to that dtype and takes the two transposed
    products in it (float32 accumulation inside the matmul, as every other 16-bit projection's
    backward): JAX's own VJP would multiply the float32 cotangent with the 16-bit operands as
    float32 GEMMs and convert the results."""
    return jax.lax.dot_general(a, b, dimension_numbers, precision=precision,
                               preferred_element_type=jnp.float32)


def _float32_products_fwd(a, b, dimension_numbers, precision):
    return _float32_products(a, b, dimension_numbers, precision), (a, b)


def _float32_products_bwd(dimension_numbers, precision, residuals, g):
    a, b = residuals
    _, vjp = jax.vjp(lambda a, b: jax.lax.dot_general(a, b, dimension_numbers,
                                                      precision=precision), a, b)
    return vjp(g.astype(a.dtype))


_float32_products.defvjp(_float32_products_fwd, _float32_products_bwd)


class _DenseParams(nn.Module):
    """``nn.Dense(features)``'s parameters for inputs of width ``inputs``: ``kernel [inputs,
    features]`` and ``bias [features]`` (zeros), named, initialised and partitioned as
    nn.Dense makes them, returned rather than applied: :class:`LionAttention` applies its
    query, key and value projections as one product where a kernel takes the result
    (:meth:`LionAttention._projections`), with the checkpoints of separate Dense layers."""

    features: int
    names: tuple
    kernel_init: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, inputs: int):
        kernel = self.param("kernel", nn.with_logical_partitioning(self.kernel_init, self.names),
                            (inputs, self.features), self.param_dtype)
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                               (self.names[1],)),
                          (self.features,), self.param_dtype)
        return kernel, bias


def _affine(x, kernel, bias, dtype):
    """``x @ kernel + bias`` as ``nn.Dense(dtype=dtype)`` computes it."""
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=dtype)
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ()))) + bias


class LionAttention(nn.Module):
    """LION token mixer ``[B, L, D] -> [B, L, D]``: bidirectional (or causal) linear attention.

    ``q = phi(W_q x)``, ``k = phi(W_k x)``, ``v = W_v x`` per head (``[B, L, H, K]``, ``K``, ``V``
    dims), mixed by :func:`lion_jax.ops.lion_attention` (``causal=True``:
    :func:`lion_jax.ops.causal_linear_attention`), then ``Dense(H*V -> D)``.

    Variants (paper Appendix C.5; ``g = sigmoid(.)`` of a ``Dense(D -> H)`` of the token):

    - ``lit``  LION-LIT: no decay, ``elu+1``, SCALE-normalised.
    - ``d``    LION-D: learnable per-head decay ``lambda_h = sigmoid(p_h)``, normalised.
    - ``retnet`` LION-RETNET: the same fixed decay, not normalised (Eq. 117).
    - ``s``    LION-S: selective ``a_i = log sigmoid(w^T x_i + b)`` per token and head (Eq. 28).
      Keys are not multiplied by the ZOH factor ``e^{a_i} - 1`` of Eq. 27 (which the paper
      says may be treated as part of ``k_i``): the mask of Eq. 28 is used as stated.
    - ``grfa`` gated RFA: ``a_i = log g_i``, keys scaled by ``1 - g_i``, normalised (Eq. 135).
    - ``xlstm`` mLSTM: forget gate ``a_i = log sigmoid(f~_i)``, input gate ``i_i = exp(i~_i)`` on
      the keys, output ``num / max(den, 1)`` (Eq. 125, ``den = sum_j s_ij M_ij``). xLSTM itself
      uses ``max(|den|, 1)``; we keep the paper's. ``i~`` is soft-capped,
      ``cap * tanh(i~ / cap)`` (``input_gate_cap``, 15 as in xLSTM-7B's gate soft-cap), so
      ``exp`` stays finite in float32 without xLSTM's running-max stabiliser.

    ``decay_shape="vector"`` (decaying variants, bidirectional; paper C.7): one decay per value
    feature, ``a_i in R^V`` per head (``Dense(D -> H*V)`` for the gates, ``H*V`` fixed decays),
    with SCALE per value feature: the op's ``[B, L, H, V]`` log-decay. A per-channel key scale
    (``grfa``'s ``1 - g``) then weighs each value column's numerator and denominator.

    The LRA recipe of paper Appendix D.2 and the ablations of Table 6 are switches:
    ``decay_init="hippo"`` adds a learnable non-selective log-decay per channel, initialised
    from HiPPO (:func:`hippo_log_decays`; ``a = -exp(p)``, so it stays negative): LION-D's
    decay is then that alone, LION-S's is ``a_c + log sigmoid(w^T x_i + b)``;
    ``value_init="zoh"`` scales ``W_v``'s columns by the ZOH factors of those decays
    (:func:`zoh_value_scales`); ``decay_activation="softplus"`` (Table 6 [7], which the paper
    does not define) takes ``a_i = -softplus(w^T x_i + b)``: ``log sigmoid`` of ``-z``, so
    with the same bias init the decays start strong instead of weak;
    ``normalize_unmasked=True`` (Table 6 [5], "scaled attention w.o. mask") divides the
    masked numerator by the *unmasked* row sum ``sum_j s_ij`` instead of ``sum_j s_ij M_ij``.

    ``decay_init="hippo_complex"`` is the other reading of D.2, where the non-selective
    ``Lambda`` is S5's own HiPPO init, whose eigenvalues are complex (``-1/2 + i omega``;
    :meth:`_complex_decay`), with a decay per value feature: channel ``c`` of the values is
    ``(B_bar x)_c``, complex, with S5's ``B_bar = Lambda^-1 (exp(Lambda dt) - 1) B``
    (:func:`complex_value_init`; the ZOH factor is applied at every call, as S5 does, so it
    follows the learned ``Lambda`` and ``dt``), and the mask of that channel gains the phase
    ``exp(i theta_c (i - j))``, ``theta_c = Im(Lambda_c dt_c)``, on top of the real decays
    (``Re(Lambda_c dt_c)`` plus the selective part)::

        y_ic = exp(i theta_c i) sum_j s_ij M_ijc (exp(-i theta_c j) v_jc)

    so the op runs unchanged on ``2V`` real columns (real and imaginary parts, turned back
    by ``theta_c j``), and the output is turned forward by ``theta_c i``; the output
    projection reads both parts (``Re(C y)`` with a complex ``C``). The phase is that of a
    forward walk with ``exp(Lambda dt)`` and a backward walk with its conjugate (S5's
    backward walk takes ``exp(Lambda dt)`` too; ours keeps one op call). SCALE divides by the
    real row sums ``sum_j s_ij M_ijc``. S5 without its eigenvalues' imaginary parts does not
    learn Pathfinder (docs/pathfinder.md), which is why this reading is here.

    Scaling: ``q`` is multiplied by ``K**-0.5`` unless the output is SCALE-normalised (there the
    factor cancels, up to ``eps``).

    Rotated scores (``rope_base``; not LION's: its paper's Table 9 adds positional embeddings
    of a kind it does not state to LION-S): ``q`` and ``k`` are rotated after the feature map
    as RoPE rotates them (:func:`lion_jax.layers.rotary.rope`, at the index of each real
    token), so the scores become ``s_ij = sum_f a_f cos(theta_f (i - j)) + b_f sin(theta_f
    (i - j))`` with ``a_f, b_f`` from the features of ``i`` and ``j``: under the decay mask
    every pair of features adds a damped oscillation in the lag, like the filters that complex
    eigenvalues give S4/S5, where the mask alone is a sum of real exponentials.
    Rotated scores change sign, so SCALE's row sums can reach zero: rotation needs an
    unnormalised variant (``normalize=False``; ``output_norm=True`` then keeps each head's
    scale, as RetNet does). ``rope_learned=True`` makes the frequencies a parameter,
    ``rope_freq [H * K/2]`` (per head, initialised at RoPE's), as S4/S5 learn their
    eigenvalues' imaginary parts; it trains at ``optim.decay_lr_factor`` with the decays.

    Padding: ``mask [B, L]`` (True = real token). Padded tokens get ``k = 0`` (so their score
    with every query is zero and their values add nothing to any numerator or denominator; v
    needs no mask, which saves a pass over it each way) and ``log_decay = 0`` (decay 1: they
    take no step of distance). The mask over real tokens is then exactly that of the sequence
    with the pads removed, so real outputs are unchanged by padding at the end *and* by pads
    inserted anywhere (for ``d``/``retnet`` the distance ``|i - j|`` counts real tokens only).
    Padded content must be finite (a zero key times a non-finite value is not zero). Outputs at
    padded positions are meaningless.

    Decay init: fixed decays and the biases of the decay/forget gates start at
    ``sigmoid(b) = 1 - 2**-e`` with ``e`` spread over ``decay_init_exponents`` across heads
    (across all ``H*V`` channels for vector decay); see :func:`decay_logits`. The input gate of
    ``xlstm`` starts at bias 0 (``i = 1``). With ``decay_init="hippo"``,
    ``selective_timescales="hippo"`` hands the same biases to the channels in the order of
    their HiPPO decays (the strongest HiPPO decay gets the strongest selective one, the weakest
    the weakest), so the two parts do not cut each other's long memories short. With the
    default ``"spread"`` they run against each other: the HiPPO steps grow over the heads while
    ``e`` does too, and in the LRA recipe's Pathfinder layer (8 heads of 24 channels) no
    channel starts with a memory ``1 / |a|`` above 82 tokens (``"hippo"``: up to 804).

    Precision: feature maps, decays and gates (their projections too) are computed in at least
    float32 whatever ``dtype``; ``q, k`` are then cast to the compute dtype for the op, which
    accumulates in float32. ``gate_products="compute"`` makes the gates' projections take the
    tokens and kernels as the compute dtype rounds them (as every other projection does),
    accumulated and returned in float32, with the bias and activation in float32; their
    backward takes the gates' cotangents rounded to the compute dtype, as every other
    projection's backward does.

    Attributes:
      num_heads: ``H``. head_dim: ``K``, the query/key width. value_dim: ``V`` (default ``K``).
      variant: one of :data:`VARIANTS`. decay_shape: ``"scalar"`` or ``"vector"``.
      feature_map: name for :func:`get_feature_map`; None = the variant's default
        (:data:`DEFAULT_FEATURE_MAP`).
      normalize: SCALE the output; None = the variant's default (:data:`DEFAULT_NORMALIZE`);
        must be None for ``xlstm``.
      output_norm: LayerNorm over each head's ``V`` outputs before the output projection
        (RetNet's GroupNorm, xLSTM's multi-head norm); None = on for ``retnet`` and ``xlstm``.
      causal: use the causal op (the same parameters serve a causal LM).
      impl, chunk_size, eps: passed to the op.
      kv_cache_len: causal only; > 0: a call with ``return_state`` and no ``state`` starts a
        KV cache of this capacity (:func:`lion_jax.ops.empty_kv_cache`) instead of the
        recurrent state, so decoding attends to every token seen; 0: the state.
      centre_values: passed to :func:`lion_jax.ops.lion_attention` (bidirectional,
        SCALE-normalised variants only): the kernels run on v less its mean over the
        sequence, which keeps 16-bit gradients precise for values far from zero mean under
        little decay (LION-LIT), for ~5 % more time in the op.
      decay_init_exponents: range of ``e`` in the decay init above.
      decay_init: ``"exponents"`` (above), ``"hippo"`` (non-selective HiPPO part, above) or
        ``"hippo_complex"`` (S5's complex one, above).
      hippo_dt_range: the steps ``dt`` of the HiPPO init, log-spaced over the heads
        (``"hippo_complex"``: drawn log-uniformly per channel, as S5 does).
      decay_activation: selective decay ``"log_sigmoid"`` (Eq. 28) or ``"softplus"``.
      selective_timescales: ``"spread"`` or ``"hippo"`` (the decay-init paragraph above).
      value_init: ``"lecun"`` or ``"zoh"`` (needs ``decay_init="hippo"`` or
        ``"hippo_complex"``, where it is S5's complex ``B_bar``).
      normalize_unmasked: SCALE by the unmasked row sum (Table 6 [5]); bidirectional,
        normalised variants only.
      input_gate_cap: soft cap of ``xlstm``'s log input gate.
      gate_products: ``"float32"`` or ``"compute"``: the products of the decay and input
        gates' projections (the precision paragraph above; with ``dtype`` None both are
        float32). ``python -m experiments.bench_vision --lion_models s,s_gate32`` times the
        two; on one H200 (2026-12-02, with the forward's products alone in the compute
        dtype) ViT-T's LION-S train step at 224 px took 18.23 ms with ``"compute"`` and 18.28
        with ``"float32"`` (docs/benchmarks.md, "Train step at 224 px").
      init_std: std of a Gaussian init for the query, key and gate kernels (the paper's LRA
        recipe, Appendix D.2, uses 0.1); None = lecun normal.
      rope_base: None, or RoPE's frequency base for rotated scores (above; bidirectional,
        unnormalised, even ``K``).
      rope_learned: learn the rotation frequencies (needs ``rope_base``, their init).
      feedthrough: add S5's ``D * x`` to the output (``D [dim]``, the parameter
        ``feedthrough``, N(0, 1) as S5 draws it): not LION's; with it a LION mixer holds
        everything S5's layer has (:class:`lion_jax.layers.s5.S5Mixer`), which the Pathfinder
        runs compare (docs/benchmarks.md).
      dtype: compute dtype of the projections and op inputs. param_dtype: parameter dtype.
    """

    num_heads: int
    head_dim: int
    value_dim: int | None = None
    variant: str = "s"
    decay_shape: str = "scalar"
    feature_map: str | None = None
    normalize: bool | None = None
    output_norm: bool | None = None
    causal: bool = False
    impl: str = "auto"
    chunk_size: int = 64
    eps: float = 1e-6
    kv_cache_len: int = 0
    centre_values: bool = False
    decay_init_exponents: tuple[float, float] = (5.0, 12.0)
    input_gate_cap: float = 15.0
    decay_init: str = "exponents"
    hippo_dt_range: tuple[float, float] = (0.001, 0.1)
    decay_activation: str = "log_sigmoid"
    selective_timescales: str = "spread"
    value_init: str = "lecun"
    normalize_unmasked: bool = False
    init_std: float | None = None
    rope_base: float | None = None
    rope_learned: bool = False
    feedthrough: bool = False
    gate_products: str = "float32"
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; valid: {list(VARIANTS)}")
        if self.decay_shape not in DECAY_SHAPES:
            raise ValueError(
                f"unknown decay_shape {self.decay_shape!r}; valid: {list(DECAY_SHAPES)}")
        if self.decay_shape == "vector" and self.variant == "lit":
            raise ValueError("decay_shape='vector' (paper C.7) needs a decay; variant 'lit' has "
                             "none")
        if self.decay_shape == "vector" and self.causal:
            raise ValueError("decay_shape='vector' (paper C.7, a decay per value feature) is "
                             "bidirectional only; causal models decay per key feature "
                             "(lion_jax.ops.causal_linear_attention with log_decay [B, L, H, K])")
        if self.impl not in ops.IMPLS:
            raise ValueError(f"unknown impl {self.impl!r}; valid: {list(ops.IMPLS)}")
        for name, value, valid in (("decay_init", self.decay_init, DECAY_INITS),
                                   ("decay_activation", self.decay_activation, DECAY_ACTIVATIONS),
                                   ("selective_timescales", self.selective_timescales,
                                    SELECTIVE_TIMESCALES),
                                   ("value_init", self.value_init, VALUE_INITS),
                                   ("gate_products", self.gate_products, GATE_PRODUCTS)):
            if value not in valid:
                raise ValueError(f"unknown {name} {value!r}; valid: {list(valid)}")
        if self.decay_init != "exponents" and self.variant not in (*FIXED_DECAY_VARIANTS, "s"):
            raise ValueError(f"decay_init={self.decay_init!r} is for variants 'd', 'retnet' "
                             f"and 's'; got variant={self.variant!r}")
        if self.decay_activation != "log_sigmoid" and self.variant != "s":
            raise ValueError(f"decay_activation={self.decay_activation!r} is for variant 's' "
                             f"(the selective decay); got variant={self.variant!r}")
        if self.selective_timescales == "hippo" and self.decay_init != "hippo":
            raise ValueError("selective_timescales='hippo' orders the gate biases by the HiPPO "
                             "decays: set decay_init='hippo'")
        if self.value_init == "zoh" and self.decay_init == "exponents":
            raise ValueError("value_init='zoh' scales W_v by the HiPPO decays: set "
                             "decay_init='hippo' or 'hippo_complex'")
        if self.decay_init == "hippo_complex" and (
                self.variant not in (*FIXED_DECAY_VARIANTS, "s") or self.decay_shape != "vector"
                or self.causal or self.value_init != "zoh" or self.rope_base is not None
                or self.selective_timescales != "spread"):
            raise ValueError(
                "decay_init='hippo_complex' (S5's complex decays, one per value feature) needs "
                "variant 'd', 'retnet' or 's', decay_shape='vector', the bidirectional mixer, "
                "value_init='zoh', no rope_base and selective_timescales='spread'; got "
                f"variant={self.variant!r}, decay_shape={self.decay_shape!r}, "
                f"causal={self.causal}, value_init={self.value_init!r}, "
                f"rope_base={self.rope_base}, selective_timescales="
                f"{self.selective_timescales!r}")
        if self.normalize_unmasked and (self.causal or not self.scaled):
            raise ValueError(
                "normalize_unmasked=True needs the bidirectional op with SCALE normalisation; "
                f"got causal={self.causal}, variant={self.variant!r}, normalize={self.normalize}")
        if not 0 < self.hippo_dt_range[0] <= self.hippo_dt_range[1]:
            raise ValueError(f"hippo_dt_range must be (min, max) with 0 < min <= max; got "
                             f"{self.hippo_dt_range}")
        if self.kv_cache_len < 0 or (self.kv_cache_len and not self.causal):
            raise ValueError(f"kv_cache_len must be >= 0, and 0 unless causal=True; got "
                             f"{self.kv_cache_len} with causal={self.causal}")
        if self.variant == "xlstm" and self.normalize is not None:
            raise ValueError("variant 'xlstm' always divides by max(den, 1); leave normalize=None")
        for name in ("num_heads", "head_dim", "value_dim", "chunk_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.centre_values and (self.causal or not self.scaled):
            raise ValueError(
                "centre_values=True needs the bidirectional op with SCALE normalisation "
                f"(causal=False and a normalised variant); got causal={self.causal}, "
                f"variant={self.variant!r}, normalize={self.normalize}")
        if self.rope_base is not None and (
                self.rope_base <= 0 or self.causal or self.scaled or self.variant == "xlstm"
                or self.head_dim % 2):
            raise ValueError(
                "rope_base (rotated scores) needs a positive base, the bidirectional mixer, no "
                "SCALE (normalize=False; rotated scores change sign, so row sums can reach "
                "zero), a variant other than 'xlstm' and an even head_dim; got rope_base="
                f"{self.rope_base}, causal={self.causal}, normalize={self.normalize}, "
                f"variant={self.variant!r}, head_dim={self.head_dim}")
        if self.rope_learned and self.rope_base is None:
            raise ValueError("rope_learned=True learns the rotation frequencies from RoPE's: "
                             "set rope_base (their init) too")
        if min(self.decay_init_exponents) <= 0 or self.input_gate_cap <= 0:
            raise ValueError("decay_init_exponents and input_gate_cap must be positive")
        get_feature_map(self.feature_map_name)  # raises on an unknown name
        super().__post_init__()

    @property
    def feature_map_name(self) -> str:
        return self.feature_map or DEFAULT_FEATURE_MAP[self.variant]

    @property
    def scaled(self) -> bool:
        """Whether the output is SCALE-normalised by the op (False for ``xlstm``)."""
        if self.variant == "xlstm":
            return False
        return DEFAULT_NORMALIZE[self.variant] if self.normalize is None else self.normalize

    @property
    def use_output_norm(self) -> bool:
        if self.output_norm is None:
            return self.variant in DEFAULT_OUTPUT_NORM
        return self.output_norm

    @property
    def value_width(self) -> int:
        return self.value_dim or self.head_dim

    def _dense(self, features, names, name, kernel_init=None, bias_init=nn.initializers.zeros,
               dtype=None, dot_general=None):
        kernel_init = kernel_init or nn.initializers.lecun_normal()
        return nn.Dense(features, dtype=dtype or self.dtype, param_dtype=self.param_dtype,
                        kernel_init=nn.with_logical_partitioning(kernel_init, names),
                        bias_init=nn.with_logical_partitioning(bias_init, (names[1],)),
                        dot_general=dot_general, name=name)

    def _gate(self, x, features, name, bias, dtype):
        """A ``Dense(D -> features)`` of the tokens, ``[B, L, features]`` in ``dtype`` (>=
        float32), its products as ``gate_products`` says."""
        init = nn.initializers.normal(self.init_std) if self.init_std else None
        products = None
        if self.gate_products == "compute" and self.dtype is not None:
            products = functools.partial(_rounded_products, dtype=self.dtype)
        dense = self._dense(features, ("embed", None), name, kernel_init=init,
                            bias_init=_constant_init(bias), dtype=dtype, dot_general=products)
        return dense(x.astype(dtype))

    def _decay_channels(self) -> tuple[int, int]:
        """``(channels per head, total channels)`` of the decay: ``V`` per head or 1."""
        per_head = self.value_width if self.decay_shape == "vector" else 1
        return per_head, self.num_heads * per_head

    def _hippo(self) -> np.ndarray:
        """The HiPPO init's log-decays, ``[H, channels per head]`` (float64)."""
        return hippo_log_decays(self.num_heads, self._decay_channels()[0], self.hippo_dt_range)

    def _map_kernels_apply(self, compute_dtype) -> bool:
        """Whether the feature map's Pallas kernels (:func:`kernel_feature_map`,
        :func:`kernel_qkv_map`: ``silu_l2`` on a GPU) may take q and k: a 16-bit compute
        dtype, ``impl`` ``"auto"`` or ``"pallas"``, SCALE and no rotation, so that only the
        op follows them."""
        return (jnp.dtype(compute_dtype).itemsize == 2 and self.impl in ("auto", "pallas")
                and self.scaled and self.rope_base is None)

    def _projections(self, x, mask, parts):
        """``(phi(q), phi(k), v)`` of the tokens ``x [B, L, D]``: the query and key
        projections through the feature map (:meth:`_features`; padded keys zero), ``[B, L,
        H, K]``, and the value projection ``[B, L, parts * H * V]`` (``parts`` 2: complex
        values' real and imaginary parts), all in the compute dtype.

        The projections' parameters are those of Dense layers ``query``, ``key`` and
        ``value`` (:class:`_DenseParams`). Where ``silu_l2``'s merged kernel applies
        (:func:`kernel_qkv_map` offers it, :meth:`_map_kernels_apply`, one part of values as
        wide as the keys) they are one product ``x [W_q | W_k | W_v]``, whose biases and
        maps the kernel applies in one pass each way and whose gradient is one array, so
        that the backward's weight and input gradients are plain GEMMs."""
        B, L, D = x.shape
        H, K, V = self.num_heads, self.head_dim, self.value_width
        qk_init = (nn.initializers.normal(self.init_std) if self.init_std
                   else nn.initializers.lecun_normal())
        (w_q, b_q), (w_k, b_k), (w_v, b_v) = (
            _DenseParams(width, ("embed", "heads"), init, self.param_dtype, name=name)(D)
            for name, width, init in (("query", H * K, qk_init), ("key", H * K, qk_init),
                                      ("value", parts * H * V, self._value_init())))
        merged = kernel_qkv_map(self.feature_map_name)
        if (merged is not None and self.dtype is not None and self._map_kernels_apply(self.dtype)
                and parts == 1 and K == V):
            p = jnp.dot(x.astype(self.dtype),
                        jnp.concatenate([w_q, w_k, w_v], axis=1).astype(self.dtype))
            q, k, v = merged(p, jnp.concatenate([b_q, b_k, b_v]), H, keep=mask)
            return q, k, v.reshape(B, L, H * V)
        q, k, v = (_affine(x, w, b, self.dtype) for w, b in ((w_q, b_q), (w_k, b_k), (w_v, b_v)))
        float_dtype = jnp.promote_types(v.dtype, jnp.float32)
        q = self._features(q.reshape(B, L, H, K), float_dtype)
        # a padded token's key is zero, so its column of the scores is: v needs no mask
        return q, self._features(k.reshape(B, L, H, K), float_dtype, mask), v

    def _features(self, x, float_dtype, mask=None):
        """``phi(x)`` of the projections ``x [B, L, H, K]`` in ``float_dtype``, except where
        the feature map's Pallas kernel takes it (:func:`kernel_feature_map`,
        :meth:`_map_kernels_apply`): then one pass each way (XLA takes two reductions and two
        passes), the result in the compute dtype the op takes. ``mask`` (``[B, L]`` bool,
        True = real token): the padded tokens' rows are zeros, in the kernel (its ``keep``) or
        by a select."""
        kernel = kernel_feature_map(self.feature_map_name)
        if kernel is not None and self._map_kernels_apply(x.dtype):
            return kernel(x) if mask is None else kernel(x, keep=mask[:, :, None])
        f = get_feature_map(self.feature_map_name)(x.astype(float_dtype))
        return f if mask is None else jnp.where(mask[:, :, None, None], f, 0.0)

    def _complex_decay(self):
        """``decay_init="hippo_complex"``: S5's discretised eigenvalues ``Lambda dt`` per value
        channel as ``(real, imaginary)`` parts ``[H * V]`` each, and the ZOH factors
        ``Lambda^-1 (exp(Lambda dt) - 1)`` as ``(real, imaginary)`` ``[H * V]`` (float32).

        Parameters as :class:`lion_jax.layers.s5.S5Mixer` names and initialises them:
        ``lambda_log_re`` (``Re Lambda = -exp(.)``, from -1/2), ``lambda_im`` (HiPPO-N's
        ``omega`` per head of ``V`` channels), ``log_step`` (log-uniform in
        ``hippo_dt_range``)."""
        H, V = self.num_heads, self.value_width
        eigenvalues, _ = hippo_normal(V)
        lo, hi = np.log(self.hippo_dt_range[0]), np.log(self.hippo_dt_range[1])

        def param(name, init):
            return self.param(name, nn.with_logical_partitioning(init, (None,)), (H * V,),
                              self.param_dtype).astype(jnp.float32)
        log_re = param("lambda_log_re", _constant_init(np.tile(np.log(-eigenvalues.real), H)))
        im = param("lambda_im", _constant_init(np.tile(eigenvalues.imag, H)))
        log_step = param("log_step", lambda key, shape, dtype=jnp.float32:
                         jax.random.uniform(key, shape, dtype, lo, hi))
        lam = jax.lax.complex(-jnp.exp(log_re), im)
        lam_dt = lam * jnp.exp(log_step)
        zoh = jnp.expm1(lam_dt) / lam
        return (lam_dt.real, lam_dt.imag), (zoh.real, zoh.imag)

    def _fixed_log_decay(self, dtype, complex_decay=None):
        """The non-selective log-decay per channel, ``[channels]``, or None (plain LION-S);
        with ``decay_init="hippo_complex"`` the real part of :meth:`_complex_decay`'s
        ``Lambda dt`` (``complex_decay``, its value)."""
        _, channels = self._decay_channels()
        if complex_decay is not None:
            return complex_decay[0][0].astype(dtype)
        if self.decay_init == "hippo":
            init = _constant_init(np.log(-self._hippo()).reshape(-1))
            log_rate = self.param("decay_log_rate", nn.with_logical_partitioning(init, (None,)),
                                  (channels,), self.param_dtype)
            return -jnp.exp(log_rate.astype(dtype))
        if self.variant in FIXED_DECAY_VARIANTS:
            init = _constant_init(decay_logits(channels, self.decay_init_exponents))
            logit = self.param("decay_logit", nn.with_logical_partitioning(init, (None,)),
                               (channels,), self.param_dtype)
            return jax.nn.log_sigmoid(logit.astype(dtype))
        return None

    def _decays(self, x, dtype, complex_decay=None):
        """Log-decays and key scales of the variant, computed in ``dtype`` (>= float32);
        ``complex_decay``: :meth:`_complex_decay`'s value with ``decay_init="hippo_complex"``.

        Returns:
          ``(log_decay, key_scale)``: ``log_decay`` None, ``[B, L, H]`` or (vector)
          ``[B, L, H, V]``; ``key_scale`` None, ``[B, L, H]`` or ``[B, L, H, V]``.
        """
        B, L, _ = x.shape
        H, V = self.num_heads, self.value_width
        if self.variant == "lit":
            return None, None
        _, channels = self._decay_channels()
        shape = (B, L, H, V) if self.decay_shape == "vector" else (B, L, H)
        fixed = self._fixed_log_decay(dtype, complex_decay)
        if self.variant in FIXED_DECAY_VARIANTS:
            return jnp.broadcast_to(fixed.reshape(shape[2:]), shape), None

        bias = decay_logits(channels, self.decay_init_exponents)  # weakest decay last
        if self.selective_timescales == "hippo":
            strongest_first = np.argsort(self._hippo().reshape(-1), kind="stable")
            bias[strongest_first] = bias.copy()
        z = self._gate(x, channels, "forget_gate" if self.variant == "xlstm" else "decay_gate",
                       bias, dtype).reshape(shape)
        if self.decay_activation == "softplus":
            log_decay = -jax.nn.softplus(z)
        else:
            log_decay = jax.nn.log_sigmoid(z)
        if fixed is not None:
            log_decay = log_decay + fixed.reshape(shape[2:])
        if self.variant == "s":
            return log_decay, None
        if self.variant == "grfa":
            return log_decay, jax.nn.sigmoid(-z)  # 1 - g
        cap = self.input_gate_cap
        log_input = self._gate(x, H, "input_gate", np.zeros(H), dtype)
        return log_decay, jnp.exp(cap * jnp.tanh(log_input / cap))

    def _value_init(self):
        """``W_v``'s initializer: lecun normal, or with ``value_init="zoh"`` its columns
        scaled by :func:`zoh_value_scales` (a head's ``V`` columns take its channels' factors,
        or its one factor for a scalar decay)."""
        if self.value_init == "lecun":
            return nn.initializers.lecun_normal()
        H, V = self.num_heads, self.value_width
        if self.decay_init == "hippo_complex":
            return complex_value_init(H, V)
        scales = np.broadcast_to(zoh_value_scales(self._hippo()), (H, V)).reshape(-1)

        def init(key, shape, dtype=jnp.float32):
            return nn.initializers.lecun_normal()(key, shape, dtype) * jnp.asarray(scales, dtype)
        return init

    def _mix(self, q, k, v, log_decay, value_scale, orders, state=None, return_state=False):
        """The op call: ``q, k [B, L, H, K]``, ``v [B, L, H, V]``, ``log_decay`` None,
        ``[B, L, H]`` or ``[B, L, H, V]``, ``value_scale`` None or ``[B, L, H, V]`` (a key scale
        per value column), ``orders`` None or token permutations, ``state`` / ``return_state``
        the causal op's ``initial_state`` / ``return_final_state`` (see :meth:`__call__`)
        ``-> ([B, L, H, V], final state or None)``."""
        op = ops.causal_linear_attention if self.causal else ops.lion_attention
        kwargs = dict(impl=self.impl, chunk_size=self.chunk_size, eps=self.eps)
        stateful = state is not None or return_state  # checked in __call__: causal only

        def call(q, k, v, log_decay, **kw):
            if not stateful:
                return op(q, k, v, log_decay, **kw, **kwargs), None
            init = state
            if init is None and self.kv_cache_len:  # v as the op sees it (+ weight columns)
                B, _, H, K = q.shape
                init = ops.empty_kv_cache(B, self.kv_cache_len, H, K, v.shape[-1],
                                          decay=None if log_decay is None else "scalar",
                                          dtype=v.dtype)
            return op(q, k, v, log_decay, **kw, **kwargs, initial_state=init,
                      return_final_state=True)
        if self.centre_values:  # checked in __post_init__: bidirectional and normalised
            kwargs["centre_values"] = True
        if orders is not None:
            if self.causal:
                raise ValueError("orders need a bidirectional mixer (causal=False)")
            kwargs["orders"] = orders
        plain = self.variant != "xlstm" and not self.normalize_unmasked
        if plain and (value_scale is None or not self.scaled):
            if value_scale is not None:
                v = v * value_scale.astype(v.dtype)
            return call(q, k, v, log_decay, normalize=self.scaled)

        # Numerator and denominator from one call: value columns, then a weight column per
        # denominator (ones, or the value scales) with the same decay.
        dtype = jnp.promote_types(v.dtype, jnp.float32)
        weights = (jnp.ones(v.shape[:-1] + (1,), dtype) if value_scale is None
                   else value_scale.astype(dtype))
        if value_scale is not None:
            v = v * value_scale.astype(v.dtype)
        mix = functools.partial(call, normalize=False)
        if self.normalize_unmasked:  # checked in __post_init__: bidirectional and normalised
            num = mix(q, k, v, log_decay)[0].astype(dtype)
            k_sum = jnp.einsum("bjhk,bjhw->bhkw", k.astype(dtype), weights)
            den = jnp.einsum("blhk,bhkw->blhw", q.astype(dtype), k_sum)
            return (num / (den + self.eps)).astype(v.dtype), None
        if log_decay is not None and log_decay.ndim == 4:
            log_decay = jnp.concatenate([log_decay, log_decay], axis=-1)
            weights = jnp.broadcast_to(weights, v.shape)
        out, final = mix(q, k, jnp.concatenate([v, weights.astype(v.dtype)], axis=-1),
                         log_decay)
        out = out.astype(dtype)
        V = v.shape[-1]
        num, den = out[..., :V], out[..., V:]
        if self.variant == "xlstm":
            return (num / jnp.maximum(den, 1.0)).astype(v.dtype), final
        if not self.scaled:
            return num.astype(v.dtype), final
        return (num / (den + self.eps)).astype(v.dtype), final

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray | None = None,
                 orders=None, *, state=None, offset=0, return_state=False):
        """Mixes the tokens of ``x [B, L, D]``; ``mask [B, L]`` bool, True = real token.

        Causal decoding (``causal=True``; the interface of the causal LM mixers,
        :mod:`lion_jax.models.lm`): ``state`` None or the state a previous call returned (the
        causal op's, float32: ``S [B, H, K, V']`` or ``(S, z)``; with ``kv_cache_len > 0`` a
        :class:`lion_jax.ops.KVCache`), ``return_state`` returns
        ``(y, state)`` after the last token, so a prefill and continuation calls give the full
        forward. ``offset`` (the position of ``x[:, 0]``) is accepted and unused: the decays
        carry the order.

        ``orders``: None, or a sequence of permutations of the L tokens (int arrays ``[L]``,
        e.g. the patch orders of :func:`lion_jax.models.vit.token_orders`): the mask is then
        the average of the masks the decays build along each order (LION-S v2, paper C.8: the
        reference averages the masks): the op's ``orders`` (:func:`lion_jax.ops.lion_attention`).

        Sows ``(q, k, v, log_decay, key_scale)`` into the ``'intermediates'`` collection as
        ``mixer_inputs``: ``q, k [B, L, H, K]`` after the feature map (>= float32; the
        compute dtype where a kernel applied the map, :meth:`_projections`), the
        ``K**-0.5`` scale and the rotation, ``v [B, L, H, V]``, decays as returned by
        :meth:`_decays`, padding applied (zeros in k, the decays and key scales at padded
        tokens; v is left as projected: a zero key leaves its value out of every sum, so the
        padded tokens' content must be finite); the op then sees ``k * key_scale``. With
        ``decay_init="hippo_complex"``, ``v`` and ``log_decay`` are the op's ``[B, L, H, 2V]``
        (the turned real and imaginary parts, each decay twice).
        """
        del offset
        if (state is not None or return_state) and not self.causal:
            raise ValueError("a decoding state needs a causal mixer (causal=True)")
        complex_decay = self._complex_decay() if self.decay_init == "hippo_complex" else None
        if complex_decay is not None and orders is not None:
            raise ValueError("decay_init='hippo_complex' rotates the values along the sequence "
                             "as given; it takes no orders")
        B, L, D = x.shape
        H, K, V = self.num_heads, self.head_dim, self.value_width
        # the index of each real token, as the decays count (rotations)
        positions = (jnp.arange(L) if mask is None
                     else jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1).astype(jnp.float32)
        q, k, v = self._projections(x, mask, 1 if complex_decay is None else 2)
        compute_dtype = v.dtype
        float_dtype = jnp.promote_types(compute_dtype, jnp.float32)
        if complex_decay is None:
            v = v.reshape(B, L, H, V)
        else:  # B_bar x, each channel turned back by its angle times the token's index
            theta = complex_decay[0][1].reshape(H, V)
            v = v.astype(float_dtype).reshape(B, L, 2, H, V)
            (v_re, v_im), (z_re, z_im) = (v[:, :, 0], v[:, :, 1]), complex_decay[1]
            z_re, z_im = z_re.reshape(H, V), z_im.reshape(H, V)
            v = jnp.concatenate([v_re * z_re - v_im * z_im, v_re * z_im + v_im * z_re], axis=-1)
            # rope turns the pairs (c, c + V), i.e. (real, imaginary), by positions * freqs
            v = rope(v, positions, freqs=-theta).astype(compute_dtype)  # [B, L, H, 2V]
        if not self.scaled:
            q = q * K ** -0.5
        log_decay, key_scale = self._decays(x, float_dtype, complex_decay)
        if complex_decay is not None:  # the real and imaginary columns share each decay
            log_decay = jnp.concatenate([log_decay, log_decay], axis=-1)
        if mask is not None:
            def real(t):  # mask broadcast against t [B, L, ...]
                return mask.reshape((B, L) + (1,) * (t.ndim - 2))
            if log_decay is not None:
                log_decay = jnp.where(real(log_decay), log_decay, 0.0)
            if key_scale is not None:
                key_scale = jnp.where(real(key_scale), key_scale, 0.0)
        if self.rope_base is not None:
            freqs = rope_frequencies(K, self.rope_base)
            if self.rope_learned:
                freqs = self.param("rope_freq", nn.with_logical_partitioning(
                    _constant_init(np.tile(freqs, H)), (None,)), (H * K // 2,),
                    self.param_dtype)
            q = rope(q, positions, freqs=freqs)
            k = rope(k, positions, freqs=freqs)
        self.sow("intermediates", "mixer_inputs", (q, k, v, log_decay, key_scale))

        value_scale = None
        if key_scale is not None and key_scale.ndim == 4:  # per value column (vector decay)
            value_scale = key_scale
        elif key_scale is not None:
            k = k * key_scale[..., None]
        y, state = self._mix(q.astype(compute_dtype), k.astype(compute_dtype), v, log_decay,
                             value_scale, orders, state, return_state)
        if complex_decay is not None:  # each output turned forward by its own index's angle
            y = rope(y, positions, freqs=theta)

        if self.use_output_norm:
            y = nn.LayerNorm(
                reduction_axes=-1, feature_axes=(-2, -1), dtype=self.dtype,
                param_dtype=self.param_dtype,
                scale_init=nn.with_logical_partitioning(nn.initializers.ones, (None, None)),
                bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None, None)),
                name="output_norm")(y)
        y = self._dense(D, ("heads", "embed"), "out")(y.reshape(B, L, -1))
        if self.feedthrough:
            d = self.param("feedthrough", nn.with_logical_partitioning(
                nn.initializers.normal(1.0), ("embed",)), (D,), self.param_dtype)
            y = (y + d * x.astype(float_dtype)).astype(y.dtype)
        return (y, state) if return_state else y
