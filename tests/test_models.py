"""Tests for lion_jax.models: the LRA sequence classifier."""

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.models import SequenceClassifier
from lion_jax.models.classifier import sinusoidal_embedding

B, L, VOCAB, CLASSES = 3, 11, 20, 5


def make_model(**kwargs):
    config = dict(vocab_size=VOCAB, num_classes=CLASSES, d_model=16, num_layers=2, num_heads=2,
                  mlp_dim=32, mixer=dict(variant="s", impl="attention")) | kwargs
    return SequenceClassifier(**config)


def jax_key(rng):
    return jax.random.key(int(rng.integers(2 ** 31)))


def random_tokens(rng, length=L):
    """Token ids in [1, VOCAB) (0 is the pad id)."""
    return jnp.asarray(rng.integers(1, VOCAB, size=(B, length)), jnp.int32)


@pytest.mark.parametrize("pooling,pos_emb", [("mean", "none"), ("cls", "learned"),
                                             ("last", "sinusoidal"), ("mean", "learned")])
def test_shapes_and_trailing_padding(rng, pooling, pos_emb):
    """Logits ``[B, C]`` float32; appending pad tokens (id 0) leaves them unchanged."""
    model = make_model(pooling=pooling, pos_emb=pos_emb, max_len=L + 4)
    tokens = random_tokens(rng)
    variables = model.init(jax_key(rng), tokens, train=False)
    logits = model.apply(variables, tokens, train=False)
    assert logits.shape == (B, CLASSES) and logits.dtype == jnp.float32
    assert np.all(np.isfinite(logits))

    padded = jnp.concatenate([tokens, jnp.zeros((B, 4), jnp.int32)], axis=1)
    np.testing.assert_allclose(model.apply(variables, padded, train=False), logits,
                               rtol=1e-5, atol=1e-5)


def test_explicit_mask_overrides_default(rng):
    model = make_model()
    tokens = random_tokens(rng)
    variables = model.init(jax_key(rng), tokens, train=False)
    mask = jnp.asarray(rng.random((B, L)) < 0.7).at[:, 0].set(True)
    # tokens at masked-out positions do not matter, whatever their id
    scrambled = jnp.where(mask, tokens, random_tokens(rng))
    np.testing.assert_allclose(model.apply(variables, tokens, train=False, mask=mask),
                               model.apply(variables, scrambled, train=False, mask=mask),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["lit", "d", "retnet", "grfa", "xlstm"])
def test_variants_run(rng, variant):
    model = make_model(num_layers=1, mixer=dict(variant=variant, impl="attention"))
    tokens = random_tokens(rng)
    variables = model.init(jax_key(rng), tokens, train=False)
    assert np.all(np.isfinite(model.apply(variables, tokens, train=False)))


def test_train_dropout_and_jit(rng):
    model = make_model(dropout=0.3)
    tokens = random_tokens(rng)
    variables = model.init(jax_key(rng), tokens, train=False)
    eval_logits = model.apply(variables, tokens, train=False)
    np.testing.assert_array_equal(eval_logits, model.apply(variables, tokens, train=False))

    train = jax.jit(lambda v, t, key: model.apply(v, t, train=True, rngs={"dropout": key}))
    key = jax_key(rng)
    a, b = train(variables, tokens, key), train(variables, tokens, key)
    np.testing.assert_array_equal(a, b)  # same rng, same dropout
    assert not np.allclose(a, eval_logits)
    assert not np.allclose(a, train(variables, tokens, jax.random.fold_in(key, 1)))
    with pytest.raises(flax.errors.InvalidRngError, match="dropout"):
        model.apply(variables, tokens, train=True)  # no dropout rng

    jitted = jax.jit(lambda v, t: model.apply(v, t, train=False))(variables, tokens)
    np.testing.assert_allclose(jitted, eval_logits, rtol=1e-5, atol=1e-6)


