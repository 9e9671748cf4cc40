"""Vision Transformer with any token mixer: ViT/DeiT (softmax) and the LION ViTs (paper Sec. 5.2).

``images [B, H, W, C] -> Conv(patch, stride patch) -> raster-ordered patch tokens (+ learned
positions) -> prepend CLS -> Dropout -> num_layers x ResidualBlock -> Norm -> CLS (or mean) ->
Dense``.

The CLS token is token 0. In LION's mask ``M_ij = exp(-|A_i - A_j|)``, ``A = cumsum(a)``, a
token's own log-decay ``a_t`` sits between tokens ``t - 1`` and ``t``, so ``a_0`` enters no
mask: the CLS token's decay is 1 (the reference replaces the CLS position's decay by 1), and it
sees patch ``j`` through the decays of patches ``1..j``.

Patch orders (paper C.8, Figure 7; LION-S (v2)): the patch tokens can be mixed along other
orders than raster: ``row_snake`` (rows alternately left to right and right to left) and
``col_snake`` (columns alternately top to bottom and bottom to top). With several orders, every
LION mixer averages the masks the decays build along each (:class:`LionAttention`'s
``orders``); the CLS token stays first in every order. Orders are rebuilt from the patch grid
at every call, so they follow the resolution.

Padding (``token_multiple``, LION mixers): the tokens (CLS + patches) can be padded at the end
with masked tokens to a multiple of ``token_multiple``, once for all blocks. It is exact: a
padded token's key, value and decay are zeroed in every LION mixer (:class:`LionAttention`'s
``mask``), so no real token sees it, it sits last in every patch order, and mean pooling skips
it. It is for kernels that take whole tiles: the Mosaic GPU ``lion_dense`` reads 8-row tiles,
so ViT's 197 tokens would otherwise be copied to 200 rows and back in every layer.

Any resolution: the image side must be a multiple of the patch. Without positional embedding
(LION-S) nothing depends on the grid; a learned embedding (``pos_emb="learned"``, ViT) is
stored for the ``image_size`` grid and bilinearly resized to other grids.
"""

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.core import FrozenDict

from lion_jax.layers.block import ResidualBlock, model_mixer_kwargs
from lion_jax.layers.md_pe import MdTpe
from lion_jax.layers.norms import check_norm, make_norm

# ViT/DeiT sizes (Dosovitskiy et al.; Touvron et al.): width, depth, heads; MLP 4x width.
VIT_SIZES = {
    "tiny": dict(d_model=192, num_layers=12, num_heads=3, mlp_dim=768),
    "small": dict(d_model=384, num_layers=12, num_heads=6, mlp_dim=1536),
    "base": dict(d_model=768, num_layers=12, num_heads=12, mlp_dim=3072),
}
PATCH_ORDERS = ("raster", "row_snake", "col_snake")
POOLINGS = ("cls", "mean")
POS_EMBS = ("none", "learned", "md_tpe")


def vit_size(name: str) -> dict:
    """The width, depth, heads and MLP width of a ViT size (``tiny``, ``small``, ``base``)."""
    if name not in VIT_SIZES:
        raise ValueError(f"unknown ViT size {name!r}; valid: {list(VIT_SIZES)}")
    return dict(VIT_SIZES[name])


def patch_order(rows: int, cols: int, name: str) -> np.ndarray:
    """The patch indices (raster numbering ``r * cols + c``) in the order ``name`` visits them,
    ``[rows * cols]`` int: ``raster``, ``row_snake`` or ``col_snake`` (see the module
    docstring). Its inverse is ``np.argsort`` of it."""
    grid = np.arange(rows * cols).reshape(rows, cols)
    if name == "raster":
        return grid.reshape(-1)
    if name == "row_snake":
        grid = grid.copy()
        grid[1::2] = grid[1::2, ::-1]
        return grid.reshape(-1)
    if name == "col_snake":
        grid = grid.T.copy()
        grid[1::2] = grid[1::2, ::-1]
        return grid.reshape(-1)
    raise ValueError(f"unknown patch order {name!r}; valid: {list(PATCH_ORDERS)}")


