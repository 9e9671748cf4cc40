"""lion_jax.models.vit: patch orders, LION ViTs across impls, mask averaging of LION-S (v2),
any-resolution inference, training on a few steps, and bad inputs."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lion_jax.layers import LionAttention
from lion_jax.models import VisionTransformer
from lion_jax.models.vit import PATCH_ORDERS, patch_order, token_orders, vit_size

SMALL = dict(num_classes=5, patch_size=4, d_model=32, num_layers=2, num_heads=2, mlp_dim=64)
MIXERS = {  # name: (mixer_kind, mixer kwargs, extra model kwargs)
    "lit": ("lion", dict(variant="lit"), {}),
    "d": ("lion", dict(variant="d"), {}),
    "s": ("lion", dict(variant="s"), {}),
    "s_v2": ("lion", dict(variant="s"), dict(orders=("row_snake", "col_snake"))),
    "softmax": ("softmax", dict(impl="xla"), dict(pos_emb="learned", image_size=16)),
}


def model(name, **kwargs):
    kind, mixer, extra = MIXERS[name]
    return VisionTransformer(**(SMALL | dict(mixer_kind=kind, mixer=mixer) | extra | kwargs))


def images(rng, b, h, w=None):
    return jnp.asarray(rng.standard_normal((b, h, w or h, 3)), jnp.float32)


def assert_same_loss_and_grads(got, want):
    """``(loss, grads)`` pairs equal in float32: the loss to 1e-5, and each gradient's error
    within 1e-5 of the whole gradient's norm (as in tests/test_layers.py: the decay gate's
    bias sums d log_decay over every token, which cancels), all finite."""
    (got, got_grads), (want, want_grads) = got, want
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    scale = np.sqrt(sum(np.sum(np.square(np.asarray(b, np.float64)))
                        for b in jax.tree.leaves(want_grads)))
    for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        assert np.all(np.isfinite(a))
        err = np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64))
        assert err <= 1e-5 * scale


@pytest.mark.parametrize("rows,cols", [(3, 4), (5, 5), (1, 7), (6, 2)])
@pytest.mark.parametrize("name", PATCH_ORDERS)
def test_orders_are_permutations_and_invert(rng, rows, cols, name):
    order = patch_order(rows, cols, name)
    assert sorted(order.tolist()) == list(range(rows * cols))
    patches = rng.standard_normal((rows * cols, 5))
    np.testing.assert_array_equal(patches[order][np.argsort(order)], patches)
    if name != "raster":  # a snake: each next patch is a grid neighbour
        r, c = np.divmod(order, cols)
        assert np.all(np.abs(np.diff(r)) + np.abs(np.diff(c)) == 1)
    full = token_orders(rows, cols, [name])
    if name != "raster":
        assert full[0][0] == 0 and sorted(full[0].tolist()) == list(range(rows * cols + 1))


@pytest.mark.parametrize("name", ["s", "s_v2"])
def test_lion_pallas_agrees_with_attention(rng, name):
    """impl="pallas" (``lion_dense``, in the Pallas interpreter on CPU) at 193 tokens (blocks
    of 64 rows, so the mask off the diagonal block and the diagonal one both count) against
    impl="attention": logits and the gradients of every parameter, float32. Each gradient's
    error is measured against the whole gradient's norm, as in tests/test_layers.py: the decay
    gate's bias sums d log_decay over every token, which cancels (s_v2, one clean-clone run:
    its own relative error 1.4e-4, 2.9e-6 in absolute terms)."""
    x = images(rng, 2, 48, 64)  # 12 x 16 patches and the CLS
    params = model(name).init(jax.random.key(int(rng.integers(2**31))), x, train=False)

    def run(impl):
        net = model(name, mixer=MIXERS[name][1] | dict(impl=impl))
        loss = lambda p: jnp.sum(jnp.sin(net.apply(p, x, train=False)))  # noqa: E731
        return jax.jit(jax.value_and_grad(loss))(params)

    assert_same_loss_and_grads(run("pallas"), run("attention"))


@pytest.mark.parametrize("name", ["s", "s_v2", "d"])
def test_lion_logits_agree_across_impls(rng, name):
    x = images(rng, 2, 12, 16)  # 3 x 4 patches: 13 tokens with the CLS
    params = model(name).init(jax.random.key(int(rng.integers(2**31))), x, train=False)
    logits = {impl: jax.jit(model(name, mixer=MIXERS[name][1] | dict(impl=impl, chunk_size=4))
                            .apply, static_argnames="train")(params, x, train=False)
              for impl in ("attention", "chunk", "recurrent")}
    for impl, y in logits.items():
        assert y.shape == (2, 5) and np.all(np.isfinite(y))
        np.testing.assert_allclose(y, logits["attention"], rtol=1e-5, atol=1e-5, err_msg=impl)


@pytest.mark.parametrize("name,pooling,impl", [
    ("s", "cls", "attention"), ("s_v2", "mean", "attention"), ("lit", "mean", "chunk"),
    ("d", "cls", "pallas"), ("s_v2", "cls", "pallas")])
def test_padded_tokens_change_nothing(rng, name, pooling, impl):
    """token_multiple=8 pads the 13 tokens (CLS + 3 x 4 patches) to 16, 5 x 7 + CLS to 40 and
    leaves 3 x 5 + CLS (16) as it is: logits and every parameter's gradient equal the unpadded
    model's (float32; "pallas" is ``lion_dense`` in the Pallas interpreter, one size)."""
    for h, w in [(12, 16), (20, 28), (12, 20)][:1 if impl == "pallas" else 3]:
        x = images(rng, 2, h, w)
        base = model(name, pooling=pooling, mixer=MIXERS[name][1] | dict(impl=impl))
        params = base.init(jax.random.key(int(rng.integers(2**31))), x, train=False)

        def run(net):
            loss = lambda p: jnp.sum(jnp.sin(net.apply(p, x, train=False)))  # noqa: E731
            return jax.jit(jax.value_and_grad(loss))(params)

        assert_same_loss_and_grads(run(base.clone(token_multiple=8)), run(base))


