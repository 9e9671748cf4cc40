"""The one-kernel Mosaic GPU causal forwards against float64 numpy: per-token decay
(``mosaic_causal_warps.causal_forward_warps``) and per-feature decay
(``mosaic_causal.causal_forward_mosaic``).

CPU (default): the kernel runs in the Mosaic GPU interpreter (``plgpu.InterpretGPUParams``).
GPU (``LION_TEST_GPU=1``, compute capability >= 9.0): compiled with Mosaic GPU, and also
compared with the two-pass kernels. Errors are ``||a - b|| / ||b||`` against a float64 token
walk of the same 16-bit inputs; the op-level tests (forward and gradients through
``causal_linear_attention(backend="mosaic")``) are ``test_pallas_kernels.test_mosaic_backend``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import two_pass
from pallas_kernels.mosaic_causal import causal_forward_mosaic, supported
from pallas_kernels.mosaic_causal_warps import causal_forward_warps

ON_GPU = jax.default_backend() == "gpu"
if ON_GPU and float(getattr(jax.devices()[0], "compute_capability", "0")) < 9.0:
    pytest.skip("Mosaic GPU kernels need compute capability >= 9.0", allow_module_level=True)
INTERPRET = None if ON_GPU else plgpu.InterpretGPUParams()
# y and h in the input dtype (W, the decayed queries, keys or values and the state rounded to it);
# the final state in float32 from the same rounded operands (in the one-product form the
# update's keys are rounded twice: K e^-b, then times e^(b_last)): the 16-bit bound for all
Y_TOL, H_TOL, FINAL_TOL = 5e-3, 5e-3, 5e-3


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)), "non-finite values in the kernel's result"
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def reference(q, k, v, g, s0, chunk):
    """float64 token walk: ``y [B, L, H, V]``, the states entering each chunk
    ``h [B, H, N, K, V]`` and the final state ``[B, H, K, V]``; g ``[B, L, H]`` or per key
    feature ``[B, L, H, K]``."""
    q, k, v, g = (np.asarray(x, np.float64) for x in (q, k, v, g))
    B, L, H, K = q.shape
    state = np.zeros((B, H, K, v.shape[-1])) if s0 is None else np.asarray(s0, np.float64)
    y, h = np.zeros(v.shape), np.zeros((B, H, L // chunk) + state.shape[2:])
    for i in range(L):
        if i % chunk == 0:
            h[:, :, i // chunk] = state
        decay = np.exp(g[:, i])[..., None] if g.ndim == 4 else np.exp(g[:, i])[..., None, None]
        state = (decay * state
                 + np.einsum("bhk,bhv->bhkv", k[:, i], v[:, i]))
        y[:, i] = np.einsum("bhk,bhkv->bhv", q[:, i], state)
    return y, h, state


def inputs(seed, B, L, H, K, V, dtype, decay, per_feature=False):
    """q, k at the scale of normalised features, v ~ N(0, 1), log-decays ``[B, L, H]`` (per
    feature ``[B, L, H, K]``) by ``decay``: "mild" U[-0.1, 0]; "strong" down to -20 per token
    with mild stretches; "edge" (per feature) U[-0.3, 0] with a few features near -0.3 on
    every token, so chunks of 64 sum to almost -FAST_RANGE (20) there (scalar decay: the
    first three heads)."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, L, H, K)) * K ** -0.5, dtype)
    k = jnp.asarray(rng.standard_normal((B, L, H, K)) * K ** -0.5, dtype)
    v = jnp.asarray(rng.standard_normal((B, L, H, V)), dtype)
    shape = (B, L, H, K) if per_feature else (B, L, H)
    if decay == "mild":
        g = -rng.uniform(0.0, 0.1, shape)
    elif decay == "edge":
        g = -rng.uniform(0.0, 0.3, shape)
        g[..., :3] = -0.31 + rng.uniform(0.0, 0.01, g[..., :3].shape)
    else:  # "strong": down to -20 per token, with mild stretches
        g = np.where(rng.random(shape) < 0.2, -rng.uniform(0, 20, shape),
                     -rng.uniform(0, 0.05, shape))
    return q, k, v, jnp.asarray(g, jnp.float32)


