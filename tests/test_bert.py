"""lion_jax.models.bert: head shapes, the tied MLM projection, padding, positions past max_len,
LION-LIT's norm after the mixer, every mixer's gradients, impl agreement, BERT-base's parameter
count, and bad settings."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.models import (BertEncoder, BertForMaskedLM, BertForSequenceClassification,
                             bert_size)
from lion_jax.models.bert import BERT_SIZES, BertBlock

B, L, VOCAB = 3, 13, 97
SMALL = dict(vocab_size=VOCAB, d_model=36, num_layers=2, num_heads=3, mlp_dim=52, max_len=24,
             dropout=0.0)
MIXERS = {  # name: encoder kwargs
    "lit": dict(mixer=dict(variant="lit")),
    "retnet": dict(mixer=dict(variant="retnet")),
    "s": dict(mixer=dict(variant="s"), pos_emb="none"),
    "softmax": dict(mixer_kind="softmax", mixer=dict(impl="xla")),
}


def encoder(name, **kwargs):
    return SMALL | MIXERS[name] | kwargs


def jax_key(rng):
    return jax.random.key(int(rng.integers(2 ** 31)))


def random_tokens(rng, b=B, length=L):
    """Token ids in [1, VOCAB) (0 is the pad id)."""
    return jnp.asarray(rng.integers(1, VOCAB, size=(b, length)), jnp.int32)


def finite(x):
    return bool(np.all(np.isfinite(np.asarray(x))))


def test_head_shapes(rng):
    """Encoder ``[B, L, D]``; MLM ``[B, L, V]`` float32, and at ``positions [B, P]`` the
    gathered rows of it; classification ``[B, n]``, regression ``[B, 1]``."""
    cfg = encoder("s")
    tokens = random_tokens(rng)
    types = jnp.asarray(rng.integers(0, 2, size=(B, L)), jnp.int32)
    enc = BertEncoder(**cfg)
    h = enc.apply(enc.init(jax_key(rng), tokens, train=False), tokens, train=False,
                  token_types=types)
    assert h.shape == (B, L, 36) and finite(h)

    mlm = BertForMaskedLM(encoder=cfg)
    params = mlm.init(jax_key(rng), tokens, train=False)
    logits = mlm.apply(params, tokens, train=False, token_types=types)
    assert logits.shape == (B, L, VOCAB) and logits.dtype == jnp.float32 and finite(logits)
    positions = jnp.asarray(rng.integers(0, L, size=(B, 4)), jnp.int32)
    at = mlm.apply(params, tokens, train=False, token_types=types, positions=positions)
    assert at.shape == (B, 4, VOCAB)
    np.testing.assert_allclose(at, np.take_along_axis(np.asarray(logits), positions[..., None],
                                                      axis=1), rtol=1e-5, atol=1e-5)

    for labels in (3, 1):
        cls = BertForSequenceClassification(labels, encoder=cfg)
        out = cls.apply(cls.init(jax_key(rng), tokens, train=False), tokens, train=False)
        assert out.shape == (B, labels) and out.dtype == jnp.float32 and finite(out)


def test_mlm_projection_is_tied(rng):
    """The output projection is the token embedding ``E``: ``logits = f @ E^T + b`` for the
    head's features ``f``, also after ``E`` is replaced; no other ``[V, D]`` weight exists."""
    mlm = BertForMaskedLM(encoder=encoder("lit"))
    tokens = random_tokens(rng)
    params = nn.unbox(mlm.init(jax_key(rng), tokens, train=False))
    vocab_shaped = [p for p in jax.tree.leaves(params) if VOCAB in p.shape and p.ndim == 2]
    assert len(vocab_shaped) == 1
    params["params"]["mlm_bias"] = jnp.asarray(rng.standard_normal(VOCAB), jnp.float32)
    for _ in range(2):
        logits, state = mlm.apply(params, tokens, train=False, mutable=["intermediates"])
        (features,) = state["intermediates"]["mlm_features"]
        table = params["params"]["encoder"]["token_embed"]["embedding"]
        expected = (np.asarray(features, np.float64) @ np.asarray(table, np.float64).T
                    + np.asarray(params["params"]["mlm_bias"]))
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
        params["params"]["encoder"]["token_embed"]["embedding"] = jnp.asarray(
            rng.standard_normal(table.shape), jnp.float32)


