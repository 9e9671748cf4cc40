"""Reporting: the progress bar and the metrics log (``metrics.jsonl`` + TensorBoard).

``metrics.jsonl`` holds one JSON object per line::

    {"step": 100, "split": "train", "metrics": {"loss": 2.1, ...}, "time": 1718000000.0}

``time`` is the Unix wall-clock time of the write. Each start or resume of a run first writes
a ``"split": "run"`` record at the step it starts from, with empty ``metrics`` and an ``info``
dict (device kind and count, platform, jax version, the config argument): the wall time of a
run split into segments is the sum, over its ``run`` records, of the time from each to the
last record before the next one. TensorBoard event files go to
``workdir/tensorboard`` when ``tensorboardX`` is importable (``pip install tensorboardX``).
Only process 0 writes or prints.
"""

import json
import os
import time

import jax
import tqdm

try:
    from tensorboardX import SummaryWriter
except ImportError:
    SummaryWriter = None


class MetricsWriter:
    """Appends metrics to ``workdir/metrics.jsonl`` (and TensorBoard when available).

    Args:
      workdir: output directory.
      resume_step: step of the checkpoint the run restarts from; records after it (written
        by the interrupted run past its last checkpoint) are dropped, so the log of a resumed
        run reads like an uninterrupted one. None starts a fresh log.
    """

    def __init__(self, workdir, resume_step=None):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._enabled = jax.process_index() == 0
        self._tb = None
        if not self._enabled:
            return
        kept = []
        if resume_step is not None and os.path.exists(self.path):
            with open(self.path) as f:
                kept = [line for line in f if json.loads(line)["step"] <= resume_step]
        with open(self.path, "w") as f:
            f.writelines(kept)
        if SummaryWriter is not None:
            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step, split, metrics):
        if not self._enabled:
            return
        record = {"step": int(step), "split": split,
                  "metrics": {k: float(v) for k, v in metrics.items()}, "time": time.time()}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for name, value in record["metrics"].items():
                self._tb.add_scalar(f"{split}/{name}", value, step)

    def write_run_info(self, step, info):
        """Appends the ``run`` record of a (re)start at ``step`` (see the module docstring)."""
        if not self._enabled:
            return
        record = {"step": int(step), "split": "run", "metrics": {}, "info": dict(info),
                  "time": time.time()}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self):
        if self._tb is not None:
            self._tb.close()


class ProgressBar:
    """A tqdm bar over optimizer steps: step rate and ETA (tqdm's), examples/s and loss."""

    def __init__(self, total, initial, examples_per_step, enabled=True):
        self._examples_per_step = examples_per_step
        self._bar = tqdm.tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                              disable=not enabled or jax.process_index() != 0)

    def update(self, **postfix):
        """Advances one step and shows ``postfix`` (e.g. loss) and the example rate."""
        rate = self._bar.format_dict.get("rate")
        if rate:
            postfix["ex/s"] = f"{rate * self._examples_per_step:.0f}"
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(1)

    def close(self):
        self._bar.close()


def echo(message):
    """Prints a line from process 0 without breaking the progress bar."""
    if jax.process_index() == 0:
        tqdm.tqdm.write(message)
