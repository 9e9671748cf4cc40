"""TNL token mixer (lion_jax.layers.tnl) and the GLU channel mixers (lion_jax.layers.glu).

Oracles are written here from the digest equations (``lightning-attention-tnl.md`` 2.2-2.5,
``scaling-laws-linear-lms.md`` 1.2, 2.2), in float64 numpy, never by calling the code under
test.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.layers.glu import Sglu, SwiGlu, glu_hidden_dim
from lion_jax.layers.tnl import Lrpe, SRMSNorm, TnlAttention, srms_norm, tnl_decay

B, L, D, H, K = 2, 37, 16, 2, 8  # L = 37: not a multiple of the chunk (16)
CHUNK = 16


def jax_key(rng):
    return jax.random.key(int(rng.integers(2 ** 31)))


def normal(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def make_layer(**kwargs):
    defaults = dict(num_heads=H, head_dim=K, layer_index=0, num_layers=4, impl="chunk",
                    chunk_size=CHUNK)
    return TnlAttention(**{**defaults, **kwargs})


def count_params(variables):
    return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nn.unbox(variables)))


def abstract_init(layer, x):
    """The layer's variables as shapes only (no compute)."""
    return jax.eval_shape(layer.init, jax.random.key(0), x)


# --- decay schedule --------------------------------------------------------------------------
# Slopes written out by hand from the ALiBi rule of the digest (2.5): 2^(-8h/H), h = 1..H; for
# H = 20 and 40 the power-of-two block then every other slope of twice that size.
HAND_SLOPES = {
    8: 2.0 ** -np.arange(1, 9),                         # 1/2 ... 1/256
    16: 2.0 ** (-np.arange(1, 17) / 2),
    20: np.concatenate([2.0 ** (-np.arange(1, 17) / 2), 2.0 ** (-np.arange(1, 8, 2) / 4)]),
    32: 2.0 ** (-np.arange(1, 33) / 4),
    40: np.concatenate([2.0 ** (-np.arange(1, 33) / 4), 2.0 ** (-np.arange(1, 16, 2) / 8)]),
}


@pytest.mark.parametrize("num_heads", sorted(HAND_SLOPES))
@pytest.mark.parametrize("layer,num_layers", [(0, 24), (7, 24), (23, 24), (0, 1)])
def test_official_decay_pinned(num_heads, layer, num_layers):
    depth = layer / (num_layers - 1) if num_layers > 1 else 0.0
    expected = -HAND_SLOPES[num_heads] * (1 - depth + 1e-5)
    got = tnl_decay(num_heads, layer, num_layers)
    assert got.dtype == np.float32 and got.shape == (num_heads,)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert np.all(got < 0)


def test_official_decay_digest_numbers():
    """The values the digest lists (2.5) for layer 0 (factor 1 + 1e-5)."""
    s = {h: -tnl_decay(h, 0, 24) / (1 + 1e-5) for h in (8, 16, 20, 32, 40)}
    np.testing.assert_allclose(s[8], [1 / 2 ** i for i in range(1, 9)], rtol=1e-6)
    np.testing.assert_allclose([s[16][0], s[16][-1], s[32][0], s[40][0], s[40][-1], s[20][16]],
                               [0.7071, 0.00391, 0.8409, 0.8409, 0.2726, 0.8409], atol=1e-4)
    last = -tnl_decay(8, 23, 24)
    np.testing.assert_allclose(last, 1e-5 * HAND_SLOPES[8], rtol=1e-3)  # almost no decay


@pytest.mark.parametrize("num_heads", sorted(HAND_SLOPES))
def test_paper_decay_pinned(num_heads):
    h = np.arange(1, num_heads + 1)
    for layer, num_layers in ((0, 24), (10, 24), (23, 24)):
        expected = -(8 * h / num_heads) * (1 - layer / num_layers)
        np.testing.assert_allclose(tnl_decay(num_heads, layer, num_layers, formula="paper"),
                                   expected, rtol=1e-6)
        np.testing.assert_allclose(
            tnl_decay(num_heads, layer, num_layers, formula="paper_alibi"),
            -HAND_SLOPES[num_heads] * (1 - layer / num_layers), rtol=1e-6)


def test_decay_without_temperature():
    for formula in ("official", "paper_alibi"):
        np.testing.assert_allclose(tnl_decay(16, 5, 12, formula=formula, temperature=False),
                                   -HAND_SLOPES[16], rtol=1e-6)