@pytest.mark.parametrize("name", list(MIXERS))
def test_padding_leaves_real_outputs(rng, name):
    """Rows padded at the end (id 0, the default mask) give, at their real positions, the
    MLM logits of the unpadded rows (so the same encoder outputs there, the classifier's first
    token too), beside an unpadded row; for LION-S without positions, pads inserted mid-row
    too."""
    n = L - 4
    tokens = random_tokens(rng).at[1:, n:].set(0)  # real lengths (L, n, n)
    mlm = BertForMaskedLM(encoder=encoder(name))
    params = mlm.init(jax_key(rng), tokens, train=False)
    logits = mlm.apply(params, tokens, train=False)
    alone = mlm.apply(params, tokens[1:, :n], train=False)
    assert finite(logits)
    np.testing.assert_allclose(logits[1:, :n], alone, rtol=1e-4, atol=1e-5)
    if name == "s":  # no positions: LION ignores pads anywhere, here 4 after token 5
        inserted = tokens.at[1].set(jnp.concatenate([tokens[1, :5], jnp.zeros(L - n, jnp.int32),
                                                     tokens[1, 5:n]]))
        out = mlm.apply(params, inserted, train=False)[1]
        np.testing.assert_allclose(np.concatenate([out[:5], out[5 + L - n:]]), alone[0],
                                   rtol=1e-4, atol=1e-5)


def test_lengths_past_max_len(rng):
    """``pos_emb="none"`` runs past any ``max_len``; learned positions refuse in one line."""
    tokens = random_tokens(rng)
    for max_len in (None, L - 9):
        mlm = BertForMaskedLM(encoder=encoder("s", max_len=max_len))
        out = mlm.apply(mlm.init(jax_key(rng), tokens, train=False), tokens, train=False)
        assert out.shape == (B, L, VOCAB) and finite(out)

    learned = BertForMaskedLM(encoder=encoder("s", pos_emb="learned", max_len=L))
    params = learned.init(jax_key(rng), tokens, train=False)
    with pytest.raises(ValueError) as e:
        learned.apply(params, random_tokens(rng, length=L + 1), train=False)
    assert str(e.value) == (f"sequence length {L + 1} exceeds max_len={L} of the learned "
                            "positions (pos_emb='none' takes any length)")


def test_lit_norm_after_mixer(rng):
    """LION-LIT's blocks norm the mixer's output by default (no other mixer does), so their
    output does not change when the mixer's output projection is scaled; switched off, it
    does."""
    for name, present in (("lit", True), ("retnet", False), ("s", False), ("softmax", False)):
        assert BertEncoder(**encoder(name)).uses_norm_after_mixer == present, name
    assert BertEncoder(**encoder("softmax", norm_after_mixer=True)).uses_norm_after_mixer
    tokens = random_tokens(rng)
    for norm_after_mixer in (None, False):
        mlm = BertForMaskedLM(encoder=encoder("lit", norm_after_mixer=norm_after_mixer))
        params = nn.unbox(mlm.init(jax_key(rng), tokens, train=False))
        block = params["params"]["encoder"]["blocks_0"]
        assert ("mixer_output_norm" in block) == (norm_after_mixer is None)
        scaled = jax.tree.map(lambda x: x, params)
        out = scaled["params"]["encoder"]["blocks_0"]["mixer"]["out"]
        out["kernel"], out["bias"] = 3.0 * out["kernel"], 3.0 * out["bias"]
        before, after = (mlm.apply(p, tokens, train=False) for p in (params, scaled))
        if norm_after_mixer is None:
            np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)
        else:
            assert not np.allclose(after, before, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("post_norm", [True, False])
def test_block_layout(rng, post_norm):
    """Post-norm (BERT): the block's output is a LayerNorm's (zero mean, unit variance per
    token at init); pre-norm: the residual stream itself."""
    block = BertBlock(dict(num_heads=3, head_dim=12, variant="s"), 52, post_norm=post_norm)
    x = jnp.asarray(3.0 + 2.0 * rng.standard_normal((B, L, 36)), jnp.float32)
    y = block.apply(block.init(jax_key(rng), x), x)
    normed = np.allclose(y.mean(-1), 0.0, atol=1e-4) and np.allclose(y.var(-1), 1.0, atol=1e-3)
    assert normed == post_norm and finite(y)


@pytest.mark.parametrize("name", list(MIXERS))
def test_every_mixer_backward(rng, name):
    """MLM loss at a few positions, with dropout: finite gradients for every mixer, nonzero
    on every parameter."""
    mlm = BertForMaskedLM(encoder=encoder(name, dropout=0.1))
    tokens = random_tokens(rng)
    positions = jnp.asarray(rng.integers(0, L, size=(B, 3)), jnp.int32)
    targets = random_tokens(rng, length=3)
    params = mlm.init(jax_key(rng), tokens, train=False)
    key = jax_key(rng)

    def loss(p):
        logits = mlm.apply(p, tokens, train=True, positions=positions, rngs={"dropout": key})
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    value, grads = jax.value_and_grad(loss)(params)
    leaves = jax.tree.leaves(nn.unbox(grads))
    assert finite(value) and all(finite(g) for g in leaves)
    assert all(float(jnp.sum(jnp.abs(g))) > 0 for g in leaves)


def test_lion_s_impls_agree(rng):
    """LION-S MLM logits through the materialized (``attention``) and chunked forms agree to
    float32 tolerance (odd length, chunk 4, padded rows)."""
    tokens = random_tokens(rng).at[1, 9:].set(0)
    logits = {}
    for impl in ("attention", "chunk"):
        mlm = BertForMaskedLM(encoder=encoder("s", mixer=dict(variant="s", impl=impl,
                                                             chunk_size=4)))
        if impl == "attention":
            params = mlm.init(jax_key(rng), tokens, train=False)
        logits[impl] = mlm.apply(params, tokens, train=False)
    assert finite(logits["chunk"])
    np.testing.assert_allclose(logits["chunk"], logits["attention"], rtol=1e-5, atol=1e-5)


def count_params(model):
    shapes = jax.eval_shape(lambda key, t: model.init(key, t, train=False), jax.random.key(0),
                            jnp.ones((1, 8), jnp.int32))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes)))


