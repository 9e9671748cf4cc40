"""LightNet Attention (lion_jax.layers.lightnet): the causal forms against each other and the
digest's parallel form, the one-scan identity, permutation equivariance, decoding, padding and
argument checks (digest papers/digests/lightnet.md section 6.2, checks 1-4, 8, 9)."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax import ops
from lion_jax.layers.lightnet import (LightNetAttention, additive_decay,
                                      softmax_over_sequence)



@pytest.fixture(autouse=True)
def _float64():
    """float64 inside this module's tests only (a global switch would change every later
    test module's dtypes)."""
    with jax.enable_x64(True):
        yield

B, L, D, H = 2, 37, 12, 3
K = D // H
CAUSAL_IMPLS = ("attention", "recurrent", "chunk")


def _x(rng, shape=(B, L, D), dtype=jnp.float64):
    return jnp.asarray(rng.normal(size=shape), dtype)


def _init(module, x, rng):
    return flax.linen.meta.unbox(module.init(jax.random.PRNGKey(int(rng.integers(2**31))), x))


def _scale_key_logits(params, x, top):
    """Scales the key (and decay) kernels so the largest |logit| is ``top``."""
    params = jax.tree_util.tree_map(lambda a: a, flax.core.unfreeze(params))
    p = params["params"]
    kernel = p["key"]["kernel"]
    p["key"]["kernel"] = kernel * (top / jnp.abs(x @ kernel).max())
    if "decay_up" in p:
        f = (x @ p["decay_down"]["kernel"]) @ p["decay_up"]["kernel"]
        p["decay_up"]["kernel"] = p["decay_up"]["kernel"] * (top / jnp.abs(f).max())
    return params


def _assert_close(a, b, tol):
    a, b = np.asarray(a), np.asarray(b)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def _silu(x):
    return x / (1 + np.exp(-x))


# ----------------------------------------------------------------------------------------------
# the core recurrence (op level)


