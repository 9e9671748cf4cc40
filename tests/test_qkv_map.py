"""pallas_kernels.qkv_map (the biases and silu_l2 of q and k applied to a merged q/k/v
projection in one pass each way) against a float64 reference of a Dense layer's bias add and
lion_jax.layers.feature_maps' map, forward and gradients (LionAttention's use of it:
tests/test_feature_map_kernel.py).
CPU (default): the Pallas interpreter. GPU: ``LION_TEST_GPU=1 pytest tests/test_qkv_map.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.layers import feature_maps
from pallas_kernels import qkv_map

ON_GPU = jax.default_backend() == "gpu"
TOL = {jnp.float32: 1e-3 if ON_GPU else 1e-5, jnp.bfloat16: 5e-3}  # ARCHITECTURE.md section 6
SHIFTS = {"silu_l2": 0.5, "silu_l2_noshift": 0.0}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)), "non-finite values in the kernel's result"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def reference(p, bias, heads, name, keep, dtype):
    """q, k, v in float64 from ``p`` and the bias as the compute dtype rounds their sum."""
    H = heads
    K = p.shape[-1] // (3 * H)
    x = (p + bias.astype(dtype).astype(p.dtype)).reshape(*p.shape[:-1], 3, H, K)
    f = feature_maps.get_feature_map(name)
    k = f(x[..., 1, :, :]) * jnp.asarray(keep, x.dtype)[..., None, None]
    return f(x[..., 0, :, :]), k, x[..., 2, :, :]


@pytest.mark.parametrize("name", list(SHIFTS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("lead,heads,dim", [((3, 37), 2, 24), ((131,), 3, 64), ((2, 5), 1, 5)],
                         ids=["K24", "K64", "K5"])
def test_matches_the_float64_reference(rng, name, dtype, lead, heads, dim):
    """Random projections at several scales, row counts that are not a multiple of the
    block, odd head dims, random kept rows: q, k, v and the gradients of p and the bias
    against float64 (of the rounded inputs and the rounded ``p + b``)."""
    width = 3 * heads * dim
    p = jnp.asarray(rng.standard_normal((*lead, width)) * rng.choice([0.3, 1.0, 4.0]), dtype)
    bias = jnp.asarray(rng.standard_normal(width) * 0.5, jnp.float32)
    keep = rng.random(lead) < 0.8
    gs = tuple(jnp.asarray(rng.standard_normal((*lead, heads, dim)), dtype) for _ in range(3))
    out, vjp = jax.vjp(lambda p, b: qkv_map.silu_l2_qkv(p, b, heads, shift=SHIFTS[name],
                                                        keep=keep), p, bias)
    dp, db = vjp(gs)
    assert [t.dtype for t in out] == [dtype] * 3 and dp.dtype == dtype
    assert db.dtype == jnp.float32 and db.shape == bias.shape
    with jax.enable_x64(True):
        f64 = lambda t: jnp.asarray(np.asarray(t, np.float64))  # noqa: E731
        # the kernel adds the bias as the compute dtype rounds it, and rounds the sum
        x = f64(jnp.asarray(p, jnp.float32) + jnp.asarray(bias.astype(dtype), jnp.float32))
        x = f64(jnp.asarray(x, dtype))
        want, vjp64 = jax.vjp(lambda x: reference(x, jnp.zeros(width), heads, name, keep,
                                                  jnp.float64), x)
        dx64, = vjp64(tuple(f64(g) for g in gs))
    for got, ref in zip(out, want):
        assert rel_err(got, ref) < TOL[dtype]
    assert rel_err(dp, dx64) < TOL[dtype]
    # the bias's gradient: column sums of the kernel's own rounded dp
    assert rel_err(db, np.asarray(dp, np.float64).reshape(-1, width).sum(0)) < 1e-5
    assert rel_err(db, np.asarray(dx64).reshape(-1, width).sum(0)) < TOL[dtype]


def test_dropped_rows_and_large_inputs(rng):
    """Rows that keep drops have k = 0 and no gradient through k; inputs of +-80 stay
    finite; the values' part is the rounded p + b and its gradient the cotangent."""
    p = rng.standard_normal((40, 3 * 2 * 16)) * 80.0
    p[::4] = 0.0
    p = jnp.asarray(p, jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(p.shape[-1]), jnp.float32)
    keep = np.arange(40) % 3 != 0
    (q, k, v), vjp = jax.vjp(lambda p: qkv_map.silu_l2_qkv(p, bias, 2, keep=keep), p)
    assert np.all(np.asarray(k)[~keep] == 0) and np.all(np.isfinite(np.asarray(q, np.float32)))
    np.testing.assert_array_equal(
        np.asarray(v), np.asarray((p + bias.astype(jnp.bfloat16)).reshape(40, 3, 2, 16)[:, 2]))
    gs = tuple(jnp.asarray(rng.standard_normal((40, 2, 16)), jnp.bfloat16) for _ in range(3))
    dp = np.asarray(vjp(gs)[0], np.float32).reshape(40, 3, 2, 16)
    assert np.all(np.isfinite(dp)) and np.all(dp[~keep, 1] == 0)
    np.testing.assert_array_equal(dp[:, 2], np.asarray(gs[2], np.float32))


