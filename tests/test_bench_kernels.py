"""experiments/bench_kernels.py on CPU: the jla peer rows compute what our ops compute (so the
benchmark compares equal work), and the report pairs them with ours.

jla (``jax-linear-attention``, a test extra) runs its plain-JAX implementations here; on a GPU
the same calls take its Mosaic GPU kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import bench_kernels
from lion_jax import ops

RTOL = 1e-5  # float32 (ARCHITECTURE.md)


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.fixture
def shapes_and_inputs(rng):
    B, L, H, D = 2, int(rng.integers(37, 80)), 3, 8
    q, k, v, _, g = bench_kernels.inputs(B, L, H, D, rng)
    g = g * 10  # log-decays down to -1: the masks span several orders of magnitude
    return [jnp.asarray(x) for x in (q, k, v, g)]


def test_jla_rows_compute_our_ops(shapes_and_inputs):
    q, k, v, g = shapes_and_inputs
    cases = bench_kernels.jla_cases()
    assert sorted(cases) == ["jla_gla", "jla_lion_2pass", "jla_simple_gla"]
    with jax.default_matmul_precision("float32"):
        causal = ops.causal_linear_attention(q, k, v, g, impl="attention")
        per_feature = ops.causal_linear_attention(
            q, k, v, jnp.broadcast_to(g[..., None], q.shape), impl="attention")
        lion = ops.lion_attention(q, k, v, g, normalize=False, impl="attention")
        got = {name: jax.jit(fn)(q, k, v, g) for name, fn in cases.items()}
    for name, want in (("jla_simple_gla", causal), ("jla_gla", per_feature),
                       ("jla_lion_2pass", lion)):
        assert not np.isnan(np.asarray(got[name])).any(), name
        assert rel_err(got[name], want) <= RTOL, (name, rel_err(got[name], want))


def test_jla_rows_have_gradients(shapes_and_inputs):
    q, k, v, g = shapes_and_inputs
    fn = bench_kernels.jla_cases()["jla_lion_2pass"]
    dy = jnp.ones_like(v)
    with jax.default_matmul_precision("float32"):
        grads = jax.grad(lambda *a: jnp.sum(fn(*a) * dy), argnums=(0, 1, 2, 3))(q, k, v, g)
        want = jax.grad(lambda *a: jnp.sum(ops.lion_attention(
            *a, normalize=False, impl="attention") * dy), argnums=(0, 1, 2, 3))(q, k, v, g)
    for got, ref in zip(grads, want):
        assert rel_err(got, ref) <= 1e-4


def test_report_pairs_ours_with_jla():
    rows = [dict(op=op, kind=kind, L=4096, D=64, ms=ms, mib=None)
            for op, ms in (("pallas_causal_2pass", 1.0), ("jla_simple_gla", 1.5),
                           ("pallas_causal_per_feature", 2.0), ("jla_gla", 1.0),
                           ("pallas_lion_plain", 1.0), ("jla_lion_2pass", 3.0))
            for kind in ("fwd", "fwd+bwd")]
    table = bench_kernels.markdown(rows, "# test")
    assert "| pallas_causal_2pass vs jla_simple_gla | fwd | 64 | 1.50 |" in table
    assert "| pallas_causal_per_feature vs jla_gla | fwd+bwd | 64 | 0.50 |" in table
    assert "| pallas_lion_plain vs jla_lion_2pass | fwd+bwd | 64 | 3.00 |" in table


@pytest.mark.parametrize("name", sorted(bench_kernels.SETTINGS))
def test_traced_under_switches_the_settings(name):
    """The A/B rows trace their op under their settings of pallas_kernels' modules (TF32 scan
    products and the chunk-parallel backward of the per-feature op; the causal op's forward
    as two kernels; the Triton gradients kernels in place of the Mosaic ones; the Mosaic
    kernels' approximate exp) and leave the defaults in place afterwards, also after an
    error; the report sets them against jla or, where jla has no such op (normalised LION),
    against the default op."""
    settings = bench_kernels.SETTINGS[name]
    assert name in bench_kernels.jax_cases(quick=False)

    def now():
        return {key: getattr(*bench_kernels.setting_place(key)) for key in settings}
    defaults = now()
    assert defaults != settings
    seen = []
    with bench_kernels.traced_under(settings):
        seen.append(now())
    assert seen == [settings]
    assert now() == defaults
    with pytest.raises(ZeroDivisionError), bench_kernels.traced_under(settings):
        1 / 0
    assert now() == defaults
    pairs = [(o, p) for o, p in bench_kernels.RATIOS if name in (o, p)]
    ours, peer = next((pair for pair in pairs if pair[1].startswith("jla")), pairs[0])
    other = peer if ours == name else ours
    assert other.startswith("jla") or other in ("pallas_causal_2pass", "pallas_lion_2pass")
    rows = [dict(op=op, kind="fwd+bwd", L=4096, D=64, ms=ms, mib=None)
            for op, ms in ((ours, 2.0), (peer, 1.0))]
    assert (f"| {ours} vs {peer} | fwd+bwd | 64 | 0.50 |"
            in bench_kernels.markdown(rows, "# test"))


def test_targets_mark_the_misses():
    """The targets table: speed ratios against the fastest peer, LION's cost against our
    causal op, cuDNN only at 16K; a ratio beyond its bound is marked "(miss)"; --acceptance
    times every op the targets name."""
    times = {("pallas_causal_2pass", "fwd"): 1.0, ("jla_simple_gla", "fwd"): 0.8,
             ("pallas_causal_2pass", "fwd+bwd"): 2.0, ("jla_simple_gla", "fwd+bwd"): 2.5,
             ("fla_simple_gla_gamma", "fwd+bwd"): 4.0, ("fla_linear_attn", "fwd+bwd"): 2.9,
             ("pallas_lion_2pass", "fwd+bwd"): 3.0, ("cudnn_full", "fwd+bwd"): 40.0}
    rows = [dict(op=op, kind=kind, L=L, D=64, ms=ms, mib=None)
            for (op, kind), ms in times.items() for L in (4096, 16384)]
    table = bench_kernels.markdown(rows, "# test")
    assert "| causal vs jla simple_gla | fwd | 64 | >= 1.0 | 0.80 (miss) | 0.80 (miss) |" in table
    assert "| causal vs jla simple_gla | fwd+bwd | 64 | >= 1.2 | 1.25 | 1.25 |" in table
    # the faster FLA kernel: 2.9 / 2.0
    assert ("| causal vs FLA's fastest | fwd+bwd | 64 | >= 1.5 | 1.45 (miss) | 1.45 (miss) |"
            in table)
    assert "| LION normalised / our causal | fwd+bwd | 64 | <= 1.6 | 1.50 | 1.50 |" in table
    assert "| LION normalised vs cuDNN | fwd+bwd | 64 | >= 10.0 | - | 13.33 |" in table
    assert "per-feature" not in table.split("Targets")[1]  # neither side ran
    named = {op for _, ours, peers, *_ in bench_kernels.TARGETS for op in (ours, *peers)}
    assert {op[:-1] for op in bench_kernels.ACCEPTANCE["ops"]} == named
    assert bench_kernels.ACCEPTANCE["only"] == {"cudnn_full$": 16384}  # its one target's L


def test_resume_keeps_this_machines_rows_and_finished_shapes(tmp_path, monkeypatch, capsys):
    """``--resume``: rows of an earlier call on this machine (same boot, device and settings)
    are kept and not measured again; another machine's of the same device kind only where it
    finished the shape (so every shape's rows come from one machine); other settings' or
    another device kind's not at all."""
    import json
    settings = dict(batch=1, heads=1, reps=2, jax=jax.__version__)
    here = bench_kernels.machine()
    device = here.split(", boot ")[0]
    path = tmp_path / "results.json"
    earlier = dict(op="xla_chunk_causal", kind="fwd", L=64, D=8, ms=9.0, mib=None)
    path.write_text(json.dumps(dict(settings, device=device, machine=here, rows=[earlier])))
    rows, finished = bench_kernels.resumed_rows(str(path), settings)
    assert rows == [dict(earlier, machine=here)] and finished == []
    assert "1 rows from earlier calls (1 on this machine)" in capsys.readouterr().out
    done = bench_kernels.bench_shape(1, 64, 1, 8, 2, np.random.default_rng(0), rows, False,
                                     lambda: False, lambda: None, ["xla_chunk_causal$"])
    assert done and [(r["kind"], r["ms"]) for r in rows][0] == ("fwd", 9.0)  # not measured again
    assert [(r["kind"], r["machine"]) for r in rows] == [("fwd", here), ("fwd+bwd", here)]
    assert bench_kernels.resumed_rows(str(path), dict(settings, reps=3)) == ([], [])
    assert "differs in reps" in capsys.readouterr().out
    # another machine of this device kind: finished shapes only
    other = dict(earlier, L=128, machine=f"{device}, boot 1")
    path.write_text(json.dumps(dict(settings, device=device, machine=f"{device}, boot 1",
                                    rows=[earlier, other], finished=[[128, 8]])))
    assert bench_kernels.resumed_rows(str(path), settings) == ([other], [[128, 8]])
    assert "1 of another machine's unfinished shapes dropped" in capsys.readouterr().out
    assert bench_kernels.bench_shape(1, 64, 1, 8, 2, np.random.default_rng(0), [], False,
                                     lambda: True, lambda: None, ["xla_chunk_causal$"]) is False
    monkeypatch.setattr(bench_kernels, "machine", lambda: "another GPU, boot 0")
    assert bench_kernels.resumed_rows(str(path), settings) == ([], [])
    assert "differs in device" in capsys.readouterr().out
    assert bench_kernels.resumed_rows(str(tmp_path / "none.json"), settings) == ([], [])


def test_ops_of_a_shape_are_timed_in_interleaved_rounds(monkeypatch, rng):
    """bench_shape compiles every (op, pass) first, then each round samples all of them in
    turn; a row is the median of its op's samples, with the quartiles."""
    events = []

    def fake_prepared(fn, args, inner=5):
        name = f"#{len([e for e in events if e[0] == 'prepare'])}"
        events.append(("prepare", name))
        value = iter(float(x) for x in rng.permutation(7) + 1)

        def sample():
            events.append(("sample", name))
            return next(value)
        return sample, 1.0

    monkeypatch.setattr(bench_kernels, "prepared_jax", fake_prepared)
    rows, saved = [], []
    bench_kernels.bench_shape(1, 64, 1, 8, 7, np.random.default_rng(0), rows, False,
                              lambda: False, lambda: saved.append(1),
                              ["xla_chunk_causal$", "xla_chunk_lion$"])
    kinds = [e[0] for e in events]
    assert kinds == ["prepare"] * 4 + ["sample"] * 28  # 2 ops x 2 passes, 7 rounds
    assert [e[1] for e in events[4:8]] == ["#0", "#1", "#2", "#3"] == [e[1] for e in events[-4:]]
    assert [(r["op"], r["kind"]) for r in rows] == [
        (op, kind) for op in ("xla_chunk_causal", "xla_chunk_lion") for kind in ("fwd", "fwd+bwd")]
    for r in rows:  # samples 1..7 in some order: median 4, quartiles 2.5 and 5.5
        assert (r["q25"], r["ms"], r["q75"], r["mib"]) == (2.5, 4.0, 5.5, 1.0), r
    assert saved == [1]
