r"""Speed and memory of the LION ViTs against ViT (paper Table 15 and Figure 3 centre).

    python -m experiments.bench_vision [--out DIR] [--size tiny] [--train_batch 256]
        [--infer_batch 128] [--resolutions 224,448,672,896,1248] [--calls 10]
        [--skip_train] [--inference_sides "LION-S, pallas;ViT, cuDNN flash"]
        [--token_multiple 1,8] [--dense_backends triton,mosaic] [--lion_models s,s_v2]

(a) Train step at 224 px (patch 16, 197 tokens), batch ``--train_batch``: forward, backward
    and an AdamW update of ViT-T/S with softmax attention (cuDNN's flash attention, which
    takes 198 tokens, one padded and masked: ``layers.softmax.padded_to_even``; and XLA's)
    against LION-LIT, LION-D, LION-S and LION-S (v2) of the same size with ``impl="auto"``. A
    side that cannot run is a row with the reason. ``--token_multiple N`` pads the LION
    models' tokens with masked ones to a multiple of N (``VisionTransformer.token_multiple``;
    the default 8, as the vision configs: 197 -> 200 tokens, whole 8-row tiles for the Mosaic
    GPU ``lion_dense``, which ``impl="auto"`` then takes on Hopper; 1: no padding; several
    values give a row each). ``--dense_backends triton,mosaic`` gives each LION model a row per
    ``lion_dense`` backend (traced with ``lion_dense(backend=...)``). Every side is compiled
    first, then the sides are timed in rounds (one sample each per round), so that a slow
    stretch of a shared device falls on all of them alike; the table gives the median, the
    fastest sample and the seconds each side took to build and compile. ``--lion_models``
    picks the LION models (``lit,d,s,s_v2`` by default; ``s_gate32``: LION-S with its decay
    gate's products in float32, ``LionAttention.gate_products``, against the configs' bf16).
(b) Inference at each resolution, batch ``--infer_batch``, bf16: images/s and XLA's compiled
    memory (arguments + outputs + temporaries of the whole jitted forward) of ViT with cuDNN
    flash attention (learned positions resized) and with plain XLA softmax, and of LION-S with
    ``impl`` = attention, chunk, pallas and recurrent (on a GPU, without a gradient, the
    Pallas token walk ``pallas_kernels.lion_walk``). A model that does not compile or run
    (out of memory, a refused shape) is reported with the reason.

Every side is timed the same way: the median of 5 samples of ``--calls`` calls back to back
with one sync each, after a warm-up call (in rounds for the train steps, as above; one side
after the other for inference, ``bench_value_decay.timed``). Prints the tables;
with ``--out`` writes ``table.md``, ``train_step.png`` (the train-step medians as bars) and
``plot.png`` (inference speed and memory against resolution), each for the part that ran.
Needs a GPU.
"""

import contextlib
import functools
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
from absl import app, flags

from experiments.bench_value_decay import SAMPLES, timed, timing
from lion_jax.models import VisionTransformer
from lion_jax.models.vit import vit_size

FLAGS = flags.FLAGS
PATCH = 16
# the mixers of configs/vision (LION-S's gate products in bf16, as there)
LION = {"LION-LIT": dict(variant="lit"), "LION-D": dict(variant="d"),
        "LION-S": dict(variant="s", gate_products="compute")}
# the LION models of the train-step table: --lion_models key -> (name, mixer, patch orders)
TRAIN_MODELS = {"lit": ("LION-LIT", LION["LION-LIT"], ("raster",)),
                "d": ("LION-D", LION["LION-D"], ("raster",)),
                "s": ("LION-S", LION["LION-S"], ("raster",)),
                "s_v2": ("LION-S (v2)", LION["LION-S"], ("row_snake", "col_snake")),
                "s_gate32": ("LION-S, float32 gate products", dict(variant="s"), ("raster",))}
DEFAULT_LION_MODELS = ("lit", "d", "s", "s_v2")
INFER_IMPLS = ("attention", "chunk", "pallas", "recurrent")


