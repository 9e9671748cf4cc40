"""lion_jax.ops: every implementation against the materialized reference, forward and gradients.

Tolerances (ARCHITECTURE.md section 6): float64 relative error <= 1e-10, float32 <= 1e-5 (both
against a float64 reference on the same inputs), bf16 relative RMS error <= 5e-3. Inputs are
drawn with a fresh seed per test (printed as [seed=...]); lengths are odd so they are never a
multiple of the chunk.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax import ops

TOL = {np.float64: 1e-10, np.float32: 1e-5}
DECAYS = ("none", "zero", "moderate", "strong")  # strong: log-decay down to -20 per token


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(x)), "non-finite values"
    return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-300)


def make_inputs(rng, *, decay, normalize, dtype, B=2, L=None, H=2, K=6, V=5):
    """Random q, k, v, log_decay, cotangent. Normalised runs get positive features (as elu+1
    gives) so the denominator is well conditioned; non-normalised ones get signed features."""
    L = L if L is not None else int(rng.integers(8, 35)) * 2 + 1
    if normalize:
        q, k = (rng.uniform(0.05, 1.0, size=(B, L, H, K)) for _ in range(2))
    else:
        q, k = (rng.normal(size=(B, L, H, K)) for _ in range(2))
    v = rng.normal(size=(B, L, H, V))
    # "feature_*": per key feature (causal); "value_*": per value feature (LION, paper C.7)
    shape = {"feature": (B, L, H, K), "value": (B, L, H, V)}.get(decay.split("_")[0], (B, L, H))
    log_decay = {
        "none": None,
        "zero": np.zeros(shape),
        "moderate": -rng.uniform(0.0, 1.0, size=shape),
        "strong": -rng.uniform(0.0, 20.0, size=shape),
    }[decay.split("_")[-1]]
    cot = rng.normal(size=(B, L, H, V))
    cast = lambda x: None if x is None else jnp.asarray(x, dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), cast(log_decay), cast(cot)


L_TEST = 45  # odd, so never a multiple of the chunk (16); fixed so compiled functions are reused


@functools.partial(jax.jit, static_argnames=("op", "impl", "normalize"))
def value_and_grads(q, k, v, log_decay, cot, *, op, impl, normalize):
    """Output of ``op`` and the gradients of <output, cot> w.r.t. q, k, v and log_decay."""
    fn = ops.lion_attention if op == "lion" else ops.causal_linear_attention

    def loss(q, k, v, a):
        return jnp.sum(fn(q, k, v, a, normalize=normalize, impl=impl, chunk_size=16) * cot)

    argnums = (0, 1, 2) if log_decay is None else (0, 1, 2, 3)
    grads = jax.grad(loss, argnums=argnums)(q, k, v, log_decay)
    return fn(q, k, v, log_decay, normalize=normalize, impl=impl, chunk_size=16), grads


def check_against_reference(inputs, dtype, **kwargs):
    """Compares an impl (output and gradients) with impl="attention" in float64."""
    with jax.enable_x64(True):
        ref_inputs = [None if x is None else jnp.asarray(x, jnp.float64) for x in inputs]
        ref_out, ref_grads = value_and_grads(*ref_inputs, **{**kwargs, "impl": "attention"})
        ref_out, ref_grads = np.asarray(ref_out), [np.asarray(g) for g in ref_grads]
    with jax.enable_x64(dtype == np.float64):
        out, grads = value_and_grads(*inputs, **kwargs)
    chex.assert_tree_all_finite((out, grads))
    assert out.dtype == dtype
    assert rel_err(out, ref_out) <= TOL[dtype], f"output: {rel_err(out, ref_out):.3g}"
    for name, g, rg in zip("qkva", grads, ref_grads):
        assert rel_err(g, rg) <= TOL[dtype], f"d{name}: {rel_err(g, rg):.3g}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("decay", DECAYS + ("value_moderate", "value_strong"))
@pytest.mark.parametrize("impl", ["recurrent", "chunk"])
def test_lion_attention_matches_reference(rng, impl, decay, normalize, dtype):
    with jax.enable_x64(dtype == np.float64):
        inputs = make_inputs(rng, decay=decay, normalize=normalize, dtype=dtype, L=L_TEST)
    check_against_reference(inputs, dtype, op="lion", impl=impl, normalize=normalize)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("decay", DECAYS + ("feature_moderate", "feature_strong"))
@pytest.mark.parametrize("impl", ["recurrent", "chunk"])
def test_causal_matches_reference(rng, impl, decay, normalize, dtype):
    with jax.enable_x64(dtype == np.float64):
        inputs = make_inputs(rng, decay=decay, normalize=normalize, dtype=dtype, L=L_TEST)
    check_against_reference(inputs, dtype, op="causal", impl=impl, normalize=normalize)


def test_reference_is_the_papers_formula(rng):
    """The materialized form equals SCALE(QK^T * M)V written out entry by entry (Eq. 28)."""
    with jax.enable_x64(True):
        q, k, v, a, _ = make_inputs(rng, decay="moderate", normalize=True, dtype=np.float64, B=1,
                                    H=1, L=9)
        qn, kn, vn, an = (np.asarray(x)[0, :, 0] for x in (q, k, v, a))
        A = np.cumsum(an)
        L = len(A)
        M = np.array([[np.prod(np.exp(an[j + 1:i + 1])) if i >= j
                        else np.prod(np.exp(an[i + 1:j + 1])) for j in range(L)]
                      for i in range(L)])
        scores = (qn @ kn.T) * M
        expected = scores @ vn / (scores.sum(1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(M, np.exp(-np.abs(A[:, None] - A[None, :])), rtol=1e-12)
        got = ops.lion_attention(q, k, v, a, impl="attention")[0, :, 0]
        assert rel_err(got, expected) <= 1e-12
        causal = (qn @ kn.T) * np.tril(M) @ vn
        got = ops.causal_linear_attention(q, k, v, a, impl="attention")[0, :, 0]
        assert rel_err(got, causal) <= 1e-12


def test_value_decay_is_eq_136(rng):
    """A per-value-feature decay: ``y_iv = sum_j s_ij M_ijv v_jv / (sum_j s_ij M_ijv + eps)``
    with ``M_ijv`` the product of the decays of value feature v between i and j (paper C.7)."""
    with jax.enable_x64(True):
        q, k, v, a, _ = make_inputs(rng, decay="value_moderate", normalize=True,
                                    dtype=np.float64, B=1, H=1, L=8, K=3, V=4)
        qn, kn, vn, an = (np.asarray(x)[0, :, 0] for x in (q, k, v, a))  # an: [L, V]
        L, V = vn.shape
        M = np.array([[np.exp(an[min(i, j) + 1:max(i, j) + 1].sum(0)) for j in range(L)]
                      for i in range(L)])  # [i, j, V]
        scores = (qn @ kn.T)[..., None] * M
        expected = np.einsum("ijv,jv->iv", scores, vn) / (scores.sum(1) + 1e-6)
        for impl in ("attention", "recurrent", "chunk"):
            got = ops.lion_attention(q, k, v, a, impl=impl, chunk_size=3)[0, :, 0]
            assert rel_err(got, expected) <= 1e-12, impl


def test_observation_3_1_naive_sum_is_not_attention(rng):
    """Paper Observation 3.1: adding two separately scaled linear recurrences (forward and
    backward, Eqs. 6-7) is not the scaled masked attention; Theorem 3.3's recurrence is."""
    with jax.enable_x64(True):
        q, k, v, a, _ = make_inputs(rng, decay="moderate", normalize=True, dtype=np.float64)
        attention = ops.lion_attention(q, k, v, a, impl="attention")

        def scaled_causal(q, k, v, a):
            return ops.causal_linear_attention(q, k, v, a, normalize=True, impl="recurrent")

        flip = lambda x: jnp.flip(x, axis=1)  # noqa: E731
        naive = scaled_causal(q, k, v, a) + flip(scaled_causal(flip(q), flip(k), flip(v), flip(a)))
        lion = ops.lion_attention(q, k, v, a, impl="recurrent")
        assert rel_err(naive, attention) > 0.1
        assert rel_err(lion, attention) <= 1e-10


