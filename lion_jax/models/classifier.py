"""Sequence classifier for the Long Range Arena (single-input tasks)."""

from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
from flax.core import FrozenDict
from flax.linen.linear import default_embed_init

from lion_jax.layers.lion import LionBlock
from lion_jax.layers.norms import check_norm, make_norm

POOLINGS = ("mean", "cls", "last")
POS_EMBS = ("none", "learned", "sinusoidal")
_RESERVED_MIXER_KEYS = ("num_heads", "head_dim", "dtype", "param_dtype")


def sinusoidal_embedding(length: int, features: int) -> jnp.ndarray:
    """``[length, features]`` float32: ``sin`` on the first half of the features, ``cos`` on the
    second (wavelengths ``10000**(2i / features)``); an odd last feature is zero."""
    half = features // 2
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) * 2.0 / features))
    angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return jnp.pad(emb, ((0, 0), (0, features - 2 * half)))


class SequenceClassifier(nn.Module):
    """Token ids ``[B, L]`` -> class logits ``[B, num_classes]`` (float32).

    ``Embed -> (+ positions) -> (prepend CLS) -> Dropout -> num_layers x LionBlock -> Norm ->
    pool -> Dense``.

    Attributes:
      vocab_size, num_classes: sizes of the token and label sets.
      d_model, num_layers, num_heads: width, depth, heads.
      head_dim: query/key width per head; None = ``d_model // num_heads``.
      mlp_dim: MLP hidden width.
      dropout: rate (embedding, residual branches, MLP); active with ``train=True``.
      pooling: ``"mean"`` over real tokens, ``"cls"`` (a learned token prepended after the
        positional embedding, so it has no position; its output is the summary) or ``"last"``
        (the last real token). With a decaying mixer a CLS token at position 0 sees token ``j``
        through the decays of tokens ``1..j``, so it favours the start of long inputs.
      pos_emb: ``"none"`` (LION-S needs none, paper Sec. 4), ``"learned"`` (needs ``max_len``)
        or ``"sinusoidal"``.
      max_len: longest input for ``pos_emb="learned"``.
      mixer: :class:`~lion_jax.layers.LionAttention` keyword arguments (``variant``, ``impl``,
        ``chunk_size``, ``feature_map``, ...), except ``num_heads``, ``head_dim``, ``dtype`` and
        ``param_dtype``, which come from this module.
      norm: ``"layernorm"`` or ``"rmsnorm"``.
      dtype, param_dtype: compute and parameter dtypes.
    """

    vocab_size: int
    num_classes: int
    d_model: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    head_dim: int | None = None
    dropout: float = 0.0
    pooling: str = "mean"
    pos_emb: str = "none"
    max_len: int | None = None
    mixer: Mapping[str, Any] = FrozenDict()
    norm: str = "layernorm"
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; valid: {list(POOLINGS)}")
        if self.pos_emb not in POS_EMBS:
            raise ValueError(f"unknown pos_emb {self.pos_emb!r}; valid: {list(POS_EMBS)}")
        if self.pos_emb == "learned" and not self.max_len:
            raise ValueError("pos_emb='learned' needs max_len")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads="
                             f"{self.num_heads}; set head_dim")
        reserved = sorted(set(self.mixer) & set(_RESERVED_MIXER_KEYS))
        if reserved:
            raise ValueError(f"set {reserved} on SequenceClassifier, not in mixer")
        check_norm(self.norm)
        super().__post_init__()

    @nn.compact
    def __call__(self, tokens: jnp.ndarray, *, train: bool,
                 mask: jnp.ndarray | None = None) -> jnp.ndarray:
        """``tokens [B, L]`` int; ``mask [B, L]`` bool (default ``tokens != 0``, pad id 0)."""
        B, L = tokens.shape
        D = self.d_model
        dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        mask = tokens != 0 if mask is None else mask.astype(bool)

        x = nn.Embed(self.vocab_size, D, **dtypes, name="embed", embedding_init=(
            nn.with_logical_partitioning(default_embed_init, ("vocab", "embed"))))(tokens)
        if self.pos_emb == "learned":
            if L > self.max_len:
                raise ValueError(f"sequence length {L} exceeds max_len={self.max_len}")
            pos = self.param("pos_embedding", nn.with_logical_partitioning(
                nn.initializers.normal(0.02), (None, "embed")), (self.max_len, D),
                self.param_dtype)
            x = x + pos[:L].astype(x.dtype)
        elif self.pos_emb == "sinusoidal":
            x = x + sinusoidal_embedding(L, D).astype(x.dtype)
        if self.pooling == "cls":
            cls = self.param("cls", nn.with_logical_partitioning(
                nn.initializers.normal(0.02), (None, None, "embed")), (1, 1, D), self.param_dtype)
            x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (B, 1, D)), x], axis=1)
            mask = jnp.concatenate([jnp.ones((B, 1), bool), mask], axis=1)

        deterministic = not train
        x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
        mixer = dict(num_heads=self.num_heads, head_dim=self.head_dim or D // self.num_heads,
                     **self.mixer)
        for i in range(self.num_layers):
            x = LionBlock(mixer, self.mlp_dim, dropout=self.dropout, norm=self.norm, **dtypes,
                          name=f"block_{i}")(x, mask, deterministic=deterministic)
        x = make_norm(self.norm, **dtypes, name="final_norm")(x).astype(jnp.float32)

        if self.pooling == "cls":
            pooled = x[:, 0]
        elif self.pooling == "mean":
            total = jnp.sum(jnp.where(mask[..., None], x, 0.0), axis=1)
            pooled = total / jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1)
        else:  # last real token, whatever the padding layout
            last = jnp.max(jnp.where(mask, jnp.arange(x.shape[1]), 0), axis=1)
            pooled = x[jnp.arange(B), last]
        return nn.Dense(
            self.num_classes, dtype=jnp.float32, param_dtype=self.param_dtype, name="head",
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                     ("embed", "classes")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("classes",)))(pooled)