def define_flags():
    flags.DEFINE_string("out", None, "Directory for table.md, train_step.png and plot.png.")
    flags.DEFINE_string("size", "tiny", "ViT size: tiny, small or base.")
    flags.DEFINE_integer("train_batch", 256, "Batch of the train-step timing.")
    flags.DEFINE_integer("infer_batch", 128, "Batch of the inference timing.")
    flags.DEFINE_list("resolutions", ["224", "448", "672", "896", "1248"],
                      "Inference resolutions (multiples of 16).")
    flags.DEFINE_integer("calls", 10, "Calls timed back to back.")
    flags.DEFINE_bool("skip_train", False, "Only the inference part.")
    flags.DEFINE_list("token_multiple", ["8"], "Pad the LION models' tokens to a multiple "
                      "of this in the train step (VisionTransformer.token_multiple; 1: none); "
                      "several, e.g. 1,8: a row each.")
    flags.DEFINE_list("dense_backends", [], "lion_dense backends of the LION train steps, e.g. "
                      "triton,mosaic: a row each (default: lion_dense.default_backend's choice).")
    flags.DEFINE_list("lion_models", list(DEFAULT_LION_MODELS),
                      "LION models of the train-step table: "
                      f"any of {', '.join(TRAIN_MODELS)}.")
    flags.DEFINE_string("inference_sides", None,
                        "Inference sides to run (default all): names as in the table, "
                        "separated by ';', e.g. 'LION-S, recurrent;ViT, cuDNN flash'; an "
                        "empty value skips inference.")


def model(size, kind, mixer=None, orders=("raster",), image_size=224, token_multiple=1):
    """A ViT of ``size``: ``kind`` "softmax" (learned positions) or "lion" with ``mixer``
    (tokens padded to a multiple of ``token_multiple``)."""
    softmax = kind == "softmax"
    return VisionTransformer(
        num_classes=1000, patch_size=PATCH, **vit_size(size), mixer_kind=kind,
        mixer=mixer or {}, orders=orders, pos_emb="learned" if softmax else "none",
        image_size=image_size if softmax else None, token_multiple=token_multiple,
        dtype=jnp.bfloat16)


def failure(e):
    """One line for a side that could not run."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ("out of memory" if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
            else f"{type(e).__name__}: {text[:120]}")


def compiled_step(net, batch):
    """``(compiled, args)``: the jitted AdamW train step (forward, backward, update) of ``net``
    at 224 px, compiled, and its arguments."""
    images = jnp.zeros((batch, 224, 224, 3), jnp.float32)
    labels = jnp.zeros((batch,), jnp.int32)
    params = net.init(jax.random.key(0), images[:1], train=False)["params"]
    tx = optax.adamw(1e-3)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, images, labels):
        def loss(p):
            logits = net.apply({"params": p}, images, train=False)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        grads = jax.grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    args = (params, opt, images, labels)
    return step.lower(*args).compile(), args


@contextlib.contextmanager
def dense_backend(backend):
    """``pallas_kernels.lion_dense`` with ``backend=backend`` while a model is traced inside
    (None: as it is, ``lion_dense.default_backend``'s choice)."""
    if backend is None:
        yield
        return
    import pallas_kernels
    default = pallas_kernels.lion_dense
    pallas_kernels.lion_dense = functools.partial(default, backend=backend)
    try:
        yield
    finally:
        pallas_kernels.lion_dense = default


def train_sides(size, token_multiples=(8,), backends=(None,), lion_models=DEFAULT_LION_MODELS):
    """``[(name, net, lion_dense backend)]``: ViT with cuDNN's and XLA's softmax, then each
    LION model of ``lion_models`` (keys of :data:`TRAIN_MODELS`) for each token multiple and
    ``lion_dense`` backend."""
    sides = [(f"ViT ({'cuDNN flash' if impl == 'cudnn' else 'XLA'} softmax)",
              model(size, "softmax", dict(impl=impl)), None) for impl in ("cudnn", "xla")]
    for key in lion_models:
        name, mixer, orders = TRAIN_MODELS[key]
        for multiple in token_multiples:
            for backend in backends:
                notes = [f"tokens to a multiple of {multiple}"] if multiple > 1 else []
                notes += [f"lion_dense on {backend}"] if backend else []
                label = f"{name} ({', '.join(notes)})" if notes else name
                sides.append((label, model(size, "lion", dict(mixer, impl="auto"), orders,
                                           token_multiple=multiple), backend))
    return sides


def timed_in_rounds(steps, calls):
    """``{name: (median, fastest)}`` ms per call of each ``steps[name] = (fn, args)``: a
    warm-up call each, then :data:`~experiments.bench_value_decay.SAMPLES` rounds in which
    every side takes one sample of ``calls`` calls back to back and one sync, so that a slow
    stretch of a shared device falls on all sides alike."""
    for fn, args in steps.values():
        jax.block_until_ready(fn(*args))
    samples = {name: [] for name in steps}
    for _ in range(SAMPLES):
        for name, (fn, args) in steps.items():
            start = time.perf_counter()
            out = None
            for _ in range(calls):
                out = fn(*args)
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - start) / calls * 1e3)
    return {name: (statistics.median(x), min(x)) for name, x in samples.items()}


