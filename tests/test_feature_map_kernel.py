"""pallas_kernels.feature_map (the one-pass silu_l2 kernels) against the XLA feature maps of
lion_jax.layers.feature_maps in float64, forward and gradient, and LionAttention's use of it.
CPU (default): the Pallas interpreter. GPU: ``LION_TEST_GPU=1 pytest
tests/test_feature_map_kernel.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.layers import feature_maps
from lion_jax.layers import lion as lion_module
from pallas_kernels import feature_map, qkv_map

ON_GPU = jax.default_backend() == "gpu"
TOL = {jnp.float32: 1e-3 if ON_GPU else 1e-5, jnp.bfloat16: 5e-3}  # ARCHITECTURE.md section 6
MAPS = {"silu_l2": 0.5, "silu_l2_noshift": 0.0}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)), "non-finite values in the kernel's result"
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def value_and_grad(fn, x, g):
    y, vjp = jax.vjp(fn, x)
    return y, vjp(g)[0]


@pytest.mark.parametrize("name", list(MAPS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(3, 37, 2, 24), (1, 131, 5), (2, 64), (7, 3, 100)],
                         ids=["K24", "K5", "K64", "K100"])
def test_matches_the_xla_map_in_float64(rng, name, dtype, shape):
    """Random inputs at several scales, rows not a multiple of ``ROWS``, odd head dims: the
    kernel's map and gradient against the XLA map in float64 (of the same rounded input)."""
    scale = rng.choice([0.1, 1.0, 4.0])
    x = jnp.asarray(rng.standard_normal(shape) * scale, dtype)
    g = jnp.asarray(rng.standard_normal(shape), dtype)
    y, dx = value_and_grad(lambda x: feature_map.silu_l2(x, shift=MAPS[name]), x, g)
    assert y.dtype == dtype and dx.dtype == dtype and y.shape == shape
    with jax.enable_x64(True):
        y64, dx64 = value_and_grad(feature_maps.get_feature_map(name),
                                   *(jnp.asarray(np.asarray(t, np.float64)) for t in (x, g)))
    assert rel_err(y, y64) < TOL[dtype]
    assert rel_err(dx, dx64) < TOL[dtype]


def test_zero_rows_and_large_inputs_stay_finite(rng):
    """Rows of zeros (``silu_l2_noshift``: u = 0, where eps keeps the map at 0 and its
    gradient finite) and inputs of +-80 (the sigmoid's saturation)."""
    x = rng.standard_normal((40, 16)) * 80.0
    x[::3] = 0.0
    x = jnp.asarray(x, jnp.float32)
    g = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    for name, shift in MAPS.items():
        y, dx = value_and_grad(lambda x: feature_map.silu_l2(x, shift=shift), x, g)
        y_ref, dx_ref = value_and_grad(feature_maps.get_feature_map(name), x, g)
        assert np.all(np.isfinite(y)) and np.all(np.isfinite(dx))
        np.testing.assert_allclose(y, y_ref, atol=1e-6)
        np.testing.assert_allclose(dx, dx_ref, rtol=1e-5, atol=1e-6)


def test_out_dtype_and_bad_inputs(rng):
    x = jnp.asarray(rng.standard_normal((5, 8)), jnp.bfloat16)
    y = feature_map.silu_l2(x, out_dtype=jnp.float32)
    assert y.dtype == jnp.float32
    ref = feature_maps.silu_l2(x.astype(jnp.float32))
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="silu_l2: the last axis must be in"):
        feature_map.silu_l2(jnp.zeros((2, 300)))
    with pytest.raises(ValueError, match="silu_l2: x must be"):
        feature_map.silu_l2(jnp.zeros((2, 3), jnp.int32))


def test_keep_zeroes_rows_and_their_gradient(rng):
    """``keep``: the rows it drops come out as zeros with zero gradient, the others as
    without it; a ``keep`` that does not broadcast is one error line."""
    x = jnp.asarray(rng.standard_normal((3, 41, 2, 24)), jnp.bfloat16)
    g = jnp.asarray(rng.standard_normal(x.shape), jnp.bfloat16)
    keep = rng.random((3, 41, 1)) < 0.7
    y, dx = value_and_grad(lambda x: feature_map.silu_l2(x, keep=keep), x, g)
    y_all, dx_all = value_and_grad(feature_map.silu_l2, x, g)
    rows = np.broadcast_to(keep, x.shape[:-1])
    assert not np.any(np.asarray(y, np.float32)[~rows])
    assert not np.any(np.asarray(dx, np.float32)[~rows])
    np.testing.assert_array_equal(np.asarray(y)[rows], np.asarray(y_all)[rows])
    np.testing.assert_array_equal(np.asarray(dx)[rows], np.asarray(dx_all)[rows])
    with pytest.raises(ValueError, match="silu_l2: keep must broadcast to"):
        feature_map.silu_l2(x, keep=np.ones((3, 40), bool))


