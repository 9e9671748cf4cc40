"""Time the Mosaic GPU states walk (pallas_kernels.mosaic_states) against the Triton one.

    python -m experiments.bench_mosaic_states [--lengths 16384,4096] [--reps 20]
        [--configs 1x4,1x6,2x3] [--splits 4,8] [--deadline 240] [--states 64x64,128x64,128x128]
        [--with-z]

Forward walk, bf16, chunk 64. Main table: B=4, H=16, (Kp, BV) in {(64, 64), (128, 64),
(128, 128)}, V = BV (one V-block per head); rows, each timed end to end from (k, v, g) (the
decay factors included):
  triton_s1        two_pass.chunk_states(splits=1): one Triton program per (b, h, V-block)
  triton_auto      two_pass.chunk_states(splits=None): runs cut by pick_splits (two launches)
  mosaic           chunk_states_mosaic with its defaults
  *_bv64           (BV = 128 only) the same V walked in V-blocks of 64
  mosaic_gG_sS     chunk_states_mosaic(group=G, stages=S) for each --configs GxS that fits
  mosaic_xw        chunk_states_mosaic(scale_in_kernel=False): k * w in XLA first
  mosaic_kernel    walk_states alone on keys scaled beforehand (the kernel of mosaic_xw)
Then a small grid (B=1, H=8, Kp=BV=64, L=16K: 8 programs), where runs pay off:
  mosaic_rR        chunk_states_mosaic(splits=R) for each --splits R
With --with-z, only the B=4, H=16 cases and these rows (the normaliser z of with_z=True):
  triton_s1, mosaic  as above (no z)
  triton_z, mosaic_z         with_z=True (u = 1, LION's forward; Mosaic: z_method="mma")
  triton_zu, mosaic_zu       with_z=True, z_weights=u (random float32 weights)
  mosaic_z[u]_reduce         the same with z_method="reduce"
Each variant is timed twice, after all of its case's variants compiled, and keeps the faster
of the two medians over ``--reps`` samples (each the mean of 5 back-to-back calls waited for
once). Mosaic rows are checked against triton_s1 (relative errors of h and the final state).
The memory floor is the bytes one walk must move (k, v, h; w and d are small) at the H100's
3.35 TB/s. Needs a GPU with compute capability >= 9.0.
"""

import argparse
import functools
import statistics
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import mosaic_states, two_pass
from pallas_kernels.chunk_scan import decay_factors

HBM_BYTES_PER_S = 3.35e12  # H100 SXM
# the Triton walk (two_pass.chunk_states would pick Mosaic on Hopper)
TRITON = {"backend": "triton"}


def time_ms(fn, args, reps, inner=5):
    """Median over ``reps`` samples of the mean time of ``inner`` back-to-back calls of a
    jitted ``fn`` (warmed up)."""
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready([fn(*args) for _ in range(inner)])
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples) * 1e3


