"""Benchmark the Pallas linear-attention kernels against FLA, cuDNN flash attention and XLA.

    python -m experiments.bench_kernels --out workdir/bench_kernels [--lengths 4096,16384]
        [--dims 64,128] [--quick] [--deadline 500] [--fla-autotune-configs 1]
        [--ops pallas_causal,fla] [--sweep 16384] [--reps 10] [--acceptance] [--resume]

Times forward and forward+backward (B=4, H=16, bf16 by default), in one process:
  ours      pallas_kernels.causal_linear_attention (per-token log_decay) and
            pallas_kernels.bidirectional_linear_attention (LION, per-token decay, normalised),
            each with algorithm="sequential" (_seq) and "two_pass" (_2pass: backend=None,
            i.e. Mosaic GPU states walks on Hopper; _2pass_triton: every kernel Triton;
            the causal forward is one warp-specialized Mosaic GPU kernel there, and
            pallas_causal_two_kernels times it as the states walk and the outputs kernel,
            ``CAUSAL_FORWARD = "two_pass"``); LION
            non-normalised (pallas_lion_plain); the causal op with per-feature decay
            [B, L, H, K] (pallas_causal_per_feature; with these log-decays, in [-0.1, 0],
            every chunk of 64 sums to >= -6.4 and takes the one-product path of
            pallas_kernels/per_feature.py, where chunks of stronger decay walk), and the same
            with the float32 scans as its backward (pallas_causal_per_feature_scans,
            ``PER_FEATURE_BACKWARD = "scans"``; the default is the chunk-parallel bf16
            backward), and those scans' products as one TF32 pass instead of three bf16 ones
            (pallas_causal_per_feature_tf32), and its forward as three passes instead of
            one Mosaic GPU kernel (pallas_causal_per_feature_three_passes,
            ``PER_FEATURE_FORWARD = "three_passes"``); the
            causal op and LION with the Triton gradients kernels in place of the Mosaic GPU
            ones (pallas_causal_triton_grads, pallas_lion_triton_grads, ``GRADS_KERNEL =
            "triton"``), and with the Mosaic GPU chunk kernels' exp as the approximate
            instruction (pallas_causal_approx_exp, pallas_lion_approx_exp,
            ``mosaic_tiles.APPROX_MATH = True``): the A/Bs of :func:`traced_under`
  FLA       fla.ops.simple_gla.chunk_simple_gla with per-head g_gamma (and per-token g,
            forward only: FLA refuses that backward on Hopper with triton < 3.7.1),
            fla.ops.linear_attn.chunk_linear_attn (no decay, not normalised)
  jla       jax-linear-attention 0.1.0 (``jla.ops.linear_attention``, impl="auto": its Mosaic
            GPU kernels where it has them): simple_gla (per-token decay), gla (per-feature
            decay), and LION non-normalised from two simple_gla passes, as a user of a
            causal-only library builds it (``lion_jax.ops._utils.bidirectional_from_causal``)
  cuDNN     jax.nn.dot_product_attention(..., implementation="cudnn"), causal and not
  XLA       lion_jax.ops.*(impl="chunk") (skipped with a note when missing)
Every side is timed the same way, one shape at a time: every (op, pass) of the shape is
compiled and warmed up first, then ``--reps`` rounds each take one sample of every one in turn
(a sample: 5 back-to-back calls with one wait for the device at the end; ``prepared_jax``,
``prepared_torch``), and a row is the median of its samples (results.json also keeps the
quartiles). Interleaving puts a change of the machine's state during the run on every op alike:
timed one row after another, two rows running the same kernels differed by 10% (one H100,
2026-12-07). Memory: XLA's compiled temp + output bytes for JAX, the peak allocated above the
inputs for torch. Prints a table of times, the speed ratios against the peers and LION's cost
against our causal op (its acceptance bound is 2x), each of the kernels' speed targets
(``TARGETS``) with its misses marked, and writes results.json, results.md and results.png under
--out (rewritten after every shape, so a timeout keeps what was measured). ``--acceptance``
times the ops of the targets at L = 4K, 16K, 32K and D = 64, 128 (cuDNN's attention at 16K
only, where its target is; with ``--resume`` over several calls).
``--deadline`` stops compiling new measurements once that many seconds have passed (those
compiled are still timed);
``--resume`` keeps the rows of --out's results.json that came from this machine since its
last boot, and those of shapes (L, D) another machine of the same device kind finished (every
op measured there), with the same settings, and measures only the missing ones, so that calls
of a few minutes each build one table (the acceptance run: every peer at L = 4K, 16K, 32K and
D = 64, 128 takes longer than one call, and the device machine is lent for at most 30
minutes). Every shape's rows come from one machine, so each ratio compares two timings of one
machine; results.md names the machine of each shape;
``--fla-autotune-configs N`` keeps only the first N configs of every Triton autotuner (FLA's
autotuning otherwise takes most of a short GPU call; FLA rows are then possibly slower than
fully tuned). Needs a GPU (and torch + fla-core for the FLA rows).
"""

import argparse
import contextlib
import functools
import json
import os
import statistics
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave memory for torch

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallas_kernels  # noqa: E402


