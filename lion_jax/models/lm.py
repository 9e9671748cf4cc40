"""Causal language models: LLaMA, TNL, HGRN2, cosFormer2 (the scaling-laws paper) and LION-S run
causally (LION paper Appendix A), on one pre-norm skeleton.

Skeleton (digest ``scaling-laws-linear-lms.md`` 1.0), for each of ``num_layers`` blocks::

    x = x + TokenMixer(Norm(x))
    x = x + ChannelMixer(Norm(x))

then a final norm and logits from the tied embedding (``x @ E^T``). ``tokens [B, L]`` int ->
``logits [B, L, vocab_size]`` (float32).

Architectures (``arch``), token mixer / channel mixer / block norm:

* ``"llama"``: :class:`~lion_jax.layers.llama.LlamaAttention` (RoPE, causal softmax) / SwiGLU /
  LayerNorm (see :data:`DEFAULT_NORM` for why).
* ``"tnl"``: :class:`~lion_jax.layers.tnl.TnlAttention` (LRPE on the first layer only, the
  "Mix" of the TNL paper) / SGLU / SRMSNorm (TNL's SimpleRMSNorm).
* ``"hgrn2"``: :class:`~lion_jax.layers.hgrn2.Hgrn2Attention`, whose per-layer forget-gate
  lower bounds come from one :class:`~lion_jax.layers.hgrn2.Hgrn2LowerBounds` the model owns /
  SGLU / SRMSNorm.
* ``"cosformer2"``: :class:`~lion_jax.layers.cosformer2.CosFormer2Attention`, with the TPE
  (:class:`~lion_jax.layers.cosformer2.Tpe`) applied once after the embedding / SGLU /
  SRMSNorm.
* ``"lion_s"``: :class:`~lion_jax.layers.lion.LionAttention` with ``variant="s"``,
  ``causal=True`` / SwiGLU / RMSNorm.
* ``"lightnet"``: :class:`~lion_jax.layers.lightnet.LightNetAttention` with ``causal=True``
  (the additive recurrence) and 1-D LRPE, its output norm RMSNorm, with the TPE
  (:class:`~lion_jax.layers.cosformer2.Tpe`, MD-TPE in 1-D) applied once after the embedding
  / SwiGLU / RMSNorm (LightNet digest 4.1; the Table 10 models are configs).

``mixer`` holds extra keyword arguments of the token mixer (the ablation switches, ``impl``,
``chunk_size``) over :data:`DEFAULT_MIXER` (TNL: the scaling-laws paper's low-rank sigmoid
gate; ``{"gate": "linear"}`` is the TNL paper's; HGRN2 and cosFormer2: SRMSNorm after the
mixer); ``norm`` overrides the block norm. With these defaults the parameter counts are Table
7's (LLaMA, TNL, HGRN2 within 0.1M; cosFormer2 0.1-0.9M under the printed counts, digest 2.3).
Sizes: :data:`SIZES` (the digest's reconciled Table 7 configurations, vocabulary 100,280) and
:func:`lm_size`.

Decoding (:mod:`lion_jax.generate`): ``model(tokens, state=None, offset=0,
return_state=False)``; ``state`` is ``{"layers": [one mixer state per block], "tpe": ...}`` (the
TPE's only for cosFormer2 and LightNet), as a previous call with ``return_state=True`` returned
it, and ``offset`` the position of ``tokens[:, 0]``. A prefill and continuation calls give the
logits of the full forward. A mixer's state is LLaMA's KV cache, or a linear mixer's recurrent
state ``S``, or with ``kv_cache=True`` a linear mixer's KV cache (:class:`lion_jax.ops.KVCache`,
of capacity ``max_len``: the same outputs by attention to every token seen).
"""

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from lion_jax.layers.cosformer2 import CosFormer2Attention, Tpe
from lion_jax.layers.glu import Sglu, SwiGlu
from lion_jax.layers.hgrn2 import Hgrn2Attention, Hgrn2LowerBounds
from lion_jax.layers.lightnet import LightNetAttention
from lion_jax.layers.lion import LionAttention
from lion_jax.layers.llama import LlamaAttention
from lion_jax.layers.norms import make_norm
from lion_jax.layers.tnl import SRMSNorm, TnlAttention

