"""The causal chunked forward pass with per-token decay as one warp-specialized Pallas Mosaic
GPU kernel (Hopper, sm_90).

Same math as ``two_pass.chunk_scan_two_pass`` (forward direction, not strict): for chunk n
with chunk-local inclusive cumulative log-decays ``A`` (``A_i = sum_{s <= i} a_s``, float32),
the state ``S`` entering the chunk and ``d = exp(A_last)``,

    W = (Q K^T) * exp(A_i - A_j) [i >= j]                          [C, C]
    O = W V + (Q * e^A) S                                          [C, BV]
    S <- d S + (K * e^tail)^T V,   e^tail_j = exp(sum_{s > j} a_s)

(``A``, ``e^A`` and ``e^tail``: the rows of ``chunk_scan.mask_rows``). Every exponent of the
mask is at most 0 where it is kept, so one build takes every decay (down to -20 per token and
beyond). Per-feature decay has its one-kernel forward in ``mosaic_causal.py``.

Why one kernel: the two-pass forward walks the chunks once to store every chunk's state in
HBM (``L Kp Vp / C`` entries) and reads them back in the output kernel. Here the program that
walks the chunks also computes their outputs, so the state stays in registers and reaches HBM
only when the backward pass asks for it (``store_states``).

Rounding as the two-pass kernels: the state is multiplied in the input dtype, W and the
decayed keys and queries are rounded to it, products accumulate in float32. The mask's
exponent is a difference of the chunk cumsum (off by about ulp(|A|) <= 1.2e-4 at log-decay -20
per token, far below a 16-bit operand's 2^-9), so only 16-bit inputs are taken.

Runs: with few programs (``B H Vp / BLOCK_V`` below ``two_pass.FUSED_TARGET_PROGRAMS``) the
chunks are cut into ``splits`` runs, and the kernel starts each run from the state entering
it (:func:`run_states`: ``mosaic_states.walk_states`` walks the chunks before the last run
from zero in short runs, ``RUN_STATES_PROGRAMS``, keeping only their end states, and
``chunk_scan.entering_states`` scans those).

The work is split across three warpgroups (four with two output warpgroups, below) of one
program per (b, h, V-block j, run r):

- the last warpgroup (memory): TMA copies of chunk n's q, k ``[C, Kp]``, v ``[C, BV]`` and
  its decay rows into slot ``n % stages``, once the chain and the chunk's outputs have
  released the slot;
- warpgroup 0 (the state chain): holds ``S [Kp, BV]`` float32 in registers; per chunk writes
  S rounded to the input dtype into one of two shared-memory tiles (the stored state ``h``
  and the outputs' operand) and signals it, then ``S <- e^(A_last) S + K^T (e^tail V)`` (one
  wgmma, K read transposed from its slot). ``e^tail V [C, BV]`` (half the entries of
  ``K e^tail`` at Kp 128) goes into one of two tiles, the next chunk's while this chunk's
  wgmma runs, so only the state's store, the wgmma and the update are serial;
- warpgroup 1 (outputs): ``W = Q K^T`` masked by ``exp(A_i - A_j)``, its exponents from A
  on the rows and a second copy of A read in the columns' layout, then ``y = W V + (Q e^A)
  S`` once warpgroup 0 has signalled chunk n's state; y goes out by TMA. W and ``Q e^A`` are
  the wgmmas' register operands when compiled; in the Mosaic GPU interpreter (the CPU
  tests), which takes no register operands (jax 0.11.2), they go through shared memory
  (``Q e^A`` over the slot's q).

The outputs of chunk n overlap the state update of chunk n + 1, and the loads run ahead by
``stages`` chunks. With ``outputs`` = 2 (``OUTPUT_WARPGROUPS``; our reading of a profile is that
the outputs warpgroup sets the pace at D 64, docs/benchmarks.md, "Where the one-kernel causal
forward's time goes") two output warpgroups take alternate chunks, so
two chunks' outputs are computed at once: the pipeline slots and the ``2 outputs`` state tiles
are multiples of ``outputs``, so that each slot's and each tile's barriers have one waiter of
each role, and the registers are shared four ways (:func:`compute_registers`).

Barriers: ``loaded`` (per input and slot, TMA bytes), ``consumed`` (per slot, two arrivals),
``state_ready`` and ``state_free`` (per state tile). Every waiter observes
every phase of its barriers (the interpreter checks it), so the memory warpgroup and the
chain wait out the last releases before the barriers go.

On one H100 (2026-12-07, L 16K, B 4, H 16, bf16, mild decay; docs/benchmarks.md) this layout
took 0.377 ms at D 64 in 2 runs and 0.496 at D 128, against 0.410 and 0.537 before it in the
same run (the chain scaling K into one tile before its wgmma; W in GLA's one-product form
``(Q e^A)(K e^-A)^T`` where every chunk's decay allowed it, else the mask with its column
tile transposed through shared memory: 0.387 and 0.550 with strong decay). Issuing the
next chunk's ``Q K^T`` with this chunk's output wgmmas was slower (0.408 and 0.722 in an
earlier run, against 0.369 and 0.466 without).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.chunk_scan import (entering_states, mask_rows, runs_until,
                                       stacked_decay_factors)
from pallas_kernels.mosaic_causal import BLOCK_V, CHUNK, layout_reason
from pallas_kernels.mosaic_states import SMEM_BYTES, _TILE16, _TILE32, walk_states
from pallas_kernels.mosaic_tiles import (DECAY_ROWS, ROWS, WGMMA, causal_mask,
                                        compiler_params, rows_of, tile_iota)

# Pipeline slots: the most of these that fit in shared memory (3 at Kp = 64 and 128; on one
# H100, 2026-12-07, 4 at Kp = 64 took 9 % longer and 2 at 128 12 %, and in an interleaved A/B
# of this layout 4 and 5 at Kp 64 took 2.7 % and 3.0 % longer: docs/benchmarks.md).
STAGES = (3, 2)
# Warpgroups computing outputs per Kp, each taking every n-th chunk of its program (the module
# docstring). 1 until 2 is timed on a GPU (tested at Kp 64 in the Mosaic GPU interpreter; at
# Kp 128 two take 230 KiB of shared memory, past the 227); read when the op is traced
# (``experiments.ab_settings``: mosaic_causal_warps.OUTPUT_WARPGROUPS={64: 2, 128: 1}).
OUTPUT_WARPGROUPS = {64: 1, 128: 1}
# Registers per thread of the memory warpgroup, which gives the rest of its share to the
# computing ones (:func:`compute_registers`).
MEMORY_REGISTERS = 40
# Programs of the walk that gives the runs their entering states (:func:`run_states`): the
# chunks before the last run walked in runs of N / runs_until(programs, N, this) chunks, so
# that walk is short (chains of N / runs chunks instead of N / splits) rather than as long as
# a run. On one H100 (2026-12-07, interleaved A/B, D 64, L 16K) 512 and 1 (a walk as long as a
# run) were within the spread: forward 0.346 against 0.355 ms, the default against itself
# 1.011 (docs/benchmarks.md). Read when the op is traced (``experiments.ab_settings``).
RUN_STATES_PROGRAMS = 512


def compute_registers(outputs):
    """Registers per thread of each computing warpgroup (the chain and ``outputs`` output
    warpgroups): the 64K of a multiprocessor less the memory warpgroup's, in multiples of 8
    (232 with one output warpgroup, 152 with two)."""
    return (65536 // 128 - MEMORY_REGISTERS) // (outputs + 1) // 8 * 8


def smem_bytes(chunk, kp, bv, itemsize, stages, outputs=1):
    """Shared memory of one program when compiled: ``stages`` slots of q, k, v and four decay
    rows; the chain's two ``e^tail V`` tiles and ``2 outputs`` state tiles; each output
    warpgroup's two y tiles; the float32 state tile (first and last state). (The interpreter
    also keeps a W tile per output warpgroup.)"""
    slot = (2 * chunk * kp + chunk * bv) * itemsize + len(DECAY_ROWS) * 4 * chunk
    chain = (2 * chunk * bv + 2 * outputs * kp * bv) * itemsize
    ys = 2 * outputs * chunk * bv * itemsize
    return stages * slot + chain + ys + 4 * kp * bv


def pick_stages(kp, itemsize, chunk=CHUNK, outputs=1):
    """The most pipeline slots of ``STAGES``, each rounded up to a multiple of ``outputs`` (a
    slot's chunks then go to one output warpgroup), that fit in shared memory (the last if
    none)."""
    counts = [-(-s // outputs) * outputs for s in STAGES]
    fits = [s for s in counts
            if smem_bytes(chunk, kp, BLOCK_V, itemsize, s, outputs) + 4096 <= SMEM_BYTES]
    return (fits or counts[-1:])[0]


def supported(q, v, chunk=CHUNK, stages=None, outputs=None):
    """None when :func:`causal_forward_warps` takes these padded inputs, else why."""
    outputs = outputs or OUTPUT_WARPGROUPS.get(q.shape[-1], 1)
    stages = stages or pick_stages(q.shape[-1], q.dtype.itemsize, chunk, outputs)
    if stages % outputs:
        return f"stages ({stages}) must be a multiple of the output warpgroups ({outputs})"
    smem = smem_bytes(chunk, q.shape[-1], BLOCK_V, q.dtype.itemsize, stages, outputs)
    return layout_reason(q, v, chunk, f"warp-specialized causal forward with {stages} stages",
                         smem)


def _kernel(q_ref, k_ref, v_ref, decay_ref, s0_ref, *refs, chunk, run, bv, stages, store,
            registers, outputs):
    """One (b, h, V-block j, run r) program over chunks ``r * run ... (r + 1) * run - 1``.

    q, k ``[B, L, H, Kp]``; v ``[B, L, H, Vp]``; ``decay_ref [3, B, H, L]`` float32 rows (A,
    e^A, e^tail); s0 ``[B, H, R, Kp, Vp]`` float32 (the state entering each run) or None;
    outputs y ``[B, L, H, Vp]``, h ``[B, H, N, Kp, Vp]`` (``store``), ends ``[B, H, R, Kp, Vp]``
    float32. ``registers``: W and ``Q e^A`` as register operands (else through shared memory).
    Warpgroups: 0 the chain, 1 ... ``outputs`` the outputs (warpgroup 1 + o takes chunks o,
    o + outputs, ...), then the memory warpgroup.
    """
    refs = list(refs)
    y_ref = refs.pop(0)
    h_ref = refs.pop(0) if store else None
    end_ref = refs.pop(0)
    b, hd, j, r = (lax.axis_index(a) for a in "bhjr")
    wg = lax.axis_index("wg")
    cols = pl.ds(j * bv, bv)
    kp = q_ref.shape[-1]
    dtype = q_ref.dtype
    f32 = jnp.float32
    first = r * run
    tokens = lambda n: pl.ds((first + n) * chunk, chunk)
    slot_of = lambda n, count: lax.rem(n, jnp.asarray(count, n.dtype))
    tiles = 2 * outputs  # state tiles: tile n % tiles, read by output warpgroup n % outputs
    regs = compute_registers(outputs)

    def body(bufs, loaded, consumed, state_ready, state_free, s_bar):
        q_buf, k_buf, v_buf, rows_buf, vt_buf, st_buf, y_bufs, s32, *extra = bufs
        w_bufs = extra.pop(0) if not registers else None

        def load(n, slot):
            seq = tokens(n)
            plgpu.copy_gmem_to_smem(q_ref.at[b, seq, hd, :], q_buf.at[slot], loaded[0].at[slot])
            plgpu.copy_gmem_to_smem(k_ref.at[b, seq, hd, :], k_buf.at[slot], loaded[1].at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[b, seq, hd, cols], v_buf.at[slot],
                                    loaded[2].at[slot])
            for x, row in enumerate(DECAY_ROWS):
                plgpu.copy_gmem_to_smem(decay_ref.at[row, b, hd, seq], rows_buf.at[slot, x],
                                        loaded[3 + x].at[slot])

        def wait_loaded(slot, which):
            for x in which:
                plgpu.barrier_wait(loaded[x].at[slot])

        @pl.when(wg == outputs + 1)
        def _memory():
            plgpu.set_max_registers(MEMORY_REGISTERS, action="decrease")
            for n in range(min(stages, run)):
                load(jnp.int32(n), n)

            @pl.loop(0, max(run - stages, 0))
            def _(n):
                slot = slot_of(n, stages)
                with jax.named_scope("memory: wait for a free slot"):
                    plgpu.barrier_wait(consumed.at[slot])
                load(n + stages, slot)

            @pl.loop(max(run - stages, 0), run)
            def _(n):  # every release observed before the barriers go
                plgpu.barrier_wait(consumed.at[slot_of(n, stages)])

        @pl.when(wg == 0)
        def _chain():
            plgpu.set_max_registers(regs, action="increase")
            if s0_ref is None:
                state = plgpu.layout_cast(jnp.zeros((kp, bv), f32), WGMMA)
            else:
                plgpu.copy_gmem_to_smem(s0_ref.at[b, hd, r, :, cols], s32, s_bar.at[0])
                plgpu.barrier_wait(s_bar.at[0])
                state = plgpu.load(s32, layout=WGMMA)

            def decayed_values(n):  # the update's right operand e^tail V into vt_buf[n % 2]
                slot = slot_of(n, stages)
                wait_loaded(slot, (2, 4, 5))  # v, e^A (its last entry decays the state), e^tail
                v = plgpu.load(v_buf.at[slot], layout=WGMMA).astype(f32)
                tail = rows_of(plgpu.load(rows_buf.at[slot, 2], layout=ROWS), v.shape)
                vt_buf[slot_of(n, 2)] = (v * tail).astype(dtype)
                plgpu.commit_smem()

            decayed_values(jnp.int32(0))

            def step(n, state):
                slot, half, t = slot_of(n, stages), slot_of(n, 2), slot_of(n, tiles)

                with jax.named_scope("chain: wait for a free state tile"):
                    @pl.when(n >= tiles)
                    def _():  # the outputs are done with chunk n - tiles' state tile
                        plgpu.barrier_wait(state_free.at[t])

                    if store:  # and its copy to h has read it
                        plgpu.wait_smem_to_gmem(1, wait_read_only=True)
                with jax.named_scope("chain: hand the state over"):
                    st_s = st_buf.at[t]
                    st_s[...] = state.astype(dtype)  # the state entering chunk n
                    plgpu.commit_smem()
                    plgpu.barrier_arrive(state_ready.at[t])
                    if store:
                        plgpu.copy_smem_to_gmem(st_s, h_ref.at[b, hd, first + n, :, cols])
                with jax.named_scope("chain: wait for k"):
                    wait_loaded(slot, (1,))

                def mma(acc):  # S <- e^(A_last) S + K^T (e^tail V)
                    plgpu.wgmma(acc, k_buf.at[slot].transpose((1, 0)), vt_buf.at[half])

                    @pl.when(n + 1 < run)
                    def _():  # the next chunk's operand while the wgmma runs
                        decayed_values(n + 1)

                    return acc[...]

                with jax.named_scope("chain: update wgmma, next e^tail V"):
                    update = pl.run_scoped(mma, plgpu.ACC((kp, bv), f32))
                with jax.named_scope("chain: decay and add"):
                    decay = rows_buf[slot, 1, chunk - 1]
                    plgpu.barrier_arrive(consumed.at[slot])
                    return state * decay + update

            state = lax.fori_loop(0, run, step, state)

            @pl.loop(max(run - tiles, 0), run)
            def _(n):  # the last state tiles' releases observed before the barriers go
                plgpu.barrier_wait(state_free.at[slot_of(n, tiles)])

            s32[...] = state
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(s32, end_ref.at[b, hd, r, :, cols])
            plgpu.wait_smem_to_gmem(0)

        def outputs_warpgroup(o):
            """Output warpgroup 1 + o: chunks o, o + outputs, ..."""
            plgpu.set_max_registers(regs, action="increase")
            y_buf = y_bufs.at[o]
            w_s = None if registers else w_bufs.at[o]
            causal = tile_iota((chunk, chunk), 0) >= tile_iota((chunk, chunk), 1)

            def scores(acc, left, right):  # Q K^T
                plgpu.wgmma(acc, left, right.transpose((1, 0)))
                return acc[...]

            def decayed(x_s, row):
                """The chunk's ``[C, Kp]`` tile x_s times e^A (``row``: rows_buf's e^A), in the
                input dtype."""
                x = plgpu.load(x_s, layout=WGMMA).astype(f32)
                return (x * rows_of(plgpu.load(row, layout=ROWS), x.shape)).astype(dtype)

            def operand(x, buf):
                """x as a wgmma's left operand: itself when compiled, else through ``buf``."""
                if registers:
                    return x
                buf[...] = x
                plgpu.commit_smem()
                return buf

            def scored(left, right):
                return pl.run_scoped(lambda acc: scores(acc, left, right),
                                     plgpu.ACC((chunk, chunk), f32))

            def w_and_queries(slot):
                """W and Q e^A, as the y wgmmas take them (``Q e^A`` over the slot's q in the
                interpreter, once nothing reads q any more)."""
                with jax.named_scope("outputs: Q K^T wgmma"):
                    s = scored(q_buf.at[slot], k_buf.at[slot])
                with jax.named_scope("outputs: mask, Q e^A"):
                    w = s * causal_mask(rows_buf.at[slot, 0], rows_buf.at[slot, 3], causal)
                    q_op = operand(decayed(q_buf.at[slot], rows_buf.at[slot, 1]),
                                   q_buf.at[slot])
                return operand(w.astype(dtype), w_s), q_op

            @pl.loop(o, run, step=outputs)
            def _(n):
                slot, t = slot_of(n, stages), slot_of(n, tiles)
                half = slot_of(lax.div(n, jnp.asarray(outputs, n.dtype)), 2)  # y tile
                with jax.named_scope("outputs: wait for the inputs"):
                    wait_loaded(slot, (0, 1, 2, 3, 4, 6))
                w_op, q_op = w_and_queries(slot)
                with jax.named_scope("outputs: wait for the state"):
                    plgpu.barrier_wait(state_ready.at[t])

                def mma(acc):  # y = W V + (Q e^A) S
                    plgpu.wgmma(acc, w_op, v_buf.at[slot])
                    plgpu.wgmma(acc, q_op, st_buf.at[t])
                    return acc[...]

                with jax.named_scope("outputs: y wgmmas"):
                    y = pl.run_scoped(mma, plgpu.ACC((chunk, bv), f32))
                with jax.named_scope("outputs: store y"):
                    plgpu.barrier_arrive(state_free.at[t])
                    plgpu.barrier_arrive(consumed.at[slot])
                    plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this y tile's last copy
                    y_s = y_buf.at[half]
                    y_s[...] = y.astype(dtype)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(y_s, y_ref.at[b, tokens(n), hd, cols])

            plgpu.wait_smem_to_gmem(0)

        for o in range(outputs):
            pl.when(wg == 1 + o)(functools.partial(outputs_warpgroup, o))

    bufs = [plgpu.SMEM((stages, chunk, kp), dtype, transforms=_TILE16),
            plgpu.SMEM((stages, chunk, kp), dtype, transforms=_TILE16),
            plgpu.SMEM((stages, chunk, bv), dtype, transforms=_TILE16),
            plgpu.SMEM((stages, len(DECAY_ROWS), chunk), f32),
            plgpu.SMEM((2, chunk, bv), dtype, transforms=_TILE16),
            plgpu.SMEM((tiles, kp, bv), dtype, transforms=_TILE16),
            plgpu.SMEM((outputs, 2, chunk, bv), dtype, transforms=_TILE16),
            plgpu.SMEM((kp, bv), f32, transforms=_TILE32)]
    if not registers:
        bufs.append(plgpu.SMEM((outputs, chunk, chunk), dtype, transforms=_TILE16))
    pl.run_scoped(
        body, bufs, [plgpu.Barrier(num_barriers=stages)] * (3 + len(DECAY_ROWS)),
        plgpu.Barrier(num_arrivals=2, num_barriers=stages), plgpu.Barrier(num_barriers=tiles),
        plgpu.Barrier(num_barriers=tiles), plgpu.Barrier(num_barriers=1), collective_axes="wg")