def prepared_jax(fn, args, inner=5):
    """``(sample, MiB)`` of a function compiled for ``args`` (traced, compiled and run once
    here, so under the settings in place now): ``sample()`` runs the compiled program
    ``inner`` times back to back, waits for the device once and returns ms per call; MiB is
    XLA's compiled temp + output bytes. Prints the compile time."""
    start = time.perf_counter()
    exe = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(exe(*args))
    print(f"  (first call incl. compile: {time.perf_counter() - start:.1f} s)", flush=True)
    jax.block_until_ready(exe(*args))

    def sample():
        start = time.perf_counter()
        jax.block_until_ready([exe(*args) for _ in range(inner)])
        return (time.perf_counter() - start) / inner * 1e3

    mem = exe.memory_analysis()
    mib = None if mem is None else (mem.temp_size_in_bytes + mem.output_size_in_bytes) / 2**20
    return sample, mib


def prepared_torch(fn, inner=5):
    """``(sample, MiB)`` of a torch callable, as :func:`prepared_jax`: ``sample()`` runs it
    ``inner`` times back to back and synchronizes once; MiB is the peak allocated above what
    was allocated before, over one call. Prints the first call's time (autotuning)."""
    import torch
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    print(f"  (first call incl. autotune: {time.perf_counter() - start:.1f} s)", flush=True)
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    mib = (torch.cuda.max_memory_allocated() - base) / 2**20

    def sample():
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / inner * 1e3

    return sample, mib


def interleaved(samples, rounds):
    """``{name: [ms per call, one per round]}`` of ``samples`` ``{name: sample()}`` (as
    :func:`prepared_jax` and :func:`prepared_torch` give them): every round takes one sample
    of each in turn, so a change of the machine's state during the run falls on all alike."""
    times = {name: [] for name in samples}
    for _ in range(rounds):
        for name, sample in samples.items():
            times[name].append(sample())
    return times


def quartiles(times):
    """``(q25, median, q75)`` of a list of times, as floats."""
    return tuple(float(x) for x in np.percentile(times, [25, 50, 75]))


def with_grads(fn, dy):
    """``fn(q, k, v, g)``'s output and its input gradients for the output cotangent ``dy``:
    the output stays live, as in training (only gradients would let XLA drop a forward kernel
    whose output the backward does not need)."""
    def run(q, k, v, g):
        out, vjp = jax.vjp(fn, q, k, v, g)
        return out, vjp(dy)
    return run


def time_jax(fn, args, reps, inner=5):
    """(median ms, MiB) of ``reps`` samples of :func:`prepared_jax`: each sample runs
    ``inner`` calls back to back and waits once, so the host's wait for the device is not
    counted into every call (dispatch is asynchronous)."""
    sample, mib = prepared_jax(fn, args, inner)
    return statistics.median(sample() for _ in range(reps)), mib


def causal_per_feature(q, k, v, g):
    """The causal op with the per-token log-decays ``g [B, L, H]`` copied to every key feature,
    so that the per-feature (GLA-form) kernels of ``pallas_kernels/per_feature.py`` run."""
    return pallas_kernels.causal_linear_attention(q, k, v,
                                                  jnp.broadcast_to(g[..., None], q.shape))


def setting_place(name):
    """``(module, attribute)`` of a setting of ``pallas_kernels``: ``NAME`` of
    ``linear_attention`` or ``module.NAME`` of another of its modules."""
    import importlib
    module, _, attr = name.rpartition(".")
    return importlib.import_module(f"pallas_kernels.{module or 'linear_attention'}"), attr


