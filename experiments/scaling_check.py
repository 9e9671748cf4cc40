r"""Scale-out check: training throughput on 1, 2, 4, 8 devices (data-parallel and FSDP) and the
losses of the first steps on every mesh against one device.

    python -m experiments.scaling_check --out DIR [--preset default|tiny]
        [--models listops,vit_s,bert_base] [--devices 1,2,4,8] [--modes dp,fsdp]
        [--steps 40] [--loss_steps 20]

Models (the library's configs, built by the trainer exactly as ``python -m experiments.train``
builds them, one process driving the devices it is given):

- ``listops``: the LRA ListOps paper model (``configs/lra/listops.py``: LION-S, 8 layers of
  width 128, rows of up to 2,000 tokens), generated data;
- ``vit_s``: a LION-S ViT-S/16 at 224 px (``configs/vision/shapes.py`` with ViT-S's size,
  patches of 16; the embedded shapes images, no download);
- ``bert_base``: LION-S BERT-BASE (``configs/mlm/c4.py``), rows of 128 tokens of the embedded
  corpus with a vocabulary of 8,192 (``data.vocab_size``; BERT's is 30,522).

For each model, mode (``dp``: mesh data=n; ``fsdp``: mesh fsdp=n, parameters and optimizer
state sharded over the devices) and device count n (the first n of ``jax.devices()``):

1. **Throughput.** ``--per_device_batch`` rows per device (global batch n times that), bf16 as
   configured, ``(1 + --windows)`` logging windows of ``--steps // (1 + windows)`` steps; the
   first window (compilation) is dropped, examples/s is the median of the others' rates
   (the trainer's own ``steps_per_sec``: what a training run gets, host input included).
2. **Losses.** ``--loss_steps`` steps at a global batch of ``--loss_batch`` on every mesh, float32
   compute and ``highest`` matmul precision, dropout as configured (its random bits do not
   depend on the mesh); the largest relative difference of the step losses from one device's.

Writes ``DIR/runs/<model>_<mode>_<n>_{speed,loss}.jsonl`` (each run's metrics; the same command
skips runs already there, so a long check resumes across commands), ``DIR/scaling_check.json``,
``DIR/scaling_check.md`` (the table) and ``DIR/scaling_check.png`` (examples/s against devices,
the ideal line from one device dotted).

Presets: ``default`` (the models above; per-device batches 128 / 256 / 256 rows) and ``tiny``
(the configs' ``tiny`` variants, per-device batch 1: a CPU check of the whole path for CI, run
with ``--xla_force_host_platform_device_count=8``; its examples/s mean nothing).

Several processes (one per GPU, ``python -m experiments.launch``) train the same way; their
equivalence with one process is tested in ``tests/test_launch.py``.
"""

import json
import os
import shutil
import sys
import tempfile

import jax
import numpy as np
from absl import app, flags, logging

from configs.lra import listops as listops_config
from configs.mlm import c4 as c4_config
from configs.vision import shapes as shapes_config
from experiments.errors import UserError
from experiments.lra_leaderboard import read_records
from experiments.trainer import train_and_evaluate
from lion_jax.models.vit import vit_size

FLAGS = flags.FLAGS
MODES = {"dp": "data", "fsdp": "fsdp"}  # mode -> the mesh axis the n devices go to


def listops(tiny):
    c = listops_config.get_config("tiny" if tiny else None)
    c.batch_length_multiple = 0  # one batch shape: examples/s comparable across steps
    if not tiny:
        c.data.update(num_train=4096, num_val=64, num_test=64)
    return c


def vit_s(tiny):
    c = shapes_config.get_config("tiny" if tiny else None)
    if not tiny:
        c.data.update(num_train=2048, num_val=64, num_test=64, resolution=224)
        c.model.update(patch_size=16, **vit_size("small"))
    return c


def bert_base(tiny):
    c = c4_config.get_config("tiny" if tiny else None)
    if not tiny:
        c.data.update(num_train=8192, num_val=64, tokenizer_documents=5000)
    return c


MODELS = {"listops": listops, "vit_s": vit_s, "bert_base": bert_base}
PRESETS = {
    "default": dict(per_device_batch=dict(listops=128, vit_s=256, bert_base=256), steps=40,
                    windows=3, loss_steps=20, loss_batch=16, devices=(1, 2, 4, 8)),
    "tiny": dict(per_device_batch=dict(listops=1, vit_s=1, bert_base=1), steps=6, windows=2,
                 loss_steps=3, loss_batch=8, devices=(1, 2, 4, 8)),
}


