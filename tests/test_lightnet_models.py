"""The LightNet models on the library's skeletons: the image classifier (the ViT with LightNet
layers, configs/lightnet/imagenet.py: Table 12's parameter counts, any resolution, the channel
mixer switch) and the bidirectional encoder (BERT with the LightNet mixer: padding). The causal
LM is tests/test_lm.py's ``arch="lightnet"``."""

import importlib.util
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.layers.block import ResidualBlock
from lion_jax.models.bert import BertEncoder
from lion_jax.models.vit import VisionTransformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config_module():
    path = os.path.join(ROOT, "configs", "lightnet", "imagenet.py")
    spec = importlib.util.spec_from_file_location("lightnet_imagenet", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(config_model, **overrides):
    kwargs = dict(config_model.to_dict(), dtype=jnp.float32, param_dtype=jnp.float32)
    kwargs.update(orders=tuple(kwargs["orders"]), **overrides)
    return VisionTransformer(num_classes=1000, **kwargs)


@pytest.mark.parametrize("variant, printed", [(None, 6.0e6), ("s", 22.6e6), ("b", 87.7e6)])
def test_table_12_parameter_counts(variant, printed):
    net = _model(_config_module().get_config(variant).model)
    shapes = jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0),
                                             jnp.zeros((1, 224, 224, 3)), train=False))
    got = sum(np.prod(x.shape) for x in jax.tree.leaves(shapes))
    assert abs(got / printed - 1) < 0.02, got


def test_any_resolution_and_the_grid_positions(rng):
    """A small LightNet ViT runs at 16 x 16 and 24 x 20 px (patch grids 4 x 4 and 6 x 5: the
    MD-TPE and the MD-LRPE take the grid of each call); the CLS token is the unrotated
    prefix; the outputs are finite and change with the image."""
    model = _config_module().lightnet_model("t")
    model.update(patch_size=4, d_model=24, num_layers=2, num_heads=2, mlp_dim=64)
    net = _model(model)
    images = jnp.asarray(rng.normal(size=(2, 16, 16, 3)), jnp.float32)
    params = nn.meta.unbox(net.init(jax.random.PRNGKey(int(rng.integers(2**31))), images,
                                    train=False))
    assert "md_tpe" in params["params"] and "gate_down" in params["params"]["block_0"]["mixer"]
    assert params["params"]["block_0"]["mlp"]["w1"]["kernel"].shape == (24, 64)  # SwiGLU
    for shape in ((2, 16, 16, 3), (2, 24, 20, 3)):
        x = jnp.asarray(rng.normal(size=shape), jnp.float32)
        logits = net.apply(params, x, train=False)
        assert logits.shape == (2, 1000) and np.isfinite(np.asarray(logits)).all()
        assert np.abs(np.asarray(logits[0] - logits[1])).max() > 0
    # the rotation is in use: without it the same parameters give other logits
    plain = _model(model, mixer=dict(model.mixer.to_dict(), lrpe=False))
    assert np.abs(np.asarray(plain.apply(params, images, train=False)
                             - net.apply(params, images, train=False))).max() > 1e-6


def test_channel_mixer_must_be_known():
    with pytest.raises(ValueError, match="unknown channel_mixer 'geglu'"):
        ResidualBlock({"num_heads": 2, "head_dim": 4}, 8, mixer_kind="lightnet",
                      channel_mixer="geglu")


def test_bert_encoder_with_the_lightnet_mixer_ignores_padding(rng):
    """configs/lightnet/mlm.py's encoder (TPE after the embeddings, 1-D LRPE): a padded row's
    real tokens equal the same row run without its padding."""
    net = BertEncoder(vocab_size=50, d_model=16, num_layers=2, num_heads=2, mlp_dim=32,
                      mixer_kind="lightnet", mixer={"lrpe": True}, pos_emb="tpe",
                      post_norm=False)
    tokens = jnp.asarray(rng.integers(1, 50, size=(2, 11)), jnp.int32).at[1, 7:].set(0)
    params = net.init(jax.random.PRNGKey(int(rng.integers(2**31))), tokens, train=False)
    out = net.apply(params, tokens, train=False)
    assert out.shape == (2, 11, 16) and np.isfinite(np.asarray(out)).all()
    shorter = net.apply(params, tokens[1:, :7], train=False)  # the same row without padding
    np.testing.assert_allclose(out[1, :7], shorter[0], rtol=1e-5, atol=1e-5)
    assert "tpe" in params["params"]
