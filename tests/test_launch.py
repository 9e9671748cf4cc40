"""experiments.launch and multi-process training on CPU: several jax.distributed processes on
localhost (gloo collectives) train a tiny config to the losses of one process, and their
checkpoint resumes in one process."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs.glue import glue as glue_config
from configs.lra import listops as listops_config
from configs.mlm import c4 as c4_config
from experiments import launch, sharding
from experiments.errors import UserError
from experiments.trainer import train_and_evaluate
from test_glue_task import write_stand_ins  # tests/ is on sys.path (pytest's rootdir import)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return subprocess.run([sys.executable, "-m", "experiments.launch", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        out = [json.loads(line) for line in f]
    return [(r["step"], r["split"], {k: v for k, v in r["metrics"].items()
                                     if k != "steps_per_sec"})
            for r in out if r["split"] != "run"]


def _run_info(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line)["info"] for line in f if '"split": "run"' in line]


def _assert_same_metrics(got, want):
    assert [(s, split) for s, split, _ in got] == [(s, split) for s, split, _ in want]
    for (step, split, g), (_, _, w) in zip(got, want):
        assert g.keys() == w.keys()
        np.testing.assert_allclose([g[k] for k in sorted(g)], [w[k] for k in sorted(w)],
                                   rtol=2e-5, atol=1e-6, err_msg=f"{split} at step {step}")


def test_child_environments():
    envs = launch.child_environments(
        processes=2, devices_per_process=2, platform="gpu", hosts=2, host_index=1,
        coordinator="h0:1234", gpus=["3", "5", "6", "7"], base={"PATH": "/bin"})
    assert [(e["JAX_PROCESS_ID"], e["JAX_NUM_PROCESSES"], e["CUDA_VISIBLE_DEVICES"])
            for e in envs] == [("2", "4", "3,5"), ("3", "4", "6,7")]
    assert all(e["JAX_COORDINATOR_ADDRESS"] == "h0:1234" and e["PATH"] == "/bin" for e in envs)
    cpu = launch.child_environments(
        processes=3, devices_per_process=4, platform="cpu", hosts=1, host_index=0,
        coordinator="localhost:9", base={"XLA_FLAGS": "--xla_dump_to=/tmp/d "
                                         "--xla_force_host_platform_device_count=8"})
    assert [e["JAX_PROCESS_ID"] for e in cpu] == ["0", "1", "2"]
    assert all(e["JAX_PLATFORMS"] == "cpu" and e["XLA_FLAGS"] == (
        "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=4") for e in cpu)


@pytest.mark.parametrize("args, message", [
    (["--processes", "2"], "no command: give it after '--'"),
    (["--processes", "2", "--"], "the command after '--' is empty"),
    (["--platform", "cpu", "--", "true"], "--processes is required on cpu"),
    (["--processes", "0", "--platform", "cpu", "--", "true"], "must be at least 1"),
    (["--processes", "2", "--platform", "cpu", "--hosts", "2", "--host_index", "2", "--",
      "true"], "--host_index 2 must lie in [0, --hosts 2)"),
    (["--processes", "2", "--platform", "cpu", "--hosts", "2", "--", "true"],
     "--coordinator host:port is required with --hosts > 1"),
    (["--processes", "9", "--platform", "gpu", "--", "true"],
     "9 processes x 1 GPUs need 9 GPUs; this host has"),
])
def test_launcher_errors(args, message):
    result = _launch(*args, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr


def test_a_failing_process_stops_the_others():
    """Process 1 exits with 3 at once; process 0 would sleep for 10 minutes (as a process
    waiting in a collective would): the launcher stops it and exits with 3."""
    code = ("import os, sys, time\n"
            "print('process', os.environ['JAX_PROCESS_ID'], 'of', os.environ['JAX_NUM_PROCESSES'],"
            " flush=True)\n"
            "sys.exit(3) if os.environ['JAX_PROCESS_ID'] == '1' else time.sleep(600)")
    start = time.time()
    result = _launch("--processes", "2", "--platform", "cpu", "--", sys.executable, "-c", code,
                     timeout=120)
    assert result.returncode == 3 and time.time() - start < 60
    assert "process 0 of 2" in result.stdout and "[process 1] process 1 of 2" in result.stdout


def test_distributed_environment_errors(monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1")
    monkeypatch.delenv("JAX_NUM_PROCESSES", raising=False)
    monkeypatch.delenv("JAX_PROCESS_ID", raising=False)
    with pytest.raises(UserError, match="JAX_COORDINATOR_ADDRESS set but JAX_NUM_PROCESSES, "
                                        "JAX_PROCESS_ID not: set all three"):
        sharding.maybe_initialize_distributed(False)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "2")
    with pytest.raises(UserError, match=r"JAX_PROCESS_ID=2 must lie in \[0, JAX_NUM_PROCESSES"):
        sharding.maybe_initialize_distributed(False)


def test_two_processes_match_one_and_resume_in_one(tmp_path):
    """2 processes x 4 CPU devices (mesh data=2 x fsdp=4) train the tiny ListOps config,
    stopping at its first checkpoint (step 2, evaluated there), with the metrics of one process
    on one device; this single process then resumes their checkpoint on 1 device and ends with
    the uninterrupted run's metrics."""
    config_arg = "configs/lra/listops.py:tiny"
    cache = str(tmp_path / "cache")
    config = listops_config.get_config("tiny")
    config.data.cache_dir = cache
    one = str(tmp_path / "one")
    summary = train_and_evaluate(config, one, devices=jax.devices()[:1])
    assert summary["final"]["step"] == config.num_train_steps == 4

    moved = str(tmp_path / "moved")
    result = _launch("--processes", "2", "--platform", "cpu", "--devices_per_process", "4",
                     "--", sys.executable, "-m", "experiments.train", "--config", config_arg,
                     f"--config.data.cache_dir={cache}", "--config.mesh.data=2",
                     "--config.mesh.fsdp=4", "--workdir", moved,
                     "--config.max_run_seconds=1e-9")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "over 8 cpu device(s) in 2 processes" in result.stdout
    assert "Stopping at step 2 of 4" in result.stdout
    assert sorted(os.listdir(os.path.join(moved, "checkpoints"))) == ["2"]
    two_steps = _records(moved)
    assert {r[0] for r in two_steps} == {2} and {r[1] for r in two_steps} >= {"train", "val"}
    _assert_same_metrics(two_steps, [r for r in _records(one) if r[0] <= 2])

    train_and_evaluate(config, moved, devices=jax.devices()[:1])
    assert [(i["num_devices"], i["num_processes"]) for i in _run_info(moved)] == [(8, 2), (1, 1)]
    _assert_same_metrics(_records(moved), _records(one))


