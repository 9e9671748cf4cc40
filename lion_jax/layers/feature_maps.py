"""Feature maps ``phi`` applied to queries and keys of linear attention (``[..., K] -> [..., K]``).

Linear attention scores are ``s_ij = phi(q_i) . phi(k_j)``. Under LION's SCALE normalisation
(``y_i = sum_j s_ij M_ij v_j / sum_j s_ij M_ij``) the scores should be non-negative, otherwise the
denominator can cross zero; the non-normalised variants (LION-RETNET, xLSTM's ``max(c, 1)``) do
not need that.

Names and where the paper uses them:

- ``elu1``: ``elu(x) + 1`` (Katharopoulos et al.), LION-LIT (paper Sec. 5.3 and Table 13).
- ``silu_l2``: ``u / ||u||_2`` with ``u = silu(x) + 0.5``, normalised over the head dim (last
  axis). Our reading of Table 13: the paper prints the LION-S map as ``SILU(x)/||SILU(x)||``
  without a shift, while the official implementation (as summarised in
  ``papers/digests/prior-art.md``; LION-D and LION-S) adds 0.5 before normalising. We default
  to the shifted form: ``silu >= -0.279``, so every entry of ``u`` is positive, every score
  ``s_ij`` lies in ``(0, 1]`` and SCALE is well defined. The literal Table 13 form is
  ``silu_l2_noshift``.
- ``silu_l2_noshift``: ``silu(x) / ||silu(x)||_2`` (Table 13 as printed); scores may be negative.
- ``sigmoid``: LRA ablation [1] of paper Table 6 (bounded features, used without scaling).
- ``relu``: LRA ablation [2] of paper Table 6.
- ``identity``: no feature map (RetNet, xLSTM's mLSTM).
- ``constant``: ``K**-0.25`` whatever the input (not a paper's map; a probe): every score is
  ``sqrt(K)``, which an unscaled layer's ``K**-0.5`` on ``q`` makes exactly 1 (under SCALE
  any constant cancels). The mixer is then its decay mask alone, a fixed linear filter of the
  values (S5's kind of layer with LION-D's decays), and queries and keys get no gradient: it
  separates what the mask does from what the scores do (docs/pathfinder.md).
"""

import functools
from typing import Callable

import jax
import jax.numpy as jnp

FeatureMap = Callable[[jnp.ndarray], jnp.ndarray]

_SILU_SHIFT = 0.5
_L2_EPS = 1e-6  # added to the squared norm: keeps phi(0) = 0 and its gradient finite


def _l2_normalize(x: jnp.ndarray) -> jnp.ndarray:
    """``x / sqrt(||x||^2 + eps)`` over the last axis."""
    return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + _L2_EPS)


def elu1(x: jnp.ndarray) -> jnp.ndarray:
    """``elu(x) + 1``: positive features (LION-LIT)."""
    return jax.nn.elu(x) + 1.0


def silu_l2(x: jnp.ndarray) -> jnp.ndarray:
    """``(silu(x) + 0.5) / ||silu(x) + 0.5||_2`` over the last axis: positive, unit norm."""
    return _l2_normalize(jax.nn.silu(x) + _SILU_SHIFT)


def silu_l2_noshift(x: jnp.ndarray) -> jnp.ndarray:
    """``silu(x) / ||silu(x)||_2`` over the last axis (paper Table 13 as printed)."""
    return _l2_normalize(jax.nn.silu(x))


def identity(x: jnp.ndarray) -> jnp.ndarray:
    """No feature map."""
    return x


def constant(x: jnp.ndarray) -> jnp.ndarray:
    """``K**-0.25`` everywhere, ``K = x.shape[-1]``: scores ``sqrt(K)`` independent of ``x``."""
    return jnp.full_like(x, x.shape[-1] ** -0.25)


FEATURE_MAPS: dict[str, FeatureMap] = {
    "elu1": elu1,
    "silu_l2": silu_l2,
    "silu_l2_noshift": silu_l2_noshift,
    "sigmoid": jax.nn.sigmoid,
    "relu": jax.nn.relu,
    "identity": identity,
    "constant": constant,
}


def get_feature_map(name: str) -> FeatureMap:
    """Returns the feature map called ``name`` (see the module docstring).

    Raises:
      ValueError: for an unknown name; the message lists the valid ones.
    """
    try:
        return FEATURE_MAPS[name]
    except KeyError:
        raise ValueError(
            f"unknown feature map {name!r}; valid names: {sorted(FEATURE_MAPS)}") from None


# The maps with a Pallas kernel (pallas_kernels.feature_map), by their shift.
_KERNEL_SHIFTS = {"silu_l2": _SILU_SHIFT, "silu_l2_noshift": 0.0}


def kernel_feature_map(name: str) -> FeatureMap | None:
    """Feature map ``name`` as a one-pass Pallas kernel (``pallas_kernels.feature_map``; the
    result in its input's dtype, computed in float32) when the default backend is a GPU and
    the map has one (``silu_l2``, ``silu_l2_noshift``); else None."""
    if name not in _KERNEL_SHIFTS or jax.default_backend() != "gpu":
        return None
    try:
        from pallas_kernels import feature_map
    except ImportError:
        return None
    return functools.partial(feature_map.silu_l2, shift=_KERNEL_SHIFTS[name], eps=_L2_EPS)


def kernel_qkv_map(name: str):
    """Feature map ``name`` applied by ``pallas_kernels.qkv_map.silu_l2_qkv`` to a merged
    query, key and value projection (biases, the map of q and k, padded keys zeroed, in one
    pass each way), when :func:`kernel_feature_map` offers the map's kernel; else None."""
    if kernel_feature_map(name) is None:
        return None
    from pallas_kernels import qkv_map
    return functools.partial(qkv_map.silu_l2_qkv, shift=_KERNEL_SHIFTS[name], eps=_L2_EPS)