@contextlib.contextmanager
def traced_under(settings):
    """Module settings of ``pallas_kernels`` ``{name: value}`` (read when the op is traced:
    ``FLOAT32_X3``, ``PER_FEATURE_BACKWARD`` of ``linear_attention``, or ``module.NAME`` of
    another module, ``mosaic_tiles.APPROX_MATH``) in place while an op is traced, compiled and
    timed inside; JAX's caches are cleared on entry and exit, so no trace under other settings
    is reused (:func:`setting_place`)."""
    saved = {name: getattr(*setting_place(name)) for name in settings}
    jax.clear_caches()
    for name, value in settings.items():
        setattr(*setting_place(name), value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(*setting_place(name), value)
        jax.clear_caches()


# cases timed under their settings of pallas_kernels' modules (traced_under)
SETTINGS = {
    "pallas_causal_per_feature_tf32": {"FLOAT32_X3": jax.lax.DotAlgorithmPreset.TF32_TF32_F32,
                                       "PER_FEATURE_BACKWARD": "scans"},
    "pallas_causal_per_feature_scans": {"PER_FEATURE_BACKWARD": "scans"},
    "pallas_causal_per_feature_three_passes": {"PER_FEATURE_FORWARD": "three_passes"},
    "pallas_causal_two_kernels": {"CAUSAL_FORWARD": "two_pass"},
    "pallas_causal_triton_grads": {"GRADS_KERNEL": "triton"},
    "pallas_lion_triton_grads": {"GRADS_KERNEL": "triton"},
    "pallas_causal_approx_exp": {"mosaic_tiles.APPROX_MATH": True},
    "pallas_lion_approx_exp": {"mosaic_tiles.APPROX_MATH": True}}


def jax_cases(quick):
    """{name: fn(q, k, v, g)} for the JAX ops of this shape (g: [B, L, H] log-decays)."""
    cases = {}
    for short, algorithm in (("seq", "sequential"), ("2pass", "two_pass")):
        cases[f"pallas_causal_{short}"] = lambda q, k, v, g, a=algorithm: (
            pallas_kernels.causal_linear_attention(q, k, v, g, algorithm=a))
        cases[f"pallas_lion_{short}"] = lambda q, k, v, g, a=algorithm: (
            pallas_kernels.bidirectional_linear_attention(q, k, v, g, algorithm=a))
    cases["pallas_causal_2pass_triton"] = lambda q, k, v, g: (
        pallas_kernels.causal_linear_attention(q, k, v, g, backend="triton"))
    cases["pallas_lion_2pass_triton"] = lambda q, k, v, g: (
        pallas_kernels.bidirectional_linear_attention(q, k, v, g, backend="triton"))
    if quick:
        return cases
    cases["pallas_lion_plain"] = lambda q, k, v, g: (  # non-normalised (LION-RETNET's form)
        pallas_kernels.bidirectional_linear_attention(q, k, v, g, normalize=False))
    cases["pallas_causal_per_feature"] = causal_per_feature
    cases.update({name: causal_per_feature for name in SETTINGS  # traced under their settings
                  if name.startswith("pallas_causal_per_feature")})
    cases["pallas_causal_two_kernels"] = cases["pallas_causal_2pass"]  # under its setting
    cases["pallas_causal_triton_grads"] = cases["pallas_causal_2pass"]
    cases["pallas_lion_triton_grads"] = cases["pallas_lion_2pass"]
    cases["pallas_causal_approx_exp"] = cases["pallas_causal_2pass"]
    cases["pallas_lion_approx_exp"] = cases["pallas_lion_2pass"]
    cases.update({
        "cudnn_causal": lambda q, k, v, g: jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation="cudnn"),
        "cudnn_full": lambda q, k, v, g: jax.nn.dot_product_attention(
            q, k, v, implementation="cudnn"),
    })
    cases.update(jla_cases())
    try:
        from lion_jax import ops
        cases["xla_chunk_causal"] = lambda q, k, v, g: ops.causal_linear_attention(
            q, k, v, g, impl="chunk")
        cases["xla_chunk_lion"] = lambda q, k, v, g: ops.lion_attention(q, k, v, g, impl="chunk")
    except (ImportError, AttributeError) as e:
        print(f"note: lion_jax.ops chunk forms unavailable ({e}); XLA rows skipped")
    return cases


def jla_cases():
    """{name: fn(q, k, v, g)} for jla's ops (g: ``[B, L, H]`` log-decays; per feature
    broadcast to ``[B, L, H, K]``), ``scale=1`` as ours; {} with a note without jla."""
    try:
        from jla.ops import linear_attention
    except ImportError as e:
        print(f"note: jla unavailable ({e}); jla rows skipped (pip install "
              "jax-linear-attention==0.1.0)")
        return {}
    from lion_jax.ops._utils import bidirectional_from_causal

    def simple_gla(q, k, v, g):
        return linear_attention("simple_gla", q, k, v, g=g, scale=1.0)

    return {
        "jla_simple_gla": lambda q, k, v, g: simple_gla(q, k, v, g)[0],
        "jla_gla": lambda q, k, v, g: linear_attention(
            "gla", q, k, v, g=jnp.broadcast_to(g[..., None], q.shape), scale=1.0)[0],
        "jla_lion_2pass": lambda q, k, v, g: bidirectional_from_causal(simple_gla, q, k, v, g),
    }


def cap_triton_autotune(n):
    """Keeps only the first ``n`` configs of every Triton autotuner created from now on."""
    from triton.runtime import autotuner
    init = autotuner.Autotuner.__init__

    def capped(self, fn, arg_names, configs, *args, **kwargs):
        init(self, fn, arg_names, configs[:n], *args, **kwargs)
    autotuner.Autotuner.__init__ = capped


def torch_cases():
    """{name: (forward fn(q, k, v, g, gamma), has backward)}, or {} without FLA."""
    try:
        from fla.ops.linear_attn import chunk_linear_attn
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError as e:
        print(f"note: FLA unavailable ({e}); FLA rows skipped")
        return {}
    return {
        "fla_simple_gla_gamma": (lambda q, k, v, g, gamma: chunk_simple_gla(
            q, k, v, g_gamma=gamma, scale=1.0)[0], True),
        "fla_simple_gla_g": (lambda q, k, v, g, gamma: chunk_simple_gla(
            q, k, v, g=g, scale=1.0)[0], False),
        "fla_linear_attn": (lambda q, k, v, g, gamma: chunk_linear_attn(
            q, k, v, scale=1.0, normalize=False)[0], True),
    }