ARCHS = ("llama", "tnl", "hgrn2", "cosformer2", "lion_s", "lightnet")
NORMS = ("rmsnorm", "srmsnorm", "layernorm")
# Norms that reproduce Table 7's non-embedding counts (digest 2.3): the linear models count no
# norm parameters (TNL's parameter-free SRMSNorm in the blocks and after the mixers), LLaMA
# counts 4d per layer beyond its matrices, which two LayerNorms (scale and bias) are. The
# digest's [EXT] reading (RMSNorm for LLaMA, RMSNorm after HGRN2's mixer) is one flag away:
# ``norm="rmsnorm"``, ``mixer={"output_norm": "rmsnorm"}``.
DEFAULT_NORM = {"llama": "layernorm", "tnl": "srmsnorm", "hgrn2": "srmsnorm",
                "cosformer2": "srmsnorm", "lion_s": "rmsnorm", "lightnet": "rmsnorm"}
# The scaling-laws paper's TNL gates with sigmoid(x W_down W_up) of rank d/h (digest 1.2, 2.2);
# the TNL paper's own models with a full linear U (TnlAttention's default, gate="linear").
DEFAULT_MIXER = {"tnl": {"gate": "lowrank_sigmoid"}, "hgrn2": {"output_norm": "srmsnorm"},
                 "cosformer2": {"output_norm": "srmsnorm"}, "lightnet": {"norm": "rmsnorm"}}
CHANNEL_MIXER = {"llama": SwiGlu, "tnl": Sglu, "hgrn2": Sglu, "cosformer2": Sglu,
                 "lion_s": SwiGlu, "lightnet": SwiGlu}
VOCAB_SIZE = 100_280  # the scaling-laws paper's tokenizer

# The scaling-laws paper's models (digest 1.6, the reconciled configuration that reproduces
# Table 7): size -> (layers, width, heads, GLU width). TNL and cosFormer2 have 25 layers at
# 410M; the 1B models have 12 heads of 128 and GLU width 4096 (Table 7 prints 16 and 5632).
SIZES = {"70m": (6, 512, 4, 1536), "160m": (12, 768, 6, 2048), "410m": (26, 1024, 8, 2816),
         "1b": (32, 1536, 12, 4096), "3b": (35, 2560, 20, 6912), "7b": (32, 4096, 32, 11008)}
LAYERS_410M_TNL_COS2 = 25


def lm_size(size: str, arch: str) -> dict:
    """``{num_layers, d_model, num_heads, mlp_dim}`` of a scaling-laws size ("70m" ... "7b")
    for ``arch``."""
    if size not in SIZES:
        raise ValueError(f"unknown LM size {size!r}; valid: {list(SIZES)}")
    layers, width, heads, glu = SIZES[size]
    if size == "410m" and arch in ("tnl", "cosformer2"):
        layers = LAYERS_410M_TNL_COS2
    return dict(num_layers=layers, d_model=width, num_heads=heads, mlp_dim=glu)


def _norm(kind, dtype, param_dtype, name):
    if kind == "srmsnorm":
        return SRMSNorm(dtype=dtype, name=name)
    return make_norm(kind, dtype=dtype, param_dtype=param_dtype, name=name)