@pytest.mark.parametrize("top", [3.0, 50.0])
def test_additive_recurrence_matches_digest_forms(rng, top):
    """kbar / log-decay on causal_linear_attention == the digest's parallel form
    A_ts = sum_i phi(q_t)_i exp(k_si - z_ti) (checks 1, 2), for every impl, including key
    logits of +-50; the final state == softmax_seq(K)^T V and z == logsumexp(K) (check 3)."""
    q = rng.normal(size=(B, L, H, K))
    k = rng.normal(size=(B, L, H, K))
    k = k * (top / np.abs(k).max())
    v = rng.normal(size=(B, L, H, K + 1))
    # reference (float64 numpy, per batch and head)
    z = np.logaddexp.accumulate(k, axis=1)
    w = np.exp(k[:, None, :] - z[:, :, None])  # [B, t, s, H, K]
    scores = np.einsum("bthi,btshi->bhts", _silu(q), w) * np.tril(np.ones((L, L)))
    ref = np.einsum("bhts,bshv->bthv", scores, v)
    soft = np.exp(k - k.max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    ref_state = np.einsum("blhk,blhv->bhkv", soft, v)

    w, log_decay, z_last = additive_decay(jnp.asarray(k))
    assert np.isfinite(np.asarray(log_decay)).all() and float(log_decay.max()) <= 0
    _assert_close(z_last, z[:, -1], 1e-12)
    for impl in CAUSAL_IMPLS:
        y, S = ops.causal_linear_attention(jax.nn.silu(jnp.asarray(q)), w, jnp.asarray(v),
                                           log_decay, impl=impl, chunk_size=8,
                                           return_final_state=True)
        _assert_close(y, ref, 1e-10)
        _assert_close(S, ref_state, 1e-10)


def test_additive_decay_gradients_finite_at_extreme_logits(rng):
    k = jnp.asarray(rng.choice([-50.0, 50.0], size=(B, L, H, K)))
    z0 = jnp.asarray(rng.normal(size=(B, H, K)))

    def loss(k, z0):
        w, a, z = additive_decay(k, z0)
        return jnp.sum(w ** 2) + jnp.sum(jnp.tanh(a)) + jnp.sum(z)

    for z0_ in (None, z0):
        grads = jax.jit(jax.grad(lambda k: loss(k, z0_)))(k)
        assert np.isfinite(np.asarray(grads)).all()


def test_softmax_over_sequence_mask(rng):
    k = jnp.asarray(rng.normal(size=(B, L, H, K)) * 30)
    mask = jnp.asarray(rng.random((B, L)) < 0.6).at[:, 0].set(True)
    w = softmax_over_sequence(k, mask)
    assert float(jnp.abs(jnp.where(mask[:, :, None, None], 0.0, w)).max()) == 0.0
    _assert_close(w.sum(1), np.ones((B, H, K)), 1e-12)
    ref = jax.nn.softmax(jnp.where(mask[:, :, None, None], k, -jnp.inf), axis=1)
    _assert_close(w, ref, 1e-12)
    assert not np.asarray(softmax_over_sequence(k, jnp.zeros((B, L), bool))).any()


# ----------------------------------------------------------------------------------------------
# the module, causal


@pytest.mark.parametrize("share_decay", [True, False])
@pytest.mark.parametrize("top", [None, 50.0])
def test_causal_impls_agree_forward_and_gradients(rng, share_decay, top):
    x = _x(rng)
    mixer = LightNetAttention(num_heads=H, causal=True, share_decay=share_decay, chunk_size=8,
                              param_dtype=jnp.float64)
    params = _init(mixer, x, rng)
    if top is not None:
        params = _scale_key_logits(params, x, top)
    dy = _x(rng)

    def forms(params, x):  # outputs and gradients of the three forms
        def loss(params, x, impl):
            return jnp.sum(mixer.clone(impl=impl).apply(params, x) * dy.astype(x.dtype))

        return {impl: (mixer.clone(impl=impl).apply(params, x),
                       jax.grad(loss, argnums=(0, 1))(params, x, impl)) for impl in CAUSAL_IMPLS}

    results = forms(params, x)
    y_ref, g_ref = results["attention"]
    for impl in ("recurrent", "chunk"):
        y, g = results[impl]
        _assert_close(y, y_ref, 1e-10)
        jax.tree_util.tree_map(lambda a, b: _assert_close(a, b, 1e-9), g, g_ref)

    if top is None:
        return
    # float32 at +-50 logits: finite outputs close to float64 for every form, and finite
    # gradients of the training form. Exact float32 matmuls: a GPU's default for float32 is
    # TF32 (10-bit mantissa), whose rounding alone exceeds 1e-3 here.
    p32 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)
    x32 = x.astype(jnp.float32)
    with jax.default_matmul_precision("highest"):
        for impl in CAUSAL_IMPLS:
            _assert_close(mixer.clone(impl=impl).apply(p32, x32), y_ref, 1e-3)
        g32 = jax.grad(lambda p, x: jnp.sum(mixer.clone(impl="chunk").apply(p, x) ** 2),
                       argnums=(0, 1))(p32, x32)
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree_util.tree_leaves(g32))


def test_causal_is_causal(rng):
    x = _x(rng)
    mixer = LightNetAttention(num_heads=H, causal=True, impl="chunk", chunk_size=8,
                              param_dtype=jnp.float64)
    params = _init(mixer, x, rng)
    t = 17
    x2 = x.at[:, t:].set(_x(rng, (B, L - t, D)))
    _assert_close(mixer.apply(params, x2)[:, :t], mixer.apply(params, x)[:, :t], 1e-12)