def define_flags():
    flags.DEFINE_string("out", None, "Output directory (runs, table, plot, JSON).")
    flags.DEFINE_enum("preset", "default", list(PRESETS), "Preset (module docstring).")
    flags.DEFINE_list("models", list(MODELS), f"Models, of {', '.join(MODELS)}.")
    flags.DEFINE_list("devices", None, "Device counts (default: 1, 2, 4, 8 up to those present).")
    flags.DEFINE_list("modes", list(MODES), "Meshes: dp (data=n), fsdp (fsdp=n).")
    flags.DEFINE_integer("per_device_batch", None, "Rows per device for throughput "
                         "(default: the preset's, per model).")
    flags.DEFINE_integer("steps", None, "Steps of a throughput run (default: the preset's).")
    flags.DEFINE_integer("windows", None, "Timed windows after the compile window.")
    flags.DEFINE_integer("loss_steps", None, "Steps of a loss run (default: the preset's).")
    flags.DEFINE_integer("loss_batch", None, "Global batch of the loss runs.")


def settings_from_flags():
    s = dict(PRESETS[FLAGS.preset])
    for key in ("steps", "windows", "loss_steps", "loss_batch"):
        if getattr(FLAGS, key) is not None:
            s[key] = getattr(FLAGS, key)
    unknown = [m for m in FLAGS.models if m not in MODELS]
    if unknown:
        raise UserError(f"--models: unknown {unknown}; the models are {', '.join(MODELS)}")
    bad_modes = [m for m in FLAGS.modes if m not in MODES]
    if bad_modes:
        raise UserError(f"--modes: unknown {bad_modes}; the modes are {', '.join(MODES)}")
    present = jax.device_count()
    if FLAGS.devices:
        try:
            s["devices"] = tuple(int(n) for n in FLAGS.devices)
        except ValueError:
            raise UserError(f"--devices must be integers, got {FLAGS.devices}") from None
        if max(s["devices"]) > present or min(s["devices"]) < 1:
            platform = jax.devices()[0].platform
            hint = (" (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=8 gives 8)"
                    if platform == "cpu" else "")
            raise UserError(f"--devices {FLAGS.devices}: this process has {present} {platform} "
                            f"device(s){hint}")
    else:
        s["devices"] = tuple(n for n in s["devices"] if n <= present)
    if 1 not in s["devices"]:
        s["devices"] = (1,) + s["devices"]  # the reference of every ratio
    if s["loss_batch"] % max(s["devices"]):
        raise UserError(f"--loss_batch {s['loss_batch']} must split over every device count "
                        f"(a multiple of {max(s['devices'])})")
    if s["steps"] < (1 + s["windows"]) or s["windows"] < 1:
        raise UserError(f"--steps {s['steps']} must cover 1 + --windows {s['windows']} windows "
                        "of at least one step (windows >= 1)")
    s["models"], s["modes"] = tuple(FLAGS.models), tuple(FLAGS.modes)
    s["per_device_batch"] = ({m: FLAGS.per_device_batch for m in MODELS}
                             if FLAGS.per_device_batch else s["per_device_batch"])
    return s


