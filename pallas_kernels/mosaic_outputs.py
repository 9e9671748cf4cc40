"""LION's output kernel (``bidirectional.py``) as a Pallas Mosaic GPU kernel (Hopper, sm_90).

Same math as ``bidirectional._output_kernel``: for chunk n with chunk-local inclusive
cumulative log-decays ``A`` (``A_i = sum_{s <= i} a_s``, float32),

    W     = (Q K^T) * exp(-|A_i - A_j|)                          [C, C]
    num   = W V + (Q * e^head) hf[n] + (Q * e^tail) hb[n]
    den   = rowsum(W) + (Q * e^head) . zf[n] + (Q * e^tail) . zb[n]     (normalize)
    y     = num / (den + eps)       (normalize; + den m / (den + eps) with an offset m)

with ``e^head_i = exp(A_i)`` and ``e^tail_i = exp(sum_{s > i} a_s)`` (the reverse and forward
walks' key factors, ``chunk_scan.decay_factors``, summed directly). The mask's exponent is a
difference of the chunk cumsum (off by about ulp(|A|) <= 1.2e-4 at log-decay -20 per token,
far below the 2^-9 of a 16-bit operand); the Triton kernel sums each segment directly, which
float32 inputs need: this kernel takes 16-bit inputs only.

Kernel layout: one program per (b, h, V-block j, run r) walks the chunks of its run with a TMA
pipeline (``plgpu.emit_pipeline``, 2 steps in flight) over q, k ``[C, Kp]``, v ``[C, BV]``, the
rows of A (twice: on the rows and, read in the columns' layout, on the columns of the mask)
and the two query factors, hf[n], hb[n] ``[Kp, BV]`` and (normalize) zf[n], zb[n] ``[Kp]``;
one warpgroup per program. Per chunk: one wgmma for ``Q K^T`` (K read transposed from shared
memory), the mask and the decayed queries in registers, then one accumulator takes ``W V`` (W
in two 16-bit parts when normalised, as the Triton kernel: y to ~16 bits), ``Qf hf`` and ``Qb
hb``, their 16-bit left operands from registers (in the interpreter, which takes them from
shared memory only, written over tiles the step is done with); the denominator's row sums
are computed while those wgmmas run. y (and its low part) and
den go out by TMA from two steps' worth of output buffers, each step's copies overlapping the
next step.

Measured on an H100 (B4 H16 bf16, docs/benchmarks.md, 2026-11-25): LION forward 1.88 -> 1.52 ms
at D = 64, L = 32K against the Triton output kernel, within 1 % of it at D = 128. The mask's
columns from the second copy of A and the register operands, against a transposed column tile
and operands through shared memory (one H200, 2026-12-07, L = 16K, the op's forward): 0.681
-> 0.637 ms normalised and 0.517 -> 0.515 plain at D = 64, 1.738 -> 1.572 and 1.308 -> 1.250
at D = 128 (docs/benchmarks.md).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.chunk_scan import mask_rows, runs_until
from pallas_kernels.mosaic_states import SMEM_BYTES, _TILE16
from pallas_kernels.mosaic_tiles import (COLS, DECAY_ROWS, ROWS, WGMMA, cols_of,
                                        compiler_params, lion_mask, rows_of)

# V columns per program: [Kp, BV] tiles of both states for 2 pipeline steps fit in shared
# memory at Kp = 128 only with BV = 64 (at 128 one step is 112 KiB of inputs).
BLOCK_V = 64
# Pipeline steps in flight (chunks loaded ahead of the one computed, plus that one).
STAGES = 2
# Cut the chunks into runs until there are this many programs (chunk_scan.runs_until).
TARGET_PROGRAMS = 256


def _smem_bytes(chunk, kp, bv, itemsize, normalize):
    """Shared memory of the pipeline's ``STAGES`` steps of inputs (16-bit tiles, four float32
    rows and z) and the two steps of output buffers (y and, normalised, y's low part and
    den)."""
    step = (2 * chunk * kp + chunk * bv + 2 * kp * bv) * itemsize + 4 * (4 * chunk + 2 * kp)
    out = (1 + normalize) * chunk * bv * itemsize + 4 * chunk
    return STAGES * step + 2 * out


def supported(q, v, chunk, normalize=True, out_dtype=None):
    """None when :func:`bidirectional_outputs_mosaic` takes these (padded) inputs, else why."""
    if q.dtype not in (jnp.bfloat16, jnp.float16) or v.dtype != q.dtype:
        return (f"the Mosaic output kernel takes bf16 or fp16 inputs (got {q.dtype}, "
                f"{v.dtype}); use the Triton output kernel")
    if out_dtype is not None and jnp.dtype(out_dtype) != q.dtype:
        return (f"the Mosaic output kernel writes y in the input dtype {q.dtype} (got "
                f"out_dtype {jnp.dtype(out_dtype)}): the weights pass through y's buffers")
    kp, vp, L = q.shape[-1], v.shape[-1], q.shape[1]
    if kp % 64 or vp % BLOCK_V:
        return (f"the Mosaic output kernel needs Kp a multiple of 64 and Vp of {BLOCK_V} "
                f"(got Kp={kp}, Vp={vp})")
    if chunk != 64 or L % chunk:
        return f"the Mosaic output kernel takes chunks of 64 dividing L (got {chunk}, L={L})"
    need = _smem_bytes(chunk, kp, BLOCK_V, q.dtype.itemsize, normalize) + 4096  # + barriers
    if need > SMEM_BYTES:
        return (f"the Mosaic output kernel at Kp = {kp} needs {need} bytes of shared memory "
                f"(at most {SMEM_BYTES})")
    return None


def _kernel(q_ref, k_ref, v_ref, rows_ref, h_ref, z_ref, m_ref, *out_refs, chunk, run, bv,
            normalize, eps, low_part, registers):
    """One (b, h, V-block j, run r) program over chunks ``r * run ... (r + 1) * run - 1``.

    q, k ``[B, L, H, Kp]``; v ``[B, L, H, Vp]``; rows ``[3, B, H, L]`` float32 (A, e^head,
    e^tail); h ``[2, B, H, N * Kp, Vp]`` (forward, reverse; input dtype); z
    ``[2, B, H, N * Kp]`` float32 or None; m ``[B, H, Vp]`` float32 or None; outputs y (and
    its low part) ``[B, L, H, Vp]``, den ``[J, B, H, L]`` float32 (normalize). ``registers``:
    the wgmmas' 16-bit left operands (the weights and decayed queries) from registers, else
    through shared memory.
    """
    out_refs = list(out_refs)
    y_ref = out_refs.pop(0)
    lo_ref = out_refs.pop(0) if low_part else None
    den_ref = out_refs.pop(0) if normalize else None
    b, hd, j, r = (lax.axis_index(a) for a in "bhjr")
    cols = pl.ds(j * bv, bv)
    kp = q_ref.shape[-1]
    dtype = q_ref.dtype
    f32 = jnp.float32

    def step(idx, q_s, k_s, v_s, a_s, eh_s, et_s, a_cols_s, hf_s, hb_s, *rest, y_buf, lo_buf,
             den_buf):
        rest = list(rest)
        zf_s, zb_s = (rest.pop(0), rest.pop(0)) if normalize else (None, None)
        m_s = rest.pop(0) if m_ref is not None else None
        n = first + idx[0]
        slot = lax.rem(idx[0], jnp.asarray(2, idx[0].dtype))
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's copies of step i - 2 read
        y_s = y_buf.at[slot]
        lo_s = lo_buf.at[slot] if normalize else None

        def scores(acc):
            plgpu.wgmma(acc, q_s, k_s.transpose((1, 0)))
            return acc[...]

        s = pl.run_scoped(scores, plgpu.ACC((chunk, chunk), f32))
        w = s * lion_mask(a_s, a_cols_s, s.shape)
        q = plgpu.load(q_s, layout=WGMMA).astype(f32)
        qf = (q * rows_of(plgpu.load(eh_s, layout=ROWS), q.shape)).astype(dtype)
        qb = (q * rows_of(plgpu.load(et_s, layout=ROWS), q.shape)).astype(dtype)
        if normalize:  # the weights in two 16-bit parts (bidirectional.two_parts)
            w_hi = w.astype(dtype)
            parts = [w_hi, (w - w_hi.astype(f32)).astype(dtype)]
        else:
            parts = [w.astype(dtype)]
        operands = parts + [qf, qb]
        if not registers:  # shared memory over tiles this step is done with: the output
            # buffers ([C, BV] = [C, C]) before y, q and k after Q K^T
            tiles = [y_s, lo_s][:len(parts)] + [q_s, k_s]
            for tile_s, x in zip(tiles, operands):
                tile_s[...] = x
            plgpu.commit_smem()  # visible to the wgmmas
            operands = tiles

        def numerator(acc):
            *weights, qf_op, qb_op = operands
            for w_op in weights:
                plgpu.wgmma(acc, w_op, v_s)
            plgpu.wgmma(acc, qf_op, hf_s)
            plgpu.wgmma(acc, qb_op, hb_s)
            den = None
            if normalize:  # while the wgmmas run: the weights as the numerator sees them
                zf = cols_of(plgpu.load(zf_s, layout=COLS), q.shape)
                zb = cols_of(plgpu.load(zb_s, layout=COLS), q.shape)
                den = (jnp.sum(w, axis=1) + jnp.sum(qf.astype(f32) * zf, axis=1)
                       + jnp.sum(qb.astype(f32) * zb, axis=1))
            return acc[...], den

        num, den = pl.run_scoped(numerator, plgpu.ACC((chunk, bv), f32))
        if not normalize:
            y_s[...] = num.astype(y_s.dtype)
        else:
            store_normalised(num, den, m_s, y_s, lo_s, den_buf.at[slot])
        plgpu.commit_smem()
        tokens = pl.ds(n * chunk, chunk)
        plgpu.copy_smem_to_gmem(y_s, y_ref.at[b, tokens, hd, cols], commit_group=False)
        if low_part:
            plgpu.copy_smem_to_gmem(lo_s, lo_ref.at[b, tokens, hd, cols], commit_group=False)
        if normalize:
            plgpu.copy_smem_to_gmem(den_buf.at[slot], den_ref.at[j, b, hd, tokens],
                                    commit_group=False)
        plgpu.commit_smem_to_gmem_group()

    def store_normalised(num, den, m_s, y_s, lo_s, den_s):
        """y = num / (den + eps) (+ the offset's share) into y_s (and its low part, lo_s)."""
        if m_s is not None:  # v came centred: num = num_c + den m
            num = num + rows_of(den, num.shape) * cols_of(plgpu.load(m_s, layout=COLS),
                                                          num.shape)
        y = num / rows_of(den + eps, num.shape)
        y_hi = y.astype(y_s.dtype)
        y_s[...] = y_hi
        if low_part:
            lo_s[...] = (y - y_hi.astype(f32)).astype(lo_s.dtype)
        den_s[...] = den

    first = r * run
    tile = lambda width: plgpu.BlockSpec((chunk, width), lambda i: (first + i, 0),
                                         transforms=_TILE16)
    row = plgpu.BlockSpec((chunk,), lambda i: (first + i,))
    state = plgpu.BlockSpec((kp, bv), lambda i: (first + i, 0), transforms=_TILE16)
    in_specs = [tile(kp), tile(kp), tile(bv), row, row, row, row, state, state]
    in_refs = [q_ref.at[b, :, hd, :], k_ref.at[b, :, hd, :], v_ref.at[b, :, hd, cols]]
    in_refs += [rows_ref.at[x, b, hd] for x in DECAY_ROWS]
    in_refs += [h_ref.at[e, b, hd, :, cols] for e in (0, 1)]
    if normalize:
        in_specs += [plgpu.BlockSpec((kp,), lambda i: (first + i,))] * 2
        in_refs += [z_ref.at[e, b, hd] for e in (0, 1)]
    if m_ref is not None:  # the same block every step: fetched once
        in_specs.append(plgpu.BlockSpec((bv,), lambda i: (0,)))
        in_refs.append(m_ref.at[b, hd, cols])

    def walk(y_buf, lo_buf=None, den_buf=None):
        plgpu.emit_pipeline(
            functools.partial(step, y_buf=y_buf, lo_buf=lo_buf, den_buf=den_buf),
            grid=(run,), in_specs=in_specs, max_concurrent_steps=STAGES)(*in_refs)
        plgpu.wait_smem_to_gmem(0)

    # the outputs' buffers, two steps' worth (each step's copies out overlap the next step)
    buf = plgpu.SMEM((2, chunk, bv), dtype, transforms=_TILE16)
    scratch = dict(y_buf=buf)
    if normalize:  # lo_buf: the weights' low part, then (low_part) y's
        scratch["lo_buf"] = buf
        scratch["den_buf"] = plgpu.SMEM((2, chunk), jnp.float32)
    pl.run_scoped(walk, **scratch)


def bidirectional_outputs_mosaic(q, k, v, g, h, z=None, offset=None, *, chunk, normalize,
                                 eps, low_part, out_dtype, interpret=None, registers=None):
    """The output pass of ``bidirectional.bidirectional_scan`` on Mosaic GPU.

    Args:
      q, k: ``[B, L, H, Kp]``; v: ``[B, L, H, Vp]``, bf16 or fp16, padded as for
        ``bidirectional_scan`` (see :func:`supported`); g: ``[B, L, H]`` float32 log-decays.
      h: ``[2, B, H, N, Kp, Vp]`` (forward, reverse) states of ``(k, v)`` entering each chunk;
        z: normalize only, ``[2, B, H, N, Kp]`` float32, their normalisers.
      offset: None or ``[B, H, Vp]`` float32 m of centred values (``bidirectional_scan``).
      normalize, eps, low_part, out_dtype: as ``bidirectional_scan`` (16-bit ``out_dtype``).
      interpret: None, or ``plgpu.InterpretGPUParams()`` to run the Mosaic GPU interpreter.
      registers: the wgmmas' 16-bit left operands from registers (None: when compiled; the
        interpreter takes them from shared memory only, jax 0.11.2).
    Returns:
      ``y [B, L, H, Vp]``, then its low part if low_part, then ``den [B, L, H]`` float32 if
      normalize.
    """
    if (reason := supported(q, v, chunk, normalize, out_dtype)) is not None:
        raise ValueError(reason)
    if low_part and not normalize:
        raise ValueError("low_part needs normalize")
    if registers is None:
        registers = interpret is None
    B, L, H, kp = q.shape
    vp = v.shape[-1]
    N, nvb = L // chunk, vp // BLOCK_V
    # A, e^head = exp(A) (the reverse walk's key factors) and e^tail (the forward walk's)
    rows = mask_rows(g, chunk)
    runs = runs_until(B * H * nvb, N, TARGET_PROGRAMS)
    out_type = [jax.ShapeDtypeStruct((B, L, H, vp), out_dtype)] * (1 + low_part)
    if normalize:
        out_type.append(jax.ShapeDtypeStruct((nvb, B, H, L), jnp.float32))
        z = z.reshape(2, B, H, N * kp)
    kernel = plgpu.kernel(
        functools.partial(_kernel, chunk=chunk, run=N // runs, bv=BLOCK_V, normalize=normalize,
                          eps=eps, low_part=low_part, registers=registers),
        out_type=tuple(out_type), grid=(B, H, nvb, runs), grid_names=tuple("bhjr"),
        interpret=interpret, compiler_params=compiler_params(),
    )
    outs = list(kernel(q, k, v, rows, h.reshape(2, B, H, N * kp, vp), z if normalize else None,
                       offset))
    if normalize:
        outs[-1] = jnp.swapaxes(outs[-1][0], 1, 2)
    return tuple(outs)