def check_orders(orders, mixer_kind: str) -> None:
    """ValueError (one line) unless ``orders`` names at least one of :data:`PATCH_ORDERS`, and
    anything but raster alone goes to the LION mixer (only its mask averages several orders)."""
    if not orders or isinstance(orders, str):
        raise ValueError("orders must be a sequence of order names with at least one patch "
                         f"order; got {orders!r}")
    for name in orders:
        if name not in PATCH_ORDERS:
            raise ValueError(f"unknown patch order {name!r} in orders; valid: "
                             f"{list(PATCH_ORDERS)}")
    if tuple(orders) != ("raster",) and mixer_kind != "lion":
        raise ValueError(f"orders={tuple(orders)} needs the LION mixer (only its mask walks "
                         f"several orders); got mixer_kind={mixer_kind!r}")


def token_orders(rows: int, cols: int, names, num_prefix: int = 1,
                 num_padded: int = 0) -> tuple[np.ndarray, ...] | None:
    """Orders of ``num_prefix`` leading tokens (ViT's CLS token: 1; they stay first), the
    ``rows x cols`` patch tokens after them and ``num_padded`` padding tokens last, one per
    name; None for raster alone (nothing to reorder)."""
    if tuple(names) == ("raster",):
        return None
    patches = num_prefix + rows * cols
    return tuple(np.concatenate([np.arange(num_prefix), num_prefix + patch_order(rows, cols, name),
                                 np.arange(patches, patches + num_padded)])
                 for name in names)


