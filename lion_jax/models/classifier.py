"""Sequence classifiers for the Long Range Arena: one input, and a dual encoder for pairs."""

from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
from flax.core import FrozenDict
from flax.linen.linear import default_embed_init

from lion_jax.layers.block import CHANNEL_MIXERS, ResidualBlock, model_mixer_kwargs
from lion_jax.layers.embed import OneHotEmbed
from lion_jax.layers.norms import SEQUENCE_NORMS, check_norm, sequence_norm
from lion_jax.models.vit import check_orders, token_orders

POOLINGS = ("mean", "cls", "last")
POS_EMBS = ("none", "learned", "sinusoidal")
INPUT_ENCODINGS = ("embed", "pixels")


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

    ``Embed -> (+ positions) -> (prepend CLS) -> Dropout -> num_layers x ResidualBlock ->
    Norm -> pool -> Dense``. With ``num_classes=None`` it stops before the ``Dense`` and returns
    the pooled features ``[B, d_model]`` (float32): the encoder of :class:`DualEncoderClassifier`.

    Attributes:
      vocab_size: size of the token set (unused with ``input_encoding="pixels"``).
      num_classes: number of labels; None = return the pooled features.
      d_model, num_layers, num_heads: width, depth, heads.
      head_dim: query/key width per head; None = ``d_model // num_heads``.
      mlp_dim: MLP hidden width.
      channel_mixer: the blocks' channel mixer (:data:`lion_jax.layers.block.CHANNEL_MIXERS`):
        ``"mlp"`` (default), ``"swiglu"``, ``"half_glu"`` or ``"half_glu2"`` (S5's LRA layers,
        no MLP).
      dropout: rate (embedding, residual branches, MLP); active with ``train=True``.
      pooling: ``"mean"`` over real tokens, ``"cls"`` (a learned token prepended after the
        positional embedding, so it has no position; its output is the summary) or ``"last"``
        (the last real token). With a decaying mixer a CLS token at position 0 sees token ``j``
        through the decays of tokens ``1..j``, so it favours the start of long inputs.
      pos_emb: ``"none"`` (LION-S needs none, paper Sec. 4), ``"learned"`` (needs ``max_len``)
        or ``"sinusoidal"``.
      max_len: longest input for ``pos_emb="learned"``.
      mixer_kind: the token mixer, a key of :data:`lion_jax.layers.MIXERS` (``"lion"``,
        ``"softmax"``: the Transformer baseline).
      mixer: the mixer's keyword arguments (LION: ``variant``, ``impl``, ``chunk_size``,
        ``feature_map``, ...), except ``num_heads``, ``head_dim``, ``dtype`` and
        ``param_dtype``, which come from this module. Checked when the model is built.
      norm: ``"layernorm"``, ``"rmsnorm"`` or ``"batchnorm"`` (S5's, per feature over the
        batch's real tokens; running statistics in the ``batch_stats`` collection, which
        training applies as mutable: :class:`lion_jax.layers.norms.SequenceBatchNorm`).
      bn_momentum: the running statistics' momentum of ``"batchnorm"`` (S5: 0.9 on
        Pathfinder, 0.95 elsewhere).
      input_encoding: ``"embed"`` (a learned embedding of the ids; LRA feeds pixel intensities
        this way) or ``"pixels"`` (ids are 8-bit intensities, mapped to ``(x / 255 - 0.5) /
        0.5`` and through ``Dense(1 -> d_model)``, as S5 feeds images).
      pad_id: the padding id (the default mask is ``tokens != pad_id``); None = no padding
        (images, where 0 is a black pixel).
      orders: the token orders the LION mixer walks (names of
        :data:`lion_jax.models.vit.PATCH_ORDERS`): ``("raster",)``, the sequence as it comes,
        or, for a sequence that is an image flattened row by row (``image_shape``), several
        orders whose masks are averaged, e.g. ``("row_snake", "col_snake")`` (LION-S v2, paper
        C.8): pixels that are vertical neighbours are then neighbours in one of the walks. A
        CLS token stays first in every order.
      image_shape: ``(rows, cols)`` of that image; needed by orders other than raster, whose
        inputs must then hold ``rows * cols`` tokens.
      dtype, param_dtype: compute and parameter dtypes.
    """

    vocab_size: int
    num_classes: int | None
    d_model: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    head_dim: int | None = None
    channel_mixer: str = "mlp"
    dropout: float = 0.0
    pooling: str = "mean"
    pos_emb: str = "none"
    max_len: int | None = None
    mixer_kind: str = "lion"
    mixer: Mapping[str, Any] = FrozenDict()
    norm: str = "layernorm"
    bn_momentum: float = 0.9
    input_encoding: str = "embed"
    pad_id: int | None = 0
    orders: tuple[str, ...] = ("raster",)
    image_shape: tuple[int, int] | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; valid: {list(POOLINGS)}")
        if self.pos_emb not in POS_EMBS:
            raise ValueError(f"unknown pos_emb {self.pos_emb!r}; valid: {list(POS_EMBS)}")
        if self.pos_emb == "learned" and not self.max_len:
            raise ValueError("pos_emb='learned' needs max_len")
        if self.input_encoding not in INPUT_ENCODINGS:
            raise ValueError(f"unknown input_encoding {self.input_encoding!r}; valid: "
                             f"{list(INPUT_ENCODINGS)}")
        check_norm(self.norm, SEQUENCE_NORMS)
        self._check_orders()
        if self.channel_mixer not in CHANNEL_MIXERS:
            raise ValueError(f"unknown channel_mixer {self.channel_mixer!r}; valid: "
                             f"{list(CHANNEL_MIXERS)}")
        self._mixer_kwargs()  # fails now on a bad key or value
        super().__post_init__()

    def _check_orders(self):
        check_orders(self.orders, self.mixer_kind)
        shape = self.image_shape
        if tuple(self.orders) != ("raster",) and (shape is None or len(shape) != 2
                                                  or min(shape) < 1):
            raise ValueError(f"orders={tuple(self.orders)} needs image_shape=(rows, cols), the "
                             f"image the sequence flattens; got image_shape={shape!r}")

    def _token_orders(self, length: int):
        """The mixer's ``orders`` for inputs of ``length`` tokens (None: as they come)."""
        if tuple(self.orders) == ("raster",):
            return None
        rows, cols = self.image_shape
        if length != rows * cols:
            raise ValueError(f"orders={tuple(self.orders)} walk an image of image_shape="
                             f"{tuple(self.image_shape)} ({rows * cols} tokens); the inputs "
                             f"hold {length}")
        return token_orders(rows, cols, self.orders, num_prefix=int(self.pooling == "cls"))

    def _mixer_kwargs(self):
        return model_mixer_kwargs("SequenceClassifier", self.mixer_kind, self.mixer,
                                  d_model=self.d_model, num_heads=self.num_heads,
                                  head_dim=self.head_dim)

    @nn.compact
    def __call__(self, tokens: jnp.ndarray, *, train: bool,
                 mask: jnp.ndarray | None = None) -> jnp.ndarray:
        """``tokens [B, L]`` int; ``mask [B, L]`` bool (default ``tokens != pad_id``)."""
        B, L = tokens.shape
        D = self.d_model
        dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        if mask is None:
            mask = jnp.ones((B, L), bool) if self.pad_id is None else tokens != self.pad_id
        mask = mask.astype(bool)

        if self.input_encoding == "pixels":
            pixels = (tokens.astype(jnp.float32) / 255.0 - 0.5) / 0.5
            x = nn.Dense(D, **dtypes, name="embed", kernel_init=nn.with_logical_partitioning(
                nn.initializers.lecun_normal(), (None, "embed")), bias_init=(
                nn.with_logical_partitioning(nn.initializers.zeros, ("embed",))))(pixels[..., None])
        else:
            x = OneHotEmbed(self.vocab_size, D, **dtypes, name="embed", embedding_init=(
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
        orders = self._token_orders(L)
        if self.pooling == "cls":
            cls = self.param("cls", nn.with_logical_partitioning(
                nn.initializers.normal(0.02), (None, None, "embed")), (1, 1, D), self.param_dtype)
            x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (B, 1, D)), x], axis=1)
            mask = jnp.concatenate([jnp.ones((B, 1), bool), mask], axis=1)

        deterministic = not train
        x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
        for i in range(self.num_layers):
            x = ResidualBlock(self._mixer_kwargs(), self.mlp_dim, mixer_kind=self.mixer_kind,
                              channel_mixer=self.channel_mixer, dropout=self.dropout,
                              norm=self.norm, bn_momentum=self.bn_momentum, **dtypes,
                              name=f"block_{i}")(x, mask, deterministic=deterministic,
                                                 orders=orders)
        x = sequence_norm(self.norm, x, mask, deterministic=deterministic,
                          bn_momentum=self.bn_momentum, **dtypes,
                          name="final_norm").astype(jnp.float32)

        if self.pooling == "cls":
            pooled = x[:, 0]
        elif self.pooling == "mean":
            total = jnp.sum(jnp.where(mask[..., None], x, 0.0), axis=1)
            pooled = total / jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1)
        else:  # last real token, whatever the padding layout
            last = jnp.max(jnp.where(mask, jnp.arange(x.shape[1]), 0), axis=1)
            pooled = x[jnp.arange(B), last]
        if self.num_classes is None:
            return pooled
        return nn.Dense(
            self.num_classes, dtype=jnp.float32, param_dtype=self.param_dtype, name="head",
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                     ("embed", "classes")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("classes",)))(pooled)


