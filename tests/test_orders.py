"""lion_attention(orders=...): the average of the masks of several token orders (LION-S v2,
paper C.8), on every form, against a float64 reference that builds each order's mask by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax import ops

TOL = {np.float64: 1e-10, np.float32: 1e-5}


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(x)), "non-finite values"
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def explicit(q, k, v, a, orders, normalize, eps=1e-6):
    """numpy float64: each order's LION mask on the permuted sequence, rows and columns put
    back, averaged; then ``(S * M) [v | 1]`` and SCALE (a per head ``[B, L, H]`` or per value
    feature ``[B, L, H, V]``)."""
    q, k, v, a = (np.asarray(x, np.float64) for x in (q, k, v, a))
    L = q.shape[1]
    per_value = a.ndim == 4
    mask = 0.0
    for p in orders:
        inv = np.argsort(p)
        A = np.cumsum(a[:, p], axis=1)[:, inv]  # token coordinates
        A = np.moveaxis(A, 1, -1)  # [B, H(, V), L]
        mask = mask + np.exp(-np.abs(A[..., :, None] - A[..., None, :]))
    mask = mask / len(orders)
    s = np.einsum("bihk,bjhk->bhij", q, k)
    if per_value:
        num = np.einsum("bhij,bhvij,bjhv->bihv", s, mask, v)
        den = np.einsum("bhij,bhvij->bihv", s, mask)
    else:
        num = np.einsum("bhij,bjhv->bihv", s * mask, v)
        den = np.einsum("bhij->bih", s * mask)[..., None]
    assert num.shape[1] == L
    return num / (den + eps) if normalize else num


def make(rng, B, L, H, K, V, dtype, per_value):
    q = jnp.asarray(np.abs(rng.standard_normal((B, L, H, K))), dtype)
    k = jnp.asarray(np.abs(rng.standard_normal((B, L, H, K))), dtype)
    v = jnp.asarray(rng.standard_normal((B, L, H, V)), dtype)
    a = jnp.asarray(rng.uniform(-1.0, 0.0, (B, L, H, V) if per_value else (B, L, H)), dtype)
    return q, k, v, a


@pytest.mark.parametrize("impl", ["attention", "recurrent", "chunk", "pallas"])
@pytest.mark.parametrize("per_value", [False, True])
def test_forms_match_the_explicit_average(rng, impl, per_value):
    B, L, H, K, V = 2, 23, 2, 16, 16
    dtype = np.float32 if impl == "pallas" else np.float64
    orders = [rng.permutation(L), np.arange(L), rng.permutation(L)]
    with jax.enable_x64(dtype == np.float64):
        q, k, v, a = make(rng, B, L, H, K, V, dtype, per_value)
        for normalize in (True, False):
            y = ops.lion_attention(q, k, v, a, impl=impl, normalize=normalize, orders=orders,
                                   chunk_size=16)
            assert y.dtype == dtype
            err = rel_err(y, explicit(q, k, v, a, orders, normalize))
            assert err <= TOL[dtype], (normalize, err)


@pytest.mark.parametrize("impl", ["recurrent", "chunk", "pallas"])
def test_gradients_match_the_materialized_form(rng, impl):
    B, L, H, K, V = 1, 19, 2, 16, 16
    orders = [rng.permutation(L), rng.permutation(L)]
    q, k, v, a = make(rng, B, L, H, K, V, np.float32, False)
    dy = jnp.asarray(rng.standard_normal(v.shape), jnp.float32)

    def grads(impl):
        fn = lambda *x: ops.lion_attention(*x, impl=impl, orders=orders, chunk_size=16)  # noqa
        return jax.vjp(fn, q, k, v, a)[1](dy)

    for name, got, want in zip("qkva", grads(impl), grads("attention")):
        assert rel_err(got, want) <= 1e-5, name


def test_one_identity_order_is_plain_lion(rng):
    q, k, v, a = make(rng, 2, 30, 2, 8, 8, np.float32, False)
    for impl in ("attention", "chunk"):
        with_order = ops.lion_attention(q, k, v, a, impl=impl, orders=[np.arange(30)])
        assert rel_err(with_order, ops.lion_attention(q, k, v, a, impl=impl)) <= 1e-6


def test_auto_picks_the_form_as_without_orders(rng):
    """Short sequences: the kernels on a GPU (lion_dense, once per order), the materialized
    form (one masked product for all orders) on CPU."""
    q, k, v, a = make(rng, 1, 20, 1, 8, 8, np.float32, False)
    orders = [rng.permutation(20), rng.permutation(20)]
    jaxpr = str(jax.make_jaxpr(lambda *x: ops.lion_attention(*x, orders=orders))(q, k, v, a))
    assert "gather" in jaxpr and "scan" not in jaxpr
    assert ("pallas_call" in jaxpr) == (jax.default_backend() == "gpu")


def test_bad_orders_are_one_line(rng):
    q, k, v, a = make(rng, 1, 6, 1, 8, 8, np.float32, False)
    for orders, match in [([np.arange(5)], r"orders\[0\] is not a permutation of the 6 tokens"),
                          ([np.array([0, 1, 2, 3, 4, 4])], r"orders\[0\] is not a permutation"),
                          ([], "at least one permutation"),
                          (3, "must be a sequence of permutations")]:
        with pytest.raises(ValueError, match=match) as e:
            ops.lion_attention(q, k, v, a, orders=orders)
        assert "\n" not in str(e.value)