def test_base_parameter_count():
    """BERT-base with softmax attention has BERT's 109,482,240 parameters (embeddings, 12
    layers, pooler; 110M in Devlin et al.), plus the classifier; LION-S adds a decay gate
    ``Dense(D -> H)`` per layer and drops the 512 learned positions."""
    softmax = bert_size("base") | dict(mixer_kind="softmax", mixer={})
    assert count_params(BertForSequenceClassification(2, encoder=softmax)) == (
        109_482_240 + 768 * 2 + 2)
    lion_s = bert_size("base") | dict(mixer=dict(variant="s"), pos_emb="none")
    assert count_params(BertForSequenceClassification(2, encoder=lion_s)) == (
        109_482_240 + 768 * 2 + 2 + 12 * (768 * 12 + 12) - 512 * 768)


def test_encoder_weights_move_to_the_classifier(rng):
    """The MLM model's ``params["encoder"]`` is the classifier's: fine-tuning starts from it."""
    tokens = random_tokens(rng)
    mlm = BertForMaskedLM(encoder=encoder("lit"))
    cls = BertForSequenceClassification(2, encoder=encoder("lit"))
    pre = mlm.init(jax_key(rng), tokens, train=False)["params"]["encoder"]
    fine = cls.init(jax_key(rng), tokens, train=False)
    assert jax.tree.structure(pre) == jax.tree.structure(fine["params"]["encoder"])
    fine = {"params": {**fine["params"], "encoder": pre}}
    assert finite(cls.apply(fine, tokens, train=False))


def test_sizes():
    assert bert_size("base") == dict(d_model=768, num_layers=12, num_heads=12, mlp_dim=3072)
    assert bert_size("large") == dict(d_model=1024, num_layers=24, num_heads=16, mlp_dim=4096)
    assert set(BERT_SIZES) == {"tiny", "base", "large"}
    with pytest.raises(ValueError) as e:
        bert_size("huge")
    assert str(e.value) == "unknown BERT size 'huge'; valid: ['tiny', 'base', 'large']"


@pytest.mark.parametrize("kwargs,match", [
    (dict(pos_emb="rope"), "unknown pos_emb 'rope'"),
    (dict(pos_emb="learned", max_len=None), "pos_emb='learned' needs max_len"),
    (dict(type_vocab_size=-1), "type_vocab_size must be >= 0"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
    (dict(mixer=dict(variant="z")), "mixer: unknown variant 'z'"),
    (dict(mixer=dict(num_heads=4)), r"set \['num_heads'\] on BertEncoder"),
    (dict(mixer_kind="mamba"), "unknown mixer_kind 'mamba'"),
    (dict(num_heads=5), "d_model=36 is not divisible by num_heads=5"),
    (dict(norm="batchnorm"), "unknown norm 'batchnorm'"),
    (dict(widht=3), "BertForMaskedLM encoder: got an unexpected keyword argument 'widht'"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        BertForMaskedLM(encoder=encoder("lit") | kwargs)
    assert "\n" not in str(e.value)


def test_bad_inputs(rng):
    with pytest.raises(ValueError, match="num_labels must be >= 1"):
        BertForSequenceClassification(0, encoder=encoder("s"))
    tokens = random_tokens(rng)
    enc = BertEncoder(**encoder("s", type_vocab_size=0))
    params = enc.init(jax_key(rng), tokens, train=False)
    assert "type_embed" not in params["params"]
    with pytest.raises(ValueError, match="token_types given but type_vocab_size=0"):
        enc.apply(params, tokens, train=False, token_types=jnp.zeros_like(tokens))
    with pytest.raises(ValueError, match=r"tokens must be \[B, L\]"):
        enc.apply(params, tokens[0], train=False)
