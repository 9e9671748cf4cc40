"""pallas_kernels.mosaic_states (the Mosaic GPU states walk) against float64 numpy and Triton.

CPU (default): the kernel runs in the Mosaic GPU interpreter (``plgpu.InterpretGPUParams``).
GPU (``LION_TEST_GPU=1``, compute capability >= 9.0): compiled with Mosaic GPU, and also
compared with the Triton states kernel (``two_pass.chunk_states``). Errors are
``||a - b|| / ||b||`` against a float64 walk over the same rounded ``k * w``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import two_pass
from pallas_kernels.mosaic_states import chunk_states_mosaic, supported

ON_GPU = jax.default_backend() == "gpu"
if ON_GPU and float(getattr(jax.devices()[0], "compute_capability", "0")) < 9.0:
    pytest.skip("Mosaic GPU kernels need compute capability >= 9.0", allow_module_level=True)
INTERPRET = None if ON_GPU else plgpu.InterpretGPUParams()
H_TOL, FINAL_TOL = 5e-3, 1e-3  # h is stored in bf16 / fp16; the end state in float32


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)), "non-finite values in the kernel's result"
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def reference(k, v, g, s0, chunk, reverse):
    """float64 walk: ``h [B, H, N, Kp, Vp]``, final ``[B, H, Kp, Vp]``."""
    w, d = two_pass.decay_factors(g, chunk, reverse=reverse)
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


@pytest.mark.parametrize("kp,vp,bv,dtype", CASES)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_s0", [False, True])
@pytest.mark.parametrize("scale_in_kernel,splits,group",
                         [(True, 1, 1), (False, 1, 1), (True, 2, 1), (True, 1, 2), (False, 2, 2)])
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
                                               precision=None, interpret=False, splits=1)
        errs |= {"h vs triton": rel_err(h, h_tr), "final vs triton": rel_err(final, final_tr)}
    print(errs)
    assert errs["h"] <= H_TOL and errs["final"] <= FINAL_TOL, errs
    if ON_GPU:
        assert errs["h vs triton"] <= H_TOL and errs["final vs triton"] <= FINAL_TOL, errs


def test_supported_rejects():
    k = jnp.zeros((1, 128, 1, 64), jnp.float32)
    assert "Triton" in supported(k, k, 64, 64)
    with pytest.raises(ValueError, match="Triton"):
        chunk_states_mosaic(k, k, jnp.zeros((1, 128, 1)), None, chunk=64, bv=64, reverse=False)
    k16 = k.astype(jnp.bfloat16)
    assert supported(k16, k16, 64, 64) is None
    assert "multiples of 64" in supported(k16[..., :32], k16, 64, 64)
    assert "chunk" in supported(k16, k16, 32, 64)
