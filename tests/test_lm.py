"""Causal LMs (lion_jax.models.lm) and generation (lion_jax.generate)."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax import generate as gen
from lion_jax import ops
from lion_jax.models.lm import ARCHS, CausalLM, lm_size, next_token_losses

VOCAB = 37


def tiny(arch, **kwargs):
    mixer = {} if arch == "llama" else {"impl": "chunk", "chunk_size": 4}
    return CausalLM(arch=arch, vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=2,
                    mlp_dim=48, max_len=32, mixer=mixer, **kwargs)


@pytest.fixture(scope="module", params=ARCHS)
def model_and_params(request):
    model = tiny(request.param)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 5), jnp.int32))
    return model, params


def tokens(rng, B, L):
    return jnp.asarray(rng.integers(0, VOCAB, (B, L)), jnp.int32)


def test_causal(model_and_params, rng):
    model, params = model_and_params
    x = tokens(rng, 2, 13)
    logits = model.apply(params, x)
    assert logits.shape == (2, 13, VOCAB) and logits.dtype == jnp.float32
    t = int(rng.integers(1, 12))
    changed = x.at[:, t:].set((x[:, t:] + 1) % VOCAB)
    np.testing.assert_allclose(model.apply(params, changed)[:, :t], logits[:, :t], atol=1e-5)


def test_prefill_and_continuation_equal_the_full_forward(model_and_params, rng):
    """L = 13 is not a multiple of the chunk (4); the continuation starts at an offset."""
    model, params = model_and_params
    x = tokens(rng, 2, 13)
    full = model.apply(params, x)
    split = int(rng.integers(1, 11))
    a, state = model.apply(params, x[:, :split], return_state=True)
    b, state = model.apply(params, x[:, split:split + 1], state=state, offset=split,
                           return_state=True)
    c = model.apply(params, x[:, split + 1:], state=state, offset=split + 1)
    np.testing.assert_allclose(jnp.concatenate([a, b, c], axis=1), full, atol=2e-5, rtol=2e-5)


def test_generation_modes_emit_the_same_greedy_tokens(model_and_params, rng):
    """The prompt (7) is no multiple of the chunk (4); chunked prefills move LRPE's offset."""
    model, params = model_and_params
    prompt = tokens(rng, 2, 7)
    ref = gen.generate(model, params, prompt, 6, mode="recompute")
    assert ref.shape == (2, 13) and np.array_equal(ref[:, :7], prompt)
    np.testing.assert_array_equal(gen.generate(model, params, prompt, 6, mode="state"), ref)
    for mode in ("state", "kv_cache"):
        np.testing.assert_array_equal(
            gen.generate(model, params, prompt, 6, mode=mode, prefill_chunk=3), ref)


def test_kv_cache_decoding_state(rng):
    """kv_cache=True: the linear mixers' state is a KV cache of max_len slots holding every
    token seen (shapes only), and a prefill from it gives the recurrent state's logits."""
    x = tokens(rng, 2, 9)
    for arch in set(ARCHS) - {"llama"}:
        model = tiny(arch, kv_cache=True)
        params = jax.eval_shape(model.init, jax.random.PRNGKey(0), x)
        _, state = jax.eval_shape(functools.partial(model.apply, return_state=True), params, x)
        cache = state["layers"][1]
        if arch == "lightnet":  # (cache, z): the running log-normaliser rides along
            cache = cache[0]
        assert isinstance(cache, ops.KVCache) and cache.v.shape == (2, 32, 2, 16), arch
    model = tiny("hgrn2")
    params = model.init(jax.random.PRNGKey(int(rng.integers(1 << 30))), x)
    ref, _ = jax.jit(functools.partial(model.apply, return_state=True))(params, x)
    logits, state = jax.jit(functools.partial(model.clone(kv_cache=True).apply,
                                              return_state=True))(params, x)
    assert int(state["layers"][0].length) == 9
    np.testing.assert_allclose(logits, ref, atol=2e-5, rtol=2e-5)


def test_sampling_modes_agree_and_respect_top_k(rng):
    model = tiny("tnl")
    params = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 4), jnp.int32))
    prompt = tokens(rng, 3, 5)
    key = jax.random.PRNGKey(int(rng.integers(1 << 30)))
    kwargs = dict(rng=key, temperature=0.8, top_k=5, top_p=0.9)
    a = gen.generate(model, params, prompt, 5, mode="recompute", **kwargs)
    b = gen.generate(model, params, prompt, 5, mode="state", **kwargs)
    np.testing.assert_array_equal(a, b)
    logits = jnp.asarray(rng.normal(size=(4, VOCAB)), jnp.float32)
    picks = jax.vmap(lambda k: gen.sample(logits, k, temperature=1.0, top_k=3))(
        jax.random.split(key, 200))
    top3 = np.argsort(-np.asarray(logits), axis=-1)[:, :3]
    assert all(int(p) in top3[i] for row in np.asarray(picks) for i, p in enumerate(row))
    # top_p: the most likely token alone when it holds more than top_p
    peaked = jnp.zeros((1, VOCAB)).at[0, 4].set(20.0)
    assert int(gen.sample(peaked, key, temperature=1.0, top_p=0.5)[0]) == 4