def run_config(model, mode, n, *, batch, steps, log_every, loss_run, tiny):
    """The config of one run: ``model``'s, on the mesh ``mode`` x ``n``, ``steps`` steps of
    global batch ``batch``; one evaluation of a small val split and one checkpoint, both at the
    end (the trainer always does these at the last step)."""
    c = MODELS[model](tiny)
    c.mesh = {**dict(data=1, fsdp=1, model=1), MODES[mode]: n}
    c.batch_size = c.eval_batch_size = batch
    c.num_train_steps = steps
    c.optim.warmup_steps = min(c.optim.warmup_steps, steps // 2)
    c.log_every = log_every
    c.eval_every = 0
    c.eval_splits = ("val",)
    c.checkpoint_every = steps + 1
    c.keep_checkpoints = 1
    c.max_run_seconds = 0
    c.progress_bar = False
    if loss_run:
        c.model.dtype = "float32"
    return c


def train_one(config, path, n):
    """Trains ``config`` on the first ``n`` devices in a temporary workdir, keeps its metrics
    as ``path``; returns the records."""
    if not os.path.exists(path):
        with tempfile.TemporaryDirectory() as workdir:
            train_and_evaluate(config, workdir, devices=jax.devices()[:n],
                               config_name=f"experiments.scaling_check {os.path.basename(path)}")
            tmp = path + ".tmp"
            shutil.copy(os.path.join(workdir, "metrics.jsonl"), tmp)
            os.replace(tmp, path)
    return read_records(path)


def train_records(records):
    return [r for r in records if r["split"] == "train"]


def device_name(records):
    info = next((r["info"] for r in records if r["split"] == "run"), {})
    return info.get("device", "?")


def check_model(model, s, out):
    """Throughput and loss rows of ``model`` over the meshes of ``s``."""
    tiny = FLAGS.preset == "tiny"
    per_device = s["per_device_batch"][model]
    window = s["steps"] // (1 + s["windows"])
    rows, reference_losses, devices = [], None, set()
    meshes = [("dp", 1)] + [(mode, n) for mode in s["modes"] for n in s["devices"] if n > 1]
    for mode, n in meshes:
        name = f"{model}_{mode}_{n}"
        print(f"== {name}: throughput ({per_device} rows per device), then losses", flush=True)
        speed = train_one(run_config(model, mode, n, batch=per_device * n,
                                     steps=window * (1 + s["windows"]), log_every=window,
                                     loss_run=False, tiny=tiny),
                          os.path.join(out, "runs", f"{name}_speed.jsonl"), n)
        with jax.default_matmul_precision("highest"):
            loss = train_one(run_config(model, mode, n, batch=s["loss_batch"],
                                        steps=s["loss_steps"], log_every=1, loss_run=True,
                                        tiny=tiny),
                             os.path.join(out, "runs", f"{name}_loss.jsonl"), n)
        devices.add(device_name(speed))
        rates = [r["metrics"]["steps_per_sec"] for r in train_records(speed)[1:]]
        losses = np.array([r["metrics"]["loss"] for r in train_records(loss)])
        if reference_losses is None:
            reference_losses = losses
        rows.append(dict(model=model, mode=mode, devices=n, batch=per_device * n,
                         examples_per_s=float(np.median(rates)) * per_device * n,
                         losses=losses.tolist(),
                         loss_rel_diff=float(np.max(np.abs(losses / reference_losses - 1)))))
    one = rows[0]["examples_per_s"]
    for row in rows:
        row["speedup"] = row["examples_per_s"] / one
        row["efficiency"] = row["speedup"] / row["devices"]
    by_mesh = {(r["mode"], r["devices"]): r for r in rows}
    for r in rows:  # FSDP against data-parallel at the same n
        dp = by_mesh.get(("dp", r["devices"]))
        if r["mode"] == "fsdp" and dp is not None:
            r["fsdp_vs_dp_rel_diff"] = float(np.max(np.abs(
                np.array(r["losses"]) / np.array(dp["losses"]) - 1)))
    return rows, devices


def table(rows, s, devices):
    lines = [f"Scale-out check (`python -m experiments.scaling_check "
             f"{' '.join(sys.argv[1:])}`): {', '.join(sorted(devices))}, jax {jax.__version__}; "
             f"throughput: the median of {s['windows']} windows after the compile window, the "
             f"trainer's steps/s x global batch; losses: {s['loss_steps']} steps at global batch "
             f"{s['loss_batch']}, float32, highest matmul precision, against one device.", "",
             "| model | mesh | devices | global batch | examples/s | speedup | efficiency | "
             "loss rel. diff vs 1 device | FSDP vs DP |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        mesh = "1 device" if r["devices"] == 1 else f"{MODES[r['mode']]}={r['devices']}"
        vs_dp = f"{r['fsdp_vs_dp_rel_diff']:.1e}" if "fsdp_vs_dp_rel_diff" in r else ""
        lines.append(f"| {r['model']} | {mesh} | {r['devices']} | {r['batch']} | "
                     f"{r['examples_per_s']:,.1f} | {r['speedup']:.2f}x | "
                     f"{100 * r['efficiency']:.0f}% | {r['loss_rel_diff']:.1e} | {vs_dp} |")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model]
        one = mine[0]
        counts = sorted({r["devices"] for r in mine})
        ax.plot(counts, [one["examples_per_s"] * n for n in counts], ":", color="gray",
                label="ideal")
        for mode, style in (("dp", "o-"), ("fsdp", "s--")):
            points = [one] + [r for r in mine if r["mode"] == mode and r["devices"] > 1]
            if len(points) > 1:
                ax.plot([r["devices"] for r in points], [r["examples_per_s"] for r in points],
                        style, label="data-parallel" if mode == "dp" else "FSDP")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_title(model)
        ax.set_xlabel("devices")
        ax.set_ylabel("examples/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    if not FLAGS.out:
        sys.exit("error: --out DIR is required")
    try:
        s = settings_from_flags()
        out = os.path.abspath(os.path.expanduser(FLAGS.out))
        os.makedirs(os.path.join(out, "runs"), exist_ok=True)
        rows, devices = [], set()
        for model in s["models"]:
            model_rows, model_devices = check_model(model, s, out)
            rows += model_rows
            devices |= model_devices
    except UserError as e:
        sys.exit(f"error: {e}")
    text = table(rows, s, devices)
    with open(os.path.join(out, "scaling_check.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "scaling_check.json"), "w") as f:
        json.dump(dict(settings={k: list(v) if isinstance(v, tuple) else v
                                 for k, v in s.items()}, devices=sorted(devices), rows=rows),
                  f, indent=1)
    plot(rows, os.path.join(out, "scaling_check.png"))
    print(text)
    print(f"wrote {out}/scaling_check.md, scaling_check.png, scaling_check.json")


if __name__ == "__main__":
    define_flags()
    app.run(main)
