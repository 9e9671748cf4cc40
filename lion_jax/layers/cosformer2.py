"""cosFormer2's token mixer and its TPE (Scaling Laws for Linear Complexity LMs, digest
``papers/digests/scaling-laws-linear-lms.md`` section 1.4; parameters section 2.2; TPE from
the LightNet digest ``papers/digests/lightnet.md`` section 3.1).

Token mixer, per head ``i`` (``K = head_dim``, default 128, the paper's ``d/h``)::

    q, k, v = swish(x W_q), swish(x W_k), x W_v                 (each D -> H*K, no bias)
    q~_t = [q_t * cos(p_t theta_i), q_t * sin(p_t theta_i)]    LRPE, p_t = offset + t
    k~_s = [k_s * cos(p_s theta_i), k_s * sin(p_s theta_i)]    (q/k head width 2K)
    o_t  = sum_{s <= t} (q~_t . k~_s) v_s                      no decay, no denominator
    G    = sigmoid(x W_gdown W_gup)                            low-rank gate, rank t = K
    y    = (RMSNorm(concat_i o_i) * G) W_o                     (W_o: H*K -> D)

``q~_t . k~_s = sum_c q_tc k_sc cos((p_t - p_s) theta_c)``: LRPE's per-channel cos reweighting
of relative distance (the extracted equation lost the position index, digest 1.4 [GARBLED]; the
doubled q/k width is what the paper's FLOPs count). The linear attention is
:func:`lion_jax.ops.causal_linear_attention` with ``log_decay=None``; its state
``S [B, H, 2K, K]`` (float32) is the whole decoding state of the mixer (with
``kv_cache_len > 0`` a :class:`lion_jax.ops.KVCache` of the LRPE-rotated keys and the values
instead), and ``offset`` places the LRPE rotation, so a prefill plus continuation equals the
full forward. The TPE's state (below) is recurrent in either case: it is not attention.

:class:`Tpe` is the positional encoding applied once, right after the token embedding (digest
1.4: ``X = Tpe(X)``), a per-channel causal Toeplitz mixer parameterised as a diagonal SSM with
``e`` states (LightNet Eq. 9 with input coefficients)::

    h_t[c, j] = lambda_j h_{t-1}[c, j] + b[c, j] x_t[c]        y_t[c] = sum_j h_t[c, j]

i.e. ``y_t = sum_{s<=t} T_{t-s} x_s`` with ``T_r[c] = sum_j b[c, j] lambda_j^r``. The paper's
accounting fixes ``e = d/h`` and ``d * e`` parameters (the coefficients ``b``) with FLOPs
``2nde`` (``x b``), ``nde`` (the recurrence) and ``nde`` (the sum over ``j``), which is
this form.

Choices where the papers are silent (defaults: the [EXT] reference code as the digests report
it where they report one; otherwise ours):

- ``qk_activation="swish"`` on q and k (paper ``f``), none on v; no bias (the ``4d^2 + 2dt``
  count); no ``K**-0.5`` scale (the RMSNorm after the attention removes constant factors).
- LRPE ``theta``: ``theta_j = 10000^(-2j / (H*K))``, ``j = 0..H*K-1`` split head by head
  (``lrpe_span="width"``, [EXT] the TNL/LRPE code of the same group, lightning-attention-tnl
  digest 2.5), learnable (``lrpe_learnable=True``, the same code; the paper calls theta a
  parameter but does not count it); ``lrpe_span="head"`` gives every head
  ``10000^(-2j/K)``, ``j = 0..K-1``. Positions are 0-based (``offset + arange(L)``). The
  prior-art digest reports that the first author's later code uses a "half head dim" LRPE
  variant; we keep the doubled width that the paper's FLOPs (6B^2 d, 4Bd^2/h) imply. The
  transform is TNL's LRPE-d (:func:`lion_jax.layers.tnl.lrpe`, the same math), theta is kept
  in float32.
- Gate input: the mixer input (the normalised ``X-bar``, as TNL's reference code; the printed
  equation has a bare ``X``), rank ``gate_rank`` (None = ``K``, the paper's ``t = d/h``).
- Norm: RMSNorm with a learnable scale over the whole ``H*K`` concat, before the gate, then
  ``W_o`` (omitted in the printed equation, counted in the parameters; digest 1.4);
  ``output_norm="srmsnorm"`` is TNL's parameter-free SRMSNorm instead.
- Parameters of one mixer: ``4 d^2 + 2 d t`` as the paper counts, plus ``theta`` (``H*K``,
  when learnable) and the norm scale (``H*K``), subleading terms the paper does not count.
- TPE: coefficients ``b [D, e]`` (the counted ``d*e``) start at ``1/e`` (Eq. 9's kernel
  ``sum_j lambda_j^r`` divided by ``e``, so ``T_0 = 1`` and the embedding keeps its scale);
  output coefficients are 1 (Eq. 9); ``lambda_j = sigmoid(w_j)`` learnable, one per state and
  shared by the channels (``decay_shape="state"``, ``e`` more parameters) or one per channel
  and state (``"channel"``, ``d*e`` more), starting at ``1 - 2^-u``, ``u`` evenly spaced over
  ``decay_init_exponents`` (timescales 2 to 256 tokens by default); no residual
  (``X = Tpe(X)``, as printed and as the [EXT] xmixers code; ``residual=True`` adds ``x``).
  The digest's cosFormer2 parameter residual (Table 7 prints 0.1-0.9M more than
  ``4ld^2 + 2ldt + 3ldg + de``, digest 2.3) is not explained by any of these terms.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lion_jax import ops
from lion_jax.layers.lion import decay_logits
from lion_jax.layers.tnl import lrpe, srms_norm

OUTPUT_NORMS = ("rmsnorm", "srmsnorm")
QK_ACTIVATIONS = ("swish", "identity")
LRPE_SPANS = ("width", "head")
TPE_DECAY_SHAPES = ("state", "channel")

_HIGHEST = jax.lax.Precision.HIGHEST


def _check_offset(offset) -> None:
    """Raises ``ValueError`` unless ``offset`` is an integer scalar (an int or a traced one)."""
    offset = jnp.asarray(offset)
    if offset.ndim != 0 or not jnp.issubdtype(offset.dtype, jnp.integer):
        raise ValueError(f"offset must be an integer scalar, got {offset.dtype} {offset.shape}")


def lrpe_thetas(num_heads: int, head_dim: int, span: str = "width",
                base: float = 10000.0) -> np.ndarray:
    """The initial LRPE frequencies ``[num_heads * head_dim]`` (head-major).

    ``span="width"``: ``base^(-2j / (H*K))`` for ``j = 0..H*K-1``, head ``h`` taking the ``h``-th
    slice; ``"head"``: ``base^(-2j / K)``, ``j = 0..K-1``, the same for every head.
    """
    if span not in LRPE_SPANS:
        raise ValueError(f"unknown lrpe_span {span!r}; valid: {list(LRPE_SPANS)}")
    if span == "width":
        n = num_heads * head_dim
        return base ** (-2.0 * np.arange(n) / n)
    return np.tile(base ** (-2.0 * np.arange(head_dim) / head_dim), num_heads)


def _decay_powers(log_lam: jnp.ndarray, exponents) -> jnp.ndarray:
    """``lambda^r = exp(r log lambda)`` for each ``r`` of ``exponents`` (``>= 0``):
    ``log_lam [P, E]`` -> ``[R, P, E]``."""
    r = jnp.asarray(exponents, jnp.float32)
    return jnp.exp(r[:, None, None] * log_lam[None])


def _to_states(x: jnp.ndarray, powers: jnp.ndarray) -> jnp.ndarray:
    """``sum_j x[..., j, d] powers[j, d or 0, e]``: ``x [..., J, D]``, ``powers [J, P, E]``
    -> ``[..., D, E]``."""
    if powers.shape[1] == 1:
        return jnp.einsum("...jd,je->...de", x, powers[:, 0], precision=_HIGHEST)
    return jnp.einsum("...jd,jde->...de", x, powers, precision=_HIGHEST)


def toeplitz_ssm(x: jnp.ndarray, log_lam: jnp.ndarray, coef: jnp.ndarray,
                 initial_state: jnp.ndarray | None = None, *, chunk_size: int = 64):
    """The TPE recurrence ``h_t = lambda h_{t-1} + coef x_t``, ``y_t = sum_e h_t``, chunked.

    Within a chunk of ``C`` tokens the outputs are a ``C x C`` causal Toeplitz product with
    ``T_r[d] = sum_e coef[d, e] lambda[d, e]^r``; the chunks are joined by the states
    ``h [B, D, E]`` (a scan over chunks). Every exponent is ``r log lambda <= 0``; the final
    state is that after the true last token.

    Args:
      x: ``[B, L, D]`` (float32). log_lam: ``[P, E]``, ``P`` 1 (shared by the channels) or
        ``D``, entries ``<= 0``. coef: ``[D, E]``.
      initial_state: None or ``[B, D, E]``.
      chunk_size: tokens per chunk.
    Returns:
      ``(y [B, L, D], final_state [B, D, E])``.
    """
    B, L, D = x.shape
    E = coef.shape[-1]
    C = min(chunk_size, L)
    N = -(-L // C)
    xc = jnp.pad(x, ((0, 0), (0, N * C - L), (0, 0))).reshape(B, N, C, D)
    r = np.arange(C)

    kernel = jnp.sum(_decay_powers(log_lam, r) * coef[None], axis=-1)  # [C, D]
    lag = r[:, None] - r[None, :]
    toeplitz = jnp.where((lag >= 0)[..., None], kernel[np.maximum(lag, 0)], 0.0)  # [C, C, D]
    y = jnp.einsum("ijd,bnjd->bnid", toeplitz, xc, precision=_HIGHEST)

    local = _to_states(xc, _decay_powers(log_lam, C - 1 - r)) * coef  # [B, N, D, E]
    chunk_decay = jnp.exp(C * log_lam)  # [P, E]
    h0 = jnp.zeros((B, D, E), x.dtype) if initial_state is None else initial_state

    def step(h, local_n):
        return chunk_decay * h + local_n, h

    _, entering = jax.lax.scan(step, h0, jnp.moveaxis(local, 1, 0))  # [N, B, D, E]
    entering = jnp.moveaxis(entering, 0, 1)
    from_start = _decay_powers(log_lam, r + 1)  # [C, P, E]
    if from_start.shape[1] == 1:
        y = y + jnp.einsum("bnde,ie->bnid", entering, from_start[:, 0], precision=_HIGHEST)
    else:
        y = y + jnp.einsum("bnde,ide->bnid", entering, from_start, precision=_HIGHEST)

    last = L - (N - 1) * C  # true length of the last chunk
    final = (jnp.exp(last * log_lam) * entering[:, -1]
             + _to_states(xc[:, -1, :last], _decay_powers(log_lam, last - 1 - r[:last])) * coef)
    return y.reshape(B, N * C, D)[:, :L], final


def check_tpe_settings(tpe) -> None:
    """One-line ValueErrors for a TPE's ``decay_shape``, ``state_dim``, ``chunk_size`` and
    ``decay_init_exponents`` (:class:`Tpe`, :class:`lion_jax.layers.md_pe.MdTpe`)."""
    if tpe.decay_shape not in TPE_DECAY_SHAPES:
        raise ValueError(f"unknown decay_shape {tpe.decay_shape!r}; valid: "
                         f"{list(TPE_DECAY_SHAPES)}")
    for name in ("state_dim", "chunk_size"):
        if getattr(tpe, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(tpe, name)}")
    if min(tpe.decay_init_exponents) <= 0:
        raise ValueError(f"decay_init_exponents must be positive, got "
                         f"{tpe.decay_init_exponents}")


class Tpe(nn.Module):
    """cosFormer2's TPE ``[B, L, D] -> [B, L, D]``, applied once after the token embedding.

    See the module docstring for the recurrence and the choices.

    Call: ``tpe(x, state=None, offset=0, return_state=False)``: ``state`` None or the
    ``h [B, D, E]`` (float32) a previous call returned; ``offset`` the position of ``x[:, 0]``,
    checked but not used (the Toeplitz mixing depends on distances only: the past enters through
    the state); returns ``y`` or ``(y, new_state)``.

    Attributes:
      state_dim: ``e`` (default 128, the paper's ``d/h``).
      decay_shape: ``"state"`` (one ``lambda`` per state) or ``"channel"`` (per channel and
        state).
      decay_init_exponents: ``lambda`` starts at ``1 - 2^-u``, ``u`` spaced over this range.
      residual: return ``x + Tpe(x)`` instead of ``Tpe(x)``.
      chunk_size: tokens per chunk of :func:`toeplitz_ssm`.
      dtype: output dtype (None = ``x.dtype``); the mixing runs in float32.
      param_dtype: parameter dtype.
    """

    state_dim: int = 128
    decay_shape: str = "state"
    decay_init_exponents: tuple[float, float] = (1.0, 8.0)
    residual: bool = False
    chunk_size: int = 64
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        check_tpe_settings(self)
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jnp.ndarray, *, state: jnp.ndarray | None = None, offset: Any = 0,
                 return_state: bool = False):
        """``x [B, L, D]`` -> ``y [B, L, D]`` or ``(y, h [B, D, E])``."""
        _check_offset(offset)
        B, L, D = x.shape
        E = self.state_dim
        P = 1 if self.decay_shape == "state" else D
        init_logits = np.broadcast_to(decay_logits(E, self.decay_init_exponents), (P, E))

        def constant(values, names):
            def init(key, shape, dtype=jnp.float32):
                del key
                return jnp.broadcast_to(jnp.asarray(values, dtype), shape)
            return nn.with_logical_partitioning(init, names)

        coef = self.param("coef", constant(1.0 / E, ("embed", None)), (D, E), self.param_dtype)
        logit = self.param("decay_logit", constant(init_logits, (None, None)), (P, E),
                           self.param_dtype)
        if state is not None and tuple(state.shape) != (B, D, E):
            raise ValueError(f"Tpe state must have shape [B, D, E] = {[B, D, E]}, got "
                             f"{list(state.shape)}")
        y, new_state = toeplitz_ssm(
            x.astype(jnp.float32), jax.nn.log_sigmoid(logit.astype(jnp.float32)),
            coef.astype(jnp.float32), None if state is None else state.astype(jnp.float32),
            chunk_size=self.chunk_size)
        if self.residual:
            y = y + x.astype(jnp.float32)
        y = y.astype(self.dtype or x.dtype)
        return (y, new_state) if return_state else y


class CosFormer2Attention(nn.Module):
    """cosFormer2 token mixer ``[B, L, D] -> [B, L, D]`` (causal); see the module docstring.

    Call: ``mixer(x, state=None, offset=0, return_state=False)``: ``x [B, L, D]``; ``state``
    None or the ``S [B, H, 2K, K]`` (float32) a previous call returned (with
    ``kv_cache_len > 0``: a :class:`lion_jax.ops.KVCache`); ``offset`` the position
    of ``x[:, 0]`` (int or traced int32 scalar; the LRPE angles use ``offset + arange(L)``);
    returns ``y [B, L, D]``, or ``(y, new_state)`` with ``return_state=True``.

    Attributes:
      num_heads: ``H``; None = ``D // head_dim``. head_dim: ``K`` (default 128).
      layer_index, num_layers: position in the model (accepted for the shared LM-mixer
        interface; cosFormer2 has no per-layer settings).
      qk_activation: ``"swish"`` (default) or ``"identity"`` on q and k.
      lrpe_span: ``"width"`` or ``"head"`` (see :func:`lrpe_thetas`). lrpe_base: its base.
      lrpe_learnable: theta is a parameter (default) or a constant.
      gate_rank: the output gate's bottleneck ``t``; None = ``K``.
      output_norm: ``"rmsnorm"`` (learnable scale, default) or ``"srmsnorm"`` (TNL's
        parameter-free :func:`lion_jax.layers.tnl.srms_norm`).
      norm_eps: the RMSNorm's epsilon.
      impl, chunk_size: passed to :func:`lion_jax.ops.causal_linear_attention`.
      kv_cache_len: > 0: a call with ``return_state`` and no ``state`` starts a KV cache of
        this capacity (:func:`lion_jax.ops.empty_kv_cache`) instead of the recurrent state;
        0: the state.
      dtype, param_dtype: compute and parameter dtypes (theta stays float32 whatever
        ``param_dtype``: in bfloat16 ``theta p`` would be off by radians at ``p ~ 10^3``).
    """

    num_heads: int | None = None
    head_dim: int = 128
    layer_index: int = 0
    num_layers: int = 1
    qk_activation: str = "swish"
    lrpe_span: str = "width"
    lrpe_base: float = 10000.0
    lrpe_learnable: bool = True
    gate_rank: int | None = None
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
        for name, valid in (("qk_activation", QK_ACTIVATIONS), ("lrpe_span", LRPE_SPANS),
                            ("output_norm", OUTPUT_NORMS)):
            if getattr(self, name) not in valid:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: {list(valid)}")
        for name in ("num_heads", "head_dim", "num_layers", "gate_rank", "chunk_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0 <= self.layer_index < self.num_layers:
            raise ValueError(f"layer_index must be in [0, num_layers={self.num_layers}), got "
                             f"{self.layer_index}")
        if not (self.lrpe_base > 1 and self.norm_eps > 0):
            raise ValueError(f"lrpe_base must be > 1 and norm_eps > 0, got {self.lrpe_base}, "
                             f"{self.norm_eps}")
        super().__post_init__()

    def _heads(self, width: int) -> int:
        if self.num_heads is not None:
            return self.num_heads
        if width % self.head_dim:
            raise ValueError(f"the input width {width} is not a multiple of head_dim="
                             f"{self.head_dim}; set num_heads or head_dim")
        return width // self.head_dim

    def _dense(self, features, names, name):
        return nn.Dense(features, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                        kernel_init=nn.with_logical_partitioning(
                            nn.initializers.lecun_normal(), names),
                        name=name)

    def _theta(self, H, K):
        """LRPE frequencies ``[H, K]``."""
        values = lrpe_thetas(H, K, self.lrpe_span, self.lrpe_base)
        if not self.lrpe_learnable:
            return jnp.asarray(values, jnp.float32).reshape(H, K)

        def init(key, shape, dtype=jnp.float32):
            del key
            return jnp.asarray(values, dtype).reshape(shape)
        theta = self.param("lrpe_theta", nn.with_logical_partitioning(init, ("heads",)),
                           (H * K,), jnp.float32)
        return theta.reshape(H, K)

    @nn.compact
    def __call__(self, x: jnp.ndarray, *, state: jnp.ndarray | None = None, offset: Any = 0,
                 return_state: bool = False):
        """``x [B, L, D]`` -> ``y [B, L, D]`` or ``(y, state)``; see the class."""
        B, L, D = x.shape
        H, K = self._heads(D), self.head_dim
        _check_offset(offset)
        shape = (B, L, H, K)
        q, k, v = (self._dense(H * K, ("embed", "heads"), name)(x).reshape(shape)
                   for name in ("query", "key", "value"))
        if self.qk_activation == "swish":
            q, k = nn.swish(q), nn.swish(k)
        theta = self._theta(H, K)
        q, k = (lrpe(t, theta, offset).astype(t.dtype) for t in (q, k))  # [B, L, H, 2K]
        if state is None and return_state and self.kv_cache_len:
            state = ops.empty_kv_cache(B, self.kv_cache_len, H, 2 * K, K, dtype=q.dtype)

        out = ops.causal_linear_attention(
            q, k, v.astype(q.dtype), None, normalize=False, impl=self.impl,
            chunk_size=self.chunk_size, initial_state=state, return_final_state=return_state)
        y, new_state = out if return_state else (out, None)

        y = y.reshape(B, L, H * K)
        if self.output_norm == "srmsnorm":
            y = srms_norm(y).astype(y.dtype)
        else:
            y = nn.RMSNorm(epsilon=self.norm_eps, dtype=self.dtype, param_dtype=self.param_dtype,
                           scale_init=nn.with_logical_partitioning(nn.initializers.ones,
                                                                   ("heads",)),
                           name="output_norm")(y)
        rank = self.gate_rank or K
        gate = self._dense(rank, ("embed", None), "gate_down")(x)
        gate = nn.sigmoid(self._dense(H * K, (None, "heads"), "gate_up")(gate))
        y = self._dense(D, ("heads", "embed"), "out")(y * gate.astype(y.dtype))
        return (y, new_state) if return_state else y
