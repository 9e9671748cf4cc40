"""Compare the train losses and throughput of runs from their ``metrics.jsonl`` files.

    python -m experiments.compare_runs WORKDIR_A WORKDIR_B [...] [--steps 5] [--batch_size 50]

Prints, for the first ``--steps`` logged train steps, each run's loss and the largest relative
difference to the first run, then each run's median steps/s (and examples/s when
``--batch_size`` is given) over the logged train steps after the first (compile) one. Used to
check that a multi-device run matches one device (docs/benchmarks.md).
"""

import argparse
import json
import os
import statistics


def read_split_metrics(workdir, split="train"):
    """``{step: metrics}`` of the ``split`` records ("train", "val", ...) in
    ``workdir/metrics.jsonl``."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path} not found (is {workdir!r} a training workdir?)")
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r["metrics"] for r in records if r["split"] == split}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdirs", nargs="+")
    parser.add_argument("--steps", type=int, default=5, help="logged train steps to compare")
    parser.add_argument("--batch_size", type=int, default=0, help="global batch, for examples/s")
    args = parser.parse_args()

    runs = {w: read_split_metrics(w) for w in args.workdirs}
    reference = runs[args.workdirs[0]]
    steps = sorted(reference)[:args.steps]
    print("step  " + "  ".join(f"{os.path.basename(w.rstrip('/')):>14s}" for w in runs)
          + "  max rel diff")
    for step in steps:
        losses = [runs[w].get(step, {}).get("loss", float("nan")) for w in runs]
        diff = max(abs(x - losses[0]) / abs(losses[0]) for x in losses)
        print(f"{step:4d}  " + "  ".join(f"{x:14.7f}" for x in losses) + f"  {diff:.2e}")
    for w, metrics in runs.items():
        rates = [m["steps_per_sec"] for s, m in sorted(metrics.items())[1:] if "steps_per_sec" in m]
        if not rates:
            continue
        rate = statistics.median(rates)
        extra = f", {rate * args.batch_size:.1f} examples/s" if args.batch_size else ""
        print(f"{w}: median {rate:.3f} steps/s{extra} over {len(rates)} logged intervals")


if __name__ == "__main__":
    main()
