"""experiments.profile_train: its HLO and trace helpers on made-up input, and a whole run on
the CPU (the ListOps ``tiny`` config) with the files it writes."""

import json
import subprocess
import sys

import numpy as np

from experiments import profile_train

HLO = """
  %fusion.3 = f32[4]{0} fusion(f32[4]{0} %p), kind=kLoop, calls=%fused_computation.3, \
metadata={op_name="jit(step)/jvp(Model)/block_0/mixer/jit(_where)/select_n"}
  ROOT %input_reduce_fusion.12 = f32[] fusion(f32[4]{0} %fusion.3), kind=kInput, \
metadata={op_name="jit(step)/transpose(jvp(Model))/block_1/mlp/reduce_sum"}
  %custom-call.7 = f32[4]{0} custom-call(f32[4]{0} %p), custom_call_target="__gpu$xla.gpu.triton"
"""


def test_op_names_and_module_groups():
    names = profile_train.op_names(HLO)
    assert names["fusion.3"] == names["fusion_3"] == (
        "jit(step)/jvp(Model)/block_0/mixer/jit(_where)/select_n")
    assert names["input_reduce_fusion.12"].endswith("mlp/reduce_sum")
    assert "custom-call.7" not in names  # no metadata
    assert profile_train.module_group(names["fusion.3"]) == "mixer/jit"
    assert profile_train.module_group(names["input_reduce_fusion.12"]) == "mlp"
    assert profile_train.module_group("jit(step)/optax/adam/add") == "optimizer"
    assert profile_train.module_group("") == "other (loss, optimizer, glue)"


def test_summarize_sums_per_step_and_names_the_sources():
    rng = np.random.default_rng()
    names = profile_train.op_names(HLO)
    steps = int(rng.integers(2, 6))
    a, b, c = (int(t) for t in rng.integers(1_000, 100_000, size=3))
    events = [("fusion.3", a), ("fusion.3", b), ("input_reduce_fusion.12", c),
              ("nvjet_sm90_gemm", a)]  # a kernel inside a command buffer: no instruction
    by_group, by_kind, by_op, sources = profile_train.summarize(events, names, steps, top=None)
    ms = lambda ns: ns / 1e6 / steps  # noqa: E731
    assert np.isclose(by_group["mixer/jit"], ms(a + b))
    assert np.isclose(by_group["mlp"], ms(c))
    assert np.isclose(by_kind["matmul"], ms(a)) and np.isclose(by_kind["reduction"], ms(c))
    assert np.isclose(by_op["fusion (mixer/jit)"], ms(a + b))
    assert sources["fusion (mixer/jit)"] == [names["fusion.3"]]
    assert sources["nvjet_sm90_gemm (other (loss, optimizer, glue))"] == []
    assert np.isclose(sum(by_group.values()), sum(by_op.values()))
    assert np.isclose(by_kind["fusion"], ms(a + b))


def test_op_kinds_do_not_read_the_backward_path_as_a_transpose():
    backward = "jit(step)/transpose(jvp(Model))/block_1/mixer/"
    assert profile_train.op_kind("loop_add_fusion.2", backward + "add") == "fusion"
    assert profile_train.op_kind("custom-call.7", backward + "pallas_call") == "pallas kernel"
    assert profile_train.op_kind("custom-call.9", backward + "dot_general") == "matmul"
    assert profile_train.op_kind("copy.4", backward + "add") == "copy/transpose"
    assert profile_train.op_kind("loop_transpose_fusion", backward + "add") == "copy/transpose"


def test_a_run_on_the_cpu_writes_the_tables_and_the_hlo(tmp_path):
    out = tmp_path / "profile"
    run = subprocess.run(
        [sys.executable, "-m", "experiments.profile_train", "--config",
         "configs/lra/listops.py:tiny", "--steps", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "train steps back to back, one sync" in run.stdout
    assert "device time by module" in run.stdout
    profile = json.loads((out / "profile.json").read_text())
    assert profile["step_ms"] > 0 and profile["device_ms"] > 0
    assert set(profile["op_sources"]) == set(profile["all_ops"])
    assert any("mixer" in name for names in profile["op_sources"].values() for name in names)
    assert "HloModule" in (out / "step.hlo.txt").read_text()
