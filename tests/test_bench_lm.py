"""experiments/bench_lm.py on CPU: its training and decoding measurements with tiny models, the
tables and plots, and the script's one `error:` line without a GPU."""

import os
import subprocess
import sys

from experiments import bench_lm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 64


def dims(arch):
    return dict(d_model=32, num_layers=1, num_heads=2, mlp_dim=32)


def test_train_and_decode_rows_tables_and_plots(tmp_path):
    archs, lengths, contexts = ["llama", "tnl"], [16, 32], [8, 24]
    train = bench_lm.train_rows(archs, dims, VOCAB, 64, lengths, calls=1)
    names, decode = bench_lm.decode_rows(["hgrn2", "llama"], ["llama"], dims, VOCAB,
                                         contexts, calls=1)
    assert names == ["hgrn2, state", "llama, state", "llama, recompute"]
    for results in (train, decode):
        for value in results.values():
            assert not isinstance(value, str), value
            assert value[0] > 0 and value[1] > 0
    table = bench_lm.markdown("cpu", "tiny", 64, 1, archs, train, lengths, names, decode,
                              contexts)
    assert "| tnl |" in table and "| llama, recompute |" in table
    bench_lm.plot(str(tmp_path / "plot.png"), archs, train, lengths, names, decode, contexts)
    assert (tmp_path / "plot_train.png").exists() and (tmp_path / "plot_decode.png").exists()


def test_recurrent_state_memory_is_flat_in_the_context():
    """The compiled memory of one decoding step: constant for a linear model, growing with
    the KV cache for LLaMA."""
    _, decode = bench_lm.decode_rows(["tnl", "llama"], [], dims, VOCAB, [16, 256], calls=1)
    assert decode["tnl, state", 16][1] == decode["tnl, state", 256][1]
    assert decode["llama, state", 256][1] > decode["llama, state", 16][1]


def test_needs_a_gpu_and_checks_its_flags():
    for args, message in ((["--archs", "gpt"], "unknown archs ['gpt']"),
                          (["--size", "5m"], "unknown LM size '5m'"),
                          ([], "bench_lm needs a GPU")):
        out = subprocess.run([sys.executable, "-m", "experiments.bench_lm", *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 1 and len(lines) == 1, out.stderr
        assert lines[0].startswith(f"error: {message}"), out.stderr