class LmBlock(nn.Module):
    """One pre-norm block ``[B, L, D] -> [B, L, D]`` of :class:`CausalLM` (see there)."""

    arch: str
    mixer: Mapping[str, Any]
    mlp_dim: int
    norm: str
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, *, state=None, offset=0, return_state=False, lower_bounds=None):
        kwargs = dict(self.mixer, dtype=self.dtype, param_dtype=self.param_dtype,
                      name="mixer")
        mixer = {"llama": LlamaAttention, "tnl": TnlAttention, "hgrn2": Hgrn2Attention,
                 "cosformer2": CosFormer2Attention, "lion_s": LionAttention,
                 "lightnet": LightNetAttention}[self.arch](**kwargs)
        extra = {} if lower_bounds is None else {"lower_bounds": lower_bounds}
        h = _norm(self.norm, self.dtype, self.param_dtype, "mixer_norm")(x)
        out = mixer(h, state=state, offset=offset, return_state=return_state, **extra)
        mixed, state = out if return_state else (out, None)
        x = x + mixed
        h = _norm(self.norm, self.dtype, self.param_dtype, "mlp_norm")(x)
        x = x + CHANNEL_MIXER[self.arch](hidden_dim=self.mlp_dim, dtype=self.dtype,
                                         param_dtype=self.param_dtype, name="mlp")(h)
        return x, state


