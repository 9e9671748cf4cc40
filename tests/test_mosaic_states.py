"""pallas_kernels.mosaic_states (the Mosaic GPU states walk) against float64 numpy and Triton.

CPU (default): the kernel runs in the Mosaic GPU interpreter (``plgpu.InterpretGPUParams``).
GPU (``LION_TEST_GPU=1``, compute capability >= 9.0): compiled with Mosaic GPU, and also
compared with the Triton states kernel (``two_pass.chunk_states``). Errors are
``||a - b|| / ||b||`` against a float64 walk over the same rounded ``k * w`` (h, final state)
or, for the normaliser z (``with_z``), over the exact ``k * w * u`` (the kernels sum it in
float32 without rounding, except with ``scale_in_kernel=False``).
"""


import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import two_pass
from pallas_kernels.chunk_scan import BOTH, decay_factors
from pallas_kernels.mosaic_states import chunk_states_mosaic, supported

ON_GPU = jax.default_backend() == "gpu"
if ON_GPU and float(getattr(jax.devices()[0], "compute_capability", "0")) < 9.0:
    pytest.skip("Mosaic GPU kernels need compute capability >= 9.0", allow_module_level=True)
INTERPRET = None if ON_GPU else plgpu.InterpretGPUParams()
H_TOL, FINAL_TOL = 5e-3, 1e-3  # h is stored in bf16 / fp16; the end state in float32
# hz, float32, against float64 of the exact k * w * u: "reduce" ~6e-8; "mma" (z from the keys
# rounded to the input dtype) and scale_in_kernel=False <= 2e-3 for bf16, ~2e-4 for fp16
# (H200 and CPU interpreter); "mma" against the Triton walk <= 2.2e-4.
Z_TOL = 5e-3
# the Triton walk (two_pass.chunk_states would pick Mosaic on Hopper)
TRITON = {"backend": "triton"}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)), "non-finite values in the kernel's result"
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def reference(k, v, g, s0, chunk, reverse, key_scale=None):
    """float64 walk: ``h [B, H, N, Kp, Vp]``, final ``[B, H, Kp, Vp]``; key_scale: None or
    ``[B, L, H]``, folded into the key factors as the kernels fold it."""
    w, d = decay_factors(g, chunk, reverse=reverse)
    if key_scale is not None:
        w = w * jnp.swapaxes(key_scale, 1, 2)
    kd = (k.astype(jnp.float32) * jnp.swapaxes(w, 1, 2)[..., None]).astype(k.dtype)
    kd, v, d = (np.asarray(x, np.float64) for x in (kd, v, d))
    B, L, H, kp = kd.shape
    N = L // chunk
    kd = kd.reshape(B, N, chunk, H, kp)
    v = v.reshape(B, N, chunk, H, v.shape[-1])
    state = np.zeros((B, H, kp, v.shape[-1])) if s0 is None else np.asarray(s0, np.float64)
    h = np.zeros((B, H, N, *state.shape[2:]))
    for n in (reversed(range(N)) if reverse else range(N)):
        h[:, :, n] = state
        state = d[:, :, n, None, None] * state + np.einsum("bchk,bchv->bhkv", kd[:, n], v[:, n])
    return h, state


def make_inputs(rng, B, L, H, kp, vp, dtype, with_s0):
    k = jnp.asarray(rng.standard_normal((B, L, H, kp)), dtype)
    v = jnp.asarray(rng.standard_normal((B, L, H, vp)), dtype)
    # log-decays from -1e-3 (barely decaying) to -20 per token (gone within a token or two)
    g = jnp.asarray(-np.exp(rng.uniform(np.log(1e-3), np.log(20.0), (B, L, H))), jnp.float32)
    s0 = jnp.asarray(rng.standard_normal((B, H, kp, vp)), jnp.float32) if with_s0 else None
    return k, v, g, s0


CASES = [  # (kp, vp, bv, dtype)
    (64, 64, 64, jnp.bfloat16),
    (128, 64, 64, jnp.bfloat16),
    (128, 128, 128, jnp.bfloat16),
    (64, 128, 64, jnp.bfloat16),  # two V-blocks
    (64, 64, 64, jnp.float16),
]