@pytest.mark.parametrize("share_decay", [True, False])
def test_prefill_then_decoding_equals_full_forward(rng, share_decay):
    L = 23
    x = _x(rng, (B, L, D))
    mixer = LightNetAttention(num_heads=H, causal=True, share_decay=share_decay, impl="chunk",
                              chunk_size=8, param_dtype=jnp.float64)
    params = _init(mixer, x, rng)
    full = mixer.apply(params, x)
    prefill = 13
    y, state = mixer.apply(params, x[:, :prefill], return_state=True)
    outs = [y]
    step = mixer.clone(impl="recurrent")
    for t in range(prefill, L):
        y, state = step.apply(params, x[:, t:t + 1], state=state, offset=t, return_state=True)
        outs.append(y)
    _assert_close(jnp.concatenate(outs, axis=1), full, 1e-10)
    # and the final state is the softmax-over-sequence state with z = logsumexp of the logits
    S, z = state
    logits = (x @ params["params"]["key"]["kernel"]).reshape(B, L, H, K) if share_decay else (
        (x @ params["params"]["decay_down"]["kernel"]) @ params["params"]["decay_up"]["kernel"]
    ).reshape(B, L, H, K)
    _assert_close(z, jax.scipy.special.logsumexp(logits, axis=1), 1e-10)


# ----------------------------------------------------------------------------------------------
# the module, non-causal


def _epilogue(params, x, o):
    """Norm (LayerNorm, no affine) -> * sigmoid(gate) -> W_o, by hand."""
    p = params["params"]
    o = o.reshape(x.shape)
    mu = o.mean(-1, keepdims=True)
    var = ((o - mu) ** 2).mean(-1, keepdims=True)
    o = (o - mu) / np.sqrt(var + 1e-6)
    g = jax.nn.sigmoid((x @ p["gate_down"]["kernel"]) @ p["gate_up"]["kernel"])
    return (o * g) @ p["out"]["kernel"]


def test_noncausal_equals_reading_the_causal_final_state(rng):
    """Non-causal LNA at every token == Norm(kv_n^T phi(q_t)), gate, W_o, with kv_n the causal
    final state (digest 2.4: "one scan")."""
    x = _x(rng)
    mixer = LightNetAttention(num_heads=H, param_dtype=jnp.float64)
    params = _init(mixer, x, rng)
    y = mixer.apply(params, x)
    _, (S, _) = mixer.clone(causal=True, impl="chunk", chunk_size=8).apply(
        params, x, return_state=True)
    q = jax.nn.silu(x @ params["params"]["query"]["kernel"]).reshape(B, L, H, K)
    o = jnp.einsum("blhk,bhkv->blhv", q, S)
    _assert_close(y, _epilogue(params, x, o), 1e-10)


@pytest.mark.parametrize("share_decay", [True, False])
def test_noncausal_permutation_equivariant(rng, share_decay):
    x = _x(rng)
    mixer = LightNetAttention(num_heads=H, share_decay=share_decay, use_bias=True,
                              param_dtype=jnp.float64)
    params = _init(mixer, x, rng)
    perm = rng.permutation(L)
    _assert_close(mixer.apply(params, x[:, perm]), mixer.apply(params, x)[:, perm], 1e-10)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "srmsnorm"])
def test_padding_does_not_change_real_tokens(rng, norm):
    x = _x(rng)
    mixer = LightNetAttention(num_heads=H, norm=norm, param_dtype=jnp.float64)
    params = _init(mixer, x, rng)
    params = _scale_key_logits(params, x, 50.0)
    lengths = [L, 20]
    mask = jnp.arange(L)[None] < jnp.asarray(lengths)[:, None]
    y = mixer.apply(params, x, mask)
    x2 = jnp.where(mask[..., None], x, 1e3 * _x(rng))
    y2 = mixer.apply(params, x2, mask)
    _assert_close(jnp.where(mask[..., None], y2, 0), jnp.where(mask[..., None], y, 0), 1e-10)
    # a padded sequence's real tokens == the unpadded sequence alone
    _assert_close(y[1:, :20], mixer.apply(params, x[1:, :20]), 1e-10)
    _assert_close(y[:1], mixer.apply(params, x[:1]), 1e-12)
    grads = jax.grad(lambda x: jnp.sum(jnp.where(mask[..., None], mixer.apply(params, x, mask),
                                                 0.0) ** 2))(x2)
    assert np.isfinite(np.asarray(grads)).all()
    assert not np.asarray(grads[1, 20:]).any()