def test_launch_settings_change_nothing_but_speed(rng):
    """Every ``block_rows`` / ``num_warps`` gives the default's result, forward and gradient,
    to one rounding of bf16 (the interpreter's float32 sums over a block's columns may take
    another order); a bad setting is one error line."""
    x = jnp.asarray(rng.standard_normal((5, 19, 3, 24)), jnp.bfloat16)
    g = jnp.asarray(rng.standard_normal(x.shape), jnp.bfloat16)
    keep = rng.random((5, 19, 1)) < 0.8
    want = value_and_grad(lambda x: feature_map.silu_l2(x, keep=keep), x, g)
    for block_rows, num_warps in ((16, 1), (64, 2), (256, 8)):
        got = value_and_grad(lambda x: feature_map.silu_l2(
            x, keep=keep, block_rows=block_rows, num_warps=num_warps), x, g)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                       rtol=2 ** -7, atol=1e-6)
    with pytest.raises(ValueError, match="silu_l2: block_rows must be a power of two"):
        feature_map.silu_l2(x, block_rows=48)


def test_kernel_feature_map_is_for_gpus_and_l2_maps():
    assert feature_maps.kernel_feature_map("elu1") is None
    assert (feature_maps.kernel_feature_map("silu_l2") is not None) == ON_GPU


# kernel offered -> the layer settings under which LionAttention takes it
TAKEN = {"silu_l2": ("plain", "value_dim"), "silu_l2_qkv": ("plain",)}
SETTINGS = {"plain": dict(), "chunk": dict(impl="chunk"), "unnormalised": dict(normalize=False),
            "float32": dict(dtype=jnp.float32), "value_dim": dict(value_dim=8)}


@pytest.mark.parametrize("offer", list(TAKEN))
@pytest.mark.parametrize("setting,padded", [("plain", False), ("plain", True), ("chunk", True),
                                            ("unnormalised", False), ("float32", True),
                                            ("value_dim", False)])
def test_lion_attention_takes_the_kernels_where_only_the_op_follows(rng, monkeypatch, offer,
                                                                    setting, padded):
    """With a kernel offered (as on a GPU; here the interpreter): ``silu_l2`` (the map of q
    and of k) or ``silu_l2_qkv`` (the biases and the map from the merged q/k/v projection,
    values as wide as keys), a bf16 LION-S layer (``impl="auto"``, SCALE) runs it and agrees
    with the XLA layer (separate Dense products, the XLA map), output and parameter gradients,
    at bf16's tolerance, with padded tokens too (the kernels zero the padded keys, ``keep``);
    other impls, no SCALE or a float32 compute dtype keep the XLA layer's every bit."""
    calls = []

    def offered(name):
        calls.append(name)
        if offer == "silu_l2":
            return lambda x, **kw: feature_map.silu_l2(x, shift=MAPS[name], interpret=True, **kw)
        return lambda *a, **kw: qkv_map.silu_l2_qkv(*a, shift=MAPS[name], interpret=True, **kw)

    layer = lion_module.LionAttention(**dict(dict(num_heads=2, head_dim=16, variant="s",
                                                  dtype=jnp.bfloat16), **SETTINGS[setting]))
    x = jnp.asarray(rng.standard_normal((2, 23, 32)), jnp.float32)
    params = layer.init(jax.random.key(int(rng.integers(2 ** 31))), x)
    mask = None
    if padded:  # pads inside and at the end, with large content
        real = np.ones((2, 23), bool)
        real[:, rng.choice(20, size=3, replace=False)] = False
        real[:, 20:] = False
        mask = jnp.asarray(real)
        x = jnp.where(mask[:, :, None], x, 10.0 * x)

    def loss(params):
        y = layer.apply(params, x, mask).astype(jnp.float32)
        return jnp.sum(y * x if mask is None else jnp.where(mask[:, :, None], y * x, 0.0))

    for name in ("kernel_feature_map", "kernel_qkv_map"):
        monkeypatch.setattr(lion_module, name, lambda name: None)
    want, want_grads = jax.value_and_grad(loss)(params)
    monkeypatch.setattr(lion_module, "kernel_feature_map" if offer == "silu_l2"
                        else "kernel_qkv_map", offered)
    got, got_grads = jax.value_and_grad(loss)(params)
    if setting not in TAKEN[offer]:
        assert got == want and jax.tree.all(jax.tree.map(jnp.array_equal, got_grads, want_grads))
        return
    assert calls == (["silu_l2", "silu_l2"] if offer == "silu_l2" else ["silu_l2"])
    assert abs(float(got) - float(want)) < 2e-2 * abs(float(want)) + 1e-2
    flat = lambda t: np.concatenate([np.ravel(np.asarray(a, np.float64))  # noqa: E731
                                     for a in jax.tree.leaves(t)])
    assert rel_err(flat(got_grads), flat(want_grads)) < 2e-2
