"""experiments/bench_scan.py on CPU: every side runs forward and backward at small sizes, the
sides agree with their definitions, the table and plot, and the one `error:` line without a
GPU."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from experiments import bench_scan
from experiments.bench_vision import two_panels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_rows_table_and_plot(tmp_path):
    lengths = [16, 40]
    results = bench_scan.rows(lengths, batch=1, heads=2, dim=8, calls=1)
    assert set(results) == {(n, L) for n in bench_scan.names() for L in lengths}
    for value in results.values():
        assert not isinstance(value, str), value
        assert value[0] > 0 and value[1] > 0
    table = bench_scan.markdown("cpu", 1, 2, 8, 1, results, lengths)
    assert "| LNA, one scan, fwd+bwd |" in table and "| two scans, fwd |" in table
    assert table.count("x |") >= 4  # the ratio rows
    two_panels(str(tmp_path / "plot.png"), bench_scan.names(), results, lengths,
               xlabel="L", speed_label="ms", xscale="log")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_two_scans_are_the_forward_plus_the_reversed_causal_pass(rng):
    (q, k, v, a), _ = bench_scan.inputs(2, 23, 3, 8, jnp.float32, seed=int(rng.integers(1000)))
    got = bench_scan.FUNCTIONS["two scans"](q, k, v, a)
    # Materialized, float64: the forward pass decays j -> i (j <= i) by a_{j+1} ... a_i, the
    # reversed pass j -> i (j >= i) by a_i ... a_{j-1}; the diagonal counts twice.
    a64 = np.transpose(np.asarray(a, np.float64), (0, 2, 1))  # [B, H, L]
    A = np.cumsum(a64, axis=-1)
    B_ = A - a64  # the cumulative decay before each token
    i, j = np.arange(23)[:, None], np.arange(23)[None, :]
    fwd = np.where(j <= i, np.exp(np.minimum(A[..., :, None] - A[..., None, :], 0)), 0)
    bwd = np.where(j >= i, np.exp(np.minimum(B_[..., None, :] - B_[..., :, None], 0)), 0)
    s_ = np.einsum("bihk,bjhk->bhij", np.asarray(q, np.float64), np.asarray(k, np.float64))
    want = np.einsum("bhij,bjhv->bihv", s_ * (fwd + bwd), np.asarray(v, np.float64))
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_lna_side_is_the_layer_core(rng):
    (q, k, v, a), _ = bench_scan.inputs(1, 19, 2, 8, jnp.float32, seed=int(rng.integers(1000)))
    got = bench_scan.FUNCTIONS["LNA, one scan"](q, k, v, a)
    w = jax.nn.softmax(k, axis=1)
    want = jnp.einsum("blhk,bhkv->blhv", jax.nn.silu(q), jnp.einsum("blhk,blhv->bhkv", w, v))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_no_gpu_is_one_error_line():
    result = subprocess.run([sys.executable, "-m", "experiments.bench_scan", "--lengths", "64"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == "error: bench_scan needs a GPU"
    bad = subprocess.run([sys.executable, "-m", "experiments.bench_scan", "--lengths", "a"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.stderr.strip().splitlines()[-1].startswith("error: --lengths must be integers")


def test_timed_is_the_median_of_samples(monkeypatch):
    """bench_value_decay.timed (every bench_* script's clock): after one warm-up call, SAMPLES
    samples of `calls` calls and one sync each, the median sample in ms per call."""
    from experiments import bench_value_decay

    durations = iter([4.0, 1.0, 9.0, 2.5, 7.0])  # seconds per sample, in order
    clock = {"now": 0.0, "start": True}

    def fake_clock():  # a sample's start reads the clock, its end adds the sample's duration
        if not clock["start"]:
            clock["now"] += next(durations)
        clock["start"] = not clock["start"]
        return clock["now"]

    calls = []
    monkeypatch.setattr(bench_value_decay.time, "perf_counter", fake_clock)
    got = bench_value_decay.timed(lambda x: calls.append(x) or jnp.zeros(()), 1.0, calls=2)
    assert bench_value_decay.SAMPLES == 5
    assert len(calls) == 1 + 5 * 2
    assert got == 4.0 / 2 * 1e3
    assert "median of 5 samples, each 2 calls" in bench_value_decay.timing(2)
