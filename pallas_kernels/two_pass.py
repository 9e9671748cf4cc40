"""Chunk-parallel form of :func:`pallas_kernels.chunk_scan`: chunk states, then chunk outputs.

Same inputs, outputs and math as the sequential kernel (``chunk_scan.py``), in two kernels:

    states  (grid B, H, V-blocks, splits; each program walks its run of chunks in order):
              h[n] = S;   S = exp(sum_{s in n} a_s) S + (K_n * exp(tail))^T V_n
            one matmul per step, the state in float32 registers, h[n] stored in the input dtype
            (the output kernel multiplies it in that dtype anyway, as the sequential kernel does).
    outputs (grid B, H, N, V-blocks, every chunk its own program):
              O_n = chunk_output(Q_n, K_n, V_n, a_n, h[n])

The serial part is the states kernel, one small matmul per chunk. To fill the GPU when
``B * H * V-blocks`` is small and the state small (see ``pick_splits``), the chunks are cut into
``splits`` runs of equal length: a first states launch walks each run from a zero state and
keeps only its end state; a scan over the runs in XLA (``splits`` steps of ``S = exp(run decay)
S + end``) gives the state entering each run; the second states launch walks each run again from
that state and stores h. Both launches are ``splits`` times shorter than one walk over all
chunks.

``h [B, H, N, Kp, Vp]`` has ``L Kp Vp / C`` entries: the custom VJPs keep it as a residual
when that is at most twice the size of q or v (``linear_attention.keep_states``), so the
backward need not walk the chunks again; otherwise it recomputes the states. Decay
exponents are chunk-local and summed directly (``chunk_scan.decay_factors``).
:func:`chunk_states` is shared with the fused kernels (``bidirectional.py``,
``causal_backward.py``). It runs the Triton states kernel below or, on Hopper GPUs, the Mosaic
GPU walk of ``mosaic_states.py`` (same results; :func:`walk_backend` picks, ``backend=``
forces one); the output kernels are Triton-lowered either way. With ``fused=True`` a forward
scan whose walk runs on Mosaic GPU takes ``mosaic_causal_warps.py`` instead: the walk and the
outputs in one warp-specialized kernel, the states kept in registers (:func:`fused_forward`
says when).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import (_pad_axis, chunk_output, fit_layout, pad_layout, pad_state,
                                       runs_until, stacked_decay_factors, walk_directions,
                                       walk_in_runs)
from pallas_kernels.mosaic_causal_warps import causal_forward_warps
from pallas_kernels.mosaic_causal_warps import supported as fused_forward_reason
from pallas_kernels.mosaic_states import chunk_states_mosaic
from pallas_kernels.mosaic_states import supported as mosaic_walk_reason

# Warps per program of the states kernel (a [Kp, BV] state, one small matmul per step): 4 was
# faster than 8 at D = 64 and 128 on an H100 (docs/benchmarks.md).
STATES_WARPS = 4
# Backward kernels (causal and LION gradients, head dims <= 128): 4 warps were faster than 8
# on an H100 at D = 64 and 128 (0.97 vs 1.41 ms for the causal backward at D = 64, L = 16K)
# and on an H200 (D = 128: causal 1.16 vs 2.08 ms, LION dk, dv 1.39 vs 1.93; num_stages 1-3
# within 0.3%: one program per chunk has no loop to pipeline; `python -m
# experiments.profile_kernels --settings`, docs/benchmarks.md, one H200, 2026-11-22).
BACKWARD_WARPS = 4
# The V-block of every states walk (forward and backward passes; the output kernels may take
# wider V-blocks of the same states): at D = 128 a 128 x 64 state walked faster than 128 x 128
# (0.71 vs 0.87 ms with z, L = 16K, H100).
WALK_BLOCK_V = 64
# V columns per program of the output kernels for 16-bit inputs with head dims up to 128
# (float32 tiles take twice the bytes: they and larger head dims keep 64). One H200, B4 H16,
# L = 16K, D = 128, bf16, states kept, 4 warps: causal forward 1.072 ms with V-blocks of 64,
# 0.872 with 128 (0.971 with 8 warps); LION forward 2.209 / 1.704 (2.144). Kernel times
# alone (H200, profile_kernels --settings, 2026-11-22): causal 0.675 / 0.503 ms, LION 1.42 /
# 1.01 ms; 8 warps 0.58 and 1.43 ms.
OUTPUT_BLOCK_V = 128


def output_block_v(k_dim, v_dim, dtype):
    """The output kernels' V-block for these head dims and input dtype (``OUTPUT_BLOCK_V``)."""
    return OUTPUT_BLOCK_V if dtype != jnp.float32 and max(k_dim, v_dim) <= 128 else 64