def test_bf16_runs_and_tracks_float32(rng):
    x = _x(rng, dtype=jnp.float32)
    for causal in (False, True):
        mixer = LightNetAttention(num_heads=H, causal=causal, impl="chunk", chunk_size=8)
        params = _init(mixer, x, rng)
        ref = mixer.apply(params, x)
        y = mixer.clone(dtype=jnp.bfloat16).apply(params, x.astype(jnp.bfloat16))
        assert y.dtype == jnp.bfloat16
        y = np.asarray(y, np.float32)
        err = np.sqrt(np.mean((y - np.asarray(ref)) ** 2) / np.mean(np.asarray(ref) ** 2))
        # the whole layer (projections too) in bf16, so looser than the ops' 5e-3
        assert np.isfinite(y).all() and err < 3e-2, err


def test_parameter_count(rng):
    x = _x(rng, (1, 5, D))
    r = 2

    def count(**kw):
        params = LightNetAttention(num_heads=H, gate_rank=r, **kw).init(
            jax.random.PRNGKey(0), x)
        return sum(a.size for a in jax.tree_util.tree_leaves(params))

    assert count() == 4 * D * D + 2 * D * r
    assert count(share_decay=False, decay_rank=3) == 4 * D * D + 2 * D * r + 2 * D * 3
    assert count(norm="rmsnorm") == 4 * D * D + 2 * D * r + D


# ----------------------------------------------------------------------------------------------
# argument checks


@pytest.mark.parametrize("kwargs, call, match", [
    (dict(), lambda m, x: m.init(jax.random.PRNGKey(0), x[0]), "x must be"),
    (dict(num_heads=5), lambda m, x: m.init(jax.random.PRNGKey(0), x), "not divisible"),
    (dict(head_dim=3), lambda m, x: m.init(jax.random.PRNGKey(0), x), "head_dim=3"),
    (dict(), lambda m, x: m.init(jax.random.PRNGKey(0), x, jnp.ones((B, L - 1), bool)),
     "mask must be"),
    (dict(), lambda m, x: m.init(jax.random.PRNGKey(0), x, jnp.ones((B, L))), "mask must be"),
    (dict(causal=True), lambda m, x: m.init(jax.random.PRNGKey(0), x, jnp.ones((B, L), bool)),
     "causal=False only"),
    (dict(), lambda m, x: m.init(jax.random.PRNGKey(0), x, return_state=True),
     "need causal=True"),
    (dict(causal=True), lambda m, x: m.init(
        jax.random.PRNGKey(0), x, state=(jnp.zeros((B, H, K, K)), jnp.zeros((B, H))),
        return_state=True), "state must be"),
])
def test_bad_shapes_one_line_errors(rng, kwargs, call, match):
    x = _x(rng)
    with pytest.raises(ValueError, match=match) as e:
        call(LightNetAttention(num_heads=kwargs.pop("num_heads", H), **kwargs), x)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs, match", [
    (dict(norm="batchnorm"), "unknown norm"),
    (dict(impl="fast"), "unknown impl"),
    (dict(gate_rank=0), "gate_rank"),
    (dict(num_heads=0), "num_heads"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(kv_cache_len=8), "kv_cache_len=8 needs causal=True"),
    (dict(grid_order="row"), "unknown grid_order 'row'"),
])
def test_bad_attributes_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        LightNetAttention(**kwargs)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------
# MD-LRPE inside the layer


def test_causal_lrpe_impls_and_decoding_agree(rng):
    L = 21
    x = _x(rng, (B, L, D))
    mixer = LightNetAttention(num_heads=H, causal=True, lrpe=True, impl="attention",
                              param_dtype=jnp.float64)
    params = _init(mixer, x, rng)
    full = mixer.apply(params, x)
    _assert_close(mixer.clone(impl="chunk", chunk_size=8).apply(params, x), full, 1e-10)
    y, state = mixer.apply(params, x[:, :11], return_state=True)
    assert state[0].shape == (B, H, 2 * K, K)
    outs = [y]
    for t in range(11, L):  # positions continue from the offset
        y, state = mixer.clone(impl="recurrent").apply(params, x[:, t:t + 1], state=state,
                                                       offset=t, return_state=True)
        outs.append(y)
    _assert_close(jnp.concatenate(outs, axis=1), full, 1e-10)
    # the rotation matters: without the offsets the continuation differs
    wrong = mixer.clone(impl="recurrent").apply(params, x[:, 11:12], state=mixer.apply(
        params, x[:, :11], return_state=True)[1], offset=0)
    assert np.abs(np.asarray(wrong) - np.asarray(full[:, 11:12])).max() > 1e-6