CASES = [  # L, K, V, dtype, decay, initial state, splits, store_states
    (256, 64, 64, jnp.bfloat16, "mild", False, 1, True),
    (192, 64, 64, jnp.bfloat16, "edge", True, 1, True),
    (320, 64, 128, jnp.bfloat16, "strong", True, 1, True),
    (512, 128, 64, jnp.bfloat16, "mild", True, 4, True),
    (256, 128, 128, jnp.float16, "strong", False, 2, False),
    (512, 64, 64, jnp.bfloat16, "strong", True, 8, False),
]


# The warp-specialized kernel in the interpreter (jax 0.11.2): each warpgroup runs as its own
# XLA CPU program, and at Kp = 128 only two of the three were ever started
# on the 2-core CI machine (the third waits for a thread while the two wait on its barriers),
# so the CPU runs its Kp = 64 cases and the GPU all of them.
RUN_CASES = [case for case in CASES if ON_GPU or case[1] == 64]


@pytest.mark.parametrize("case", RUN_CASES, ids=[f"case{CASES.index(c)}" for c in RUN_CASES])
def test_against_float64(case):
    """Per-token decay in the warp-specialized kernel."""
    check_warps(case)


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[5]], ids=["case1", "case2", "case5"])
def test_two_output_warpgroups(case, monkeypatch):
    """Two output warpgroups (``mosaic_causal_warps.OUTPUT_WARPGROUPS`` 2 at Kp 64: each takes
    every other chunk, with 4 pipeline slots and 4 state tiles) against the float64 walk."""
    from pallas_kernels import mosaic_causal_warps
    monkeypatch.setattr(mosaic_causal_warps, "OUTPUT_WARPGROUPS", {64: 2})
    check_warps(case)