# When the states kernel cuts the chunks into runs: only for states of at most
# MAX_SPLIT_STATE entries, until TARGET_PROGRAMS programs (chunk_scan.runs_until).
# Measured on an H100 at L = 16K (docs/benchmarks.md): 64 x 64 states with 64 programs took
# 0.53 ms unsplit and 0.43 ms in 8 runs; 128 x 64 and 128 x 128 states were fastest unsplit.
MAX_SPLIT_STATE = 64 * 64
TARGET_PROGRAMS = 512
# The Mosaic GPU walk (mosaic_states.py) splits, for any state size, until 64 programs: on an
# H100 at L = 16K a 64 x 64 walk with 64 programs took 0.21 ms unsplit and 0.31 in 2 runs, one
# with 8 programs 0.20 ms unsplit and 0.08-0.09 in 8 runs.
MOSAIC_TARGET_PROGRAMS = 64
# The fused forward (mosaic_causal_warps.py) splits until 128 programs: on one H200 at L = 16K,
# B = 4, H = 16 (2026-12-06) D 64 (64 programs) took 0.460 ms in 1 run, 0.370 in 2 and 0.367
# in 4; D 128 (128 programs) 0.595 in 1 run and 0.762 in 2.
FUSED_TARGET_PROGRAMS = 128
# With z, a 128 x 128 Mosaic walk spilled registers: 1.49 ms against Triton's 1.15 on an H200
# (L = 16K); 128 x 64 took 0.35 against 0.78. backend=None walks larger states with Triton.
MOSAIC_MAX_Z_STATE = 128 * 64
BACKENDS = ("triton", "mosaic")


def fitted_chunk(chunk, kp, bv, dtype, state_bytes, return_states):
    """``chunk_scan.fit_layout`` for an output kernel and its states walk; with
    ``return_states`` (states per chunk, for a fused backward pass at this chunk) a chunk that
    does not fit is a ValueError."""
    fitted = fit_layout(chunk, kp, bv, jnp.dtype(dtype).itemsize, state_bytes)
    if return_states and fitted[0] != chunk:
        raise ValueError(f"return_states: chunks of {chunk} tokens with Kp = {kp} do not fit in "
                         f"shared memory; use chunks of at most {fitted[0]}")
    return fitted


def pick_splits(programs, num_chunks, state_entries, *, backend="triton"):
    """The number of runs (a power of two dividing ``num_chunks``) to cut the chunks into,
    keeping at least ``chunk_scan.MIN_RUN_CHUNKS`` chunks per run. Triton: 1 for states larger than
    ``MAX_SPLIT_STATE``, else until ``programs * splits`` reaches ``TARGET_PROGRAMS``; Mosaic:
    until ``MOSAIC_TARGET_PROGRAMS``."""
    if backend != "mosaic" and state_entries > MAX_SPLIT_STATE:
        return 1
    return runs_until(programs, num_chunks,
                      MOSAIC_TARGET_PROGRAMS if backend == "mosaic" else TARGET_PROGRAMS)


def chunk_index(directions, axis):
    """``n(first, run, step)``: the chunk a program walks at step ``step`` of the run starting
    at chunk ``first``. ``directions`` is a tuple of bools (one per entry of the grid's
    direction axis, ``axis``): one direction is static, two (``BOTH``) are picked by the
    program's index along that axis."""
    if len(directions) == 1:
        reverse = directions[0]
        return lambda first, run, step: first + (run - 1 - step if reverse else step)
    reverse = pl.program_id(axis) == 1
    return lambda first, run, step: first + jnp.where(reverse, run - 1 - step, step)