def test_logical_axes(rng):
    model = make_model(pooling="cls", pos_emb="learned", max_len=L)
    variables = model.init(jax_key(rng), random_tokens(rng), train=False)
    specs = nn.get_partition_spec(variables)["params"]
    assert tuple(specs["embed"]["embedding"]) == ("vocab", "embed")
    assert tuple(specs["head"]["kernel"]) == ("embed", "classes")
    assert tuple(specs["pos_embedding"]) == (None, "embed")
    mixer = specs["block_0"]["mixer"]
    assert tuple(mixer["query"]["kernel"]) == ("embed", "heads")
    assert tuple(mixer["out"]["kernel"]) == ("heads", "embed")
    assert tuple(mixer["decay_gate"]["kernel"]) == ("embed", None)
    assert tuple(specs["block_1"]["mlp"]["fc1"]["kernel"]) == ("embed", "mlp")
    is_spec = lambda s: isinstance(s, jax.sharding.PartitionSpec)  # noqa: E731
    leaves = jax.tree.leaves(nn.unbox(variables))
    spec_leaves = jax.tree.leaves(nn.get_partition_spec(variables), is_leaf=is_spec)
    assert len(leaves) == len(spec_leaves)
    for leaf, spec in zip(leaves, spec_leaves):
        assert len(spec) == leaf.ndim  # every parameter is annotated

    # the annotations resolve to a mesh sharding under typical rules
    mesh = jax.make_mesh((1, jax.device_count()), ("data", "model"))
    rules = (("embed", None), ("heads", "model"), ("mlp", "model"), ("vocab", None),
             ("classes", None))
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(variables), mesh, rules)
    kernel = shardings["params"]["block_0"]["mlp"]["fc1"]["kernel"]
    assert kernel.spec == jax.sharding.PartitionSpec(None, "model")


def test_bfloat16(rng):
    tokens = random_tokens(rng)
    model32 = make_model()
    variables = model32.init(jax_key(rng), tokens, train=False)
    logits32 = model32.apply(variables, tokens, train=False)
    model16 = make_model(dtype=jnp.bfloat16)
    logits16 = model16.apply(variables, tokens, train=False)
    assert logits16.dtype == jnp.float32
    err = np.sqrt(np.mean((np.asarray(logits16) - logits32) ** 2) / np.mean(logits32 ** 2))
    # bf16 activations through the whole model: over seeds 0-199 the error's median was 5.0e-3,
    # its 99th percentile 1.3e-2 and its largest 1.7e-2; seed 2135072126 gave 2.3e-2 (small
    # logits make the ratio large). A dtype slip gives errors of order 1.
    assert err < 4e-2


def test_sinusoidal_embedding():
    emb = sinusoidal_embedding(7, 9)
    assert emb.shape == (7, 9)
    np.testing.assert_allclose(emb[0, :4], 0.0)  # sin(0)
    np.testing.assert_allclose(emb[0, 4:8], 1.0)  # cos(0)
    np.testing.assert_allclose(emb[:, 8], 0.0)  # odd last feature
    np.testing.assert_allclose(emb[3, 0], np.sin(3.0), rtol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(pooling="max"), "unknown pooling"),
    (dict(pos_emb="rope"), "unknown pos_emb"),
    (dict(pos_emb="learned"), "needs max_len"),
    (dict(d_model=15), "not divisible"),
    (dict(norm="groupnorm"), "unknown norm"),
    (dict(mixer=dict(num_heads=4)), "not in mixer"),
    (dict(channel_mixer="glu"), "unknown channel_mixer"),
    (dict(orders=("diagonal",)), "unknown patch order 'diagonal' in orders"),
    (dict(orders=()), "orders must be a sequence"),
    (dict(orders=("row_snake", "col_snake")), r"needs image_shape=\(rows, cols\)"),
    (dict(orders=("col_snake",), image_shape=(3, 4), mixer_kind="softmax",
          mixer=dict(impl="xla")), "needs the LION mixer"),
])
def test_bad_config_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_model(**kwargs)


def test_bad_config_raises_at_init(rng):
    tokens = random_tokens(rng)
    with pytest.raises(ValueError, match="unknown variant"):
        make_model(mixer=dict(variant="mamba")).init(jax_key(rng), tokens, train=False)
    with pytest.raises(ValueError, match="exceeds max_len"):
        make_model(pos_emb="learned", max_len=L - 1).init(jax_key(rng), tokens, train=False)


def test_pixel_inputs_have_no_padding(rng):
    """``input_encoding="pixels"`` with ``pad_id=None``: every pixel is real (0 is black), and
    the intensities enter through a Dense of ``(x / 255 - 0.5) / 0.5``."""
    model = make_model(input_encoding="pixels", pad_id=None)
    pixels = jnp.asarray(rng.integers(0, 256, size=(B, L)), jnp.uint8).at[:, -3:].set(0)
    variables = model.init(jax_key(rng), pixels, train=False)
    assert nn.unbox(variables)["params"]["embed"]["kernel"].shape == (1, 16)
    logits = model.apply(variables, pixels, train=False)
    assert np.all(np.isfinite(logits))
    # trailing zeros are black pixels, not padding: dropping them changes the output
    assert not np.allclose(model.apply(variables, pixels[:, :-3], train=False), logits)
    with pytest.raises(ValueError, match="unknown input_encoding"):
        make_model(input_encoding="onehot")