def inputs(B, L, H, D, rng):
    """float32 numpy q, k (positive: LION's feature maps), v, dy and log_decay in [-0.1, 0]."""
    q = np.abs(rng.standard_normal((B, L, H, D))) / D
    k = np.abs(rng.standard_normal((B, L, H, D)))
    v = rng.standard_normal((B, L, H, D))
    dy = rng.standard_normal((B, L, H, D))
    g = -rng.uniform(0.0, 0.1, (B, L, H))
    return [x.astype(np.float32) for x in (q, k, v, dy, g)]


def selected(name, ops):
    """Whether ``--ops`` picks the op ``name``: an entry ending in ``$`` names one op exactly,
    any other is a prefix of op names."""
    return any(name == op[:-1] if op.endswith("$") else name.startswith(op) for op in ops)


def machine():
    """This machine since its last boot: the device kind and the kernel's boot id (Linux), so
    that ``--resume`` merges rows of one machine only."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "unknown"
    return f"{jax.devices()[0].device_kind}, boot {boot}"


def resumed_rows(path, settings):
    """``(rows, finished)`` of an earlier results.json at ``path`` whose ``settings`` (batch,
    heads, reps, jax version) and device kind are this run's: its rows from this machine (since
    its last boot) and those of the shapes in its ``finished`` list ([L, D] pairs whose every
    op was measured, on one machine); else ``([], [])``, saying why."""
    if not os.path.exists(path):
        return [], []
    with open(path) as f:
        earlier = json.load(f)
    here = machine()
    device = here.split(", boot ")[0]
    differ = [key for key, value in dict(settings, device=device).items()
              if earlier.get(key) != value]
    if differ:
        print(f"--resume: {path} differs in {', '.join(differ)}: measuring afresh")
        return [], []
    finished = earlier.get("finished", [])
    rows = [dict(r, machine=r.get("machine", earlier["machine"])) for r in earlier["rows"]]
    kept = [r for r in rows if r["machine"] == here or [r["L"], r["D"]] in finished]
    mine = sum(r["machine"] == here for r in kept)
    print(f"--resume: {len(kept)} rows from earlier calls ({mine} on this machine), "
          f"{len(rows) - len(kept)} of another machine's unfinished shapes dropped")
    return kept, finished


def bench_shape(B, L, H, D, reps, rng, rows, quick, out_of_time, save, ops=None):
    """Measures every op (or those ``ops`` selects, see :func:`selected`) at one shape but
    those rows already holds, and appends their rows. Every (op, pass) is compiled and warmed
    up first (:func:`prepared_jax`, :func:`prepared_torch`); then ``reps`` rounds each take
    one sample of every one in turn, so that a change of the machine's state during the run
    (clocks, what ran before) falls on all ops alike rather than on the rows timed during it.
    A row holds the median and the quartiles of its samples and names this machine. save() is
    called after. Returns whether every op was measured (False: ``out_of_time`` stopped it)."""
    q, k, v, dy, g = inputs(B, L, H, D, rng)
    ready = {}  # (name, kind): (sample, MiB)

    def prepare(name, kind, preparer):
        """Compiles and warms up one (op, pass) with ``preparer() -> (sample, MiB)``; False
        once time is up."""
        if ops and not selected(name, ops):
            return True
        if any((r["op"], r["kind"], r["L"], r["D"]) == (name, kind, L, D) for r in rows):
            return True
        if out_of_time():
            return False
        try:
            ready[name, kind] = preparer()
        except Exception as e:  # a baseline that does not run here is reported, not fatal
            print(f"{name} {kind} L={L} D={D}: failed: {type(e).__name__}: {e}"[:300])
        return True

    jq, jk, jv, jdy = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, dy))
    jg = jnp.asarray(g)

    def jax_preparer(name, f):
        def preparer():
            with (traced_under(SETTINGS[name]) if name in SETTINGS
                  else contextlib.nullcontext()):
                return prepared_jax(f, (jq, jk, jv, jg))
        return preparer

    def prepare_all():
        for name, fn in jax_cases(quick).items():
            for kind, f in (("fwd", fn), ("fwd+bwd", with_grads(fn, jdy))):
                if not prepare(name, kind, jax_preparer(name, f)):
                    return False
        cases = torch_cases()
        if not cases:
            return True
        import torch
        tq, tk, tv, tdy = (torch.tensor(x, dtype=torch.bfloat16, device="cuda")
                           for x in (q, k, v, dy))
        tg = torch.tensor(g, device="cuda")
        gamma = torch.full((H,), -0.05, device="cuda")
        for name, (fn, has_bwd) in cases.items():
            leaves = [t.clone().requires_grad_(has_bwd) for t in (tq, tk, tv)]

            def fwd(fn=fn, leaves=leaves):
                with torch.no_grad():
                    fn(*leaves, tg, gamma)

            def fwd_bwd(fn=fn, leaves=leaves):
                fn(*leaves, tg, gamma).backward(tdy)

            for kind, f in (("fwd", fwd), ("fwd+bwd", fwd_bwd))[:2 if has_bwd else 1]:
                if not prepare(name, kind, lambda f=f: prepared_torch(f)):
                    return False
        return True

    finished = prepare_all()
    times = interleaved({key: sample for key, (sample, _) in ready.items()}, reps)
    here = machine()
    for (name, kind), (_, mib) in ready.items():
        q25, ms, q75 = quartiles(times[name, kind])
        rows.append(dict(op=name, kind=kind, L=L, D=D, ms=ms, q25=q25, q75=q75, mib=mib,
                         machine=here))
        print(f"{name:26s} {kind:8s} L={L:6d} D={D:4d} {ms:9.3f} ms (IQR {q25:.3f} to "
              f"{q75:.3f})  {mib or 0:9.1f} MiB", flush=True)
    if ready:
        save()
    return finished


def cross_check_with_fla(rng):
    """Our causal forward vs FLA's chunk_simple_gla with per-token g (bf16, relative RMS)."""
    try:
        import torch
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError:
        return None
    q, k, v, _, g = inputs(2, 1000, 4, 64, rng)
    ours = pallas_kernels.causal_linear_attention(*(jnp.asarray(x, jnp.bfloat16)
                                                    for x in (q, k, v)), jnp.asarray(g))
    t = [torch.tensor(x, dtype=torch.bfloat16, device="cuda") for x in (q, k, v)]
    theirs = chunk_simple_gla(*t, g=torch.tensor(g, device="cuda"), scale=1.0)[0]
    a = np.asarray(ours, np.float32)
    b = theirs.float().cpu().numpy()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def sweep(B, L, H, dims, reps, rng):
    """Times the stages of the two-pass ops (states walks, output kernels, fused backward
    kernels, with and without the forward's states kept), the one-kernel forwards
    (``mosaic_causal_warps.py`` for per-token decay in 1-4 runs, ``mosaic_causal.py`` for
    per-feature decay), jla's forward and a few launch settings, at one shape (bf16, ms)."""
    from pallas_kernels.bidirectional import bidirectional_scan, lion_backward
    from pallas_kernels.chunk_scan import BOTH
    from pallas_kernels.causal_backward import causal_backward
    from pallas_kernels.mosaic_causal_warps import causal_forward_warps
    from pallas_kernels.per_feature import chunk_scan_per_feature
    from pallas_kernels.two_pass import chunk_scan_two_pass, chunk_states
    print(f"sweep: two-pass stages, B={B} L={L} H={H} bf16 (ms)")
    walk = functools.partial(chunk_states, s0=None, chunk=64, precision=None, interpret=False)
    # label: fn(q, k, v, dy, g, state, den, causal states, LION states); the LION backward
    # stages take v as a stand-in for the forward's y and its low part (same shapes and cost)
    stages = {
        "states walk (bv=64)": lambda q, k, v, dy, g, *_: walk(k, v, g, bv=64, reverse=False),
        "states walk with z (bv=64)": lambda q, k, v, dy, g, *_: walk(k, v, g, bv=64,
                                                                      with_z=True, reverse=False),
        "states walks with z, both ways, two launches": lambda q, k, v, dy, g, *_: [
            walk(k, v, g, bv=64, with_z=True, reverse=r) for r in BOTH],
        "states walks with z, both ways, one launch": lambda q, k, v, dy, g, *_: walk(
            k, v, g, bv=64, with_z=True, reverse=BOTH),
        "states walks with z, both ways, two Triton launches": lambda q, k, v, dy, g, *_: [
            walk(k, v, g, bv=64, with_z=True, reverse=r, backend="triton") for r in BOTH],
        "states walks with z, both ways, one Triton launch": lambda q, k, v, dy, g, *_: walk(
            k, v, g, bv=64, with_z=True, reverse=BOTH, backend="triton"),
        "causal forward": lambda q, k, v, dy, g, *_: chunk_scan_two_pass(
            q, k, v, g, out_dtype=jnp.bfloat16),
        "causal forward, states kept": lambda q, k, v, dy, g, *_: chunk_scan_two_pass(
            q, k, v, g, out_dtype=jnp.bfloat16, return_states=True),
        "causal forward, states kept, one warp-specialized kernel": lambda q, k, v, dy, g, *_: (
            chunk_scan_two_pass(q, k, v, g, out_dtype=jnp.bfloat16, return_states=True,
                                fused=True)),
        "causal backward, recomputed": lambda q, k, v, dy, g, s, *_: causal_backward(
            q, k, v, g, None, dy, s),
        "LION forward": lambda q, k, v, dy, g, *_: bidirectional_scan(q, k, v, g,
                                                                      normalize=True),
        "LION backward, recomputed": lambda q, k, v, dy, g, s, den, *_: lion_backward(
            q, k, v, g, dy, y=v, y_low=v, den=den, normalize=True),
    }
    stages["causal backward, states kept, Mosaic gradients kernel where it applies"] = (
        lambda q, k, v, dy, g, s, den, h, hl: causal_backward(q, k, v, g, None, dy, s, h))
    stages["LION backward, states kept, Mosaic gradients kernel where it applies"] = (
        lambda q, k, v, dy, g, s, den, h, hl: lion_backward(
            q, k, v, g, dy, hl, y=v, y_low=v, den=den, normalize=True))
    for warps in (4, 8):
        stages[f"causal backward, states kept, Triton, {warps} warps"] = (
            lambda q, k, v, dy, g, s, den, h, hl, w=warps: causal_backward(
                q, k, v, g, None, dy, s, h, num_warps=w, grads="triton"))
        for one in (True, False):
            label = (f"states kept, Triton {'one kernel' if one else 'two kernels'}, "
                     f"{warps} warps")
            stages[f"LION backward, {label}"] = (
                lambda q, k, v, dy, g, s, den, h, hl, o=one, w=warps: lion_backward(
                    q, k, v, g, dy, hl, y=v, y_low=v, den=den, normalize=True, one_kernel=o,
                    num_warps=w, grads="triton"))
    for fused in (False, True):  # per-feature decay: three passes, or one Mosaic kernel
        stages[f"per-feature forward, {'one Mosaic kernel' if fused else 'three passes'}"] = (
            lambda q, k, v, dy, g, *_, f=fused: chunk_scan_per_feature(
                q, k, v, jnp.broadcast_to(g[..., None], q.shape), out_dtype=jnp.bfloat16,
                fused=f))
    for splits in (1, 2, 4):  # the warp-specialized forward (mosaic_causal_warps.py)
        stages[f"causal forward, warp-specialized, {splits} runs"] = (
            lambda q, k, v, dy, g, *_, s=splits: causal_forward_warps(q, k, v, g, splits=s))
    if "jla_simple_gla" in (jla := jla_cases()):  # the peer's forward, in the same run
        stages["jla simple_gla forward"] = lambda q, k, v, dy, g, *_: jla["jla_simple_gla"](
            q, k, v, g)
    for block_v, warps in ((32, 4), (64, 4), (64, 8)):
        stages[f"causal forward block_v={block_v} warps={warps}"] = (
            lambda q, k, v, dy, g, *_, b=block_v, w=warps: chunk_scan_two_pass(
                q, k, v, g, out_dtype=jnp.bfloat16, block_v=b, num_warps=w))
    for D in dims:
        q, k, v, dy, g = inputs(B, L, H, D, rng)
        q, k, v, dy = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, dy))
        g = jnp.asarray(g)
        args = (q, k, v, dy, g, jnp.zeros((B, H, D, D), jnp.float32),
                jnp.ones((B, L, H), jnp.float32),
                chunk_scan_two_pass(q, k, v, g, return_states=True)[-1],
                bidirectional_scan(q, k, v, g, normalize=True, return_states=True)[-1])
        for label, fn in stages.items():
            try:
                ms, _ = time_jax(fn, args, reps)
            except Exception as e:
                print(f"  D={D} {label}: failed: {type(e).__name__}: {e}"[:300])
                continue
            print(f"  D={D:4d} {label:56s}: {ms:8.3f}", flush=True)