# --- SRMSNorm and LRPE -----------------------------------------------------------------------


def test_srmsnorm(rng):
    x = rng.standard_normal((3, 5, 24)) * 3.0
    expected = x / (np.linalg.norm(x, axis=-1, keepdims=True) / np.sqrt(24) + 1e-8)
    layer = SRMSNorm()
    variables = layer.init(jax_key(rng), jnp.asarray(x, jnp.float32))
    assert count_params(variables) == 0
    y = np.asarray(layer.apply(variables, jnp.asarray(x, jnp.float32)), np.float64)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.sqrt(np.mean(y ** 2, -1)), 1.0, rtol=1e-5)
    y7 = np.asarray(layer.apply(variables, jnp.asarray(7.0 * x, jnp.float32)))
    np.testing.assert_allclose(y7, y, rtol=1e-5, atol=1e-6)  # scale-invariant
    zero = jnp.zeros((2, 4))
    assert np.all(np.asarray(srms_norm(zero)) == 0)
    zero_grad = jax.grad(lambda z: jnp.sum(srms_norm(z)))(zero)
    assert np.all(np.isfinite(np.asarray(zero_grad)))  # an all-zero row: finite, not NaN


@pytest.mark.parametrize("head_dim", [8, 5])  # an odd head dim is fine: cos/sin concatenation
def test_lrpe_is_relative(rng, head_dim):
    """q~_t . k~_s = sum_j q_j k_j cos(theta_j (t - s)) (digest 2.5), whatever the offset."""
    Lq = 6
    q, k = normal(rng, 1, Lq, H, head_dim), normal(rng, 1, Lq, H, head_dim)
    pe = Lrpe(H, head_dim)
    variables = pe.init(jax_key(rng), q)
    theta = np.asarray(nn.unbox(variables)["params"]["theta"], np.float64)
    j = np.arange(H * head_dim).reshape(H, head_dim)
    np.testing.assert_allclose(theta, 10000.0 ** (-2 * j / (H * head_dim)), rtol=1e-6)

    qn, kn = np.asarray(q, np.float64)[0], np.asarray(k, np.float64)[0]  # [L, H, K]
    dt = np.arange(Lq)[:, None] - np.arange(Lq)[None, :]
    expected = np.einsum("thj,shj,tshj->hts", qn, kn,
                         np.cos(dt[:, :, None, None] * theta[None, None]))
    for offset in (0, 11, 1000):
        qt, kt = pe.apply(variables, q, offset), pe.apply(variables, k, offset)
        assert qt.shape == (1, Lq, H, 2 * head_dim)
        scores = np.einsum("thj,shj->hts", np.asarray(qt, np.float64)[0],
                           np.asarray(kt, np.float64)[0])
        np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=2e-4)


# --- the layer against the equations ---------------------------------------------------------


HAND_SLOPES_SMALL = {2: np.array([2.0 ** -4, 2.0 ** -8])}  # 2^(-8h/H), H = 2