def run_states(k, v, g, s0, *, chunk, splits, interpret):
    """The state entering each of ``splits`` runs of chunks, ``[B, H, R, Kp, Vp]`` float32 (or
    None: one run from zero); g the per-token log-decays ``[B, L, H]``, s0 None or ``[B, H,
    Kp, Vp]``.

    The chunks before the last run are walked from zero in shorter runs, as many as make
    ``RUN_STATES_PROGRAMS`` programs over the whole sequence (``mosaic_states.walk_states``
    keeping only their end states; the last run's chunks are not read, since no run starts
    after it), then their ends are scanned from s0 (``chunk_scan.entering_states``) and the
    states at the runs' starts kept."""
    N = k.shape[1] // chunk
    if splits < 1 or N % splits:
        raise ValueError(f"splits must divide the number of chunks {N}; got {splits}")
    if splits == 1:
        return None if s0 is None else s0[:, :, None]
    programs = k.shape[0] * k.shape[2] * (v.shape[-1] // BLOCK_V)
    walks = max(splits, runs_until(programs, N, RUN_STATES_PROGRAMS))
    per_run = walks // splits
    w, d = stacked_decay_factors(g, chunk, (False,))
    ends = walk_states(k, v, w, d, None, chunk=chunk, bv=BLOCK_V, splits=walks,
                       runs=walks - per_run, store=False, interpret=interpret)[0][0]
    # the last run's walks as zero ends: entering_states reads them only after the last state
    ends = jnp.pad(ends, [(0, 0), (0, 0), (0, per_run), (0, 0), (0, 0)])
    return entering_states(ends, d[0], s0, reverse=False)[:, :, ::per_run]


def causal_forward_warps(q, k, v, g, s0=None, *, chunk=CHUNK, splits=1, store_states=False,
                         stages=None, outputs=None, interpret=None, registers=None,
                         profile_dir=None):
    """The causal forward pass (not strict) of padded inputs in the warp-specialized kernel.

    Args:
      q, k: ``[B, L, H, Kp]``; v: ``[B, L, H, Vp]``, bf16 or fp16, padded as
        ``chunk_scan.pad_layout`` pads them (see :func:`supported`), L a multiple of
        ``chunk``.
      g: float32 per-token log-decays ``[B, L, H]`` (entries <= 0).
      s0: None or ``[B, H, Kp, Vp]`` float32, the state before the first token.
      splits: runs to cut the chunks into (a power of two dividing N; module docstring).
      store_states: also return the state entering every chunk (the backward's residual).
      stages: pipeline slots (None: :func:`pick_stages`), a multiple of ``outputs``.
      outputs: warpgroups computing outputs (None: ``OUTPUT_WARPGROUPS`` at Kp).
      interpret: None, or ``plgpu.InterpretGPUParams()`` to run the Mosaic GPU interpreter.
      registers: W and ``Q e^A`` as the wgmmas' register operands (None: when compiled; the
        interpreter takes none).
      profile_dir: None, or a directory for a trace of the kernel's named regions per
        warpgroup (Mosaic GPU's profiler, compiled only; ``experiments.profile_warps`` reads
        it). The trace takes the shared memory the kernel leaves: as many regions as fit,
        the rest dropped (at Kp 128 pass ``stages=2`` to leave room).
    Returns:
      ``(y [B, L, H, Vp] q.dtype, final [B, H, Kp, Vp] float32)``, then with
      ``store_states`` ``h [B, H, N, Kp, Vp]`` q.dtype.
    """
    if g.ndim != 3:
        raise ValueError(f"the warp-specialized causal forward takes scalar log-decays "
                         f"[B, L, H] (got {g.shape}); per-feature decay: causal_forward_mosaic")
    outputs = outputs or OUTPUT_WARPGROUPS.get(q.shape[-1], 1)
    if (reason := supported(q, v, chunk, stages, outputs)) is not None:
        raise ValueError(reason)
    B, L, H, kp = q.shape
    stages = stages or pick_stages(kp, q.dtype.itemsize, chunk, outputs)
    if registers is None:  # the interpreter takes no register operands
        registers = interpret is None
    vp = v.shape[-1]
    N, nvb = L // chunk, vp // BLOCK_V
    s0 = run_states(k, v, g, s0, chunk=chunk, splits=splits, interpret=interpret)
    out_type = [jax.ShapeDtypeStruct((B, L, H, vp), q.dtype)]
    if store_states:
        out_type.append(jax.ShapeDtypeStruct((B, H, N, kp, vp), q.dtype))
    out_type.append(jax.ShapeDtypeStruct((B, H, splits, kp, vp), jnp.float32))
    params = compiler_params()
    if profile_dir is not None:  # 4 int32 entries per region and warpgroup
        per_region = 16 * (outputs + 2)
        free = (SMEM_BYTES - 8192
                - smem_bytes(chunk, kp, BLOCK_V, q.dtype.itemsize, stages, outputs))
        if free < per_region * 64:
            raise ValueError(f"no shared memory left for the profiler's trace at Kp {kp} "
                             f"with {stages} stages; pass stages={stages - outputs}")
        params = compiler_params(profile_space=free // per_region, profile_dir=profile_dir,
                                 profile_bounds_check=True)
    y, *rest = plgpu.kernel(
        functools.partial(_kernel, chunk=chunk, run=N // splits, bv=BLOCK_V, stages=stages,
                          store=store_states, registers=registers, outputs=outputs),
        out_type=tuple(out_type), grid=(B, H, nvb, splits), grid_names=tuple("bhjr"),
        num_threads=outputs + 2, thread_name="wg", interpret=interpret,
        compiler_params=params,
    )(q, k, v, mask_rows(g, chunk), s0)
    final = rest[-1][:, :, -1]
    return (y, final, rest[0]) if store_states else (y, final)
