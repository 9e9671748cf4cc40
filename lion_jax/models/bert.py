"""BERT with any token mixer: BERT (softmax) and the LION BERTs of paper Sec. 5.2, App. D.4-D.6.

``tokens [B, L] -> Embed (+ learned positions) (+ token types) -> LayerNorm -> Dropout ->
num_layers x BertBlock -> [B, L, D]`` (:class:`BertEncoder`), with the masked-LM head
(:class:`BertForMaskedLM`) or the pooled classification / regression head
(:class:`BertForSequenceClassification`) on top. The paper replaces BERT's self-attention by
LION-LIT / LION-RETNET / LION-S "while keeping all hyperparameters the same" (App. D.5); here
that is ``mixer_kind="lion"`` with ``mixer=dict(variant=...)`` and everything else unchanged.

Layout. BERT is post-norm (Devlin et al., after Vaswani et al.): ``x = LN(x + Drop(Attn(x)))``,
``x = LN(x + Drop(Mlp(x)))``. :class:`lion_jax.layers.ResidualBlock` is pre-norm only, so this
module composes its own block, :class:`BertBlock`, from the same layers (the mixers of
:data:`lion_jax.layers.MIXERS`, :class:`lion_jax.layers.Mlp`, the norms of
:mod:`lion_jax.layers.norms`); ``post_norm=False`` gives the pre-norm layout (with a final
norm) for comparison.

LION-LIT's extra norm. "For LION-LIT, we incorporate LayerNorm after the attention block to
enhance stability" (App. D.5). We read "the attention block" as the token mixer including its
output projection, so the norm acts on the mixer's ``[B, L, D]`` output before dropout and
the residual sum: ``x = LN(x + Drop(LN_mix(Mixer(x))))`` (name ``mixer_output_norm``). It is
``norm_after_mixer``, on by default for variant ``"lit"`` only. (A norm of each head's output
before the output projection, RetNet's, is the mixer's own ``output_norm`` switch.)

Padding: ``mask [B, L]`` (True = real token; default ``tokens != pad_id``) goes to every mixer
as it takes it: LION ignores padded tokens wherever they are; softmax attention takes the mask
as sequence lengths, so it must be a prefix per row (pad at the end). Outputs at padded
positions are meaningless.

Left out: BERT's dropout on the attention probabilities (no mixer has it; LION forms no
attention matrix in its chunked and recurrent forms). LayerNorm epsilon is the library's
(1e-6, BERT: 1e-12); the MLP's GELU is :class:`lion_jax.layers.Mlp`'s (tanh approximation).

Weights. The heads hold the encoder as the submodule ``"encoder"``, so MLM-pretrained weights
move to the classifier as ``params["encoder"]``. Embeddings start from ``normal(0.02)``
(BERT's ``initializer_range``); dense layers keep the layers' own inits.
"""

from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
from flax.core import FrozenDict

from lion_jax.layers.block import MIXERS, make_mixer, model_mixer_kwargs
from lion_jax.layers.cosformer2 import Tpe
from lion_jax.layers.embed import Embed, OneHotEmbed
from lion_jax.layers.mlp import Mlp
from lion_jax.layers.norms import check_norm, make_norm

# BERT sizes: width, depth, heads, MLP width. tiny: BERT-Tiny of Turc et al. (2019);
# base and large: Devlin et al. (2019), 110M and 340M parameters.
BERT_SIZES = {
    "tiny": dict(d_model=128, num_layers=2, num_heads=2, mlp_dim=512),
    "base": dict(d_model=768, num_layers=12, num_heads=12, mlp_dim=3072),
    "large": dict(d_model=1024, num_layers=24, num_heads=16, mlp_dim=4096),
}
POS_EMBS = ("learned", "none", "tpe")
EMBED_INIT_STD = 0.02  # BERT's initializer_range


def bert_size(name: str) -> dict:
    """The width, depth, heads and MLP width of a BERT size (``tiny``, ``base``, ``large``)."""
    if name not in BERT_SIZES:
        raise ValueError(f"unknown BERT size {name!r}; valid: {list(BERT_SIZES)}")
    return dict(BERT_SIZES[name])


def _embed_init(names):
    return nn.with_logical_partitioning(nn.initializers.normal(EMBED_INIT_STD), names)