def oracle(variables, x, layer):
    """TnlAttention's output from the digest's equations (2.2, 2.4, 2.5), float64 numpy."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), nn.unbox(variables)["params"])
    x = np.asarray(x, np.float64)
    Bx, Lx, _ = x.shape
    hid = layer.num_heads * layer.head_dim
    w = p["qkvu_proj"]["kernel"]  # [D, 4 * hidden]: q | k | v | u
    w = w.reshape(w.shape[0], -1, hid)
    q, k, v, u = (x @ w[:, i] for i in range(4))
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    q, k = (silu(z).reshape(Bx, Lx, H, K) for z in (q, k))
    v = v.reshape(Bx, Lx, H, K)
    lam = np.exp(-HAND_SLOPES_SMALL[H] * (1 - layer.layer_index / (layer.num_layers - 1) + 1e-5))
    t = np.arange(Lx)
    dist = t[:, None] - t[None, :]
    decay = np.where(dist[None] >= 0, lam[:, None, None] ** np.maximum(dist, 0)[None], 0.0)
    if layer.use_lrpe:
        theta = p["lrpe"]["theta"]  # [H, K]
        scores = np.einsum("bthj,bshj,tshj->bhts", q, k,
                           np.cos(dist[:, :, None, None] * theta[None, None]))
    else:
        scores = np.einsum("bthj,bshj->bhts", q, k)
    o = np.einsum("bhts,hts,bshv->bthv", scores, decay, v).reshape(Bx, Lx, hid)
    o = o / (np.sqrt(np.mean(o ** 2, -1, keepdims=True)) + 1e-8)
    return (o * u) @ p["out_proj"]["kernel"]


@pytest.mark.parametrize("use_lrpe", [False, True])
def test_layer_matches_equations(rng, use_lrpe):
    layer = make_layer(use_lrpe=use_lrpe, layer_index=1, impl="attention")
    x = normal(rng, B, L, D)
    variables = layer.init(jax_key(rng), x)
    assert rel_err(layer.apply(variables, x), oracle(variables, x, layer)) < 1e-5


@pytest.mark.parametrize("use_lrpe", [False, True])
def test_impls_agree(rng, use_lrpe):
    x = normal(rng, B, L, D)
    variables = make_layer(use_lrpe=use_lrpe).init(jax_key(rng), x)
    outs = {}
    for impl in ("attention", "recurrent", "chunk"):
        outs[impl] = make_layer(use_lrpe=use_lrpe, impl=impl).apply(
            variables, x, return_state=True)
    for impl in ("recurrent", "chunk"):
        assert rel_err(outs[impl][0], outs["attention"][0]) < 1e-5, impl
        assert rel_err(outs[impl][1], outs["attention"][1]) < 1e-5, impl


def test_causal(rng):
    layer = make_layer(use_lrpe=True)
    x = normal(rng, B, L, D)
    variables = layer.init(jax_key(rng), x)
    y = np.asarray(layer.apply(variables, x))
    for t in (1, 20, 36):
        x2 = x.at[:, t:].set(100.0 * normal(rng, B, L - t, D))
        y2 = np.asarray(layer.apply(variables, x2))
        np.testing.assert_allclose(y2[:, :t], y[:, :t], rtol=1e-6, atol=1e-6)
        assert not np.allclose(y2[:, t:], y[:, t:])


@pytest.mark.parametrize("use_lrpe", [False, True])
def test_prefill_then_continuation(rng, use_lrpe):
    """Prefill + continuation (any split, chunked, L = 37 with chunks of 16) and one-token
    steps give the full forward (float32). Jitted: ``offset`` is a traced int32 scalar (and
    one compile per piece shape costs less CPU than eager ops on new shapes)."""
    # LRPE sits on layer 0 (strongest decay); without it, the last layer (decay ~ 1 - 1e-5)
    layer = make_layer(use_lrpe=use_lrpe, layer_index=0 if use_lrpe else 3)
    x = normal(rng, B, L, D)
    variables = jax.jit(layer.init)(jax_key(rng), x)
    run = jax.jit(lambda x, state, offset: layer.apply(variables, x, state=state, offset=offset,
                                                       return_state=True))
    y_full, s_full = run(x, None, 0)
    assert s_full.shape == layer.state_shape(B) and s_full.dtype == jnp.float32
    scale = np.abs(np.asarray(y_full)).max()

    # a prefill whose last chunk is partial (20 = 16 + 4); a 1-token prefill, pieces across
    # chunk boundaries and a 1-token tail; then one-token steps after a 3-token prompt
    for cuts in ((20,), (1, 16, 36), (3,) + tuple(range(4, L))):
        pieces, state = [], None
        for start, stop in zip((0,) + cuts, cuts + (L,)):
            y, state = run(x[:, start:stop], state, jnp.int32(start))
            pieces.append(y)
        np.testing.assert_allclose(np.concatenate(pieces, 1), y_full, atol=1e-5 * scale,
                                   err_msg=str(cuts[:3]))
        np.testing.assert_allclose(state, s_full, rtol=1e-5, atol=1e-5)


# --- parameter accounting --------------------------------------------------------------------


def test_parameter_counts(rng):
    """scaling-laws digest 2.2: TNL token mixer 4d^2 + 2dt (t = d/h, low-rank sigmoid gate),
    channel mixer 3dg; the official TNL mixer (fused QKVU + W_o) has 5d^2 (TNL digest 2.7);
    without the gate (Table 5) 4d^2; LRPE adds its theta (d)."""
    d, h, g = 32, 4, 48
    x = normal(rng, 1, 3, d)
    t = d // h

    def n(**kw):
        layer = TnlAttention(num_heads=h, head_dim=d // h, layer_index=0, num_layers=2, **kw)
        return count_params(abstract_init(layer, x))

    assert n(gate="lowrank_sigmoid") == 4 * d * d + 2 * d * t
    assert n(gate="lowrank_sigmoid", gate_rank=3) == 4 * d * d + 2 * d * 3
    assert n() == 5 * d * d
    assert n(gate="none") == 4 * d * d
    assert n(use_lrpe=True) == 5 * d * d + d
    assert n(use_lrpe=True, lrpe_learnable=False) == 5 * d * d
    for cls in (Sglu, SwiGlu):
        assert count_params(abstract_init(cls(g), x)) == 3 * d * g
    assert [glu_hidden_dim(m) for m in (512, 1024, 2048)] == [1536, 2816, 5632]


# --- GLUs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [Sglu, SwiGlu])
def test_glu_equations(rng, cls):
    x = normal(rng, B, 5, D)
    layer = cls(24)
    variables = layer.init(jax_key(rng), x)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), nn.unbox(variables)["params"])
    assert set(p) == {"w1", "w2", "w3"} and all(set(v) == {"kernel"} for v in p.values())
    xn = np.asarray(x, np.float64)
    h1, h2 = xn @ p["w1"]["kernel"], xn @ p["w2"]["kernel"]
    if cls is SwiGlu:
        h1 = h1 / (1 + np.exp(-h1))
    assert rel_err(layer.apply(variables, x), (h1 * h2) @ p["w3"]["kernel"]) < 1e-5


# --- switches, bad settings, bf16 ------------------------------------------------------------


@pytest.mark.parametrize("kw", [
    dict(gate="none"), dict(gate="lowrank_sigmoid"), dict(norm_type="rmsnorm"),
    dict(norm_type="layernorm"), dict(feature_map="identity"), dict(feature_map="elu1"),
    dict(use_decay=False), dict(decay_temperature=False), dict(decay_formula="paper"),
    dict(activate_v=True)], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_switches_run(rng, kw):
    layer = make_layer(use_lrpe=True, impl="attention", **kw)
    x = normal(rng, B, L, D)  # the shapes of the other tests: eager ops are compiled per shape
    y = layer.apply(layer.init(jax_key(rng), x), x)
    assert y.shape == x.shape and np.all(np.isfinite(np.asarray(y)))


@pytest.mark.parametrize("kw", [
    dict(decay_formula="alibi"), dict(feature_map="relu"), dict(gate="sigmoid"),
    dict(norm_type="groupnorm"), dict(impl="flash"), dict(head_dim=0), dict(num_heads=-1),
    dict(layer_index=4), dict(layer_index=-1), dict(num_layers=0), dict(chunk_size=0),
    dict(gate_rank=4), dict(gate="lowrank_sigmoid", gate_rank=0), dict(norm_eps=-1.0)],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_bad_settings(kw):
    with pytest.raises(ValueError):
        make_layer(**kw)


def test_bad_calls(rng):
    layer = make_layer()
    x = normal(rng, 1, 4, D)
    variables = abstract_init(layer, x)
    with pytest.raises(ValueError):
        jax.eval_shape(lambda v: layer.apply(v, x, offset=-1), variables)
    with pytest.raises(ValueError):  # an LRPE-sized state for a layer without LRPE
        jax.eval_shape(lambda v: layer.apply(v, x, state=jnp.zeros((1, H, 2 * K, K))),
                       variables)
    with pytest.raises(ValueError):
        tnl_decay(8, 0, 4, formula="nope")
    with pytest.raises(ValueError):
        Sglu(0)


def test_bf16_is_finite_and_close(rng):
    x = normal(rng, B, L, D)
    f32 = make_layer(use_lrpe=True)
    bf16 = make_layer(use_lrpe=True, dtype=jnp.bfloat16)
    variables = f32.init(jax_key(rng), x)

    def loss(layer, v, x):
        y, s = layer.apply(v, x, return_state=True)
        return jnp.sum(jnp.square(y.astype(jnp.float32))), (y, s)

    (_, (y, s)), grads = jax.jit(jax.value_and_grad(
        lambda v, x: loss(bf16, v, x), has_aux=True))(variables, x.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    for a in [y, s, *jax.tree.leaves(nn.unbox(grads))]:
        assert np.all(np.isfinite(np.asarray(a, np.float32)))
    assert rel_err(np.asarray(y, np.float32), f32.apply(variables, x)) < 5e-2