def train_rows(size, batch, calls, token_multiples=(8,), backends=(None,),
               lion_models=DEFAULT_LION_MODELS):
    """``[(name, (median ms, fastest ms, compile s) or the reason it could not run)]``: every
    side compiled first (each under its ``lion_dense`` backend; the seconds of its init,
    trace, lowering and compilation), then timed in rounds."""
    steps, failed, seconds = {}, {}, {}
    sides = train_sides(size, token_multiples, backends, lion_models)
    for name, net, backend in sides:
        start = time.perf_counter()
        try:
            with dense_backend(backend):
                steps[name] = compiled_step(net, batch)
        except Exception as e:  # noqa: BLE001  a refused shape is a row of the table
            failed[name] = failure(e)
        seconds[name] = time.perf_counter() - start
        print(f"  compiled the train step of {name} in {seconds[name]:.0f} s"
              + (f": {failed[name]}" if name in failed else ""), flush=True)
    times = timed_in_rounds(steps, calls)
    rows = [(name, times[name] + (seconds[name],) if name in times else failed[name])
            for name, _, _ in sides]
    for name, ms in rows:
        print(f"  train step, {name}: {ms}", flush=True)
    return rows


def inference(net, params, batch, resolution, calls):
    """(images/s, compiled memory in MiB) of the jitted forward at ``resolution``."""
    images = jnp.zeros((batch, resolution, resolution, 3), jnp.bfloat16)
    forward = jax.jit(lambda p, x: net.apply({"params": p}, x, train=False))
    compiled = forward.lower(params, images).compile()
    m = compiled.memory_analysis()
    mib = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes) / 2 ** 20
    return batch / timed(compiled, params, images, calls=calls) * 1e3, mib


def inference_rows(size, batch, resolutions, calls, only=None):
    """``only``: the names of the sides to run (all when None)."""
    sides = [("ViT, cuDNN flash", model(size, "softmax", dict(impl="cudnn"))),
             ("ViT, XLA softmax", model(size, "softmax", dict(impl="xla")))]
    sides += [(f"LION-S, {impl}", model(size, "lion", dict(LION["LION-S"], impl=impl)))
              for impl in INFER_IMPLS]
    if only is not None:
        unknown = set(only) - {name for name, _ in sides}
        if unknown:
            raise ValueError(f"--inference_sides: unknown {sorted(unknown)}; the sides are "
                             f"{[name for name, _ in sides]}")
        sides = [(name, net) for name, net in sides if name in only]
    results = {}
    for name, net in sides:
        init_net = net.clone(mixer=dict(impl="xla")) if net.mixer_kind == "softmax" else net
        params = init_net.init(jax.random.key(0), jnp.zeros((1, 224, 224, 3)),
                               train=False)["params"]  # the same parameters for either softmax
        params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
        for r in resolutions:
            try:  # ViT resizes its 224 px learned positions itself
                results[name, r] = inference(net, params, batch, r, calls)
            except Exception as e:  # noqa: BLE001  OOM / refused: reported, not fatal
                results[name, r] = failure(e)
            print(f"  {name} at {r} px: {results[name, r]}", flush=True)
    return [name for name, _ in sides], results