def test_softmax_baseline_and_mixer_checks(rng):
    model = make_model(mixer_kind="softmax", mixer=dict(impl="xla"), pos_emb="learned",
                       max_len=L + 4)
    tokens = random_tokens(rng)
    variables = model.init(jax_key(rng), tokens, train=False)
    logits = model.apply(variables, tokens, train=False)
    padded = jnp.concatenate([tokens, jnp.zeros((B, 4), jnp.int32)], axis=1)
    np.testing.assert_allclose(model.apply(variables, padded, train=False), logits,
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unexpected keyword argument 'variant'"):
        make_model(mixer_kind="softmax", mixer=dict(variant="s"))
    with pytest.raises(ValueError, match="unknown impl 'bogus'"):
        make_model(mixer=dict(variant="s", impl="bogus"))
    with pytest.raises(ValueError, match="unknown mixer_kind"):
        make_model(mixer_kind="mamba")


def test_dual_encoder_shares_weights(rng):
    """One encoder for both documents: swapping the pair swaps the encodings, and
    ``[u, v, u*v, u-v]`` feeds the head."""
    from lion_jax.models import DualEncoderClassifier

    encoder = dict(vocab_size=VOCAB, d_model=16, num_layers=1, num_heads=2, mlp_dim=32,
                   mixer=dict(variant="s", impl="attention"))
    model = DualEncoderClassifier(num_classes=2, encoder=encoder, mlp_dim=24)
    t1, t2 = random_tokens(rng), random_tokens(rng)
    variables = model.init(jax_key(rng), t1, t2, train=False)
    assert set(nn.unbox(variables)["params"]) == {"encode", "hidden", "head"}
    logits = model.apply(variables, t1, t2, train=False)
    assert logits.shape == (B, 2) and np.all(np.isfinite(logits))
    u, v = model.apply(variables, t1, t2, train=False, method="encode_pair")
    v2, u2 = model.apply(variables, t2, t1, train=False, method="encode_pair")
    np.testing.assert_allclose(u2, u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v2, v, rtol=1e-5, atol=1e-6)
    single = SequenceClassifier(num_classes=None, **encoder)
    np.testing.assert_allclose(
        single.apply({"params": nn.unbox(variables)["params"]["encode"]}, t1, train=False), u,
        rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="one shape"):
        model.apply(variables, t1, t2[:, :-1], train=False)


def test_one_hot_embed_matches_take(rng):
    """OneHotEmbed gives nn.Embed's output and gradient (float32 to rounding, exact rows)."""
    from lion_jax.layers.embed import OneHotEmbed

    ids = jnp.asarray(rng.integers(0, VOCAB, size=(B, L)), jnp.int32)
    cot = jnp.asarray(rng.normal(size=(B, L, 8)), jnp.float32)
    one_hot, take = OneHotEmbed(VOCAB, 8), nn.Embed(VOCAB, 8)
    params = take.init(jax_key(rng), ids)
    out = lambda m: lambda p: jnp.sum(m.apply(p, ids) * cot)  # noqa: E731
    np.testing.assert_allclose(one_hot.apply(params, ids), take.apply(params, ids), rtol=1e-6)
    g1, g2 = jax.grad(out(one_hot))(params), jax.grad(out(take))(params)
    np.testing.assert_allclose(g1["params"]["embedding"], g2["params"]["embedding"],
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="must be integers"):
        one_hot.apply(params, ids.astype(jnp.float32))


def test_float32_gather_embed_matches_take(rng):
    """Embed gives nn.Embed's output exactly in bfloat16 (the cast is elementwise), and its
    gradient is the float32 sum of the bfloat16 cotangents (nn.Embed in float32 given those
    cotangents); ids are drawn with heavy repeats (one id at half the positions, as [MASK] or
    [PAD] are)."""
    from lion_jax.layers.embed import Embed

    vocab, rows, feats = 37, 4, 24
    ids = rng.integers(0, vocab, size=(rows, 29))
    ids[rng.random(ids.shape) < 0.5] = int(rng.integers(vocab))
    ids = jnp.asarray(ids, jnp.int32)
    cot = jnp.asarray(rng.normal(size=(*ids.shape, feats)), jnp.float32)
    ours, theirs = Embed(vocab, feats, dtype=jnp.bfloat16), nn.Embed(vocab, feats,
                                                                      dtype=jnp.bfloat16)
    params = theirs.init(jax_key(rng), ids)
    out_ours, out_theirs = ours.apply(params, ids), theirs.apply(params, ids)
    assert out_ours.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out_ours, np.float32),
                                  np.asarray(out_theirs, np.float32))
    loss = lambda m: lambda p: jnp.sum(m.apply(p, ids).astype(jnp.float32) * cot)  # noqa: E731
    grad = jax.grad(loss(ours))(params)["params"]["embedding"]
    assert grad.dtype == jnp.float32 and np.all(np.isfinite(grad))
    cot = cot.astype(jnp.bfloat16).astype(jnp.float32)  # what reaches the float32 rows
    expected = jax.grad(loss(nn.Embed(vocab, feats)))(params)["params"]["embedding"]
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-5)
    x = jnp.asarray(rng.normal(size=(rows, feats)), jnp.float32)
    np.testing.assert_array_equal(ours.apply(params, x, method="attend"),
                                  theirs.apply(params, x, method="attend"))
    with pytest.raises(ValueError, match="must be integers"):
        ours.apply(params, ids.astype(jnp.float32))


