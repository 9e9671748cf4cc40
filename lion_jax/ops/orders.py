"""Several token orders in one LION mask (LION-S v2, paper C.8 / Figure 7).

An order is a permutation ``p`` of the L tokens: the decays are accumulated along it,
``A'_s = sum_{r <= s} a_{p[r]}``, and token ``i`` (at position ``inv[i]`` of the walk,
``inv = argsort(p)``) gets ``A^p_i = A'_{inv[i]}``. Its mask is ``M^p_ij = exp(-|A^p_i - A^p_j|)``
(the LION mask of the permuted sequence, put back in token coordinates), and with several
orders LION uses their average, ``M = mean_p M^p``, in numerator and denominator alike: SCALE
divides ``sum_j s_ij M_ij v_j`` by ``sum_j s_ij M_ij``.

The materialized form averages the masks (:func:`mask_in_order` builds each in walk order, where
the cumulative sums fall along the sequence as the mask's formula needs, and puts it back); the
other forms run once per order on the permuted tokens (:func:`permute_tokens`) and average the
outputs put back in place, which is the same sum.
"""

import jax
import jax.numpy as jnp
import numpy as np


def check_orders(name, orders, length):
    """``orders`` as a tuple of int64 numpy permutations of ``range(length)``; ValueError (one
    line, naming ``name``) for anything else."""
    try:
        arrays = tuple(np.asarray(p) for p in orders)
    except TypeError:
        raise ValueError(f"{name}: orders must be a sequence of permutations of the {length} "
                         f"tokens; got {type(orders).__name__}") from None
    if not arrays:
        raise ValueError(f"{name}: orders must hold at least one permutation; got none")
    for n, p in enumerate(arrays):
        if (p.shape != (length,) or not np.issubdtype(p.dtype, np.integer)
                or not np.array_equal(np.sort(p), np.arange(length))):
            raise ValueError(f"{name}: orders[{n}] is not a permutation of the {length} tokens "
                             f"(shape {p.shape}, dtype {p.dtype})")
    return tuple(p.astype(np.int64) for p in arrays)


def permute_tokens(x, order, axis=1):
    """``x`` gathered by the permutation ``order [L]`` (numpy) along ``axis`` (the tokens of
    ``[B, L, ...]`` by default; None passes through), whose gradient is the inverse
    permutation's gather: not the scatter-add that differentiating a gather gives (a
    permutation's cotangents never collide)."""
    if x is None:
        return None
    order = np.asarray(order)
    inverse = np.argsort(order)
    take = lambda t, idx: jnp.take(t, idx, axis=axis, mode="clip")  # noqa: E731  (in bounds)

    @jax.custom_vjp
    def permute(x):
        return take(x, order)

    permute.defvjp(lambda x: (take(x, order), None), lambda _, dy: (take(dy, inverse),))
    return permute(x)


def mask_in_order(mask_fn, log_decay, order):
    """The mask of ``log_decay [B, L, H(, V)]`` along ``order`` in token coordinates,
    ``[B, H(, V), L, L]``: ``mask_fn`` (e.g. ``masks.bidirectional_mask``, which needs the
    cumulative sums in walk order) on the permuted decays, rows and columns put back."""
    walked = jnp.cumsum(permute_tokens(log_decay, order), axis=1)
    mask = mask_fn(jnp.moveaxis(walked, 1, -1))
    inverse = np.argsort(np.asarray(order))
    return permute_tokens(permute_tokens(mask, inverse, axis=-1), inverse, axis=-2)


def average_in_orders(form, orders, q, k, v, log_decay):
    """``mean_p unpermute(form(permuted q, k, v, log_decay))``: a numerator form (linear in
    its mask) under the average of the orders' masks."""
    total = 0.0
    for order in orders:
        y = form(*(permute_tokens(x, order) for x in (q, k, v, log_decay)))
        total = total + permute_tokens(y, np.argsort(order))
    return total / len(orders)