class BertBlock(nn.Module):
    """One encoder layer ``[B, L, D] -> [B, L, D]``, post-norm (BERT) or pre-norm::

        post_norm=True:   x = Norm(x + Drop(MixNorm(Mixer(x, mask))))
                          x = Norm(x + Drop(Mlp(x)))
        post_norm=False:  x = x + Drop(MixNorm(Mixer(Norm(x), mask)))
                          x = x + Drop(Mlp(Norm(x)))

    ``MixNorm`` (``mixer_output_norm``) is there only with ``norm_after_mixer`` (LION-LIT's
    extra LayerNorm, App. D.5). ``Drop`` is dropout on each residual branch (BERT's hidden
    dropout); the MLP has none inside.

    Attributes:
      mixer: the mixer's keyword arguments, ``num_heads`` and ``head_dim`` included, except
        ``dtype`` and ``param_dtype`` (taken from here).
      mlp_dim: hidden width of the MLP.
      mixer_kind: a key of :data:`lion_jax.layers.MIXERS`.
      norm_after_mixer: the norm on the mixer's output above.
      post_norm: the layout above.
      dropout: rate of the residual-branch dropouts.
      norm: ``"layernorm"`` or ``"rmsnorm"``.
      dtype, param_dtype: compute and parameter dtypes.
    """

    mixer: Mapping[str, Any]
    mlp_dim: int
    mixer_kind: str = "lion"
    norm_after_mixer: bool = False
    post_norm: bool = True
    dropout: float = 0.0
    norm: str = "layernorm"
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        check_norm(self.norm)
        if self.mixer_kind not in MIXERS:
            raise ValueError(f"unknown mixer kind {self.mixer_kind!r}; valid: {list(MIXERS)}")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray | None = None, *,
                 deterministic: bool = True) -> jnp.ndarray:
        """``x [B, L, D]``, ``mask [B, L]`` bool (True = real token) -> ``[B, L, D]``."""
        dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)

        def norm(name):
            return make_norm(self.norm, **dtypes, name=name)

        def drop(h):
            return nn.Dropout(self.dropout)(h, deterministic=deterministic)

        h = x if self.post_norm else norm("mixer_norm")(x)
        h = MIXERS[self.mixer_kind](**self.mixer, **dtypes, name="mixer")(h, mask)
        if self.norm_after_mixer:
            h = norm("mixer_output_norm")(h)
        x = x + drop(h)
        if self.post_norm:
            x = norm("mixer_norm")(x)
        h = x if self.post_norm else norm("mlp_norm")(x)
        x = x + drop(Mlp(self.mlp_dim, **dtypes, name="mlp")(h))
        return norm("mlp_norm")(x) if self.post_norm else x


