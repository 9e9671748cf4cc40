r"""Where a config's training step spends its time, from a device trace.

    python -m experiments.profile_train --config configs/lra/listops.py [--config.key=value ...] \
        [--steps 20] [--out DIR]

Builds the task and the jitted train step exactly as the trainer does (one device), then:

1. times ``--steps`` train steps called back to back with one sync at the end (cycling four
   batches, each run twice before, so every batch shape is compiled), and the host side alone
   (``next(batches)`` and the transfer to the device);
2. traces ``--steps`` more steps with ``jax.profiler`` and sums the device time of every XLA
   operation, grouped by the Flax module that emitted it (from the ``op_name`` metadata of the
   compiled HLO: ``block_3/mixer/...`` -> ``mixer``, the optimizer update -> ``optimizer``, ...)
   and by kind (matmul, Pallas kernel, fusion, copy/transpose, reduction, other), and lists the
   most expensive ops.

Prints the tables (ms per step) and, with ``--out``, writes them as JSON (with every op's time
too, ``all_ops``, and the op_name metadata of the instructions behind each, ``op_sources``),
the compiled step's optimised HLO (``step.hlo.txt``, where a fusion's name leads to its ops),
and keeps the trace.
"""

import collections
import glob
import json
import os
import re
import sys
import tempfile
import time

import flax.linen as nn
import jax
from absl import app, flags
from ml_collections import config_flags

from experiments import optim, sharding, trainer
from experiments.tasks import get_task

FLAGS = flags.FLAGS


def define_flags():
    """The command's flags (defined when run, so that importing the module's helpers, as the
    tests do, leaves the process's absl flags alone)."""
    config_flags.DEFINE_config_file("config", None, "Config file, path.py[:variant].",
                                    lock_config=True)
    flags.DEFINE_integer("steps", 20, "Steps timed, and steps traced.")
    flags.DEFINE_string("out", None, "Directory for profile.json and the trace.")


# Module path components, most specific first: the group of an op is the first one found in
# its op_name (the Flax scope names of lion_jax.models / lion_jax.layers).
MODULE_GROUPS = ("mixer_norm", "mlp_norm", "final_norm", "mixer", "mlp", "embed", "head")
KIND_PATTERNS = (
    ("pallas kernel", re.compile(r"pallas|triton|mosaic|__gpu\$xla\.gpu\.triton", re.I)),
    ("matmul", re.compile(r"gemm|cublas|dot|matmul|cutlass|nvjet|xmma", re.I)),
    ("copy/transpose", re.compile(r"copy|transpose", re.I)),
    ("reduction", re.compile(r"reduce", re.I)),
    ("fusion", re.compile(r"fusion", re.I)),
)


def op_names(hlo_text):
    """``{hlo instruction name: op_name metadata}`` of a compiled module's HLO text."""
    names = {}
    for match in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]*)\"", hlo_text,
                             re.M):
        names[match.group(1)] = names[match.group(1).replace(".", "_")] = match.group(2)
    return names


def module_group(op_name):
    """The model module (or ``optimizer`` / ``other``) an op_name belongs to."""
    parts = op_name.split("/")
    for group in MODULE_GROUPS:
        for i, part in enumerate(parts):
            if part == group or part.startswith(group + "_"):
                if group == "mixer" and i + 1 < len(parts):  # its projections, gates, the op
                    return f"mixer/{parts[i + 1].split('[')[0].split('(')[0]}"
                return group
    if "optax" in op_name or "apply_updates" in op_name or "tx.update" in op_name:
        return "optimizer"
    return "other (loss, optimizer, glue)"


def op_kind(hlo_op, op_name=""):
    """The kind of an op from its instruction or kernel name, else from the JAX primitive
    that made it (the last part of its op_name: ``dot_general``, ``pallas_call``, ...). Not
    from the rest of the op_name: a backward op's path starts ``transpose(jvp(...))``."""
    for text in (hlo_op, op_name.rsplit("/", 1)[-1]):
        for kind, pattern in KIND_PATTERNS:
            if pattern.search(text):
                return kind
    return "other"


def device_events(trace_dir):
    """``[(op, duration_ns)]`` of the device (GPU, else CPU thunk) ops in a trace.

    ``op`` is the HLO instruction, or inside a CUDA graph (XLA's command buffers, whose events
    carry ``hlo_op`` "command_buffer_N") the kernel's name, which XLA derives from the fusion's
    name with "." -> "_" (library kernels such as cuBLAS's keep their own names)."""
    path = max(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True),
               key=os.path.getmtime)
    from jax.profiler import ProfileData
    data = ProfileData.from_file(path)
    planes = [p for p in data.planes if p.name.startswith("/device:GPU")]
    events, seen = [], []
    for plane in planes or [p for p in data.planes if p.name == "/host:CPU"]:
        lines = list(plane.lines)
        seen += [f"{plane.name}:{line.name}" for line in lines]
        streams = [line for line in lines if line.name.startswith("Stream")]
        for line in streams or lines:  # kernels on the GPU's streams; CPU thunks otherwise
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    op = str(stats["hlo_op"])
                    events.append((event.name if op.startswith("command_buffer") else op,
                                   event.duration_ns))
    if not events:
        raise RuntimeError(f"no XLA op events in {path}; lines seen: {seen}")
    return events