def test_noncausal_grid_lrpe_is_relative(rng):
    """A class token and a 3 x 4 grid: the module's output is the one-scan core on MD-LRPE-
    rotated queries and keys, and the grid-to-grid weights depend on grid offsets only."""
    from lion_jax.layers.lightnet import one_scan, softmax_over_sequence
    from lion_jax.layers.md_pe import grid_positions, md_lrpe, md_lrpe_thetas
    grid, N = (3, 4), 13
    x = _x(rng, (B, N, D))
    mixer = LightNetAttention(num_heads=H, lrpe=True, grid_shape=grid, num_prefix=1,
                              param_dtype=jnp.float64)
    params = _init(mixer, x, rng)
    p = params["params"]
    q = _silu(np.asarray(x @ p["query"]["kernel"])).reshape(B, N, H, K)
    kbar = softmax_over_sequence((x @ p["key"]["kernel"]).reshape(B, N, H, K))
    v = (x @ p["value"]["kernel"]).reshape(B, N, H, K)
    theta = md_lrpe_thetas(H, K, 2)

    def core(kbar, shift):
        pos = grid_positions(grid, 1) + np.array([[0, 0]] + [[shift, 0]] * 12)
        return one_scan(md_lrpe(jnp.asarray(q), theta, pos), md_lrpe(kbar, theta, pos), v)

    _assert_close(mixer.apply(params, x), _epilogue(params, x, core(kbar, 0)), 1e-10)
    # The prefix stays at 0 when the grid moves, so only grid-to-grid weights are shift-free:
    # the grid tokens' outputs from the grid keys alone.
    kbar_grid = kbar.at[:, 0].set(0.0)
    _assert_close(core(kbar_grid, 1)[:, 1:], core(kbar_grid, 0)[:, 1:], 1e-10)
    with pytest.raises(ValueError, match=r"13 tokens, but num_prefix \+ prod\(grid_shape\)"):
        mixer.clone(num_prefix=0).init(jax.random.PRNGKey(0), x)


@pytest.mark.parametrize("grid", [(4, 3), (2, 3, 2)])
def test_noncausal_grid_order_invariance(rng, grid):
    """The module on a grid flattened row-major (``grid_order="C"``) and column-major
    (``"F"``), with a class token in front: the same outputs once the tokens are put back
    (digest 6.2: flattening order does not matter with MD-LRPE)."""
    n = int(np.prod(grid))
    cells = _x(rng, (B, *grid, D))
    cls = _x(rng, (B, 1, D))
    axes = list(range(1, len(grid) + 1))

    def tokens(order):  # column-major = row-major of the grid with its axes reversed
        g = cells if order == "C" else jnp.transpose(cells, [0, *axes[::-1], len(grid) + 1])
        return jnp.concatenate([cls, g.reshape(B, n, D)], axis=1)

    mixer = LightNetAttention(num_heads=2, lrpe=True, grid_shape=grid, num_prefix=1,
                              param_dtype=jnp.float64)  # head_dim 6: 2 or 3 axis groups
    params = _init(mixer, tokens("C"), rng)
    row = mixer.apply(params, tokens("C"))
    col = mixer.clone(grid_order="F").apply(params, tokens("F"))
    col_cells = jnp.transpose(col[:, 1:].reshape(B, *grid[::-1], D),
                              [0, *axes[::-1], len(grid) + 1]).reshape(B, n, D)
    _assert_close(col[:, :1], row[:, :1], 1e-10)
    _assert_close(col_cells, row[:, 1:], 1e-10)
    # without the right order the rotations are wrong
    assert np.abs(np.asarray(mixer.apply(params, tokens("F")) - col)).max() > 1e-6