def _states_kernel(k_ref, v_ref, w_ref, d_ref, u_ref, s0_ref, z0_ref, *out_refs, chunk, run,
                   directions, precision, store, with_z):
    """One (direction, b, h, V-block, run) program: k ``[Lp, Kp]``, v ``[Lp, BV]``, key
    factors w ``[Lp]``, chunk decay factors d ``[N]`` (both of the program's direction); s0 and
    the end state ``[Kp, BV]``; h ``[N, Kp, BV]`` when stored; with_z also the z weights u
    ``[Lp]`` (u_ref None: ones), z0, the end z ``[Kp]`` and (stored) the z of every chunk
    ``[N, Kp]``. s0_ref / z0_ref None: start from zero."""
    out_refs = list(out_refs)
    h_ref = out_refs.pop(0) if store else None
    hz_ref = out_refs.pop(0) if store and with_z else None
    end_ref = out_refs.pop(0)
    zend_ref = out_refs.pop(0) if with_z else None
    first = pl.program_id(4) * run
    z_block = pl.program_id(3) == 0  # every V-block walks z, V-block 0 stores it
    chunk_of = chunk_index(directions, 0)

    def body(step, carry):
        state, z = carry
        n = chunk_of(first, run, step)
        if store:
            h_ref[n] = state.astype(h_ref.dtype)
            if with_z:
                @pl.when(z_block)
                def _():
                    hz_ref[n] = z
        sl = pl.ds(n * chunk, chunk)
        k = k_ref[sl, :]
        k_dec = (k * w_ref[sl][:, None]).astype(k.dtype)
        decay = jnp.sum(d_ref[pl.ds(n, 1)])
        update = pltriton.dot(k_dec, v_ref[sl, :], trans_a=True, precision=precision)
        if with_z:  # the same rounded keys as the state's: num and den stay consistent
            z_dec = k_dec.astype(jnp.float32)
            z_dec = z_dec if u_ref is None else z_dec * u_ref[sl].astype(jnp.float32)[:, None]
            z = decay * z + jnp.sum(z_dec, axis=0)
        return decay * state + update, z

    state = (jnp.zeros(end_ref.shape, jnp.float32) if s0_ref is None
             else s0_ref[...].astype(jnp.float32))
    z = None
    if with_z:
        z = jnp.zeros(zend_ref.shape, jnp.float32) if z0_ref is None else z0_ref[...]
    state, z = jax.lax.fori_loop(0, run, body, (state, z))
    end_ref[...] = state
    if with_z:
        @pl.when(z_block)
        def _():
            zend_ref[...] = z