RATIOS = [  # (ours, peer): ratio = peer time / our time (> 1: ours faster)
    ("pallas_causal_2pass", "pallas_causal_seq"),
    ("pallas_lion_2pass", "pallas_lion_seq"),
    ("pallas_causal_2pass", "pallas_causal_2pass_triton"),
    ("pallas_lion_2pass", "pallas_lion_2pass_triton"),
] + [(f"pallas_causal_{a}", peer) for a in ("seq", "2pass")
     for peer in ("fla_simple_gla_gamma", "fla_simple_gla_g", "fla_linear_attn", "cudnn_causal",
                  "xla_chunk_causal")] + [
    (f"pallas_lion_{a}", peer) for a in ("seq", "2pass")
    for peer in ("cudnn_full", "xla_chunk_lion")] + [
    ("pallas_causal_2pass", "jla_simple_gla"), ("pallas_causal_seq", "jla_simple_gla"),
    ("pallas_causal_two_kernels", "jla_simple_gla"),
    ("pallas_causal_2pass", "pallas_causal_two_kernels"),
    ("pallas_causal_triton_grads", "jla_simple_gla"),
    ("pallas_causal_2pass", "pallas_causal_triton_grads"),
    ("pallas_lion_2pass", "pallas_lion_triton_grads"),
    ("pallas_causal_approx_exp", "pallas_causal_2pass"),
    ("pallas_lion_approx_exp", "pallas_lion_2pass"),
    ("pallas_causal_per_feature", "jla_gla"), ("pallas_causal_per_feature_tf32", "jla_gla"),
    ("pallas_causal_per_feature_scans", "jla_gla"),
    ("pallas_causal_per_feature_three_passes", "jla_gla"),
    ("pallas_causal_per_feature", "pallas_causal_per_feature_three_passes"),
    ("pallas_lion_plain", "jla_lion_2pass"),
    ("pallas_lion_plain", "cudnn_full")]
