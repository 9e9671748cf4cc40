"""experiments/ab_settings.py on CPU: variants parse or fail with one line, the settings are in
place only while a variant is traced, a run writes its table, json and plot, and --base times a
second copy of the kernels."""

import json
import os

import pytest

from experiments import ab_settings
from pallas_kernels import linear_attention, mosaic_tiles


def test_parse_variant():
    name, settings = ab_settings.parse_variant(
        'both:mosaic_tiles.APPROX_MATH=True, GRADS_KERNEL="triton"')
    assert name == "both"
    assert settings == {"mosaic_tiles.APPROX_MATH": True, "GRADS_KERNEL": "triton"}
    # commas inside brackets belong to the value
    assert ab_settings.parse_variant("s:mosaic_causal_warps.STAGES=(4, 2),GRADS_KERNEL='a'") \
        == ("s", {"mosaic_causal_warps.STAGES": (4, 2), "GRADS_KERNEL": "a"})


@pytest.mark.parametrize("text, says", [
    ("approx", "NAME:SETTING=VALUE"),
    ("a:APPROX_MATH", "is not SETTING=VALUE"),
    ("a:nowhere.APPROX_MATH=True", "no module"),
    ("a:mosaic_tiles.NOT_A_SETTING=1", "has no setting"),
    ("a:GRADS_KERNEL=triton", "quote strings"),
])
def test_bad_variants_say_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        ab_settings.parse_variant(text)


def test_cli_errors_are_one_line(capsys):
    for argv in (["--variant", "x"], ["--op", "no_such_op"],
                 ["--variant", "default:GRADS_KERNEL='triton'"], ["--base", "no-such-rev"]):
        with pytest.raises(SystemExit):
            ab_settings.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert "error:" in err[-1], err


def test_run_writes_results_and_restores_settings(tmp_path, rng):
    seen = []
    traced = ab_settings.traced_under

    def spy(settings):  # the settings in place while each variant is traced
        seen.append(dict(settings))
        return traced(settings)

    ab_settings.traced_under = spy
    try:
        L = 64 * int(rng.integers(1, 4))  # the op takes whole chunks of 64
        ab_settings.main(["--op", "pallas_causal_2pass", "--dims", "16", "--length", str(L),
                          "--batch", "1", "--heads", "2", "--rounds", "3", "--out",
                          str(tmp_path), "--variant", 'tr:GRADS_KERNEL="triton"'])
    finally:
        ab_settings.traced_under = traced
    assert seen == [{}, {}, {"GRADS_KERNEL": "triton"}] * 2  # fwd, then fwd+bwd
    assert linear_attention.GRADS_KERNEL == "auto" and mosaic_tiles.APPROX_MATH is False
    with open(tmp_path / "results.json") as f:
        rows = json.load(f)["rows"]
    assert [(r["kind"], r["variant"]) for r in rows] == [
        (kind, v) for kind in ("fwd", "fwd+bwd") for v in ("default", "default again", "tr")]
    for r in rows:
        assert r["rounds"] == 3 and 0 < r["q25"] <= r["ms"] <= r["q75"], r
        assert r["variant"] != "default" or r["ratio"] == 1.0
    assert "| pallas_causal_2pass | 16 | fwd+bwd | tr |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.png").stat().st_size > 0
    ab_settings.main(["--op", "pallas_causal_2pass", "--dims", "16", "--length", str(L),
                      "--batch", "1", "--heads", "2", "--rounds", "2", "--out",
                      str(tmp_path / "fwd"), "--pass", "fwd"])
    with open(tmp_path / "fwd" / "results.json") as f:
        assert {r["kind"] for r in json.load(f)["rows"]} == {"fwd"}


def test_base_runs_a_second_copy_of_the_kernels(tmp_path, rng):
    """--base DIR: the ops traced with the copy in DIR (imported as a second package) for the
    variant "base DIR", this checkout's for the others, in the same rounds."""
    import shutil
    import sys
    root = tmp_path / "base"
    shutil.copytree(os.path.join(ab_settings.ROOT, "pallas_kernels"), root / "pallas_kernels",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(root / "pallas_kernels" / "__init__.py", "a") as f:  # counts its op's traces
        f.write("\nTRACES = []\n_op = causal_linear_attention\n\n\n"
                "def causal_linear_attention(*args, **kwargs):\n"
                "    TRACES.append(1)\n    return _op(*args, **kwargs)\n")
    out = tmp_path / "out"
    ab_settings.main(["--op", "pallas_causal_2pass", "--dims", "16", "--length",
                      str(64 * int(rng.integers(1, 3))), "--batch", "1", "--heads", "2",
                      "--rounds", "2", "--out", str(out), "--base", str(root)])
    assert sys.modules["pallas_kernels_base"].TRACES == [1, 1]  # fwd, fwd+bwd: once each
    with open(out / "results.json") as f:
        results = json.load(f)
    assert [r["variant"] for r in results["rows"]][:3] == [
        "default", "default again", "base base"]
    assert "pallas_kernels_base at its defaults" in results["header"]


def test_base_revision_and_bad_bases():
    """--base REV writes the revision's modules with their imports renamed; a base that is
    neither a directory with the package nor a commit is one line."""
    package = ab_settings.revision_kernels("HEAD")
    assert package.__name__.startswith("pallas_kernels_")
    assert callable(package.causal_linear_attention)
    assert package.linear_attention.__name__ == f"{package.__name__}.linear_attention"
    with pytest.raises(ValueError, match="neither a directory"):
        ab_settings.revision_kernels("no-such-revision")