def _states_call(k, v, w, d, u, s0, z0, *, chunk, splits, bv, directions, store, with_z,
                 precision, params, interpret):
    """One launch of the states kernel over ``splits`` runs in each of ``directions`` (the
    leading axis, ``D``, of w ``[D, B, H, L]``, d ``[D, B, H, N]``, s0, z0 and every result);
    returns ``[h, hz,] ends[, zends]`` (h, hz when stored, hz and zends with_z):
    ``ends [D, B, H, splits, Kp, Vp]``, ``zends [D, B, H, splits, Kp]``,
    ``h [D, B, H, N, Kp, Vp]`` (k.dtype), ``hz [D, B, H, N, Kp]``, all float32 but h."""
    B, L, H, kp = k.shape
    vp = v.shape[-1]
    N, D = L // chunk, len(directions)
    run_spec = pl.BlockSpec((None, None, None, None, kp, bv),
                            lambda e, b, h, j, r: (e, b, h, r, 0, j))
    z_run_spec = pl.BlockSpec((None, None, None, None, kp), lambda e, b, h, j, r: (e, b, h, r, 0))
    token_spec = pl.BlockSpec((None, None, None, L), lambda e, b, h, j, r: (e, b, h, 0))
    out_specs, out_shape = [], []

    def out(spec, shape, dtype=jnp.float32):
        out_specs.append(spec)
        out_shape.append(jax.ShapeDtypeStruct(shape, dtype))

    if store:
        out(pl.BlockSpec((None, None, None, N, kp, bv), lambda e, b, h, j, r: (e, b, h, 0, 0, j)),
            (D, B, H, N, kp, vp), k.dtype)
        if with_z:
            out(pl.BlockSpec((None, None, None, N, kp), lambda e, b, h, j, r: (e, b, h, 0, 0)),
                (D, B, H, N, kp))
    out(run_spec, (D, B, H, splits, kp, vp))
    if with_z:
        out(z_run_spec, (D, B, H, splits, kp))
    name = "chunk_states" + {(False,): "", (True,): "_reverse"}.get(tuple(directions), "_both")
    return pl.pallas_call(
        functools.partial(_states_kernel, chunk=chunk, run=N // splits, directions=directions,
                          precision=precision, store=store, with_z=with_z),
        grid=(D, B, H, vp // bv, splits),
        in_specs=[pl.BlockSpec((None, L, None, kp), lambda e, b, h, j, r: (b, 0, h, 0)),
                  pl.BlockSpec((None, L, None, bv), lambda e, b, h, j, r: (b, 0, h, j)),
                  token_spec,
                  pl.BlockSpec((None, None, None, N), lambda e, b, h, j, r: (e, b, h, 0)),
                  None if u is None else pl.BlockSpec((None, None, L),
                                                      lambda e, b, h, j, r: (b, h, 0)),
                  None if s0 is None else run_spec,
                  None if z0 is None else z_run_spec],
        out_specs=out_specs, out_shape=out_shape, compiler_params=params,
        interpret=interpret, name=name,
    )(k, v, w, d, u, s0, z0)


def states_stages(kp, bv):
    """Triton pipelining depth of the states kernel: 3 for states larger than 64 x 64 (a
    128 x 64 walk took 0.56 ms with 3 against 0.68 with 2 on an H100, L = 16K), else 2."""
    return 3 if kp * bv > 64 * 64 else 2


def hopper():
    """Whether the default device is an NVIDIA GPU of compute capability >= 9.0 (Hopper)."""
    device = jax.devices()[0]
    return (device.platform == "gpu"
            and float(getattr(device, "compute_capability", None) or 0) >= 9.0)


def walk_backend(k, v, *, chunk, bv, backend, interpret, with_z=False):
    """The kernel that walks these states: ``"mosaic"`` (``mosaic_states.py``) or ``"triton"``.

    ``backend`` None picks Mosaic GPU when compiling for a Hopper GPU and its walk takes the
    inputs (16-bit, ``Kp`` and ``bv`` multiples of 64, chunk 64..256: ``mosaic_states.supported``)
    and, with z, the state has at most ``MOSAIC_MAX_Z_STATE`` entries, else Triton;
    ``"mosaic"`` raises a ValueError with the reason when its walk cannot take them;
    ``"triton"`` is always Triton. ``interpret`` runs the chosen kernel in its interpreter.
    """
    if backend == "triton":
        return backend
    if backend not in (None, "mosaic"):
        raise ValueError(f"backend must be None or one of {BACKENDS}; got {backend!r}")
    reason = mosaic_walk_reason(k, v, chunk, bv)
    if backend == "mosaic":
        if reason is not None:
            raise ValueError(f"backend='mosaic': {reason}; use backend=None or 'triton'")
        return backend
    if with_z and k.shape[-1] * bv > MOSAIC_MAX_Z_STATE:
        return "triton"
    return "mosaic" if reason is None and not interpret and hopper() else "triton"


def chunk_states(k, v, g, s0, *, chunk, bv, reverse, precision, interpret, num_stages=None,
                 splits=None, with_z=False, z_weights=None, key_scale=None, backend=None):
    """The state entering each chunk in the scan's direction, and the final state.

    Args:
      k: ``[B, L, H, Kp]``, v: ``[B, L, H, Vp]`` (padded to the tile layout of ``pad_layout``;
        Vp a multiple of ``bv``), g: ``[B, L, H]`` float32 log-decays, L a multiple of ``chunk``.
      s0: None or ``[B, H, Kp, Vp]`` float32, the state before the first chunk scanned.
      reverse: False (first chunk to last), True, or ``BOTH``: the two directions in one launch
        (twice the programs; LION walks the same keys and values both ways), every result with
        a leading axis of 2 (forward, then reverse) and s0, if given, ``[2, B, H, Kp, Vp]``.
      splits: runs to cut the chunks into (a power of two dividing N); None: :func:`pick_splits`.
      num_stages: Triton pipelining depth (the kernel runs ``STATES_WARPS`` warps); None:
        :func:`states_stages`.
      with_z: also carry ``z = sum_j decay_j u_j k_j``, starting from zero: with ``u = 1`` the
        state of a ones column of v (LION's normaliser).
      z_weights: None (u = 1) or ``[B, L, H]``, the ``u`` of ``z`` (both directions alike).
      key_scale: None or ``[B, L, H]``: the states (and z) of ``(k * key_scale, v)``, the scale
        folded into the key factors (each product rounded to k's dtype once).
      backend: the walk's kernel, see :func:`walk_backend` (None: Mosaic GPU on Hopper where
        it applies, else Triton).
    Returns:
      ``(h [B, H, N, Kp, Vp] k.dtype, final [B, H, Kp, Vp] float32)``; with_z
      ``(h, z [B, H, N, Kp] float32, final)``.
    """
    B, L, H, _ = k.shape
    N = L // chunk
    directions = walk_directions(reverse)
    backend = walk_backend(k, v, chunk=chunk, bv=bv, backend=backend, interpret=interpret,
                           with_z=with_z)
    if splits is None:
        programs = len(directions) * B * H * (v.shape[-1] // bv)
        splits = pick_splits(programs, N, k.shape[-1] * bv, backend=backend)
    if N % splits:
        raise ValueError(f"splits must divide the number of chunks {N}; got {splits}")
    if backend == "mosaic":
        return chunk_states_mosaic(k, v, g, s0, chunk=chunk, bv=bv, reverse=reverse,
                                   splits=splits, with_z=with_z, z_weights=z_weights,
                                   key_scale=key_scale,
                                   interpret=plgpu.InterpretGPUParams() if interpret else None)
    w, d = stacked_decay_factors(g, chunk, directions, key_scale)
    u = None if z_weights is None else jnp.swapaxes(z_weights, 1, 2).astype(jnp.float32)
    params = pltriton.CompilerParams(num_warps=STATES_WARPS,
                                     num_stages=num_stages or states_stages(k.shape[-1], bv))
    walk = functools.partial(_states_call, k, v, w, d, u, chunk=chunk, splits=splits, bv=bv,
                             directions=directions, with_z=with_z, precision=precision,
                             params=params, interpret=interpret)
    return walk_in_runs(walk, d, s0, reverse=reverse, splits=splits, with_z=with_z)


def fused_forward(q, k, v, *, chunk, reverse, strict, out_dtype, backend, interpret):
    """Whether :func:`chunk_scan_two_pass` can take the fused Mosaic GPU forward kernel for
    these padded inputs: a forward, non-strict scan writing the input dtype, whose states walk
    would run on Mosaic GPU (:func:`walk_backend`) and whose layout the fused kernel takes
    (``mosaic_causal_warps.supported``)."""
    if reverse or strict or jnp.dtype(out_dtype) != q.dtype:
        return False
    if fused_forward_reason(q, v, chunk) is not None:
        return False
    return walk_backend(k, v, chunk=chunk, bv=WALK_BLOCK_V, backend=backend,
                        interpret=interpret) == "mosaic"


def backward_layout(q, k, v, dy, log_decay, *, max_dim, chunk, interpret, num_warps,
                    num_stages, splits, backend):
    """The shared set-up of the fused backward kernels (causal and LION).

    Pads q, k, v and the output cotangent ``dy`` to the tile layout (``pad_layout`` with whole
    ``[Kp, Vp]`` tiles up to ``max_dim``, ``num_warps`` None: ``BACKWARD_WARPS``) and binds
    :func:`chunk_states` for the backward's walks (V-blocks of ``WALK_BLOCK_V``, the walks'
    kernel picked by ``backend`` as in :func:`walk_backend`).

    Returns:
      ``(q, k, v, dy, g, kp, vp, precision, params, states)``: g the float32 log-decays,
      ``states(k, v, s0=..., reverse=..., ...)`` the bound :func:`chunk_states`.
    """
    q, k, v, kp, _, vp, precision, params = pad_layout(q, k, v, max_dim,
                                                       num_warps or BACKWARD_WARPS, num_stages)
    dy = _pad_axis(dy.astype(q.dtype), 3, vp)
    g = log_decay.astype(jnp.float32)
    states = functools.partial(chunk_states, g=g, chunk=chunk, bv=min(vp, WALK_BLOCK_V),
                               precision=precision, interpret=interpret, splits=splits,
                               backend=backend)
    return q, k, v, dy, g, kp, vp, precision, params, states


def _output_kernel(q_ref, k_ref, v_ref, g_ref, h_ref, o_ref, *, reverse, strict, precision):
    """One (b, h, n, V-block): q, k ``[C, Kp]``, v, o ``[C, BV]``, g ``[C]``,
    h ``[Kp, BV]`` (the state entering the chunk)."""
    a = g_ref[...].astype(jnp.float32)
    out = chunk_output(q_ref[...], k_ref[...], v_ref[...], a, h_ref[...], reverse=reverse,
                       strict=strict, precision=precision)
    o_ref[...] = out.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("reverse", "strict", "chunk", "block_v",
                                             "out_dtype", "interpret", "num_warps",
                                             "num_stages", "splits", "return_states",
                                             "backend", "fused"))
def chunk_scan_two_pass(q, k, v, log_decay, initial_state=None, *, reverse=False, strict=False,
                        chunk=64, block_v=None, out_dtype=jnp.float32, interpret=False,
                        num_warps=None, num_stages=2, splits=None, return_states=False,
                        backend=None, fused=False):
    """:func:`pallas_kernels.chunk_scan` computed chunk-parallel (same arguments and results).

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``, one dtype; L a multiple of ``chunk``.
      log_decay: ``[B, L, H]``, entries ``<= 0``; initial_state: None or ``[B, H, K, V]``.
      reverse, strict, chunk, out_dtype, interpret: as there (the chunk smaller where the
        tiles would not fit in shared memory, :func:`fitted_chunk`).
      block_v: V columns per output program (None: :func:`output_block_v`).
      num_stages: of the output kernel (the states kernel's: :func:`states_stages`).
      num_warps: of the output kernel (None: 4, faster than 8 here on an H100).
      splits: runs the states kernel cuts the chunks into (see :func:`chunk_states`).
      return_states: also return the states entering every chunk, ``h [B, H, N, Kp, Vp]`` in
        the input dtype, padded to the tile layout (``pad_layout``), for a backward pass.
      backend: the states walk's kernel (see :func:`walk_backend`; the output kernel is Triton).
      fused: where :func:`fused_forward` holds, one warp-specialized Mosaic GPU kernel walks
        the chunks and writes the outputs (``mosaic_causal_warps.py``), in runs of chunks
        until ``FUSED_TARGET_PROGRAMS``. The causal op passes it when compiled
        (``linear_attention.CAUSAL_FORWARD``; timings in docs/benchmarks.md).
    Returns:
      ``(o [B, L, H, V] out_dtype, state [B, H, K, V] float32[, h])``.
    """
    B, L, H, K = q.shape
    V = v.shape[-1]
    block_v = block_v or output_block_v(K, V, q.dtype)
    q, k, v, kp, bv, vp, precision, params = pad_layout(q, k, v, block_v, num_warps or 4,
                                                        num_stages)
    chunk, bv = fitted_chunk(chunk, kp, bv, q.dtype, 4, return_states)
    g = log_decay.astype(jnp.float32)
    s0 = pad_state(initial_state, kp, vp)
    if fused and fused_forward(q, k, v, chunk=chunk, reverse=reverse, strict=strict,
                               out_dtype=out_dtype, backend=backend, interpret=interpret):
        nvb = vp // WALK_BLOCK_V
        splits = splits or runs_until(B * H * nvb, L // chunk, FUSED_TARGET_PROGRAMS)
        outs = causal_forward_warps(
            q, k, v, g, s0, chunk=chunk, splits=splits, store_states=return_states,
            interpret=plgpu.InterpretGPUParams() if interpret else None)
        o, state = outs[0][..., :V], outs[1][:, :, :K, :V]
        return (o, state, outs[2]) if return_states else (o, state)
    h, state = chunk_states(k, v, g, s0, chunk=chunk, bv=min(bv, WALK_BLOCK_V), reverse=reverse,
                            precision=precision, interpret=interpret, splits=splits,
                            backend=backend)
    qk_spec = pl.BlockSpec((None, chunk, None, kp), lambda b, h, n, j: (b, n, h, 0))
    v_spec = pl.BlockSpec((None, chunk, None, bv), lambda b, h, n, j: (b, n, h, j))
    o = pl.pallas_call(
        functools.partial(_output_kernel, reverse=reverse, strict=strict, precision=precision),
        grid=(B, H, L // chunk, vp // bv),
        in_specs=[qk_spec, qk_spec, v_spec,
                  pl.BlockSpec((None, chunk, None), lambda b, h, n, j: (b, n, h)),
                  pl.BlockSpec((None, None, None, kp, bv), lambda b, h, n, j: (b, h, n, 0, j))],
        out_specs=v_spec,
        out_shape=jax.ShapeDtypeStruct((B, L, H, vp), out_dtype),
        compiler_params=params, interpret=interpret, name="chunk_outputs",
    )(q, k, v, g, h)
    o, state = o[..., :V], state[:, :, :K, :V]
    return (o, state, h) if return_states else (o, state)