@pytest.mark.parametrize("layer", ["half_glu", "half_glu2"])
def test_half_glu_blocks_are_s5_layers(rng, layer):
    """channel_mixer="half_glu": one residual branch per block, x + h * sigmoid(Dense(h)) with
    h = gelu(m), m = mixer(norm(x)), and no MLP; "half_glu2": x + m * sigmoid(Dense(h)). The
    classifier trains (finite gradients everywhere)."""
    from lion_jax.layers.block import MIXERS, ResidualBlock
    from lion_jax.layers.norms import make_norm

    model = make_model(channel_mixer=layer, num_layers=1)
    tokens = random_tokens(rng)
    params = nn.unbox(model.init(jax_key(rng), tokens, train=False))["params"]
    block = params["block_0"]
    assert set(block) == {"mixer_norm", "mixer", "glu"}, sorted(block)

    x = jnp.asarray(rng.normal(size=(B, L, 16)), jnp.float32)
    mask = jnp.ones((B, L), bool)
    got = ResidualBlock(model._mixer_kwargs(), 32, channel_mixer=layer).apply(
        {"params": block}, x, mask)
    normed = make_norm("layernorm").apply({"params": block["mixer_norm"]}, x)
    m = MIXERS["lion"](**model._mixer_kwargs()).apply({"params": block["mixer"]}, normed, mask)
    h = jax.nn.gelu(m)
    gate = h @ block["glu"]["kernel"] + block["glu"]["bias"]
    gated = h if layer == "half_glu" else m
    np.testing.assert_allclose(got, x + gated * jax.nn.sigmoid(gate), rtol=1e-5, atol=1e-5)
    assert not np.allclose(m, h, atol=1e-3)  # the two layers differ on this input

    labels = jnp.asarray(rng.integers(0, CLASSES, B))

    def loss(p):
        logits = model.apply({"params": p}, tokens, train=False)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    grads = jax.grad(loss)(params)
    assert all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grads))
    assert float(jnp.abs(grads["block_0"]["glu"]["kernel"]).sum()) > 0