class CausalLM(nn.Module):
    """A causal LM ``tokens [B, L] -> logits [B, L, vocab_size]`` (module docstring).

    Attributes:
      arch: one of :data:`ARCHS`.
      vocab_size, d_model, num_layers, num_heads, mlp_dim: sizes (head width
        ``d_model // num_heads``; :func:`lm_size` gives the paper's).
      max_len: the context: LLaMA's KV cache capacity (and the linear models' with
        ``kv_cache``); :mod:`lion_jax.generate` refuses a longer prompt + generation there.
        The linear models decoding from their state have no limit.
      mixer: extra token-mixer keyword arguments (ablation switches, ``impl``, ...).
      norm: block and final norm (``"rmsnorm"``, ``"srmsnorm"``, ``"layernorm"``); "" = the
        architecture's (:data:`DEFAULT_NORM`).
      embed_init_std: the embedding's init deviation.
      remat: recompute each block's activations in the backward pass (``nn.remat``): memory
        for one block's activations instead of all, for about one more forward pass of time.
      kv_cache: the linear mixers' decoding state is a KV cache of capacity ``max_len``
        (their ``kv_cache_len``) instead of the recurrent state (LLaMA's always is one).
      dtype, param_dtype: compute and parameter dtypes (logits are float32).
    """

    arch: str
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    max_len: int = 2048
    mixer: Mapping[str, Any] = None
    norm: str = ""
    embed_init_std: float = 0.02
    remat: bool = False
    kv_cache: bool = False
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; valid: {list(ARCHS)}")
        if self.norm and self.norm not in NORMS:
            raise ValueError(f"unknown norm {self.norm!r}; valid: {list(NORMS)}")
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "mlp_dim", "max_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads="
                             f"{self.num_heads}")
        super().__post_init__()

    def _mixer_kwargs(self, index):
        kwargs = dict(num_heads=self.num_heads, head_dim=self.d_model // self.num_heads)
        if self.arch == "llama":
            kwargs["max_len"] = self.max_len
        elif self.arch == "lion_s":
            kwargs.update(variant="s", causal=True)
        elif self.arch == "lightnet":
            kwargs.update(causal=True, lrpe=True)
        else:
            kwargs.update(layer_index=index, num_layers=self.num_layers)
            if self.arch == "tnl":
                kwargs["use_lrpe"] = index == 0
        if self.kv_cache and self.arch != "llama":
            kwargs["kv_cache_len"] = self.max_len
        return {**kwargs, **DEFAULT_MIXER.get(self.arch, {}), **dict(self.mixer or {})}

    @nn.compact
    def __call__(self, tokens, *, state=None, offset=0, return_state=False, hidden=False):
        """``tokens [B, L]`` int -> ``logits [B, L, V]`` float32, or ``(logits, state)``.

        ``hidden=True`` returns the final-norm features ``[B, L, D]`` (float32) instead of the
        logits, for :func:`next_token_losses`, which never holds all ``B x L x V`` logits.
        """
        embed = nn.Embed(self.vocab_size, self.d_model, param_dtype=self.param_dtype,
                         embedding_init=nn.with_logical_partitioning(
                             nn.initializers.normal(self.embed_init_std), ("vocab", "embed")),
                         name="embed")
        x = embed(tokens).astype(self.dtype or jnp.float32)
        new_state = {"layers": []}
        if self.arch in ("cosformer2", "lightnet"):
            tpe = Tpe(state_dim=self.d_model // self.num_heads, dtype=self.dtype,
                      param_dtype=self.param_dtype, name="tpe")  # e = d/h (digest 1.0)
            out = tpe(x, state=None if state is None else state["tpe"], offset=offset,
                      return_state=return_state)
            x, new_state["tpe"] = out if return_state else (out, None)
        lower_bounds = None
        if self.arch == "hgrn2" and dict(self.mixer or {}).get("use_lower_bound", True):
            lower_bounds = Hgrn2LowerBounds(num_layers=self.num_layers, width=self.d_model,
                                            param_dtype=self.param_dtype,
                                            name="lower_bounds")()
        norm = self.norm or DEFAULT_NORM[self.arch]
        decoding = state is not None or return_state
        for i in range(self.num_layers):
            block = (nn.remat(LmBlock) if self.remat and not decoding else LmBlock)(
                arch=self.arch, mixer=self._mixer_kwargs(i), mlp_dim=self.mlp_dim, norm=norm,
                dtype=self.dtype, param_dtype=self.param_dtype, name=f"block_{i}")
            if decoding:
                x, layer_state = block(
                    x, state=None if state is None else state["layers"][i], offset=offset,
                    return_state=return_state, lower_bounds=lower_bounds)
            else:  # no Python flags through remat: they would be traced
                x, layer_state = block(x, offset=offset, lower_bounds=lower_bounds)
            new_state["layers"].append(layer_state)
        x = _norm(norm, self.dtype, self.param_dtype, "final_norm")(x).astype(jnp.float32)
        out = x if hidden else embed.attend(x)
        return (out, new_state) if return_state else out


def next_token_losses(features, embedding, targets, *, max_logits=2**26):
    """Per-token cross-entropy and argmax hits of the tied-embedding logits, in slices.

    ``logits = features @ embedding^T`` (what :class:`CausalLM` returns) would hold ``B x L x V``
    float32 numbers, and their softmax and gradient as many again: 13 GB each for 32K tokens of
    the 100,280-token vocabulary. Here the sequence axis is cut into slices of at most
    ``max_logits`` logits, scanned, and each slice is recomputed in the backward pass
    (``jax.checkpoint``), so memory holds one slice; values and gradients are those of the full
    logits.

    Args:
      features: ``[B, L, D]`` float32, ``CausalLM(..., hidden=True)``'s output.
      embedding: ``[V, D]``, the tied embedding (``params["embed"]["embedding"]``).
      targets: ``[B, L]`` int.
      max_logits: the most logits one slice holds (``B x slice length x V``).
    Returns:
      ``(xent [B, L], correct [B, L])``, float32.
    """
    B, L, _ = features.shape
    size = max(1, min(L, max_logits // (B * embedding.shape[0])))
    pad = -L % size
    features = jnp.pad(features, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    embedding = embedding.astype(jnp.float32)

    @jax.checkpoint
    def one_slice(_, inputs):
        x, y = inputs  # [B, size, D], [B, size]
        logits = x @ embedding.T
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, y)
        return None, (xent, (jnp.argmax(logits, -1) == y).astype(jnp.float32))

    def slices(a):
        return jnp.moveaxis(a.reshape(B, -1, size, *a.shape[2:]), 1, 0)

    _, (xent, correct) = jax.lax.scan(one_slice, None, (slices(features), slices(targets)))

    def unslice(a):
        return jnp.moveaxis(a, 0, 1).reshape(B, -1)[:, :L]
    return unslice(xent), unslice(correct)
