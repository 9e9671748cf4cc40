"""experiments.profile_kernels: its silu_l2 and silu_l2_qkv sweeps run end to end (on the CPU
through the Pallas interpreter, at a small shape; the GPU runs are in docs/benchmarks.md)."""

from experiments import profile_kernels


def test_feature_map_sweep_times_every_setting(capsys):
    profile_kernels.feature_map_settings(1, batch=2, length=20, real=17, heads=2, dim=16)
    out = capsys.readouterr().out
    assert "== silu_l2 at [2, 20, 2, 16] bf16, tokens past 17 dropped" in out
    assert "== silu_l2_qkv at [2, 20, 96] bf16 (q, k, v of 2 heads of 16)" in out
    lines = [line for line in out.splitlines() if line.startswith("   ")]
    assert len(lines) == (1 + 16) + (1 + 9)  # XLA's and every setting, for each kernel
    assert not [line for line in lines if "failed" in line]
    assert sum("(default)" in line for line in lines) == 2