def summarize(events, names, steps, top=15):
    """Three ``{name: ms per step}`` tables: by module group, by kind, and the ``top`` ops
    (numbered copies of one fusion or kernel counted together, named with their group; every
    op with ``top=None``); and ``{op: [op_name metadata]}``, the sources of each op of the
    third table (the jitted calls and primitives its instructions came from; empty where the
    trace names a kernel and not an instruction, as inside XLA's command buffers)."""
    by_group, by_kind, by_op = (collections.Counter() for _ in range(3))
    sources = collections.defaultdict(set)
    for op, duration_ns in events:
        ms = duration_ns / 1e6 / steps
        group = module_group(names.get(op, ""))
        by_group[group] += ms
        by_kind[op_kind(op, names.get(op, ""))] += ms
        key = f"{re.sub(r'[._]\d+$', '', op)[:40]} ({group})"
        by_op[key] += ms
        if op in names:
            sources[key].add(names[op])
    by_op = dict(by_op.most_common(top))
    return (dict(by_group.most_common()), dict(by_kind.most_common()), by_op,
            {key: sorted(sources[key]) for key in by_op})


def _print_table(title, table, total):
    print(f"\n{title:<50} {'ms/step':>9} {'share':>7}")
    for name, ms in table.items():
        print(f"  {name:<48} {ms:9.3f} {ms / total:7.1%}")


def main(argv):
    del argv
    config = FLAGS.config
    task = get_task(config)
    tx, schedule = optim.make_optimizer(config.optim, config.num_train_steps)
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    data_sharding = sharding.batch_sharding(mesh)
    params, model_state = trainer.split_variables(task, jax.jit(
        lambda r: nn.meta.unbox(task.init(r)))(jax.random.PRNGKey(0)))
    state = trainer.TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                               opt_state=tx.init(params), ema_params=None,
                               rng=jax.random.PRNGKey(1), model_state=model_state)
    step_fn = jax.jit(trainer.make_train_step(task, tx, schedule, config), donate_argnums=0)
    batches = task.train_batches(config.batch_size, config.seed)
    fixed = [sharding.put_batch(next(batches), data_sharding) for _ in range(4)]
    lowered = step_fn.lower(state, fixed[0])
    hlo_text = lowered.compile().as_text()
    names = op_names(hlo_text)

    for batch in fixed * 2:  # every shape compiled (length-bucketed batches differ), also for
        state, metrics = step_fn(state, batch)  # the state the steps return (placed on device)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for i in range(FLAGS.steps):
        state, metrics = step_fn(state, fixed[i % 4])
    jax.block_until_ready(metrics)
    step_ms = (time.perf_counter() - start) / FLAGS.steps * 1e3

    start = time.perf_counter()
    for _ in range(FLAGS.steps):
        jax.block_until_ready(sharding.put_batch(next(batches), data_sharding))
    host_ms = (time.perf_counter() - start) / FLAGS.steps * 1e3

    trace_dir = FLAGS.out or tempfile.mkdtemp()
    with jax.profiler.trace(trace_dir):
        for i in range(FLAGS.steps):
            state, metrics = step_fn(state, fixed[i % 4])
        jax.block_until_ready(metrics)
    by_group, by_kind, all_ops, sources = summarize(device_events(trace_dir), names,
                                                    FLAGS.steps, top=None)
    by_op = dict(list(all_ops.items())[:15])  # most expensive first
    device_ms = sum(by_group.values())

    print(f"{jax.devices()[0].device_kind}: {FLAGS.steps} train steps back to back, one sync: "
          f"{step_ms:.2f} ms/step ({1e3 / step_ms:.1f} steps/s); host batch + transfer "
          f"{host_ms:.2f} ms/step; device op time in the trace {device_ms:.2f} ms/step")
    _print_table("device time by module", by_group, device_ms)
    _print_table("device time by kind of op", by_kind, device_ms)
    _print_table("most expensive ops", by_op, device_ms)
    if FLAGS.out:
        with open(os.path.join(FLAGS.out, "profile.json"), "w") as f:
            json.dump({"device": jax.devices()[0].device_kind, "step_ms": step_ms,
                       "host_ms": host_ms, "device_ms": device_ms, "by_module": by_group,
                       "by_kind": by_kind, "top_ops": by_op,
                       "all_ops": all_ops, "op_sources": sources,
                       "argv": sys.argv}, f, indent=1)
        with open(os.path.join(FLAGS.out, "step.hlo.txt"), "w") as f:
            f.write(hlo_text)


if __name__ == "__main__":
    define_flags()
    flags.mark_flag_as_required("config")
    app.run(main)