def floor_ms(B, L, H, kp, vp, chunk, itemsize):
    moved = B * H * (L * (kp + vp) + L // chunk * kp * vp) * itemsize
    return moved / HBM_BYTES_PER_S * 1e3


def rel_err(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


class Bench:
    """Times the variants of one case, twice in turn, until ``deadline`` seconds have passed."""

    def __init__(self, reps, deadline):
        self.reps, self.deadline, self.start = reps, deadline, time.perf_counter()

    def case(self):
        self.fns, self.args, self.results, self.errors, self.ref = {}, {}, {}, {}, None

    def __call__(self, name, fn, *args):
        """Compiles and times ``fn(*args)`` as ``name``; checks a Mosaic result against the
        first variant's (triton_s1). A failure is printed and skipped."""
        if time.perf_counter() - self.start > self.deadline:
            print(f"deadline reached; {name} not measured", flush=True)
            return
        fn = jax.jit(fn)
        try:
            out = jax.block_until_ready(fn(*args))
            h, end = out[0], out[-1]  # with_z: (h, hz, end)
            self.results[name] = time_ms(fn, args, self.reps)
        except ValueError as e:  # e.g. a config that does not fit in shared memory
            print(f"  {name}: skipped ({str(e).splitlines()[0][:200]})", flush=True)
            return
        except Exception:  # noqa: BLE001 - report it and go on with the other variants
            print(f"{name} failed:\n{traceback.format_exc()[-2000:]}", flush=True)
            return
        self.fns[name], self.args[name] = fn, args
        if self.ref is None:
            self.ref = (h, end)
        elif name.startswith("mosaic"):
            end = end[:, :, -1] if end.ndim == 5 else end  # walk_states: the runs' ends
            self.errors[name] = (rel_err(h, self.ref[0]), rel_err(end, self.ref[1]))
        print(f"  {name}: {self.results[name]:.3f} ms", flush=True)

    def report(self, table, label, floor):
        """Times every variant a second time (keeping the faster median), then appends (and
        prints) one line per variant: ms, ratio to triton_s1 and to the floor, errors."""
        for name, fn in self.fns.items():
            self.results[name] = min(self.results[name],
                                     time_ms(fn, self.args[name], self.reps))
        base = self.results.get("triton_s1")
        for name, ms in self.results.items():
            ratio = f"{ms / base:12.2f}" if base else f"{'-':>12}"
            line = f"{label} {name:<18} {ms:8.3f} {ratio} {ms / floor:9.2f}"
            if name in self.errors:
                line += "   err h {:.1e} final {:.1e}".format(*self.errors[name])
            table.append(line)
            print(line, flush=True)
        table.append(f"{label} {'memory floor':<18} {floor:8.3f}")
        print(table[-1], flush=True)


def inputs(rng, B, L, H, kp, bv, chunk):
    k = jnp.asarray(rng.standard_normal((B, L, H, kp)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((B, L, H, bv)), jnp.bfloat16)
    g = jnp.asarray(-rng.uniform(0.0, 1.0, (B, L, H)), jnp.float32)
    return k, v, g


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16384,4096")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--configs", default="1x4,1x6,2x3",
                        help="chunks per step x pipeline stages of the mosaic_gG_sS rows")
    parser.add_argument("--splits", default="4,8")
    parser.add_argument("--states", default="64x64,128x64,128x128", help="Kp x BV of the cases")
    parser.add_argument("--with-z", action="store_true",
                        help="time with_z walks against plain ones (B=4, H=16 cases only)")
    parser.add_argument("--deadline", type=float, default=240.0,
                        help="seconds after which no new measurement starts")
    args = parser.parse_args()
    bench = Bench(args.reps, args.deadline)
    chunk = 64
    configs = [tuple(map(int, c.split("x"))) for c in args.configs.split(",") if c]
    rng = np.random.default_rng()
    print(f"device: {jax.devices()[0].device_kind}; chunk={chunk} bf16, forward")
    table = [f"{'B':>2} {'H':>3} {'L':>6} {'Kp':>4} {'BV':>4} {'variant':<18} {'ms':>8} "
             f"{'vs triton_s1':>12} {'vs floor':>9}"]
    states = [tuple(map(int, st.split("x"))) for st in args.states.split(",") if st]
    cases = [(4, 16, L, kp, bv) for L in map(int, args.lengths.split(",")) for kp, bv in states]
    if not args.with_z:
        cases.append((1, 8, 16384, 64, 64))
    for B, H, L, kp, bv in cases:
        k, v, g = inputs(rng, B, L, H, kp, bv, chunk)

        def triton(k, v, g, splits, bv=bv, **z):
            return two_pass.chunk_states(k, v, g, None, chunk=chunk, bv=bv, reverse=False,
                                         precision=None, interpret=False, splits=splits,
                                         **TRITON, **z)

        def mosaic(k, v, g, bv=bv, **options):
            return mosaic_states.chunk_states_mosaic(k, v, g, None, chunk=chunk, bv=bv,
                                                     reverse=False, **options)

        bench.case()
        bench("triton_s1", functools.partial(triton, splits=1), k, v, g)
        if args.with_z:
            u = jnp.asarray(rng.standard_normal((B, L, H)), jnp.float32)
            bench("triton_z", functools.partial(triton, splits=1, with_z=True), k, v, g)
            bench("triton_zu", lambda k, v, g, u: triton(k, v, g, 1, with_z=True, z_weights=u),
                  k, v, g, u)
            bench("mosaic", mosaic, k, v, g)
            bench("mosaic_z", functools.partial(mosaic, with_z=True), k, v, g)
            bench("mosaic_zu", lambda k, v, g, u: mosaic(k, v, g, with_z=True, z_weights=u),
                  k, v, g, u)
            bench("mosaic_z_reduce", functools.partial(mosaic, with_z=True, z_method="reduce"),
                  k, v, g)
            bench("mosaic_zu_reduce", lambda k, v, g, u: mosaic(k, v, g, with_z=True, z_weights=u,
                                                                z_method="reduce"), k, v, g, u)
            bench.report(table, f"{B:>2} {H:>3} {L:>6} {kp:>4} {bv:>4}",
                         floor_ms(B, L, H, kp, bv, chunk, 2))
            continue
        bench("triton_auto", functools.partial(triton, splits=None), k, v, g)
        bench("mosaic", mosaic, k, v, g)
        if (B, H) != (4, 16):
            for r in map(int, filter(None, args.splits.split(","))):
                bench(f"mosaic_r{r}", functools.partial(mosaic, splits=r), k, v, g)
        else:
            if bv > 64:  # the same V in V-blocks of 64: twice the programs, half the registers
                bench("triton_s1_bv64", functools.partial(triton, splits=1, bv=64), k, v, g)
                bench("mosaic_bv64", functools.partial(mosaic, bv=64), k, v, g)
            for group, stages in configs:
                bench(f"mosaic_g{group}_s{stages}",
                      functools.partial(mosaic, group=group, stages=stages), k, v, g)
            bench("mosaic_xw", functools.partial(mosaic, scale_in_kernel=False), k, v, g)
            w, d = decay_factors(g, chunk, reverse=False)
            kd = (k.astype(jnp.float32) * jnp.swapaxes(w, 1, 2)[..., None]).astype(k.dtype)
            bench("mosaic_kernel", lambda kd, v, d, bv=bv: tuple(
                x[0] for x in mosaic_states.walk_states(kd, v, None, d[None], None,
                                                        chunk=chunk, bv=bv)), kd, v, d)
        bench.report(table, f"{B:>2} {H:>3} {L:>6} {kp:>4} {bv:>4}",
                     floor_ms(B, L, H, kp, bv, chunk, 2))
    print("\n" + "\n".join(table))


if __name__ == "__main__":
    main()