# (scale_in_kernel, splits, group)
RUNS = [(True, 1, 1), (False, 1, 1), (True, 2, 1), (True, 1, 2), (False, 2, 2)]
# On the GPU every combination (100); in the CPU interpreter (~3.4 s a case) the 25 pairs of a
# shape case and a run layout, with reverse and with_s0 varied so that each case meets both
# values of each and each layout all four of their pairs.
WALK_CASES_GPU = [(*case, reverse, with_s0, *run) for case in CASES for reverse in (False, True)
                  for with_s0 in (False, True) for run in RUNS]
WALK_CASES_CPU = [(*case, bool((i + j) % 2), bool((i // 2 + j) % 2), *run)
                  for i, case in enumerate(CASES) for j, run in enumerate(RUNS)]


@pytest.mark.parametrize("kp,vp,bv,dtype,reverse,with_s0,scale_in_kernel,splits,group",
                         WALK_CASES_GPU if ON_GPU else WALK_CASES_CPU)
def test_states_walk(rng, kp, vp, bv, dtype, reverse, with_s0, scale_in_kernel, splits, group):
    B, L, H, chunk = (2, 1024, 3, 64) if ON_GPU else (1, 256, 2, 64)
    k, v, g, s0 = make_inputs(rng, B, L, H, kp, vp, dtype, with_s0)
    h, final = chunk_states_mosaic(k, v, g, s0, chunk=chunk, bv=bv, reverse=reverse,
                                   splits=splits, group=group, scale_in_kernel=scale_in_kernel,
                                   interpret=INTERPRET)
    assert h.shape == (B, H, L // chunk, kp, vp) and h.dtype == dtype
    assert final.shape == (B, H, kp, vp) and final.dtype == jnp.float32
    h_ref, final_ref = reference(k, v, g, s0, chunk, reverse)
    errs = {"h": rel_err(h, h_ref), "final": rel_err(final, final_ref)}
    if ON_GPU:
        h_tr, final_tr = two_pass.chunk_states(k, v, g, s0, chunk=chunk, bv=bv, reverse=reverse,
                                               precision=None, interpret=False, splits=1,
                                               **TRITON)
        errs |= {"h vs triton": rel_err(h, h_tr), "final vs triton": rel_err(final, final_tr)}
    print(errs)
    assert errs["h"] <= H_TOL and errs["final"] <= FINAL_TOL, errs
    if ON_GPU:
        assert errs["h vs triton"] <= H_TOL and errs["final vs triton"] <= FINAL_TOL, errs


def reference_z(k, g, u, chunk, reverse, splits):
    """float64 walk of z from the exact ``k * w * u`` (u None: ones), every run from the z
    entering it: ``hz [B, H, N, Kp]``."""
    w, d = decay_factors(g, chunk, reverse=reverse)
    kw = np.asarray(k, np.float64) * np.swapaxes(np.asarray(w, np.float64), 1, 2)[..., None]
    if u is not None:
        kw = kw * np.asarray(u, np.float64)[..., None]
    d = np.asarray(d, np.float64)
    B, L, H, kp = kw.shape
    N = L // chunk
    upd = kw.reshape(B, N, chunk, H, kp).sum(axis=2)  # [B, N, H, Kp]
    z = np.zeros((B, H, kp))
    hz = np.zeros((B, H, N, kp))
    for n in (reversed(range(N)) if reverse else range(N)):
        hz[:, :, n] = z
        z = d[:, :, n, None] * z + upd[:, n]
    return hz


# (kp, vp, bv, dtype, reverse, weighted, splits, with_s0, group, scale_in_kernel, z_method)
Z_CASES_CPU = [
    (64, 64, 64, jnp.bfloat16, False, False, 1, False, 1, True, None),
    (64, 64, 64, jnp.bfloat16, True, True, 2, True, 1, True, None),
    (64, 128, 64, jnp.bfloat16, False, True, 2, False, 2, True, None),
    (128, 64, 64, jnp.bfloat16, True, False, 1, True, 2, True, None),
    (128, 128, 64, jnp.bfloat16, True, True, 2, True, 2, True, None),  # z in 2 parts
    (64, 64, 64, jnp.float16, False, True, 1, True, 1, False, None),  # "reduce"
    (64, 64, 64, jnp.bfloat16, True, True, 1, False, 2, True, "reduce"),
]
Z_SHAPES_GPU = [((64, 64, 64), jnp.bfloat16), ((128, 64, 64), jnp.bfloat16),
                ((128, 128, 128), jnp.bfloat16), ((64, 128, 64), jnp.bfloat16),
                ((128, 128, 64), jnp.bfloat16),
                ((64, 64, 64), jnp.float16)]
Z_CASES_GPU = [(*shape, dtype, reverse, weighted, splits, with_s0, group, sik, method)
               for shape, dtype in Z_SHAPES_GPU
               for reverse in (False, True) for weighted in (False, True)
               for method, runs in [(None, [(1, 1, False, True), (4, 1, True, True),
                                            (2, 2, False, True), (1, 1, True, False)]),
                                    ("reduce", [(1, 1, False, True), (2, 2, True, True)])]
               for splits, group, with_s0, sik in runs]


@pytest.mark.parametrize(
    "kp,vp,bv,dtype,reverse,weighted,splits,with_s0,group,scale_in_kernel,z_method",
    Z_CASES_GPU if ON_GPU else Z_CASES_CPU)
def test_states_walk_z(rng, kp, vp, bv, dtype, reverse, weighted, splits, with_s0, group,
                       scale_in_kernel, z_method):
    """with_z: z of ones or of random float32 weights u (both signs, magnitudes 1e-3 to 1e3);
    z_method None: "mma" (z from the rounded k * w) but "reduce" for fp16 with weights."""
    B, L, H, chunk = (2, 1024, 3, 64) if ON_GPU else (1, 256, 1, 64)
    k, v, g, s0 = make_inputs(rng, B, L, H, kp, vp, dtype, with_s0)
    u = None
    if weighted:
        mag = np.exp(rng.uniform(np.log(1e-3), np.log(1e3), (B, L, H)))
        u = jnp.asarray(rng.choice([-1.0, 1.0], (B, L, H)) * mag, jnp.float32)
    h, hz, final = chunk_states_mosaic(k, v, g, s0, chunk=chunk, bv=bv, reverse=reverse,
                                       splits=splits, group=group,
                                       scale_in_kernel=scale_in_kernel, with_z=True,
                                       z_weights=u, z_method=z_method, interpret=INTERPRET)
    N = L // chunk
    assert h.shape == (B, H, N, kp, vp) and h.dtype == dtype
    assert hz.shape == (B, H, N, kp) and hz.dtype == jnp.float32
    assert final.shape == (B, H, kp, vp) and final.dtype == jnp.float32
    h_ref, final_ref = reference(k, v, g, s0, chunk, reverse)
    hz_ref = reference_z(k, g, u, chunk, reverse, splits)
    errs = {"h": rel_err(h, h_ref), "final": rel_err(final, final_ref),
            "hz": rel_err(hz, hz_ref)}
    if ON_GPU:
        h_tr, hz_tr, final_tr = two_pass.chunk_states(
            k, v, g, s0, chunk=chunk, bv=bv, reverse=reverse, precision=None, interpret=False,
            splits=splits, with_z=True, z_weights=u, **TRITON)
        errs |= {"h vs triton": rel_err(h, h_tr), "final vs triton": rel_err(final, final_tr),
                 "hz vs triton": rel_err(hz, hz_tr), "triton hz": rel_err(hz_tr, hz_ref)}
    print(errs)
    assert errs["h"] <= H_TOL and errs["final"] <= FINAL_TOL and errs["hz"] <= Z_TOL, errs
    if ON_GPU:
        assert (errs["h vs triton"] <= H_TOL and errs["final vs triton"] <= FINAL_TOL
                and errs["hz vs triton"] <= Z_TOL), errs


@pytest.mark.parametrize("backend", ["triton", "mosaic"])
@pytest.mark.parametrize("with_z,weighted,splits,with_s0", [
    (False, False, 1, True), (False, False, 2, False), (True, False, 1, False),
    (True, True, 2, True)])
def test_both_directions_in_one_launch(rng, backend, with_z, weighted, splits, with_s0):
    """``two_pass.chunk_states(reverse=BOTH)`` (LION's walks side by side in one launch) gives
    what the two one-direction walks give, and the float64 walk; two V-blocks."""
    B, L, H, chunk, kp, vp, bv = 1, 512, 2, 64, 64, 128, 64
    k, v, g, _ = make_inputs(rng, B, L, H, kp, vp, jnp.bfloat16, False)
    s0 = (jnp.asarray(rng.standard_normal((2, B, H, kp, vp)), jnp.float32) if with_s0
          else None)
    u = jnp.asarray(rng.standard_normal((B, L, H)), jnp.float32) if weighted else None
    walk = functools.partial(two_pass.chunk_states, k, v, g, chunk=chunk, bv=bv,
                             precision=None, interpret=not ON_GPU, splits=splits,
                             with_z=with_z, z_weights=u, backend=backend)
    both = walk(s0, reverse=BOTH)
    for e, reverse in enumerate(BOTH):
        one = walk(None if s0 is None else s0[e], reverse=reverse)
        h_ref, final_ref = reference(k, v, g, None if s0 is None else s0[e], chunk, reverse)
        for name, a, b in zip(("h", "z", "final") if with_z else ("h", "final"), both, one):
            assert a.shape[1:] == b.shape and a.dtype == b.dtype, name
            assert rel_err(a[e], b) <= 1e-6, (name, reverse, rel_err(a[e], b))
        assert rel_err(both[0][e], h_ref) <= H_TOL and rel_err(both[-1][e], final_ref) <= FINAL_TOL


@pytest.mark.parametrize("backend", ["triton", "mosaic"])
def test_key_scale(rng, backend):
    """``key_scale`` (LION's backward: ``1 / (den + eps)``) scales every key row of the walk:
    h, the final state and the weighted z, both directions in one launch, two V-blocks."""
    B, L, H, chunk, kp, vp, bv = 1, 256, 2, 64, 128, 128, 64
    k, v, g, _ = make_inputs(rng, B, L, H, kp, vp, jnp.bfloat16, False)
    scale = jnp.asarray(np.exp(rng.uniform(np.log(1e-2), np.log(1e2), (B, L, H))), jnp.float32)
    u = jnp.asarray(rng.standard_normal((B, L, H)), jnp.float32)
    h, hz, final = two_pass.chunk_states(k, v, g, None, chunk=chunk, bv=bv, reverse=BOTH,
                                         precision=None, interpret=not ON_GPU, splits=1,
                                         with_z=True, z_weights=u, key_scale=scale,
                                         backend=backend)
    for e, reverse in enumerate(BOTH):
        h_ref, final_ref = reference(k, v, g, None, chunk, reverse, key_scale=scale)
        hz_ref = reference_z(k, g, u * scale, chunk, reverse, 1)
        errs = {"h": rel_err(h[e], h_ref), "final": rel_err(final[e], final_ref),
                "hz": rel_err(hz[e], hz_ref)}
        print(reverse, errs)
        assert errs["h"] <= H_TOL and errs["final"] <= FINAL_TOL and errs["hz"] <= Z_TOL, errs


@pytest.mark.parametrize("reverse", [False, True] if ON_GPU else [True])
def test_more_chunks_than_one_copy_moves(rng, reverse):
    """N > 256 chunks (a TMA copy moves at most 256 elements along a dimension): the decay
    factors d go to shared memory as rows of ``D_ROW``. One direction in the CPU interpreter
    (20 s each; both directions of the walk are in ``test_states_walk``)."""
    B, L, H, chunk = 1, 300 * 64, 1, 64
    k, v, g, s0 = make_inputs(rng, B, L, H, 64, 64, jnp.bfloat16, True)
    g = g * 1e-3  # mild decay: the state carries across many chunks
    h, final = chunk_states_mosaic(k, v, g, s0, chunk=chunk, bv=64, reverse=reverse,
                                   interpret=INTERPRET)
    h_ref, final_ref = reference(k, v, g, s0, chunk, reverse)
    errs = {"h": rel_err(h, h_ref), "final": rel_err(final, final_ref)}
    print(errs)
    assert errs["h"] <= H_TOL and errs["final"] <= FINAL_TOL, errs


def test_supported_rejects():
    k = jnp.zeros((1, 128, 1, 64), jnp.float32)
    assert "Triton" in supported(k, k, 64, 64)
    with pytest.raises(ValueError, match="Triton"):
        chunk_states_mosaic(k, k, jnp.zeros((1, 128, 1)), None, chunk=64, bv=64, reverse=False)
    k16 = k.astype(jnp.bfloat16)
    assert supported(k16, k16, 64, 64) is None
    assert "multiples of 64" in supported(k16[..., :32], k16, 64, 64)
    assert "chunk" in supported(k16, k16, 32, 64)