def test_bad_requests_are_one_line():
    llama = tiny("llama")
    with pytest.raises(ValueError, match="pass LLaMA's context max_len=32"):
        gen.check_request(llama, 30, 5)
    gen.check_request(tiny("tnl"), 30, 5)  # the linear models have no limit
    with pytest.raises(ValueError, match=r"the KV cache's capacity max_len=32.*mode='state'"):
        gen.check_request(tiny("tnl"), 30, 5, mode="kv_cache")  # unless they keep a KV cache
    with pytest.raises(ValueError, match="unknown mode"):
        gen.check_request(llama, 3, 2, mode="kv")
    with pytest.raises(ValueError, match="unknown arch"):
        CausalLM(arch="gpt", vocab_size=5, d_model=8, num_layers=1, num_heads=1, mlp_dim=8)


# Table 7 of the scaling-laws paper: non-embedding parameters (M), digest section 1.6
TABLE_7 = {"llama": (20.5, 85.0, 334.1, 906.2, 2775.8, 6476.5),
           "tnl": (21.2, 87.3, 327.7, 918.6, 2798.4, 6509.6),
           "hgrn2": (20.5, 84.9, 334.0, 906.0, 2775.5, 6476.1),
           "cosformer2": (21.3, 87.5, 328.0, 919.1, 2799.0, 6511.0)}
SIZES = ("70m", "160m", "410m", "1b", "3b", "7b")


def non_embedding_millions(arch, size):
    model = CausalLM(arch=arch, vocab_size=100_280, **lm_size(size, arch))
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
    flat = jax.tree_util.tree_flatten_with_path(shapes["params"])[0]
    return sum(np.prod(x.shape) for path, x in flat
               if "embed" not in jax.tree_util.keystr(path)) / 1e6


@pytest.mark.parametrize("arch", ["llama", "tnl", "hgrn2"])
def test_parameter_counts_match_table_7(arch):
    for size, printed in zip(SIZES, TABLE_7[arch]):
        assert abs(non_embedding_millions(arch, size) - printed) <= 0.1, (arch, size)


def test_cosformer2_parameter_counts_near_table_7():
    """cosFormer2's printed counts are 0.1-0.9M above what its equations give (digest 2.3)."""
    for size, printed in zip(SIZES, TABLE_7["cosformer2"]):
        assert -0.1 <= printed - non_embedding_millions("cosformer2", size) <= 1.0, size


@pytest.mark.parametrize("max_logits", [1, 5 * 37 * 3, 10**9])  # 1 token, 3 with padding, all
def test_next_token_losses_match_the_full_logits(rng, max_logits):
    B, L, D, V = 5, 11, 16, 37
    features = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
    embedding = jnp.asarray(rng.normal(size=(V, D)) * 0.5, jnp.float32)
    targets = jnp.asarray(rng.integers(0, V, size=(B, L)), jnp.int32)
    weights = jnp.asarray(rng.normal(size=(B, L)), jnp.float32)

    def full(f, e):
        logits = f @ e.T
        xent = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
        return xent, (jnp.argmax(logits, -1) == targets).astype(jnp.float32)

    def sliced(f, e):
        return next_token_losses(f, e, targets, max_logits=max_logits)

    for got, want in zip(sliced(features, embedding), full(features, embedding)):
        assert got.shape == (B, L) and got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    grads = [jax.grad(lambda f, e, fn=fn: jnp.sum(fn(f, e)[0] * weights), argnums=(0, 1))(
        features, embedding) for fn in (sliced, full)]
    for got, want in zip(*grads):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_hidden_features_give_the_logits(rng):
    net = CausalLM(arch="tnl", vocab_size=41, d_model=16, num_layers=2, num_heads=2,
                   mlp_dim=24)
    tokens = jnp.asarray(rng.integers(0, 41, size=(2, 7)), jnp.int32)
    params = nn.meta.unbox(net.init(jax.random.PRNGKey(int(rng.integers(2**31))), tokens))
    features = net.apply(params, tokens, hidden=True)
    assert features.shape == (2, 7, 16) and features.dtype == jnp.float32
    np.testing.assert_allclose(features @ params["params"]["embed"]["embedding"].T,
                               net.apply(params, tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["tnl", "llama"])
def test_remat_changes_neither_values_nor_gradients(rng, arch):
    kwargs = dict(arch=arch, vocab_size=29, d_model=16, num_layers=2, num_heads=2, mlp_dim=24)
    tokens = jnp.asarray(rng.integers(0, 29, size=(2, 9)), jnp.int32)
    plain, remat = CausalLM(**kwargs), CausalLM(remat=True, **kwargs)
    params = nn.meta.unbox(plain.init(jax.random.PRNGKey(int(rng.integers(2**31))), tokens))
    np.testing.assert_allclose(remat.apply(params, tokens), plain.apply(params, tokens),
                               rtol=1e-6, atol=1e-6)
    grads = [jax.grad(lambda p, n=n: jnp.sum(n.apply(p, tokens) ** 2))(params)
             for n in (plain, remat)]
    for got, want in zip(jax.tree.leaves(grads[1]), jax.tree.leaves(grads[0])):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Decoding takes the plain path (remat cannot carry its flags): same logits and state.
    _, state = remat.apply(params, tokens[:, :5], return_state=True)
    step = remat.apply(params, tokens[:, 5:], state=state, offset=5)
    np.testing.assert_allclose(step, plain.apply(params, tokens)[:, 5:], rtol=1e-4, atol=1e-5)