# The kernels' speed targets: (label, ours, peers, pass, test, bound, only at L). ">=": the
# fastest peer's time / ours is at least the bound (speed); "<=": ours / the peer's (our
# causal op's) is at most the bound (cost). cuDNN's quadratic attention only at 16K.
FLA_FASTEST = ("fla_simple_gla_gamma", "fla_linear_attn")
TARGETS = [
    ("causal vs jla simple_gla", "pallas_causal_2pass", ("jla_simple_gla",), "fwd", ">=", 1.0,
     None),
    ("causal vs jla simple_gla", "pallas_causal_2pass", ("jla_simple_gla",), "fwd+bwd", ">=",
     1.2, None),
    ("causal vs FLA's fastest", "pallas_causal_2pass", FLA_FASTEST, "fwd+bwd", ">=", 1.5, None),
    ("per-feature vs jla gla", "pallas_causal_per_feature", ("jla_gla",), "fwd", ">=", 1.0,
     None),
    ("per-feature vs jla gla", "pallas_causal_per_feature", ("jla_gla",), "fwd+bwd", ">=", 1.0,
     None),
    ("LION normalised / our causal", "pallas_lion_2pass", ("pallas_causal_2pass",), "fwd+bwd",
     "<=", 1.6, None),
    ("LION plain vs jla two passes", "pallas_lion_plain", ("jla_lion_2pass",), "fwd+bwd", ">=",
     2.0, None),
    ("LION normalised vs cuDNN", "pallas_lion_2pass", ("cudnn_full",), "fwd+bwd", ">=", 10.0,
     16384)]


