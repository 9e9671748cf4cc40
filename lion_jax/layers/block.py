"""The pre-norm residual block, with any token mixer of :data:`MIXERS`."""

from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp

from lion_jax.layers.glu import SwiGlu
from lion_jax.layers.lightnet import LightNetAttention
from lion_jax.layers.lion import LionAttention
from lion_jax.layers.mlp import Mlp
from lion_jax.layers.norms import SEQUENCE_NORMS, check_norm, sequence_norm
from lion_jax.layers.s5 import S5Mixer
from lion_jax.layers.softmax import SoftmaxAttention

MIXERS = {"lion": LionAttention, "softmax": SoftmaxAttention, "lightnet": LightNetAttention,
          "s5": S5Mixer}  # S5: the LRA reference (lion_jax/layers/s5.py)
# GELU MLP (ViT, BERT); SwiGLU (LightNet's GLU); S5's one-branch GELU + half-GLUs (its LRA layers)
CHANNEL_MIXERS = ("mlp", "swiglu", "half_glu", "half_glu2")
# set by the model that holds the mixer, never in its ``mixer`` keyword arguments
RESERVED_MIXER_KEYS = ("num_heads", "head_dim", "dtype", "param_dtype")


def make_mixer(kind: str, **kwargs) -> nn.Module:
    """The token mixer ``MIXERS[kind](**kwargs)``, built (and so checked) now.

    Raises:
      ValueError: an unknown kind, an unknown keyword or a bad value, in one line naming it.
    """
    if kind not in MIXERS:
        raise ValueError(f"unknown mixer kind {kind!r}; valid: {list(MIXERS)}")
    try:
        return MIXERS[kind](**kwargs)
    except TypeError as e:  # an unknown keyword argument
        raise ValueError(f"{kind} mixer: {e}".replace(".__init__()", "")) from None