def markdown(device, size, train, train_batch, names, results, resolutions, infer_batch, calls):
    lines = [f"{device}, jax {jax.__version__}, ViT-{size[0].upper()}/16, bf16; "
             f"{timing(calls)}", ""]
    if train:
        base = next((ms for n, ms in train if n.startswith("ViT") and not isinstance(ms, str)),
                    None)
        lines += [f"Train step at 224 px, batch {train_batch} (forward, backward, AdamW; the "
                  f"sides timed in rounds, one sample each per round), ms:", "",
                  "| model | median | fastest | vs ViT (median) | vs ViT (fastest) | compile (s) |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for n, ms in train:
            if isinstance(ms, str):
                lines.append(f"| {n} | {ms} | | | | |")
                continue
            ratios = (["", ""] if base is None
                      else [f"{a / b:.2f}x" for a, b in zip(ms[:2], base[:2])])
            lines.append(f"| {n} | {ms[0]:.2f} | {ms[1]:.2f} | {ratios[0]} | {ratios[1]} | "
                         f"{ms[2]:.0f} |")
        lines.append("")
    if not names:
        return "\n".join(lines) + "\n"
    lines += [f"Inference, batch {infer_batch}: images/s (compiled memory, MiB)", "",
              "| model | " + " | ".join(f"{r} px" for r in resolutions) + " |",
              "| --- |" + " --- |" * len(resolutions)]
    for n in names:
        cells = []
        for r in resolutions:
            x = results[n, r]
            cells.append(x if isinstance(x, str) else f"{x[0]:.0f} ({x[1]:,.0f})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def two_panels(path, names, results, xs, *, xlabel, speed_label, xscale="linear"):
    """``results[name, x]``: ``(speed, MiB)`` or a failure string; one line per name in two
    panels (speed, compiled memory) against ``xs``, log-scaled values; written to ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n in names:
        pts = [(x, results[n, x]) for x in xs if not isinstance(results[n, x], str)]
        if pts:
            axes[0].plot([x for x, _ in pts], [r[0] for _, r in pts], "o-", label=n)
            axes[1].plot([x for x, _ in pts], [r[1] for _, r in pts], "o-", label=n)
    axes[0].set(xlabel=xlabel, ylabel=speed_label, xscale=xscale, yscale="log")
    axes[1].set(xlabel=xlabel, ylabel="compiled memory (MiB)", xscale=xscale, yscale="log")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(path, names, results, resolutions):
    two_panels(path, names, results, resolutions, xlabel="resolution (px)",
               speed_label="images / s")


def plot_train(path, train):
    """The train-step table's medians as horizontal bars (ms), fastest sample as a tick; a side
    that did not run is left out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [(n, ms) for n, ms in train if not isinstance(ms, str)]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    ys = range(len(rows))
    ax.barh(ys, [ms[0] for _, ms in rows], color="tab:blue", label="median")
    ax.plot([ms[1] for _, ms in rows], ys, "k|", markersize=14, label="fastest")
    ax.set_yticks(list(ys), [n for n, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="train step at 224 px (ms)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv):
    del argv
    if jax.default_backend() != "gpu":
        sys.exit("error: bench_vision needs a GPU")
    try:
        vit_size(FLAGS.size)
        resolutions = [int(r) for r in FLAGS.resolutions]
    except ValueError as e:
        sys.exit(f"error: {e}")
    if any(r % PATCH for r in resolutions):
        sys.exit(f"error: --resolutions must be multiples of {PATCH}; got {resolutions}")
    only = FLAGS.inference_sides
    if only is not None:
        only = [n.strip() for n in only.split(";") if n.strip()]
    device = jax.devices()[0].device_kind
    try:
        multiples = [int(m) for m in FLAGS.token_multiple]
    except ValueError:
        sys.exit(f"error: --token_multiple takes ints >= 1; got {FLAGS.token_multiple}")
    if any(m < 1 for m in multiples):
        sys.exit(f"error: --token_multiple takes ints >= 1; got {multiples}")
    backends = FLAGS.dense_backends or [None]
    if not set(backends) <= {None, "triton", "mosaic"}:
        sys.exit(f"error: --dense_backends takes triton and mosaic; got {backends}")
    if not set(FLAGS.lion_models) <= set(TRAIN_MODELS):
        sys.exit(f"error: --lion_models takes {', '.join(TRAIN_MODELS)}; got "
                 f"{FLAGS.lion_models}")
    train = None if FLAGS.skip_train else train_rows(FLAGS.size, FLAGS.train_batch, FLAGS.calls,
                                                     multiples, backends, FLAGS.lion_models)
    try:
        names, results = inference_rows(FLAGS.size, FLAGS.infer_batch, resolutions, FLAGS.calls,
                                        only)
    except ValueError as e:
        sys.exit(f"error: {e}")
    table = markdown(device, FLAGS.size, train, FLAGS.train_batch, names, results, resolutions,
                     FLAGS.infer_batch, FLAGS.calls)
    print(table)
    if FLAGS.out:
        os.makedirs(FLAGS.out, exist_ok=True)
        with open(os.path.join(FLAGS.out, "table.md"), "w") as f:
            f.write(table)
        if names:
            plot(os.path.join(FLAGS.out, "plot.png"), names, results, resolutions)
        if train:
            plot_train(os.path.join(FLAGS.out, "train_step.png"), train)


if __name__ == "__main__":
    define_flags()
    app.run(main)