def only_length(op):
    """The one length at which the targets naming ``op`` are checked, or None (any)."""
    lengths = {only for _, ours, peers, *_, only in TARGETS if op in (ours, *peers)}
    return lengths.pop() if len(lengths) == 1 else None


# --acceptance: the ops of TARGETS at these lengths and head dims; an op is timed only at the
# one length its targets name, if they name one ("only": {op: L})
ACCEPTANCE = dict(lengths=(4096, 16384, 32768), dims=(64, 128),
                  ops=sorted({f"{op}$" for _, ours, peers, *_ in TARGETS
                              for op in (ours, *peers)}))
ACCEPTANCE["only"] = {op: only_length(op[:-1]) for op in ACCEPTANCE["ops"]
                      if only_length(op[:-1]) is not None}
# (op, base): cost = op time / base time; LION's acceptance bound is 2x our causal op
COSTS = [(f"pallas_lion_{a}", f"pallas_causal_{a}")
         for a in ("2pass", "seq", "2pass_triton", "triton_grads", "approx_exp")]


def markdown(rows, header):
    """A table of times (ms) per op, kind, D and L, then the speed ratios (``RATIOS``) and
    LION's cost against our causal op (``COSTS``), each table only where both ops ran."""
    lengths = sorted({r["L"] for r in rows})
    index = {(r["op"], r["kind"], r["D"], r["L"]): r for r in rows}
    keys = sorted({(r["op"], r["kind"], r["D"]) for r in rows}, key=lambda x: (x[2], x[1], x[0]))
    shapes = {}
    for r in rows:
        shapes.setdefault(r.get("machine", "unknown"), set()).add((r["L"], r["D"]))
    lines = [header, "", "Machines: " + "; ".join(
                 f"{m} (" + ", ".join(f"L={L} D={D}" for L, D in sorted(s)) + ")"
                 for m, s in shapes.items()),
             "", "Times in ms (peak MiB in parentheses).", "",
             "| op | pass | D | " + " | ".join(f"L={L}" for L in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    for op, kind, D in keys:
        cells = []
        for L in lengths:
            r = index.get((op, kind, D, L))
            cells.append("-" if r is None else
                         f"{r['ms']:.3f} ({r['mib']:.0f})" if r["mib"] is not None
                         else f"{r['ms']:.3f}")
        lines.append(f"| {op} | {kind} | {D} | " + " | ".join(cells) + " |")
    def ratio_lines(title, pairs, label, invert):
        out = ["", title, "",
               f"| {label} | pass | D | " + " | ".join(f"L={L}" for L in lengths) + " |",
               "|---|---|---|" + "---|" * len(lengths)]
        for x, y in pairs:
            for kind in ("fwd", "fwd+bwd"):
                for D in sorted({r["D"] for r in rows}):
                    cells = []
                    for L in lengths:
                        a, b = index.get((x, kind, D, L)), index.get((y, kind, D, L))
                        ratio = None if a is None or b is None else (
                            b["ms"] / a["ms"] if invert else a["ms"] / b["ms"])
                        cells.append("-" if ratio is None else f"{ratio:.2f}")
                    if any(c != "-" for c in cells):
                        out.append(f"| {x} vs {y} | {kind} | {D} | " + " | ".join(cells) + " |")
        return out if len(out) > 5 else []

    lines += ratio_lines("Speed ratios, peer time / our time (> 1: ours faster).", RATIOS,
                         "ours vs peer", invert=True)
    lines += ratio_lines("Cost of LION, its time / our causal op's time (bound: 2).", COSTS,
                         "LION vs causal", invert=False)
    return "\n".join(lines + targets(rows, index, lengths))


def targets(rows, index, lengths):
    """Markdown lines: each of ``TARGETS`` per D and L where both sides ran, its ratio with
    "(miss)" where it misses the bound; [] where none ran."""
    lines = ["", "Targets (speed: the fastest peer's time / ours, at least the bound; cost: "
             "ours / our causal op's, at most the bound; a miss is marked).", "",
             "| target | pass | D | bound | " + " | ".join(f"L={L}" for L in lengths) + " |",
             "|---|---|---|---|" + "---|" * len(lengths)]
    for label, ours, peers, kind, test, bound, only in TARGETS:
        for D in sorted({r["D"] for r in rows}):
            cells = []
            for L in lengths:
                mine = index.get((ours, kind, D, L))
                times = [index[p, kind, D, L]["ms"] for p in peers if (p, kind, D, L) in index]
                if mine is None or not times or only not in (None, L):
                    cells.append("-")
                    continue
                speed = test == ">="
                ratio = min(times) / mine["ms"] if speed else mine["ms"] / min(times)
                met = ratio >= bound if speed else ratio <= bound
                cells.append(f"{ratio:.2f}" + ("" if met else " (miss)"))
            if any(c != "-" for c in cells):
                lines.append(f"| {label} | {kind} | {D} | {test} {bound} | "
                             + " | ".join(cells) + " |")
    return lines if len(lines) > 5 else []


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dims = sorted({r["D"] for r in rows})
    fig, axes = plt.subplots(len(dims), 2, figsize=(12, 4.5 * len(dims)), squeeze=False)
    for i, D in enumerate(dims):
        for j, kind in enumerate(("fwd", "fwd+bwd")):
            ax = axes[i][j]
            for op in sorted({r["op"] for r in rows}):
                pts = sorted((r["L"], r["ms"]) for r in rows
                             if r["op"] == op and r["kind"] == kind and r["D"] == D)
                if pts:
                    style = "-o" if op.startswith("pallas") else "--."
                    ax.plot(*zip(*pts), style, label=op)
            ax.set(xscale="log", yscale="log", xlabel="L", ylabel="ms",
                   title=f"{kind}, D={D}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="workdir/bench_kernels")
    parser.add_argument("--lengths", default="4096,16384,32768,1024,8192")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--quick", action="store_true",
                        help="L=4096,16384, D=64, our kernels and FLA only, 5 reps")
    parser.add_argument("--deadline", type=float, default=0, metavar="S",
                        help="start no new measurement after S seconds (0: no limit)")
    parser.add_argument("--fla-autotune-configs", type=int, default=0, metavar="N",
                        help="keep only the first N configs of each Triton autotuner (0: all)")
    parser.add_argument("--sweep", type=int, default=0, metavar="L",
                        help="only time the two-pass kernels' stages and settings at this L")
    parser.add_argument("--ops", default="", metavar="PREFIXES",
                        help="comma-separated op-name prefixes to time, or names ending in $ "
                             "for one op exactly (default: all)")
    parser.add_argument("--resume", action="store_true",
                        help="keep --out's rows from this machine and measure the rest")
    parser.add_argument("--acceptance", action="store_true",
                        help="the ops, lengths and head dims of the kernels' targets (TARGETS)")
    args = parser.parse_args()
    only = ACCEPTANCE["only"] if args.acceptance else {}
    if args.acceptance:
        args.lengths, args.dims, args.ops = (",".join(map(str, ACCEPTANCE[key]))
                                             for key in ("lengths", "dims", "ops"))
    lengths = [4096, 16384] if args.quick else [int(x) for x in args.lengths.split(",")]
    dims = [64] if args.quick else [int(x) for x in args.dims.split(",")]
    reps = 5 if args.quick else args.reps
    start = time.perf_counter()

    def out_of_time():
        late = args.deadline and time.perf_counter() - start > args.deadline
        if late:
            print(f"deadline of {args.deadline} s reached: stopping", flush=True)
        return late

    if args.fla_autotune_configs:
        try:
            cap_triton_autotune(args.fla_autotune_configs)
        except ImportError:
            pass
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(0)
    device = jax.devices()[0].device_kind
    print(f"device: {device}; jax {jax.__version__}; B={args.batch} H={args.heads} bf16")
    err = cross_check_with_fla(rng)
    if err is not None:
        print(f"cross-check: our causal forward vs FLA chunk_simple_gla(g): rel RMS {err:.2e}")
    if args.sweep:
        sweep(args.batch, args.sweep, args.heads, dims, reps, rng)
        return
    header = (f"Device {device}, jax {jax.__version__}, B={args.batch}, H={args.heads}, bf16, "
              f"median of {reps}; FLA cross-check rel RMS {err}; FLA autotune configs capped "
              f"at {args.fla_autotune_configs or 'no cap'}")
    settings = dict(batch=args.batch, heads=args.heads, reps=reps, jax=jax.__version__)
    path = os.path.join(args.out, "results.json")
    rows, finished = resumed_rows(path, settings) if args.resume else ([], [])

    def save():
        with open(path, "w") as f:
            json.dump(dict(settings, device=device, machine=machine(), rows=rows,
                           finished=finished, fla_cross_check=err), f, indent=1)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(markdown(rows, header) + "\n")

    for L in lengths:
        for D in dims:
            if out_of_time():
                break
            ops = [x for x in args.ops.split(",") if x and only.get(x, L) == L]
            if args.ops and not ops:
                continue
            if bench_shape(args.batch, L, args.heads, D, reps, rng, rows, args.quick,
                           out_of_time, save, ops) and [L, D] not in finished:
                finished.append([L, D])
                save()
    if rows:
        plot(rows, os.path.join(args.out, "results.png"))
        print(markdown(rows, header))


if __name__ == "__main__":
    main()