def test_fine_tuning_starts_from_a_checkpoint_of_another_process_layout(tmp_path):
    """GLUE fine-tuning in 2 processes with FSDP loads the encoder of an MLM run saved by one
    process (the warm start gathers the fresh parameters across processes and reads the
    checkpoint on the host) and trains to one process's losses."""
    cache, mlm = str(tmp_path / "cache"), str(tmp_path / "mlm")
    pretrain = c4_config.get_config("tiny")
    pretrain.data.cache_dir = cache
    train_and_evaluate(pretrain, mlm)
    write_stand_ins(str(tmp_path / "glue_data"))
    flags = [f"--config.init_from={mlm}", "--config.data.source=files",
             f"--config.data.data_dir={tmp_path / 'glue_data'}", f"--config.data.cache_dir={cache}"]
    two = str(tmp_path / "two")
    result = _launch("--processes", "2", "--platform", "cpu", "--devices_per_process", "4", "--",
                     sys.executable, "-m", "experiments.train", "--config",
                     "configs/glue/glue.py:tiny", *flags, "--config.mesh.data=2",
                     "--config.mesh.fsdp=4", "--workdir", two)
    assert result.returncode == 0, result.stderr[-3000:]

    config = glue_config.get_config("tiny")
    config.update(init_from=mlm)
    config.data.update(source="files", data_dir=str(tmp_path / "glue_data"), cache_dir=cache)
    one = str(tmp_path / "one")
    train_and_evaluate(config, one, devices=jax.devices()[:1])
    _assert_same_metrics(_records(two), _records(one))