class DualEncoderClassifier(nn.Module):
    """A pair of token sequences ``[B, L]``, ``[B, L]`` -> logits ``[B, num_classes]`` (LRA
    Retrieval).

    Both sequences go through one :class:`SequenceClassifier` encoder (the same weights; the
    pair is stacked along the batch, so one call encodes both), and the pooled encodings
    ``u, v [B, D]`` are combined as LRA's dual encoder does, ``[u, v, u * v, u - v]``, then
    ``Dense(mlp_dim) -> relu -> Dense(num_classes)``.

    Attributes:
      num_classes: number of labels.
      encoder: :class:`SequenceClassifier` keyword arguments except ``num_classes``.
      mlp_dim: hidden width of the classifier on the combined encodings; None = ``d_model``.
    """

    num_classes: int
    encoder: Mapping[str, Any]
    mlp_dim: int | None = None

    def __post_init__(self):
        if "num_classes" in self.encoder:
            raise ValueError("set num_classes on DualEncoderClassifier, not in encoder")
        SequenceClassifier(num_classes=None, **self.encoder)  # fails now on a bad key or value
        super().__post_init__()

    def setup(self):
        self.encode = SequenceClassifier(num_classes=None, **self.encoder)
        hidden = self.mlp_dim or self.encoder["d_model"]
        self.hidden = nn.Dense(hidden, dtype=jnp.float32,
                               param_dtype=self.encoder.get("param_dtype", jnp.float32),
                               kernel_init=nn.with_logical_partitioning(
                                   nn.initializers.lecun_normal(), (None, "mlp")),
                               bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                                      ("mlp",)))
        self.head = nn.Dense(self.num_classes, dtype=jnp.float32,
                             param_dtype=self.encoder.get("param_dtype", jnp.float32),
                             kernel_init=nn.with_logical_partitioning(
                                 nn.initializers.lecun_normal(), ("mlp", "classes")),
                             bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                                    ("classes",)))

    def encode_pair(self, tokens1, tokens2, *, train: bool):
        """The pooled encodings ``(u, v)``, each ``[B, D]`` float32, of two ``[B, L]`` token
        arrays (encoded in one batch)."""
        if tokens1.shape != tokens2.shape:
            raise ValueError(f"the two sequences must have one shape [B, L]; got "
                             f"{tokens1.shape} and {tokens2.shape}")
        both = self.encode(jnp.concatenate([tokens1, tokens2]), train=train)
        return both[:tokens1.shape[0]], both[tokens1.shape[0]:]

    def __call__(self, tokens1: jnp.ndarray, tokens2: jnp.ndarray, *, train: bool
                 ) -> jnp.ndarray:
        """``tokens1, tokens2 [B, L]`` int (padded with ``encoder['pad_id']``, 0 by default) ->
        ``[B, num_classes]`` float32."""
        u, v = self.encode_pair(tokens1, tokens2, train=train)
        h = jnp.concatenate([u, v, u * v, u - v], axis=-1)
        return self.head(nn.relu(self.hidden(h)))