def check_warps(case):
    """One of ``CASES`` in the warp-specialized kernel against the float64 walk."""
    L, K, V, dtype, decay, with_s0, splits, store = case
    seed = np.random.SeedSequence().entropy % 2**32
    B, H = 2, 3
    q, k, v, g = inputs(seed, B, L, H, K, V, dtype, decay)
    s0 = None
    if with_s0:
        s0 = jnp.asarray(np.random.default_rng(seed + 1).standard_normal((B, H, K, V)) * 0.3,
                         jnp.float32)
    outs = jax.jit(lambda *a: causal_forward_warps(
        *a, splits=splits, store_states=store, interpret=INTERPRET))(q, k, v, g, s0)
    assert outs[0].dtype == dtype and outs[0].shape == v.shape
    assert outs[1].dtype == jnp.float32 and outs[1].shape == (B, H, K, V)
    y, h, final = reference(q, k, v, g, s0, 64)
    errors = {"y": rel_err(outs[0], y), "final": rel_err(outs[1], final)}
    if store:
        assert outs[2].dtype == dtype and outs[2].shape == (B, H, L // 64, K, V)
        errors["h"] = rel_err(outs[2], h)
    msg = f"seed {seed}: {errors}"
    assert errors["y"] <= Y_TOL and errors["final"] <= FINAL_TOL, msg
    assert errors.get("h", 0.0) <= H_TOL, msg


PER_FEATURE_CASES = [  # L, K, V, decay, initial state, store_states, splits
    (256, 64, 64, "mild", False, True, 1),
    (320, 64, 128, "edge", True, False, 5),
    (192, 128, 64, "edge", True, True, 3),
    (512, 64, 64, "mild", True, True, 4),
]


@pytest.mark.parametrize("L,K,V,decay,with_s0,store,splits", PER_FEATURE_CASES)
def test_per_feature_against_float64(L, K, V, decay, with_s0, store, splits):
    """Per-feature decay (every chunk mild: GLA's one-product form, exp(-b) up to e^20), the
    chunks in ``splits`` runs, each from its entering state (here the float64 walk's; the op's
    from the states walk, ``test_per_feature_scan_runs``)."""
    seed = np.random.SeedSequence().entropy % 2**32
    B, H = 1, 2
    q, k, v, g = inputs(seed, B, L, H, K, V, jnp.bfloat16, decay, per_feature=True)
    s0 = None
    if with_s0:
        s0 = jnp.asarray(np.random.default_rng(seed + 1).standard_normal((B, H, K, V)) * 0.3,
                         jnp.float32)
    y, h, final = reference(q, k, v, g, s0, 64)
    starts = s0 if splits == 1 else jnp.asarray(h[:, :, ::L // 64 // splits], jnp.float32)
    outs = jax.jit(lambda *a: causal_forward_mosaic(*a, splits=splits, store_states=store,
                                                    interpret=INTERPRET))(q, k, v, g, starts)
    errors = {"y": rel_err(outs[0], y), "final": rel_err(outs[1], final)}
    if store:
        errors["h"] = rel_err(outs[2], h)
    # the final state's keys are K e^-b rounded, then times e^(b_last) rounded: 16-bit bound
    assert max(errors.values()) <= 5e-3, f"seed {seed}: {errors}"


@pytest.mark.parametrize("decay", ["mild", "strong"])
def test_per_feature_scan_takes_the_fused_kernel(decay, spy):
    """chunk_scan_per_feature(fused=True): mild inputs run the fused kernel, others the three
    passes (lax.cond at run time); both give the float64 results."""
    from pallas_kernels import per_feature

    calls = spy(per_feature, "causal_forward_mosaic")
    q, k, v, g = inputs(5, 1, 256, 2, 48, 40, jnp.bfloat16, decay, per_feature=True)
    s0 = jnp.asarray(np.random.default_rng(6).standard_normal((1, 2, 48, 40)), jnp.float32)
    y, final = per_feature.chunk_scan_per_feature(q, k, v, g, s0, out_dtype=jnp.bfloat16,
                                                  interpret=not ON_GPU, fused=True)
    assert len(calls) == 1  # traced once; lax.cond picks at run time
    want_y, _, want_final = reference(q, k, v, g, s0, 64)
    assert rel_err(y, want_y) <= 5e-3 and rel_err(final, want_final) <= 5e-3


def test_per_feature_scan_runs(spy, monkeypatch):
    """``per_feature.FUSED_TARGET_PROGRAMS``: the fused forward in runs until that many
    programs (here 2 (b, h) x 2 V-blocks x 4 runs of 8 chunks), each from its entering state
    by the states walk, the float64 results; a number of runs that does not divide the chunks,
    or runs without their entering states, is one error line."""
    from pallas_kernels import per_feature

    monkeypatch.setattr(per_feature, "FUSED_TARGET_PROGRAMS", 16)
    calls = spy(per_feature, "causal_forward_mosaic")
    seed = int(np.random.default_rng().integers(2**31))
    q, k, v, g = inputs(seed, 1, 2048, 2, 64, 72, jnp.bfloat16, "mild", per_feature=True)
    s0 = jnp.asarray(np.random.default_rng(seed).standard_normal((1, 2, 64, 72)), jnp.float32)
    y, final = per_feature.chunk_scan_per_feature(q, k, v, g, s0, out_dtype=jnp.bfloat16,
                                                  interpret=not ON_GPU, fused=True)
    assert [call["splits"] for call in calls] == [4]
    want_y, _, want_final = reference(q, k, v, g, s0, 64)
    errors = (rel_err(y, want_y), rel_err(final, want_final))
    assert max(errors) <= 5e-3, (seed, errors)
    with pytest.raises(ValueError, match="splits must divide the number of chunks 32; got 3"):
        causal_forward_mosaic(q, k, v[..., :64], g, splits=3, interpret=INTERPRET)
    with pytest.raises(ValueError, match=r"s0 must be the state entering each run, \[B, H, "
                                         r"splits, Kp, Vp\] = \(1, 2, 2, 64, 64\); got None"):
        causal_forward_mosaic(q, k, v[..., :64], g, splits=2, interpret=INTERPRET)
    jax.clear_caches()  # no trace under the setting outlives the test


def test_per_feature_scan_states_from_the_fused_kernel():
    """chunk_scan_per_feature(fused=True, return_states=True) in the inputs' dtype (what the
    op's forward keeps for per_feature_grads): the kernel's stored states, as the three
    passes give them; float32 states keep the three passes."""
    from pallas_kernels import per_feature

    seed = int(np.random.default_rng().integers(2**31))
    q, k, v, g = inputs(seed, 1, 320, 2, 40, 72, jnp.bfloat16, "mild", per_feature=True)
    scan = lambda **kw: per_feature.chunk_scan_per_feature(  # noqa: E731
        q, k, v, g, out_dtype=jnp.bfloat16, interpret=not ON_GPU, return_states=True, **kw)
    y, final, h = scan(fused=True, states_dtype=jnp.bfloat16)
    assert h.dtype == jnp.bfloat16 and h.shape == (1, 2, 5, 40, 72)
    want_y, want_h, want_final = reference(q, k, v, g, None, 64)
    errors = (rel_err(y, want_y), rel_err(h, want_h), rel_err(final, want_final))
    assert max(errors) <= 5e-3, (seed, errors)
    three = scan(states_dtype=jnp.bfloat16)
    assert rel_err(h, three[2]) <= 5e-3, seed
    assert scan(fused=True)[2].dtype == jnp.float32


@pytest.mark.parametrize("decay", ["mild", "strong"])
def test_runs_agree(decay):
    """Cutting the chunks into runs (a walk of run ends, their scan, then the runs from their
    states) gives the single walk's results to 16-bit rounding: the run states come from the
    states walk's keys (``K e^tail`` rounded), the kernel's chain rounds ``e^tail V`` instead,
    so with mild decay the final states differ by that rounding; with strong decay the
    earlier runs' share of the final state vanishes and they agree to float32."""
    q, k, v, g = inputs(7, 1, 1024, 2, 64, 64, jnp.bfloat16, decay)
    call = jax.jit(lambda splits: causal_forward_warps(q, k, v, g, splits=splits,
                                                       interpret=INTERPRET),
                   static_argnums=0)
    one = call(1)
    y, _, final = reference(q, k, v, g, None, 64)
    for splits in (2, 16):
        many = call(splits)
        assert rel_err(many[0], y) <= Y_TOL and rel_err(many[1], final) <= FINAL_TOL
        assert rel_err(many[0], one[0]) <= 5e-3
        assert rel_err(many[1], one[1]) <= (5e-3 if decay == "mild" else 1e-5)


@pytest.mark.parametrize("programs", [1, 8, 4096])
def test_run_states(programs, monkeypatch):
    """The state entering each run: the chunks before the last run walked in shorter runs
    (as many as make ``RUN_STATES_PROGRAMS`` programs: here the runs themselves, 4 walks or
    16 of one chunk each), their ends scanned from s0; the float64 states at the runs' first
    chunks, to the keys' 16-bit rounding. A walk of some runs stores no h."""
    import sys

    from pallas_kernels import mosaic_causal_warps, mosaic_states

    chunk_scan = sys.modules["pallas_kernels.chunk_scan"]  # the package exports a function so named
    monkeypatch.setattr(mosaic_causal_warps, "RUN_STATES_PROGRAMS", programs)
    monkeypatch.setattr(chunk_scan, "MIN_RUN_CHUNKS", 1)
    seed = int(np.random.default_rng().integers(2**31))
    q, k, v, g = inputs(seed, 1, 1024, 2, 64, 64, jnp.bfloat16, "mild")
    s0 = jnp.asarray(np.random.default_rng(seed).standard_normal((1, 2, 64, 64)), jnp.float32)
    _, h, _ = reference(q, k, v, g, s0, 64)
    for splits in (2, 4):
        got = mosaic_causal_warps.run_states(k, v, g, s0, chunk=64, splits=splits,
                                             interpret=INTERPRET)
        assert got.shape == (1, 2, splits, 64, 64)
        assert rel_err(got, h[:, :, ::16 // splits]) <= H_TOL, (seed, splits)
    w, d = chunk_scan.stacked_decay_factors(g, 64, (False,))
    with pytest.raises(ValueError, match="runs must be None or 1 ... splits = 4, and all"):
        mosaic_states.walk_states(k, v, w, d, None, chunk=64, bv=64, splits=4, runs=2,
                                  interpret=INTERPRET)


def test_strongest_decay_no_nan():
    """log-decay -20 on every token: e^A underflows to 0 within a chunk, no inf or NaN."""
    q, k, v, _ = inputs(3, 1, 256, 2, 64, 64, jnp.bfloat16, "mild")
    g = jnp.full((1, 256, 2), -20.0, jnp.float32)
    y, final = causal_forward_warps(q, k, v, g, interpret=INTERPRET)
    want, _, want_final = reference(q, k, v, g, None, 64)
    assert rel_err(y, want) <= Y_TOL and rel_err(final, want_final) <= FINAL_TOL


def test_two_pass_takes_the_fused_kernel(spy):
    """chunk_scan_two_pass(fused=True) routes forward, non-strict 16-bit scans on the Mosaic
    walk to the fused (warp-specialized) kernel (with the two-pass results of fused=False, the
    default); reverse, strict and float32-output scans keep the two passes."""
    q, k, v, g = inputs(11, 1, 256, 2, 64, 64, jnp.bfloat16, "mild")
    calls = spy(two_pass, "causal_forward_warps")
    scan = lambda **kw: two_pass.chunk_scan_two_pass(  # noqa: E731
        q, k, v, g, out_dtype=jnp.bfloat16, backend="mosaic", interpret=not ON_GPU, **kw)
    fused = scan(return_states=True, fused=True)
    assert len(calls) == 1 and calls[0]["store_states"]
    for kw in (dict(reverse=True), dict(strict=True)):
        scan(fused=True, **kw)
    two_pass.chunk_scan_two_pass(q, k, v, g, out_dtype=jnp.float32, backend="mosaic",
                                 interpret=not ON_GPU, fused=True)
    assert len(calls) == 1
    plain = scan(return_states=True)
    assert len(calls) == 1
    for got, want in zip(fused, plain):
        assert rel_err(got, want) <= 5e-3


def test_supported_reasons():
    def shape(kp, L=256, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct((1, L, 2, kp), dtype)

    assert supported(shape(64), shape(64)) is None
    assert supported(shape(128), shape(256)) is None
    for dtype in (jnp.float16, jnp.float32):
        assert "bf16 inputs" in supported(shape(64, dtype=dtype), shape(64, dtype=dtype))
    assert "Kp = 64 or 128" in supported(shape(256), shape(64))
    assert "Kp = 64 or 128" in supported(shape(64), shape(96))
    assert "chunks of 64" in supported(shape(64), shape(64), chunk=128)
    assert "chunks of 64" in supported(shape(64, L=200), shape(64, L=200))
    assert "shared memory" in supported(shape(128), shape(128), stages=3)
    q, k, v, g = inputs(0, 1, 256, 1, 64, 64, jnp.bfloat16, "mild")
    with pytest.raises(ValueError, match="per-feature log-decays"):
        causal_forward_mosaic(q, k, v, g, interpret=INTERPRET)


def test_warps_bad_inputs():
    """The warp-specialized kernel refuses per-feature decay, float32 and unpadded head dims
    with one line naming the problem."""
    q, k, v, g = inputs(1, 1, 128, 1, 64, 64, jnp.bfloat16, "mild")
    with pytest.raises(ValueError, match="scalar log-decays"):
        causal_forward_warps(q, k, v, jnp.broadcast_to(g[..., None], q.shape))
    with pytest.raises(ValueError, match="bf16 or fp16"):
        causal_forward_warps(q.astype(jnp.float32), k, v.astype(jnp.float32), g)
    with pytest.raises(ValueError, match="Kp = 64 or 128"):
        causal_forward_warps(q[..., :48], k[..., :48], v, g)
    with pytest.raises(ValueError, match="splits must divide"):
        causal_forward_warps(q, k, v, g, splits=3)