def test_launch_settings_and_bad_inputs(rng):
    """Every ``block_rows`` / ``num_warps`` gives the default's results, to one rounding of
    bf16 (the interpreter's float32 sums over a block's columns may take another order) and
    the bias's gradient, the column sums of the rounded dp, to those dp's differences plus the
    bound on reordering a float32 sum (its partial sums follow the blocks); bad inputs are one
    error line naming the problem."""
    p = jnp.asarray(rng.standard_normal((5, 19, 3 * 3 * 24)), jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(p.shape[-1]), jnp.float32)
    gs = tuple(jnp.asarray(rng.standard_normal((5, 19, 3, 24)), jnp.bfloat16) for _ in range(3))

    def run(**kw):
        out, vjp = jax.vjp(lambda p, b: qkv_map.silu_l2_qkv(p, b, 3, keep=None, **kw), p, bias)
        return out, vjp(gs)
    want = run()
    for block_rows, num_warps in ((16, 1), (128, 8)):
        (out, (dp, db)) = run(block_rows=block_rows, num_warps=num_warps)
        for a, b in zip((*out, dp), (*want[0], want[1][0])):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                       rtol=2 ** -7, atol=1e-6)
        # db sums the rounded dp: it moves by their differences (a dp one bf16 rounding off)
        # plus, summing n terms in another order, at most n eps sum|terms|.
        terms = np.abs(np.asarray(want[1][0], np.float32)).reshape(-1, p.shape[-1])
        moved = np.abs(np.asarray(dp, np.float32) - np.asarray(want[1][0], np.float32))
        np.testing.assert_array_less(
            np.abs(np.asarray(db) - np.asarray(want[1][1])),
            moved.reshape(terms.shape).sum(0) + len(terms) * 2 ** -24 * terms.sum(0) * 1.01
            + 1e-30)
    for args, match in (((p, bias, 5), "must be 3 \\* heads \\* K"),
                        ((p, bias[:-1], 3), "bias must have"),
                        ((p.astype(jnp.int32), bias, 3), "float32, bfloat16 or float16"),
                        ((jnp.zeros((4, 3 * 300)), jnp.zeros(900), 1), "at most 256")):
        with pytest.raises(ValueError, match="silu_l2_qkv: .*" + match):
            qkv_map.silu_l2_qkv(*args)
    with pytest.raises(ValueError, match="keep must broadcast"):
        qkv_map.silu_l2_qkv(p, bias, 3, keep=np.ones(7, bool))
    with pytest.raises(ValueError, match="block_rows must be a power of two"):
        qkv_map.silu_l2_qkv(p, bias, 3, block_rows=48)