def model_mixer_kwargs(owner: str, kind: str, mixer: Mapping[str, Any], *, d_model: int,
                       num_heads: int, head_dim: int | None) -> dict:
    """The keyword arguments of a model's mixer: ``mixer`` plus ``num_heads`` and ``head_dim``
    (None = ``d_model // num_heads``), checked by building the mixer now.

    Raises:
      ValueError: in one line naming the problem (``owner`` is the model's name).
    """
    reserved = sorted(set(mixer) & set(RESERVED_MIXER_KEYS))
    if reserved:
        raise ValueError(f"set {reserved} on {owner}, not in mixer")
    if head_dim is None and d_model % num_heads:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}; set "
                         "head_dim")
    if kind not in MIXERS:
        raise ValueError(f"unknown mixer_kind {kind!r}; valid: {list(MIXERS)}")
    kwargs = dict(num_heads=num_heads, head_dim=head_dim or d_model // num_heads, **mixer)
    try:
        make_mixer(kind, parent=None, **kwargs)  # unbound: a check, not a submodule
    except ValueError as e:
        raise ValueError(f"mixer: {e}") from None
    return kwargs


class ResidualBlock(nn.Module):
    """Pre-norm residual block ``[B, L, D] -> [B, L, D]``::

        x = x + DropPath(Dropout(Mixer(Norm(x), mask)))
        x = x + DropPath(Dropout(Mlp(Norm(x))))

    (``Mlp`` is the GELU MLP, or with ``channel_mixer="swiglu"`` a SwiGLU of the same hidden
    width, LightNet's GLU layer.) ``channel_mixer="half_glu"`` is the layer of S5's LRA models
    (Smith et al. 2023, its ``half_glu1`` activation), whose model sizes the LION paper's LRA
    runs take (App. D.2): one residual branch and no MLP (``mlp_dim`` unused)::

        h = Dropout(gelu(Mixer(Norm(x), mask)))
        x = x + DropPath(Dropout(h * sigmoid(Dense(h))))

    ``channel_mixer="half_glu2"`` is S5's ``half_glu2``, the layer of its ListOps and IMDb
    scripts: the GELU feeds only the gate, the mixer's output passes ungated by it::

        m = Mixer(Norm(x), mask)
        x = x + DropPath(Dropout(m * sigmoid(Dense(Dropout(gelu(m))))))

    Attributes:
      mixer: keyword arguments of the mixer (``num_heads``, ``head_dim``, ``variant``,
        ``impl``, ...), except ``dtype`` and ``param_dtype`` (taken from here).
      mlp_dim: hidden width of the MLP.
      mixer_kind: a key of :data:`MIXERS` (``"lion"``: :class:`LionAttention`,
        ``"softmax"``: :class:`SoftmaxAttention`, ``"lightnet"``: :class:`LightNetAttention`).
      channel_mixer: ``"mlp"``, ``"swiglu"``, ``"half_glu"`` or ``"half_glu2"``
        (:data:`CHANNEL_MIXERS`).
      dropout: rate of the residual-branch dropouts and the MLP's inner dropout.
      drop_path: stochastic depth: the rate at which a residual branch is dropped for a whole
        example in training (the kept ones scaled by ``1 / (1 - rate)``).
      norm: ``"layernorm"``, ``"rmsnorm"`` or ``"batchnorm"`` (S5's, over the batch's real
        tokens, :class:`lion_jax.layers.norms.SequenceBatchNorm`; its running statistics are
        the ``batch_stats`` collection, mutable in training).
      bn_momentum: the running statistics' momentum of ``"batchnorm"``.
      dtype, param_dtype: compute and parameter dtypes.
    """

    mixer: Mapping[str, Any]
    mlp_dim: int
    mixer_kind: str = "lion"
    channel_mixer: str = "mlp"
    dropout: float = 0.0
    drop_path: float = 0.0
    norm: str = "layernorm"
    bn_momentum: float = 0.9
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        check_norm(self.norm, SEQUENCE_NORMS)
        if self.channel_mixer not in CHANNEL_MIXERS:
            raise ValueError(f"unknown channel_mixer {self.channel_mixer!r}; valid: "
                             f"{list(CHANNEL_MIXERS)}")
        if self.mixer_kind not in MIXERS:
            raise ValueError(f"unknown mixer kind {self.mixer_kind!r}; valid: {list(MIXERS)}")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray | None = None, *,
                 deterministic: bool = True, orders=None) -> jnp.ndarray:
        """``x [B, L, D]``, ``mask [B, L]`` bool (True = real token) -> ``[B, L, D]``;
        ``orders``: token orders for a LION mixer (:class:`LionAttention`), else None."""
        dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)

        def branch(h):  # dropout, then drop the whole branch of an example (stochastic depth)
            h = nn.Dropout(self.dropout)(h, deterministic=deterministic)
            return nn.Dropout(self.drop_path, broadcast_dims=(1, 2))(
                h, deterministic=deterministic)

        def norm(h, name):
            return sequence_norm(self.norm, h, mask, deterministic=deterministic,
                                 bn_momentum=self.bn_momentum, **dtypes, name=name)

        h = norm(x, "mixer_norm")
        mixer = MIXERS[self.mixer_kind](**self.mixer, **dtypes, name="mixer")
        if orders is not None:
            if self.mixer_kind != "lion":
                raise ValueError(f"token orders are for the LION mixer; got mixer_kind="
                                 f"{self.mixer_kind!r}, whose output does not depend on them")
            h = mixer(h, mask, orders=orders)
        else:
            h = mixer(h, mask)
        if self.channel_mixer in ("half_glu", "half_glu2"):
            g = nn.Dropout(self.dropout)(nn.gelu(h), deterministic=deterministic)
            gate = nn.Dense(x.shape[-1], **dtypes, name="glu", kernel_init=(
                nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))),
                bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(g)
            return x + branch((g if self.channel_mixer == "half_glu" else h) * nn.sigmoid(gate))
        x = x + branch(h)
        h = norm(x, "mlp_norm")
        if self.channel_mixer == "swiglu":
            h = SwiGlu(self.mlp_dim, init_std=None, **dtypes, name="mlp")(h)
        else:
            h = Mlp(self.mlp_dim, dropout=self.dropout, **dtypes, name="mlp")(
                h, deterministic=deterministic)
        return x + branch(h)