def test_sequence_batchnorm_matches_formula(rng):
    """SequenceBatchNorm (S5's BatchNorm): in training the mean and variance of the real tokens
    only (over batch and length, per feature), and the running averages moved by
    ``1 - momentum`` towards them; in evaluation those averages. Float32, odd sizes."""
    from lion_jax.layers.norms import SequenceBatchNorm

    Bn, Ln, D, momentum = 3, 13, 7, 0.8
    x = jnp.asarray(rng.normal(1.5, 2.0, size=(Bn, Ln, D)), jnp.float32)
    mask = jnp.asarray(rng.random((Bn, Ln)) < 0.7).at[:, 0].set(True)
    norm = SequenceBatchNorm(momentum=momentum)
    variables = norm.init(jax_key(rng), x, mask, deterministic=True)
    params = {"bn": {"scale": jnp.asarray(rng.normal(size=D), jnp.float32),
                     "bias": jnp.asarray(rng.normal(size=D), jnp.float32)}}
    got, state = norm.apply({"params": params, **{"batch_stats": variables["batch_stats"]}},
                            x, mask, deterministic=False, mutable=["batch_stats"])
    real = np.asarray(x)[np.asarray(mask)]  # [tokens, D]
    mean, var = real.mean(0), real.var(0)
    scale, bias = np.asarray(params["bn"]["scale"]), np.asarray(params["bn"]["bias"])
    want = (np.asarray(x) - mean) / np.sqrt(var + 1e-5) * scale + bias
    m = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(got)[m], want[m], rtol=1e-5, atol=1e-5)
    stats = state["batch_stats"]["bn"]
    np.testing.assert_allclose(stats["mean"], (1 - momentum) * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["var"], momentum + (1 - momentum) * var, rtol=1e-5)

    evaluated = norm.apply({"params": params, "batch_stats": state["batch_stats"]}, x, mask,
                           deterministic=True)
    want = ((np.asarray(x) - stats["mean"]) / np.sqrt(np.asarray(stats["var"]) + 1e-5)
            * scale + bias)
    np.testing.assert_allclose(evaluated, want, rtol=1e-5, atol=1e-5)


def test_batchnorm_classifier_ignores_padding_and_its_batch(rng):
    """norm="batchnorm": padding changes no real output in training (masked statistics) or
    evaluation, evaluation gives an example the same logits in any batch, training moves the
    running statistics of every norm, and a bad norm is one error naming the valid ones."""
    model = make_model(norm="batchnorm", channel_mixer="half_glu", bn_momentum=0.9)
    tokens = random_tokens(rng).at[0, 7:].set(0)
    padded = jnp.concatenate([tokens, jnp.zeros((B, 4), jnp.int32)], axis=1)
    variables = model.init(jax_key(rng), tokens, train=False)
    assert set(variables["batch_stats"]) == {"block_0", "block_1", "final_norm"}

    train = [model.apply(variables, t, train=True, mutable=["batch_stats"]) for t in
             (tokens, padded)]
    np.testing.assert_allclose(train[0][0], train[1][0], rtol=1e-5, atol=1e-6)
    moved = train[0][1]["batch_stats"]
    assert all(not np.allclose(a, b) for a, b in zip(
        jax.tree_util.tree_leaves(moved), jax.tree_util.tree_leaves(variables["batch_stats"])))

    trained = {"params": variables["params"], "batch_stats": moved}
    full = model.apply(trained, tokens, train=False)
    np.testing.assert_allclose(model.apply(trained, padded, train=False), full, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(model.apply(trained, tokens[1:], train=False), full[1:],
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"unknown norm 'groupnorm'.*'batchnorm'"):
        make_model(norm="groupnorm")


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_image_orders_walk_the_permuted_image(rng, pooling):
    """``orders=("col_snake",)`` on an image flattened row by row is the raster model on the
    column-snake sequence (everything but the mixer works per token, and mean or CLS pooling
    ignores where a token sits); two orders average the masks, so they differ from either."""
    from lion_jax.models.vit import patch_order

    rows, cols = 3, 5
    kwargs = dict(input_encoding="pixels", pad_id=None, pooling=pooling, image_shape=(rows, cols),
                  mixer=dict(variant="s", impl="attention", decay_shape="vector"))
    pixels = jnp.asarray(rng.integers(0, 256, size=(B, rows * cols)), jnp.uint8)
    raster = make_model(**kwargs)
    variables = raster.init(jax_key(rng), pixels, train=False)
    col = patch_order(rows, cols, "col_snake")
    walked = make_model(orders=("col_snake",), **kwargs).apply(variables, pixels, train=False)
    np.testing.assert_allclose(walked, raster.apply(variables, pixels[:, col], train=False),
                               rtol=1e-5, atol=1e-5)
    both = make_model(orders=("row_snake", "col_snake"), **kwargs).apply(variables, pixels,
                                                                       train=False)
    assert np.all(np.isfinite(both)) and not np.allclose(both, walked, atol=1e-4)
    with pytest.raises(ValueError, match=r"walk an image of image_shape=\(3, 5\) \(15 tokens\); "
                                         r"the inputs hold 14"):
        make_model(orders=("col_snake",), **kwargs).apply(variables, pixels[:, 1:], train=False)
