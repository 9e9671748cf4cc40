"""experiments.profile_warps: the trace summary (a synthetic Mosaic GPU profiler trace) and its
refusal without a GPU."""

import sys

import jax
import pytest

from experiments import profile_warps


def trace(programs, chunk_cycles):
    """A trace as Mosaic GPU's profiler writes it: per program three warpgroups (tid 1 + 3 p +
    wg), each with one region per chunk of ``chunk_cycles[wg]`` cycles and a 10-cycle gap."""
    events = []
    for p in range(programs):
        for wg, (name, cycles) in enumerate(chunk_cycles):
            t = 1000.0 * p
            for _ in range(4):
                tid = 1 + 3 * p + wg
                events += [{"name": name, "ph": "B", "ts": t / 1e3, "pid": 1, "tid": tid},
                           {"name": name, "ph": "E", "ts": (t + cycles) / 1e3, "pid": 1,
                            "tid": tid}]
                t += cycles + 10
    return {"traceEvents": events}


def test_region_cycles_and_table():
    regions = [("chain: update", 90), ("outputs: y wgmmas", 190), ("memory: wait", 40)]
    assert profile_warps.warpgroup_names(1) == profile_warps.WARPGROUPS
    assert profile_warps.warpgroup_names(2) == ("chain", "outputs 1", "outputs 2", "memory")
    calls, spans = profile_warps.region_cycles(trace(2, regions))
    assert sorted(calls) == sorted(zip(profile_warps.WARPGROUPS, (n for n, _ in regions)))
    assert calls["outputs", "outputs: y wgmmas"] == pytest.approx([190] * 8)
    assert spans["chain"] == pytest.approx([4 * 90 + 3 * 10] * 2)
    rows = profile_warps.table(calls, spans)
    chain = next(r for r in rows if r.startswith("| chain "))
    assert chain == "| chain | update | 4 | 90 | 92% |"  # 360 of 390 cycles


def test_refuses_without_a_gpu(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["profile_warps"])
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    with pytest.raises(SystemExit, match="needs a Hopper GPU"):
        profile_warps.main()


def test_kernel_refuses_a_trace_without_room():
    """At Kp 128 with 3 stages the kernel leaves no shared memory for the trace: one line that
    names the fix."""
    import jax.numpy as jnp

    from pallas_kernels.mosaic_causal_warps import causal_forward_warps
    q = jnp.zeros((1, 128, 1, 128), jnp.bfloat16)
    g = jnp.zeros((1, 128, 1), jnp.float32)
    with pytest.raises(ValueError, match="pass stages=2"):
        causal_forward_warps(q, q, q, g, stages=3, profile_dir="/tmp")