class BertEncoder(nn.Module):
    """Token ids ``[B, L]`` -> hidden states ``[B, L, d_model]`` (compute dtype).

    ``Embed(tokens) (+ positions) (+ Embed(token_types)) -> Norm -> Dropout -> num_layers x
    BertBlock (-> Norm, pre-norm only)``.

    Attributes:
      vocab_size: size of the token set (BERT's uncased WordPiece: 30522).
      d_model, num_layers, num_heads, mlp_dim: width, depth, heads, MLP width
        (:data:`BERT_SIZES`; the defaults are BERT-base).
      head_dim: query/key width per head; None = ``d_model // num_heads``.
      mixer_kind: ``"lion"`` or ``"softmax"`` (:data:`lion_jax.layers.MIXERS`).
      mixer: the mixer's keyword arguments (LION: ``variant`` ``"lit"``, ``"retnet"``, ``"s"``,
        ..., ``impl``, ``chunk_size``), except ``num_heads``, ``head_dim``, ``dtype`` and
        ``param_dtype``; checked when the model is built. The default is LION-S.
      norm_after_mixer: LION-LIT's LayerNorm on each mixer's output (module docstring); None =
        on for a LION mixer of variant ``"lit"``, off otherwise.
      post_norm: BERT's post-norm layout (True) or pre-norm (False; adds a final norm).
      pos_emb: ``"learned"`` absolute positions (BERT; needs ``max_len``), ``"none"``
        (LION-S, paper Sec. 4; then any length runs) or ``"tpe"`` (LightNet's encoder: the
        1-D TPE, MD-TPE in one dimension, once after the embeddings, state width the head
        width; any length; causal along the sequence, so right padding changes no real
        token).
      max_len: longest input for learned positions (BERT: 512).
      type_vocab_size: number of token types (segments A/B of a sentence pair; BERT: 2);
        0 = no token-type embedding.
      dropout: dropout after the embedding and on the residual branches (BERT: 0.1); active
        with ``train=True`` (needs the ``'dropout'`` rng).
      norm: ``"layernorm"`` (BERT) or ``"rmsnorm"``.
      pad_id: the padding id (the default mask is ``tokens != pad_id``; BERT's [PAD] is 0);
        None = no padding.
      dtype, param_dtype: compute and parameter dtypes.
    """

    vocab_size: int = 30522
    d_model: int = 768
    num_layers: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    head_dim: int | None = None
    mixer_kind: str = "lion"
    mixer: Mapping[str, Any] = FrozenDict()
    norm_after_mixer: bool | None = None
    post_norm: bool = True
    pos_emb: str = "learned"
    max_len: int | None = 512
    type_vocab_size: int = 2
    dropout: float = 0.1
    norm: str = "layernorm"
    pad_id: int | None = 0
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.pos_emb not in POS_EMBS:
            raise ValueError(f"unknown pos_emb {self.pos_emb!r}; valid: {list(POS_EMBS)}")
        if self.pos_emb == "learned" and not self.max_len:
            raise ValueError("pos_emb='learned' needs max_len (the longest input)")
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "mlp_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive; got {getattr(self, name)}")
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be >= 0 (0 = no token types); got "
                             f"{self.type_vocab_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")
        check_norm(self.norm)
        self._mixer_kwargs()  # fails now on a bad key or value
        super().__post_init__()

    def _mixer_kwargs(self):
        return model_mixer_kwargs("BertEncoder", self.mixer_kind, self.mixer,
                                  d_model=self.d_model, num_heads=self.num_heads,
                                  head_dim=self.head_dim)

    @property
    def uses_norm_after_mixer(self) -> bool:
        """Whether each block norms its mixer's output (``norm_after_mixer`` resolved)."""
        if self.norm_after_mixer is not None:
            return self.norm_after_mixer
        if self.mixer_kind != "lion":
            return False
        return make_mixer("lion", parent=None, **self._mixer_kwargs()).variant == "lit"

    def setup(self):
        dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        D = self.d_model
        self.token_embed = Embed(self.vocab_size, D, embedding_init=_embed_init(
            ("vocab", "embed")), **dtypes)
        if self.pos_emb == "learned":
            self.pos_embedding = self.param("pos_embedding", _embed_init((None, "embed")),
                                            (self.max_len, D), self.param_dtype)
        if self.type_vocab_size:
            self.type_embed = OneHotEmbed(self.type_vocab_size, D, embedding_init=_embed_init(
                (None, "embed")), **dtypes)
        if self.pos_emb == "tpe":
            self.tpe = Tpe(state_dim=self.head_dim or D // self.num_heads, **dtypes)
        self.embed_norm = make_norm(self.norm, **dtypes)
        self.embed_dropout = nn.Dropout(self.dropout)
        mixer, norm_after_mixer = self._mixer_kwargs(), self.uses_norm_after_mixer
        self.blocks = [BertBlock(mixer, self.mlp_dim, mixer_kind=self.mixer_kind,
                                 norm_after_mixer=norm_after_mixer, post_norm=self.post_norm,
                                 dropout=self.dropout, norm=self.norm, **dtypes)
                       for _ in range(self.num_layers)]
        if not self.post_norm:
            self.final_norm = make_norm(self.norm, **dtypes)

    def __call__(self, tokens: jnp.ndarray, *, train: bool, mask: jnp.ndarray | None = None,
                 token_types: jnp.ndarray | None = None) -> jnp.ndarray:
        """``tokens [B, L]`` int; ``mask [B, L]`` bool (True = real token; default ``tokens !=
        pad_id``); ``token_types [B, L]`` int in ``[0, type_vocab_size)`` (default all 0)
        -> ``[B, L, d_model]``."""
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [B, L]; got shape {tokens.shape}")
        B, L = tokens.shape
        if self.pos_emb == "learned" and L > self.max_len:
            raise ValueError(f"sequence length {L} exceeds max_len={self.max_len} of the learned "
                             f"positions (pos_emb='none' takes any length)")
        if mask is None:
            mask = jnp.ones((B, L), bool) if self.pad_id is None else tokens != self.pad_id
        mask = mask.astype(bool)

        x = self.token_embed(tokens)
        if self.pos_emb == "learned":
            x = x + self.pos_embedding[:L].astype(x.dtype)
        if token_types is not None and not self.type_vocab_size:
            raise ValueError("token_types given but type_vocab_size=0 (no token-type embedding)")
        if self.type_vocab_size:
            types = jnp.zeros_like(tokens) if token_types is None else token_types
            x = x + self.type_embed(types).astype(x.dtype)
        if self.pos_emb == "tpe":
            x = self.tpe(x)
        deterministic = not train
        x = self.embed_dropout(self.embed_norm(x), deterministic=deterministic)
        for block in self.blocks:
            x = block(x, mask, deterministic=deterministic)
        return x if self.post_norm else self.final_norm(x)

    def attend(self, h: jnp.ndarray) -> jnp.ndarray:
        """``h [..., d_model] -> h @ E^T [..., vocab_size]`` with the token embedding ``E``
        (the tied output projection), in the compute dtype."""
        return self.token_embed.attend(h)


def _check_encoder(owner: str, encoder: Mapping[str, Any]) -> None:
    """Builds ``BertEncoder(**encoder)`` unbound, turning a bad key into one ValueError line."""
    try:
        BertEncoder(parent=None, **encoder)
    except TypeError as e:  # an unknown keyword argument
        raise ValueError(f"{owner} encoder: {str(e).split('() ', 1)[-1]}") from None


class BertForMaskedLM(nn.Module):
    """Token ids ``[B, L]`` -> masked-LM logits ``[B, L, vocab_size]`` float32 (or
    ``[B, P, vocab_size]`` at ``positions [B, P]``).

    Head (BERT's): ``Dense(D -> D) -> gelu -> Norm -> h @ E^T + b``, the output projection tied
    to the encoder's token embedding ``E`` (no separate weight; ``b [vocab_size]`` is its own).

    Only the masked tokens (15-30 %) enter the loss; ``positions [B, P]`` (int indices into
    the sequence, e.g. the masked tokens' padded to a fixed ``P``) gathers the hidden states
    there first, so the head and the ``[B, P, vocab]`` logits cost ``P / L`` of the full ones.

    Attributes:
      encoder: :class:`BertEncoder` keyword arguments (sizes: :func:`bert_size`).
    """

    encoder: Mapping[str, Any] = FrozenDict()

    def __post_init__(self):
        _check_encoder("BertForMaskedLM", self.encoder)
        super().__post_init__()

    @nn.compact
    def __call__(self, tokens: jnp.ndarray, *, train: bool, mask: jnp.ndarray | None = None,
                 token_types: jnp.ndarray | None = None,
                 positions: jnp.ndarray | None = None) -> jnp.ndarray:
        """``tokens [B, L]`` int, ``mask``/``token_types`` as :meth:`BertEncoder.__call__`;
        ``positions [B, P]`` int or None (all L) -> logits ``[B, P or L, vocab_size]``.

        Sows the head's features (before the tied projection) as ``'intermediates'`` /
        ``mlm_features``."""
        enc = BertEncoder(**self.encoder, name="encoder")
        x = enc(tokens, train=train, mask=mask, token_types=token_types)
        if positions is not None:
            if positions.ndim != 2 or positions.shape[0] != tokens.shape[0]:
                raise ValueError(f"positions must be [B, P] with B={tokens.shape[0]}; got shape "
                                 f"{positions.shape}")
            x = jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)
        dtypes = dict(dtype=enc.dtype, param_dtype=enc.param_dtype)
        h = nn.Dense(enc.d_model, **dtypes, name="mlm_dense",
                     kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                              (None, "embed")),
                     bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(x)
        h = make_norm(enc.norm, **dtypes, name="mlm_norm")(nn.gelu(h))
        self.sow("intermediates", "mlm_features", h)
        bias = self.param("mlm_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, ("vocab",)), (enc.vocab_size,), enc.param_dtype)
        return enc.attend(h).astype(jnp.float32) + bias.astype(jnp.float32)


class BertForSequenceClassification(nn.Module):
    """Token ids ``[B, L]`` -> logits ``[B, num_labels]`` float32 (GLUE).

    ``encoder -> first token ([CLS]) -> Dense(D -> D) -> tanh (BERT's pooler) -> Dropout ->
    Dense(D -> num_labels)``. ``num_labels=1`` is regression (STS-B): the one output is the
    score (train on ``(logits[:, 0] - y)**2``).

    Attributes:
      num_labels: number of classes; 1 = regression.
      encoder: :class:`BertEncoder` keyword arguments (sizes: :func:`bert_size`).
      dropout: rate before the classifier; None = the encoder's ``dropout``.
    """

    num_labels: int
    encoder: Mapping[str, Any] = FrozenDict()
    dropout: float | None = None

    def __post_init__(self):
        if self.num_labels < 1:
            raise ValueError(f"num_labels must be >= 1 (1 = regression); got {self.num_labels}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")
        _check_encoder("BertForSequenceClassification", self.encoder)
        super().__post_init__()

    @nn.compact
    def __call__(self, tokens: jnp.ndarray, *, train: bool, mask: jnp.ndarray | None = None,
                 token_types: jnp.ndarray | None = None) -> jnp.ndarray:
        """``tokens [B, L]`` int (``[CLS]`` first), ``mask``/``token_types`` as
        :meth:`BertEncoder.__call__` -> ``[B, num_labels]`` float32."""
        enc = BertEncoder(**self.encoder, name="encoder")
        x = enc(tokens, train=train, mask=mask, token_types=token_types)
        pooled = nn.tanh(nn.Dense(
            enc.d_model, dtype=enc.dtype, param_dtype=enc.param_dtype, name="pooler",
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                     (None, "embed")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(x[:, 0]))
        rate = enc.dropout if self.dropout is None else self.dropout
        pooled = nn.Dropout(rate)(pooled.astype(jnp.float32), deterministic=not train)
        return nn.Dense(
            self.num_labels, dtype=jnp.float32, param_dtype=enc.param_dtype, name="classifier",
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                     ("embed", "classes")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("classes",)))(pooled)
