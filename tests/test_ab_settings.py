"""experiments/ab_settings.py on CPU: variants parse or fail with one line, the settings are in
place only while a variant is traced, and a run writes its table, json and plot."""

import json

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
                 ["--variant", "default:GRADS_KERNEL='triton'"]):
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