def test_v2_averages_the_masks_of_both_orders(rng):
    """One LION-S layer with two orders: ``y = sum_j s_ij Mbar_ij v_j / sum_j s_ij Mbar_ij``,
    ``Mbar`` the mean of the masks the decays build along each order (paper C.8)."""
    rows, cols = 3, 3
    orders = token_orders(rows, cols, ("row_snake", "col_snake"))
    layer = LionAttention(num_heads=2, head_dim=4, variant="s", impl="attention")
    x = jnp.asarray(rng.standard_normal((1, 10, 16)), jnp.float32)
    params = layer.init(jax.random.key(0), x, orders=orders)
    y, state = layer.apply(params, x, orders=orders, mutable=["intermediates"])
    q, k, v, a, _ = (None if t is None else np.asarray(t, np.float64)
                     for t in state["intermediates"]["mixer_inputs"][0])
    masks = []
    for order in orders:  # the mask along this order, indexed by the original tokens
        A = np.cumsum(a[0][order], axis=0)  # [L, H] along the order
        m = np.exp(-np.abs(A[:, None] - A[None, :]))  # [i, j, H] in order positions
        inv = np.argsort(order)
        masks.append(m[inv][:, inv])
    mbar = np.mean(masks, axis=0)
    scores = np.einsum("ihk,jhk->ijh", q[0], k[0]) * mbar
    expected = np.einsum("ijh,jhv->ihv", scores, v[0]) / (scores.sum(1)[..., None] + 1e-6)
    out = nn.unbox(params)["params"]["out"]
    expected = expected.reshape(10, -1) @ np.asarray(out["kernel"]) + np.asarray(out["bias"])
    np.testing.assert_allclose(y[0], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["s", "s_v2", "softmax"])
def test_any_resolution(rng, name):
    """Trained at 16 px, applied at 24 x 32 px with the same parameters (learned positions
    resized); at the training size the positions are used as they are."""
    m = model(name)
    params = m.init(jax.random.key(0), images(rng, 1, 16), train=False)
    before = jax.tree.map(np.asarray, params)
    y = m.apply(params, images(rng, 2, 24, 32), train=False)
    assert y.shape == (2, 5) and np.all(np.isfinite(y))
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, params))


@pytest.mark.parametrize("name", list(MIXERS))
def test_every_mixer_trains(rng, name):
    """A few Adam steps on a fixed batch (label = the brightest image quadrant) lower the
    loss."""
    x = images(rng, 16, 16)
    quadrants = x.reshape(16, 2, 8, 2, 8, 3).mean(axis=(2, 4, 5)).reshape(16, 4)
    labels = jnp.argmax(quadrants, axis=1)
    m = model(name, drop_path=0.1)
    params = m.init(jax.random.key(1), x, train=False)
    opt = optax.adam(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state, key):
        def loss(p):
            logits = m.apply(p, x, train=True, rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    losses = []
    for i in range(12):
        params, state, value = step(params, state, jax.random.key(i))
        losses.append(float(value))
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.7 * losses[0], losses


def test_drop_path_only_in_training(rng):
    x = images(rng, 4, 8)
    m = model("s", drop_path=0.5)
    params = m.init(jax.random.key(0), x, train=False)
    eval_a, eval_b = (m.apply(params, x, train=False) for _ in range(2))
    np.testing.assert_array_equal(eval_a, eval_b)
    train = [m.apply(params, x, train=True, rngs={"dropout": jax.random.key(i)})
             for i in range(2)]
    assert not np.allclose(train[0], train[1])


def test_sizes():
    assert vit_size("tiny") == dict(d_model=192, num_layers=12, num_heads=3, mlp_dim=768)
    assert vit_size("base")["num_heads"] == 12
    with pytest.raises(ValueError, match=r"unknown ViT size 'huge'; valid: \['tiny'"):
        vit_size("huge")


@pytest.mark.parametrize("kwargs,match", [
    (dict(orders=("spiral",)), "unknown patch order 'spiral'"),
    (dict(orders=()), "at least one patch order"),
    (dict(mixer_kind="softmax", mixer={}, orders=("row_snake",)), "needs the LION mixer"),
    (dict(pos_emb="learned"), "needs image_size"),
    (dict(pos_emb="learned", image_size=18), "not a multiple of patch_size=4"),
    (dict(pooling="max"), "unknown pooling"),
    (dict(mixer=dict(variant="s", impl="bogus")), "mixer: unknown impl 'bogus'"),
    (dict(mixer=dict(num_heads=4)), "set \\['num_heads'\\] on VisionTransformer"),
    (dict(token_multiple=0), "token_multiple must be an int >= 1"),
    (dict(mixer_kind="softmax", mixer={}, token_multiple=8), "pads the tokens for LION mixers"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VisionTransformer(**(SMALL | dict(mixer=dict(variant="s")) | kwargs))


def test_bad_image_size(rng):
    m = model("s")
    params = m.init(jax.random.key(0), images(rng, 1, 16), train=False)
    with pytest.raises(ValueError, match="image size 18x16 is not a multiple of the patch "
                                         "size 4; resize or crop"):
        m.apply(params, images(rng, 1, 18, 16), train=False)