class VisionTransformer(nn.Module):
    """Images ``[B, H, W, C]`` (float, normalised) -> class logits ``[B, num_classes]`` float32.

    Attributes:
      num_classes: number of labels.
      patch_size: side of the square patches; H and W must be multiples of it.
      d_model, num_layers, num_heads, mlp_dim: width, depth, heads, MLP width
        (:data:`VIT_SIZES`).
      head_dim: query/key width per head; None = ``d_model // num_heads``.
      mixer_kind: ``"lion"``, ``"softmax"`` or ``"lightnet"`` (:data:`lion_jax.layers.MIXERS`);
        a LightNet mixer with ``lrpe`` gets the patch grid (CLS token unrotated) per call.
      channel_mixer: ``"mlp"`` (GELU, ViT) or ``"swiglu"`` (LightNet's GLU), hidden
        ``mlp_dim``.
      mixer: the mixer's keyword arguments except ``num_heads``, ``head_dim``, ``dtype`` and
        ``param_dtype``; checked when the model is built.
      orders: patch orders mixed (names of :data:`PATCH_ORDERS`); several (LION only): the
        masks of each are averaged (LION-S v2 uses ``("row_snake", "col_snake")``).
      pos_emb: ``"none"`` (LION-S), ``"learned"`` (ViT; needs ``image_size``) or
        ``"md_tpe"`` (LightNet: :class:`~lion_jax.layers.md_pe.MdTpe` over the patch grid,
        once after the embedding, any resolution; ``coef_init="unit"`` keeps the scale).
      image_size: the training resolution, for the learned positions' grid.
      pooling: ``"cls"`` or ``"mean"`` (over the patch tokens).
      dropout: dropout after the embedding and in the residual branches.
      drop_path: stochastic depth, rising linearly from 0 at the first block to this at the
        last (DeiT).
      norm: ``"layernorm"`` or ``"rmsnorm"``.
      token_multiple: pad the tokens with masked ones to a multiple of this (LION mixers;
        module docstring); 1: no padding.
      dtype, param_dtype: compute and parameter dtypes.
    """

    num_classes: int
    patch_size: int
    d_model: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    head_dim: int | None = None
    mixer_kind: str = "lion"
    channel_mixer: str = "mlp"
    mixer: Mapping[str, Any] = FrozenDict()
    orders: tuple[str, ...] = ("raster",)
    pos_emb: str = "none"
    image_size: int | None = None
    pooling: str = "cls"
    dropout: float = 0.0
    drop_path: float = 0.0
    norm: str = "layernorm"
    token_multiple: int = 1
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        for name, value, valid in (("pooling", self.pooling, POOLINGS),
                                   ("pos_emb", self.pos_emb, POS_EMBS)):
            if value not in valid:
                raise ValueError(f"unknown {name} {value!r}; valid: {list(valid)}")
        check_orders(self.orders, self.mixer_kind)
        if self.pos_emb == "learned" and not self.image_size:
            raise ValueError("pos_emb='learned' needs image_size (the training resolution)")
        if self.image_size and self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} is not a multiple of patch_size="
                             f"{self.patch_size}")
        if self.patch_size < 1:
            raise ValueError(f"patch_size must be positive; got {self.patch_size}")
        if not 0.0 <= self.drop_path < 1.0:
            raise ValueError(f"drop_path must be in [0, 1); got {self.drop_path}")
        check_norm(self.norm)
        if not isinstance(self.token_multiple, int) or self.token_multiple < 1:
            raise ValueError(f"token_multiple must be an int >= 1; got {self.token_multiple!r}")
        if self.token_multiple > 1 and self.mixer_kind != "lion":
            raise ValueError(f"token_multiple={self.token_multiple} pads the tokens for LION "
                             f"mixers (they zero a padded token's key, value and decay); got "
                             f"mixer_kind={self.mixer_kind!r}: use token_multiple=1")
        self._mixer_kwargs()  # fails now on a bad key or value
        super().__post_init__()

    def _mixer_kwargs(self):
        return model_mixer_kwargs("VisionTransformer", self.mixer_kind, self.mixer,
                                  d_model=self.d_model, num_heads=self.num_heads,
                                  head_dim=self.head_dim)

    def _positions(self, rows, cols):
        """The learned positional embedding for a ``rows x cols`` grid, ``[rows * cols, D]``."""
        side = self.image_size // self.patch_size
        pos = self.param("pos_embedding", nn.with_logical_partitioning(
            nn.initializers.normal(0.02), (None, "embed")), (side * side, self.d_model),
            self.param_dtype)
        if (rows, cols) == (side, side):
            return pos
        grid = jax.image.resize(pos.reshape(side, side, -1).astype(jnp.float32),
                                (rows, cols, self.d_model), method="bilinear")
        return grid.reshape(rows * cols, -1)

    @nn.compact
    def __call__(self, images: jnp.ndarray, *, train: bool) -> jnp.ndarray:
        """``images [B, H, W, C]`` float, H and W multiples of ``patch_size``."""
        if images.ndim != 4:
            raise ValueError(f"images must be [B, H, W, C]; got shape {images.shape}")
        B, H, W, _ = images.shape
        p = self.patch_size
        if H % p or W % p:
            raise ValueError(f"image size {H}x{W} is not a multiple of the patch size {p}; "
                             f"resize or crop the images to a multiple of {p}")
        rows, cols = H // p, W // p
        D = self.d_model
        dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        x = nn.Conv(D, (p, p), strides=(p, p), padding="VALID", **dtypes, name="patch_embed",
                    kernel_init=nn.with_logical_partitioning(
                        nn.initializers.lecun_normal(), (None, None, None, "embed")),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(
            images)
        x = x.reshape(B, rows * cols, D)
        if self.pos_emb == "learned":
            x = x + self._positions(rows, cols).astype(x.dtype)
        elif self.pos_emb == "md_tpe":
            x = MdTpe(grid_shape=(rows, cols), coef_init="unit", **dtypes, name="md_tpe")(x)
        cls = self.param("cls", nn.with_logical_partitioning(
            nn.initializers.normal(0.02), (None, None, "embed")), (1, 1, D), self.param_dtype)
        x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (B, 1, D)), x], axis=1)
        L = x.shape[1]
        num_padded = -L % self.token_multiple
        mask = None
        if num_padded:
            x = jnp.pad(x, ((0, 0), (0, num_padded), (0, 0)))
            mask = jnp.broadcast_to(jnp.arange(L + num_padded) < L, (B, L + num_padded))

        deterministic = not train
        orders = token_orders(rows, cols, self.orders, num_padded=num_padded)
        mixer = self._mixer_kwargs()
        if self.mixer_kind == "lightnet" and mixer.get("lrpe"):
            mixer.update(grid_shape=(rows, cols), num_prefix=1)
        x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
        for i in range(self.num_layers):
            rate = self.drop_path * i / max(self.num_layers - 1, 1)
            x = ResidualBlock(mixer, self.mlp_dim, mixer_kind=self.mixer_kind,
                              channel_mixer=self.channel_mixer, dropout=self.dropout,
                              drop_path=rate, norm=self.norm, **dtypes, name=f"block_{i}")(
                x, mask, deterministic=deterministic, orders=orders)
        x = make_norm(self.norm, **dtypes, name="final_norm")(x).astype(jnp.float32)
        pooled = x[:, 0] if self.pooling == "cls" else jnp.mean(x[:, 1:L], axis=1)
        return nn.Dense(
            self.num_classes, dtype=jnp.float32, param_dtype=self.param_dtype, name="head",
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                     ("embed", "classes")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("classes",)))(pooled)
