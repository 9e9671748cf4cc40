"""experiments/bench_mlm.py on CPU: its building blocks with BERT-tiny at short lengths (the
cuDNN side fails on CPU and must come back as a row cell, not an exception), the Markdown
table's shape, the plot file, and the script's one `error:` line without a GPU."""

import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from experiments import bench_mlm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LENGTHS = [32, 64]
VOCAB = 500


@pytest.fixture(scope="module")
def measured():
    named = bench_mlm.sides("tiny", max(LENGTHS), VOCAB, lion_impls=("chunk", "recurrent"))
    return bench_mlm.run_sides(named, 2, LENGTHS, VOCAB, calls=1)


def test_sides_and_models():
    named = bench_mlm.sides("base", 14336, 30522)
    assert [n for n, _ in named] == ["BERT, cuDNN flash", "BERT, XLA softmax", "LION-S, pallas",
                                     "LION-S, chunk", "LION-S, recurrent"]
    bert, lion = named[0][1].encoder, named[2][1].encoder
    assert bert["pos_emb"] == "learned" and bert["max_len"] == 14336
    assert bert["mixer_kind"] == "softmax" and bert["mixer"] == {"impl": "cudnn"}
    assert lion["pos_emb"] == "none" and lion["mixer"] == {"variant": "s", "impl": "pallas"}
    assert bert["d_model"] == 768 and bert["num_layers"] == 12 and bert["vocab_size"] == 30522
    assert bert["dtype"] == jnp.bfloat16 and bert["pad_id"] is None


def test_inputs_are_fifteen_percent_distinct_positions():
    tokens, positions = bench_mlm.inputs(3, 100, VOCAB)
    assert tokens.shape == (3, 100) and positions.shape == (3, 15)
    assert int(tokens.min()) >= 0 and int(tokens.max()) < VOCAB
    for row in positions.tolist():
        assert row == sorted(set(row)) and 0 <= row[0] and row[-1] < 100
    assert bench_mlm.inputs(1, 4, VOCAB)[1].shape == (1, 1)  # at least one position


def test_cudnn_fails_as_a_row_and_the_others_run(measured):
    names, results, train_results = measured
    assert names == ["BERT, cuDNN flash", "BERT, XLA softmax", "LION-S, chunk",
                     "LION-S, recurrent"]
    assert train_results is None
    assert set(results) == {(n, L) for n in names for L in LENGTHS}
    for L in LENGTHS:
        assert isinstance(results["BERT, cuDNN flash", L], str)
        for n in names[1:]:
            ms, mib = results[n, L]
            assert ms > 0 and mib > 0


def test_markdown_table_and_plot(measured, tmp_path):
    names, results, _ = measured
    text = bench_mlm.markdown("cpu", "tiny", 2, 1, names, results, LENGTHS)
    lines = text.splitlines()
    rows = [line for line in lines if line.startswith("|")]
    assert rows[0] == "| model | 32 | 64 |" and rows[1] == "| --- | --- | --- |"
    assert len(rows) == 2 + len(names)
    assert all(r.count("|") == len(LENGTHS) + 2 for r in rows)
    assert rows[2].startswith("| BERT, cuDNN flash | ")
    assert "masked positions" in lines[0] and "batch 2" in lines[0]
    path = tmp_path / "plot.png"
    bench_mlm.plot(str(path), names, results, LENGTHS)
    assert path.stat().st_size > 0


def test_train_step_table():
    named = bench_mlm.sides("tiny", 32, VOCAB, softmax_impls=(), lion_impls=("chunk",))
    names, results, train_results = bench_mlm.run_sides(named, 1, [32], VOCAB, calls=1,
                                                        train=True)
    ms, mib = train_results["LION-S, chunk", 32]
    assert ms > 0 and mib > 0
    text = bench_mlm.markdown("cpu", "tiny", 1, 1, names, results, [32], train_results)
    assert text.count("| model | 32 |") == 2 and "Forward + backward" in text


def test_main_without_gpu_is_one_error_line():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-m", "experiments.bench_mlm", "--size", "tiny"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