# The ops under jax.jit (options static): called eagerly, every op of the chunked and recurrent
# forms compiled on its own.
_STATIC = ("normalize", "impl", "chunk_size", "return_final_state")
_causal_jit = jax.jit(ops.causal_linear_attention, static_argnames=_STATIC)
_lion_jit = jax.jit(ops.lion_attention, static_argnames=_STATIC[:3])


@pytest.mark.parametrize("impl", ["recurrent", "chunk"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("decay", ["moderate", "feature_moderate", "none"])
def test_causal_initial_and_final_state(rng, impl, decay, normalize):
    """A sequence split in two, the second half started from the first's final state, equals
    the whole sequence; states and their gradients match the reference."""
    with jax.enable_x64(True):
        q, k, v, a, cot = make_inputs(rng, decay=decay, normalize=normalize, dtype=np.float64)
        L = q.shape[1]
        cut = int(rng.integers(1, L - 1))
        kwargs = dict(normalize=normalize, chunk_size=16, return_final_state=True)
        full, full_state = _causal_jit(q, k, v, a, impl="attention", **kwargs)
        part = lambda x, s: None if x is None else x[:, s]  # noqa: E731
        first, state = _causal_jit(
            *(part(x, slice(0, cut)) for x in (q, k, v, a)), impl=impl, **kwargs)
        second, final_state = _causal_jit(
            *(part(x, slice(cut, None)) for x in (q, k, v, a)), impl=impl, initial_state=state,
            **kwargs)
        assert rel_err(jnp.concatenate([first, second], axis=1), full) <= 1e-10
        chex.assert_trees_all_close(final_state, full_state, rtol=1e-10, atol=1e-12)

        def loss(s0, impl):
            y, s = ops.causal_linear_attention(*(part(x, slice(cut, None)) for x in (q, k, v, a)),
                                               impl=impl, initial_state=s0, **kwargs)
            return jnp.sum(y * cot[:, cut:]) + sum(jnp.sum(x) for x in jax.tree.leaves(s))

        grad = jax.jit(jax.grad(loss), static_argnums=1)
        ref_grad = grad(state, "attention")
        chex.assert_trees_all_close(grad(state, impl), ref_grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("decay", ["moderate", "feature_moderate", "none"])
def test_step_decoding_matches_sequence(rng, decay, normalize):
    """Token-by-token decoding with causal_linear_attention_step reproduces the sequence op,
    also after a chunked prefill whose length is not a multiple of the chunk."""
    with jax.enable_x64(True):
        q, k, v, a, _ = make_inputs(rng, decay=decay, normalize=normalize, dtype=np.float64)
        L = q.shape[1]
        full = _causal_jit(q, k, v, a, normalize=normalize, impl="attention")
        at = lambda x, t: None if x is None else x[:, t]  # noqa: E731
        step = jax.jit(lambda q, k, v, s, a: ops.causal_linear_attention_step(
            q, k, v, s, a, normalize=normalize))

        state, ys = None, []
        for t in range(L):
            y, state = step(at(q, t), at(k, t), at(v, t), state, at(a, t))
            ys.append(y)
        assert rel_err(jnp.stack(ys, axis=1), full) <= 1e-10

        prefill = int(rng.integers(2, L - 3)) | 1  # odd: never a multiple of the chunk
        y_pre, state = _causal_jit(
            *(None if x is None else x[:, :prefill] for x in (q, k, v, a)), normalize=normalize,
            impl="chunk", chunk_size=8, return_final_state=True)
        ys = [y_pre]
        for t in range(prefill, L):
            y, state = step(at(q, t), at(k, t), at(v, t), state, at(a, t))
            ys.append(y[:, None])
        assert rel_err(jnp.concatenate(ys, axis=1), full) <= 1e-10


_kv_call = _reference = jax.jit(ops.causal_linear_attention,
                                static_argnames=("normalize", "return_final_state", "impl"))


def _decode_with_kv_cache(q, k, v, a, cuts, *, normalize, capacity):
    """``causal_linear_attention`` from an empty KV cache over the pieces of the sequence
    between ``cuts``, jitted (a traced length) -> (y, final cache)."""
    decay = None if a is None else ("per_key" if a.ndim == 4 else "scalar")
    B, _, H, K = q.shape
    cache = ops.empty_kv_cache(B, capacity, H, K, v.shape[-1], decay=decay, dtype=q.dtype)
    ys = []
    for s, e in zip(cuts[:-1], cuts[1:]):
        y, cache = _kv_call(*(None if x is None else x[:, s:e] for x in (q, k, v, a)),
                            initial_state=cache, normalize=normalize, return_final_state=True)
        ys.append(y)
    return jnp.concatenate(ys, axis=1), cache


def _kv_cuts(rng, L):
    """An odd prefill, three single tokens, then the rest as one chunk."""
    prefill = int(rng.integers(2, L - 6)) | 1
    return [0, prefill, prefill + 1, prefill + 2, prefill + 3, L]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("decay", ["none", "zero", "strong", "feature_strong"])
def test_kv_cache_matches_reference(rng, decay, normalize, dtype):
    """Prefill, single tokens and a chunk from a KV cache with spare slots equal the reference
    on the whole sequence; the cache holds every key and value, its length the tokens seen."""
    L = L_TEST
    with jax.enable_x64(dtype == np.float64):
        q, k, v, a, _ = make_inputs(rng, decay=decay, normalize=normalize, dtype=dtype, L=L)
    with jax.enable_x64(True):
        ref = _reference(*(None if x is None else jnp.asarray(x, jnp.float64)
                           for x in (q, k, v, a)), normalize=normalize, impl="attention")
    with jax.enable_x64(dtype == np.float64):
        y, cache = _decode_with_kv_cache(q, k, v, a, _kv_cuts(rng, L), normalize=normalize,
                                         capacity=L + 4)
    assert y.dtype == dtype and rel_err(y, ref) <= TOL[dtype], rel_err(y, ref)
    assert int(cache.length) == L and (cache.log_decay_cum is None) == (a is None)
    np.testing.assert_array_equal(cache.k[:, :L], k)
    np.testing.assert_array_equal(cache.v[:, :L], v)
    assert not np.any(np.asarray(cache.k[:, L:])), "slots past the length were written"


@pytest.mark.parametrize("decay, normalize", [("none", True), ("zero", False),
                                              ("strong", True), ("feature_moderate", False)])
def test_kv_cache_gradients_match_reference(rng, decay, normalize):
    with jax.enable_x64(True):
        q, k, v, a, cot = make_inputs(rng, decay=decay, normalize=normalize, dtype=np.float64,
                                      L=int(rng.integers(9, 20)) * 2 + 1)
        cuts, capacity = _kv_cuts(rng, q.shape[1]), q.shape[1] + 3

        def loss(q, k, v, a, kv):
            if kv:
                y = _decode_with_kv_cache(q, k, v, a, cuts, normalize=normalize,
                                          capacity=capacity)[0]
            else:
                y = ops.causal_linear_attention(q, k, v, a, normalize=normalize,
                                                impl="attention")
            return jnp.sum(y * cot)

        argnums = (0, 1, 2) if a is None else (0, 1, 2, 3)
        grad = jax.jit(jax.grad(loss, argnums), static_argnums=4)
        grads = grad(q, k, v, a, True)
        chex.assert_tree_all_finite(grads)
        for name, g, rg in zip("qkva", grads, grad(q, k, v, a, False)):
            assert rel_err(g, rg) <= 1e-10, f"d{name}: {rel_err(g, rg):.3g}"


def test_kv_cache_capacity_and_shape_errors(rng):
    q, k, v, a, _ = make_inputs(rng, decay="moderate", normalize=False, dtype=np.float32, L=7)
    cache = ops.empty_kv_cache(2, 6, 2, 6, 5, decay="scalar")
    with pytest.raises(ValueError, match=r"7 new tokens after the 0 cached pass .* C=6"):
        jax.jit(lambda *x: ops.causal_linear_attention(*x, initial_state=cache))(q, k, v, a)
    _, full = ops.causal_linear_attention(q[:, :4], k[:, :4], v[:, :4], a[:, :4],
                                          initial_state=cache, return_final_state=True)
    with pytest.raises(ValueError, match=r"3 new tokens after the 4 cached pass"):
        ops.causal_linear_attention(q[:, 4:], k[:, 4:], v[:, 4:], a[:, 4:], initial_state=full)
    # past the capacity with a traced length: NaN, never a silently wrong output
    y = jax.jit(lambda c: ops.causal_linear_attention(q[:, 4:], k[:, 4:], v[:, 4:], a[:, 4:],
                                                      initial_state=c))(full)
    assert np.all(np.isnan(y))
    with pytest.raises(ValueError, match=r"KV cache .* must have shapes"):
        ops.causal_linear_attention(q, k, v, None, initial_state=cache)  # decay mismatch
    with pytest.raises(ValueError, match=r"unknown decay"):
        ops.empty_kv_cache(2, 6, 2, 6, 5, decay="vector")


@pytest.mark.parametrize("op", ["lion", "lion_value_decay", "causal"])
def test_bf16_inputs(rng, op):
    """bf16 inputs: float32 accumulation, bf16 output within 5e-3 relative RMS of float32."""
    decay = "value_moderate" if op == "lion_value_decay" else "moderate"
    q, k, v, a, _ = make_inputs(rng, decay=decay, normalize=True, dtype=jnp.bfloat16, L=301)
    fn = ops.causal_linear_attention if op == "causal" else ops.lion_attention
    ref = fn(*(x.astype(jnp.float32) for x in (q, k, v, a)), impl="attention")
    for impl in ("attention", "recurrent", "chunk"):
        out = fn(q, k, v, a, impl=impl)
        assert out.dtype == jnp.bfloat16
        assert rel_err(out, ref) <= 5e-3, impl
    if op == "causal":  # the KV-cache form (bf16 keys and values cached)
        out, _ = _decode_with_kv_cache(q, k, v, a, [0, 297, 298, 299, 301], normalize=False,
                                       capacity=301)
        assert out.dtype == jnp.bfloat16 and rel_err(out, ref) <= 5e-3


def test_edge_lengths(rng):
    """L = 1 and chunk_size = 1 or larger than L."""
    with jax.enable_x64(True):
        for L, chunk in ((1, 16), (5, 1), (7, 64)):
            q, k, v, a, _ = make_inputs(rng, decay="moderate", normalize=True, dtype=np.float64,
                                        L=L)
            a_value = jnp.asarray(-rng.uniform(0.0, 1.0, size=v.shape))
            for fn, a_ in ((_lion_jit, a), (_lion_jit, a_value), (_causal_jit, a)):
                ref = fn(q, k, v, a_, impl="attention")
                for impl in ("recurrent", "chunk"):
                    assert rel_err(fn(q, k, v, a_, impl=impl, chunk_size=chunk), ref) <= 1e-10


def _temp_bytes(impl, L, B=1, H=2, K=16, V=16):
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    fn = jax.jit(lambda q, k, v, a: ops.lion_attention(q, k, v, a, impl=impl))
    compiled = fn.lower(spec(B, L, H, K), spec(B, L, H, K), spec(B, L, H, V),
                        spec(B, L, H)).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_recurrent_memory_is_linear_attention_quadratic():
    """Compiled temporary memory at L and 4L: the recurrent LION grows ~4x (O(L d), and below
    one [L, K, V] stack of states), the materialized form ~16x (O(L^2))."""
    L, H, K, V = 512, 2, 16, 16
    rec = [_temp_bytes("recurrent", n) for n in (L, 4 * L)]
    att = [_temp_bytes("attention", n) for n in (L, 4 * L)]
    assert 3.0 <= rec[1] / rec[0] <= 5.0, rec
    assert rec[1] < 4 * L * H * K * V * 4, "recurrent form stores O(L d^2)"
    assert att[1] / att[0] >= 12.0, att


def test_auto_picks_a_form(rng):
    q, k, v, a, _ = make_inputs(rng, decay="moderate", normalize=True, dtype=np.float32, L=300)
    ref = ops.lion_attention(q, k, v, a, impl="attention")
    assert rel_err(ops.lion_attention(q, k, v, a), ref) <= 1e-5


class TestBadInputs:
    def setup_method(self):
        r = np.random.default_rng(0)
        self.q = jnp.asarray(r.uniform(size=(2, 9, 3, 4)), jnp.float32)
        self.v = jnp.asarray(r.uniform(size=(2, 9, 3, 5)), jnp.float32)
        self.a = -jnp.ones((2, 9, 3), jnp.float32)

    def raises(self, match, fn, *args, **kwargs):
        with pytest.raises(ValueError, match=match):
            fn(*args, **kwargs)

    def test_shapes(self):
        q, v, a = self.q, self.v, self.a
        self.raises(r"k must have the shape of q", ops.lion_attention, q, q[..., :3], v)
        self.raises(r"v must have shape \[B, L, H, V\]", ops.lion_attention, q, q, v[:, :8])
        self.raises(r"q must have shape \[B, L, H, K\]", ops.lion_attention, q[0], q, v)
        self.raises(r"log_decay must have shape", ops.lion_attention, q, q, v, a[:, :, :2])
        self.raises(r"\[B, L, H, V\] \(per value feature\) = .*\[2, 9, 3, 5\]",
                    ops.lion_attention, q, q, v, jnp.zeros(q.shape))  # per key: causal only
        self.raises(r"log_decay must have shape", ops.causal_linear_attention, q, q, v, a[:, :4])
        self.raises(r"state must have shape \[B, H, K, V\]", ops.causal_linear_attention, q, q,
                    v, initial_state=jnp.zeros((2, 3, 4, 4)))
        self.raises(r"pair \(S, z\)", ops.causal_linear_attention, q, q, v, normalize=True,
                    initial_state=jnp.zeros((2, 3, 4, 5)))

    def test_positive_log_decay(self):
        self.raises(r"log_decay must be <= 0 .* got max 0.5", ops.lion_attention, self.q, self.q,
                    self.v, self.a.at[0, 3, 1].set(0.5))
        self.raises(r"log_decay must be <= 0", ops.causal_linear_attention, self.q, self.q,
                    self.v, self.a.at[1, 0, 0].set(jnp.nan))

    def test_options(self):
        q, v = self.q, self.v
        self.raises(r"impl must be one of", ops.lion_attention, q, q, v, impl="flash")
        self.raises(r"chunk_size must be a positive int", ops.lion_attention, q, q, v,
                    impl="chunk", chunk_size=0)
        self.raises(r"eps must be >= 0", ops.lion_attention, q, q, v, eps=-1.0)

    def test_dtypes(self):
        q, v = self.q, self.v
        self.raises(r"share one floating dtype.*k bfloat16", ops.lion_attention, q,
                    q.astype(jnp.bfloat16), v)
        self.raises(r"share one floating dtype", ops.causal_linear_attention, q.astype(jnp.int32),
                    q.astype(jnp.int32), v.astype(jnp.int32))

    def test_step_shapes(self):
        self.raises(r"one token", ops.causal_linear_attention_step, self.q, self.q, self.v)


@pytest.mark.parametrize("normalize", [True, False])
def test_pallas_impl_routes_to_the_kernels(rng, normalize):
    """impl="pallas" runs pallas_kernels (interpret mode on CPU) with the ops' semantics:
    normalisation, initial/final states (also (S, z) pairs) and per-feature causal decay."""
    q, k, v, a, _ = make_inputs(rng, decay="moderate", normalize=True, dtype=np.float32, L=37,
                                K=16, V=24)
    lion = lambda impl: _lion_jit(q, k, v, a, normalize=normalize, impl=impl,  # noqa
                                  chunk_size=16)
    assert rel_err(lion("pallas"), lion("attention")) <= 1e-5

    cut = 20
    for log_decay in (a, -jnp.asarray(rng.uniform(0, 1, size=q.shape), jnp.float32)):
        def causal(impl, s, state=None):
            return _causal_jit(q[:, s], k[:, s], v[:, s], log_decay[:, s],
                               normalize=normalize, impl=impl, chunk_size=16,
                               initial_state=state, return_final_state=True)
        ref, ref_state = causal("attention", slice(None))
        first, state = causal("pallas", slice(0, cut))
        second, final_state = causal("pallas", slice(cut, None), state)
        assert rel_err(jnp.concatenate([first, second], axis=1), ref) <= 1e-5
        for x, y in zip(jax.tree.leaves(final_state), jax.tree.leaves(ref_state)):
            assert rel_err(x, y) <= 1e-5


def test_pallas_centre_values(rng):
    """centre_values=True reaches the kernels: bf16 values far from zero mean, no decay, keep
    the gradient's precision (the same inputs without it are far off: the check has teeth);
    the XLA forms ignore it; without normalize it is an error. L = 300: the chunked kernels
    (up to 256 tokens "pallas" is lion_dense, which has no centre_values)."""
    q, k, v, _, cot = make_inputs(rng, decay="none", normalize=True, dtype=np.float32, L=300,
                                  K=16, V=16)
    v = jnp.abs(v) + 2.0
    args16 = [x.astype(jnp.bfloat16) for x in (q, k, v)]

    @functools.partial(jax.jit, static_argnums=(0, 2))
    def dq(impl, args, centre):
        f = lambda q_: ops.lion_attention(q_, *args[1:], impl=impl, chunk_size=16,  # noqa
                                          centre_values=centre)
        y, vjp = jax.vjp(f, args[0])
        return y, vjp(cot.astype(y.dtype))[0]

    with jax.enable_x64(True):
        args64 = [jnp.asarray(np.asarray(x, np.float64)) for x in args16]
        y_ref, dq_ref = dq("attention", args64, False)
        assert rel_err(dq("attention", args64, True)[1], dq_ref) == 0.0
    y, got = dq("pallas", args16, True)
    assert rel_err(y, y_ref) <= 5e-3 and rel_err(got, dq_ref) <= 5e-3
    assert rel_err(dq("pallas", args16, False)[1], dq_ref) > 5e-3
    with pytest.raises(ValueError, match="centre_values=True needs normalize=True"):
        ops.lion_attention(*args16, normalize=False, centre_values=True)


def test_pallas_impl_rejects_unsupported_shapes_clearly(rng):
    """A shape the kernels do not take (here K = 264 > 256) is a ValueError with the reason for
    impl="pallas"; for impl="auto" (CPU or GPU) it means an XLA form, here the chunked one
    (L > 256). Head dims below 16 are taken (zero-padded inside the kernels)."""
    q, k, v, a, _ = make_inputs(rng, decay="moderate", normalize=True, dtype=np.float32, L=300,
                                K=264, V=8)
    with pytest.raises(ValueError, match=r"head dim must be in \[1, 256\]"):
        ops.lion_attention(q, k, v, a, impl="pallas")
    ref = ops.lion_attention(q, k, v, a, impl="chunk")
    assert rel_err(ops.lion_attention(q, k, v, a, impl="auto"), ref) == 0.0
    small = [x[:, :40, :, :8] if x.ndim == 4 else x[:, :40] for x in (q, k, v, a)]
    assert rel_err(ops.lion_attention(*small, impl="pallas"),
                   ops.lion_attention(*small, impl="attention")) <= 1e-5


def test_auto_keeps_per_key_decay_off_the_kernels(rng, monkeypatch):
    """On a GPU, impl="auto" takes the XLA forms for a decay per key feature (the kernels'
    backward compiles for minutes) with chunks of at most ``AUTO_PER_KEY_CHUNK`` (K masks of
    C x C compiled for minutes at C = 64), the materialized one only within one such chunk;
    a decay per token still goes to the kernels with the caller's chunk size; an explicit
    impl keeps it too."""
    from lion_jax.ops import api
    if api._kernels_module() is None:
        pytest.skip("pallas_kernels not importable")
    c = api.AUTO_PER_KEY_CHUNK
    assert c == 16
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    q = jnp.zeros((1, 300, 2, 16), jnp.float32)
    per_key = -jnp.ones((1, 300, 2, 16), jnp.float32)

    def resolve(length, decay, impl="auto", chunk_size=64):
        x = q[:, :length]
        return api._resolve_impl(impl, x, x, x, None if decay is None else decay[:, :length],
                                 chunk_size, False)

    assert resolve(300, per_key) == ("chunk", c)
    assert resolve(c, per_key) == ("attention", c)
    assert resolve(c + 1, per_key) == ("chunk", c)
    assert resolve(300, per_key, chunk_size=8) == ("chunk", 8)  # a smaller chunk is kept
    assert resolve(300, per_key[..., 0]) == ("pallas", 64)
    assert resolve(300, per_key, impl="chunk") == ("chunk", 64)
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert resolve(256, per_key) == ("chunk", c)
    assert resolve(256, None) == ("attention", 64)
