"""lion_jax.scaling.fit: the scaling-law fitter (digest scaling-laws-linear-lms.md 3, 9.2.4)."""

import dataclasses

import numpy as np
import pytest

from lion_jax.scaling.fit import (PAPER_LAWS, UNITS, PowerLaw, Run, compute_grid, envelope,
                                  fit_offset_power_law, fit_power_law, fit_scaling_laws,
                                  ordering, plot_figure1, synthetic_runs)

PAPER_ORDER = ["hgrn2", "tnl", "cosformer2", "llama"]  # lowest loss first (digest 3.4)
# The 7B models' full-run compute in PF-days (digest 2.3 and 3.4).
RUN_7B = {"llama": 179.0, "tnl": 136.3, "hgrn2": 135.6, "cosformer2": 137.4}
# 48 log-spaced sizes over the paper's non-embedding range (20.5M-6.5B). N_opt on the envelope
# is a staircase, one step per winning size, and a line through M whole steps is flatter by
# ~a/M^2: ~3e-4 here (M = 46 bracketed steps), ~1.3e-3 with 25 sizes (too much for a within
# 1e-3), ~0.04 with the paper's six; D_opt's slope is steeper by ~(1-b)/M^2.
SIZES = np.geomspace(2e7, 6.5e9, 48)


def law_errors(fit, law):
    """alpha, log beta errors of the L, N_opt, D_opt laws."""
    return {name: (getattr(fit, name).alpha - getattr(law, name).alpha,
                   np.log(getattr(fit, name).beta / getattr(law, name).beta))
            for name in ("loss", "params", "tokens")}


def test_fit_power_law_is_exact_on_noiseless_data(rng):
    beta, alpha = np.exp(rng.uniform(-5, 5)), rng.uniform(-1, 1)
    x = np.geomspace(1e-3, 1e4, 37)
    fit = fit_power_law(x, beta * x ** alpha)
    assert isinstance(fit, PowerLaw)
    np.testing.assert_allclose(fit, (beta, alpha), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("arch", PAPER_ORDER)
def test_fitter_recovers_the_paper_laws_from_synthetic_runs(arch, rng):
    """0.1% loss noise, curvature 1 (synthetic_runs explains why): alpha's within 1e-3 and
    log beta's within 1e-2. Measured over 200 seeds per arch: |alpha_C| <= 7e-5,
    |log beta_C| <= 3.3e-3 (the envelope's bumps), |a| <= 6.7e-4 (mean -3e-4: the staircase,
    std 1.4e-4), |b| <= 5.4e-4, |log beta_N| <= 1.1e-3, |log beta_D| <= 8.1e-4."""
    law = PAPER_LAWS[arch]
    runs = synthetic_runs(law, SIZES, noise=1e-3, rng=rng)
    fit = fit_scaling_laws(runs, points=4000)
    assert fit.arch == arch and fit.unit == "pf-days" and fit.eps == 0
    for name, (d_alpha, d_log_beta) in law_errors(fit, law).items():
        assert abs(d_alpha) < 1e-3 and abs(d_log_beta) < 1e-2, (name, d_alpha, d_log_beta)
    # the envelope: one point per covered grid compute, each from the run winning there
    env = fit.envelope
    assert np.all(np.diff(env.flops) > 0) and np.all(np.diff(env.params) >= 0)
    assert env.params[0] > SIZES[0] and env.params[-1] < SIZES[-1]  # bracketed
    for i in (0, len(env.run) // 2, len(env.run) - 1):
        run = runs[env.run[i]]
        assert env.params[i] == run.params
        np.testing.assert_allclose(env.tokens[i], np.interp(
            env.flops[i], run.flops, run.tokens), rtol=1e-9)  # tokens are linear in flops


def test_envelope_without_bracketing_keeps_every_covered_point():
    runs = synthetic_runs(PAPER_LAWS["tnl"], SIZES[::8], span=10)
    grid = compute_grid(runs, 500)
    loose = envelope(runs, np.concatenate([grid[:1] / 10, grid, grid[-1:] * 10]),
                     bracketed=False)
    assert loose.flops[0] == runs[0].flops[0] and loose.flops[-1] == runs[-1].flops[-1]
    assert loose.params[0] == SIZES[0] and loose.params[-1] == SIZES[-8]  # not extrapolated
    np.testing.assert_allclose(loose.loss[0], runs[0].loss[0], rtol=1e-12)
    tight = envelope(runs, loose.flops)
    assert set(tight.params) == set(SIZES[8:-8:8])


def test_smoothing_averages_logged_log_losses():
    run = Run("r", "x", 1.0, [1, 2, 3], [1.0, 2.0, 4.0], [np.e, np.e ** 4, np.e])
    env = envelope([run], run.flops, smooth=3, bracketed=False)
    np.testing.assert_allclose(np.log(env.loss), [2.5, 2.0, 2.5])
    env = envelope([run], run.flops, smooth=5, bracketed=False)  # wider than the run
    np.testing.assert_allclose(np.log(env.loss), [2.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="odd"):
        envelope([run], run.flops, smooth=2)


def test_paper_laws_at_the_7b_runs_in_pf_days():
    """Table 3 read in PF-days puts each 7B run near its own optimum (digest 3.4, whose losses
    are rounded to 0.01: cosFormer2's is 2.4728)."""
    for arch, compute in RUN_7B.items():
        loss, n_opt, d_opt = PAPER_LAWS[arch].predict(compute)
        assert 2.40 <= round(float(loss), 2) <= 2.47, (arch, loss)
        assert 6e9 <= n_opt <= 7.5e9 and 3.4e11 <= d_opt <= 4.5e11, (arch, n_opt, d_opt)
        flops = PAPER_LAWS[arch].predict(compute * 8.64e19, unit="flops")
        np.testing.assert_allclose(flops, (loss, n_opt, d_opt), rtol=1e-12)
        assert PAPER_LAWS[arch].loss(compute * 8.64e19) < 0.1  # C read as FLOPs: implausible


def test_fits_in_flops_and_pf_days_differ_by_the_unit_factor():
    runs = synthetic_runs(PAPER_LAWS["hgrn2"], SIZES[::3])
    pf_days, flops = (fit_scaling_laws(runs, unit=u) for u in ("pf-days", "flops"))
    for name in ("loss", "params", "tokens"):
        a, b = getattr(pf_days, name), getattr(flops, name)
        np.testing.assert_allclose(b.alpha, a.alpha, rtol=1e-10)
        np.testing.assert_allclose(b.beta, a.beta * UNITS["pf-days"] ** -a.alpha, rtol=1e-9)


@pytest.mark.parametrize("compute", [1e-3, 1.0, 100.0, 1e3])
def test_paper_laws_order_hgrn2_tnl_cosformer2_llama(compute):
    assert ordering(PAPER_LAWS, compute) == PAPER_ORDER


def test_ordering_converts_units_and_sees_the_cosformer2_llama_crossing():
    """LLaMA's steeper exponent passes cosFormer2 at C ~ 2.7e3 PF-days (digest 3.4)."""
    assert ordering(PAPER_LAWS, 100.0 * 8.64e19, unit="flops") == PAPER_ORDER
    assert ordering(PAPER_LAWS, 1e4) == ["hgrn2", "tnl", "llama", "cosformer2"]


OFFSET_LAW = dataclasses.replace(PAPER_LAWS["tnl"], arch="toy", loss=PowerLaw(1.5, -0.25),
                                 eps=1.7)


def test_offset_power_law_is_exact_on_noiseless_data():
    c = np.geomspace(1e-3, 1e3, 50)
    eps, fit = fit_offset_power_law(c, OFFSET_LAW.predict(c)[0])
    np.testing.assert_allclose([eps, *fit], [1.7, 1.5, -0.25], rtol=1e-8)


def test_offset_form_recovers_eps_from_synthetic_runs(rng):
    """0.1% noise: eps within 0.02 (of 1.7), log beta within 2e-2, alpha within 2e-3 (measured
    over 100 seeds: |eps| <= 8.2e-3, mean +5.3e-3 as the envelope's bumps sit above the law,
    |log beta| <= 5.5e-3, |alpha| <= 5.3e-4)."""
    law = OFFSET_LAW
    fit = fit_scaling_laws(synthetic_runs(law, SIZES, noise=1e-3, rng=rng), points=4000,
                           form="offset")
    assert abs(fit.eps - 1.7) < 0.02, fit.eps
    assert abs(np.log(fit.loss.beta / 1.5)) < 2e-2 and abs(fit.loss.alpha + 0.25) < 2e-3, fit.loss
    np.testing.assert_allclose(fit.predict(1.0)[0], 1.7 + 1.5, rtol=5e-3)


def test_loss_points_all_fits_every_logged_point():
    runs = synthetic_runs(PAPER_LAWS["llama"], SIZES[::6], span=10)
    fit = fit_scaling_laws(runs, loss_points="all")
    c = np.concatenate([r.flops for r in runs]) / UNITS["pf-days"]
    assert fit.loss == fit_power_law(c, np.concatenate([r.loss for r in runs]))
    assert fit.params == fit_scaling_laws(runs).params  # N_opt, D_opt: always the envelope


def one_line_error(fn, match):
    with pytest.raises(ValueError, match=match) as info:
        fn()
    assert "\n" not in str(info.value)


def test_bad_inputs_raise_one_line_errors():
    good = dict(name="r", arch="x", params=1e6, tokens=[1.0, 2.0], flops=[1.0, 2.0],
                loss=[3.0, 2.0])
    run = Run(**good)
    one_line_error(lambda: fit_scaling_laws([]), "no runs")
    one_line_error(lambda: Run(**{**good, "loss": [3.0, 2.0, 1.0]}), "one length")
    one_line_error(lambda: Run(**{**good, "flops": [0.0, 2.0]}), "flops must be positive")
    one_line_error(lambda: Run(**{**good, "loss": [3.0, -1.0]}), "loss must be positive")
    one_line_error(lambda: Run(**{**good, "flops": [2.0, 1.0]}), "increase strictly")
    one_line_error(lambda: Run(**{**good, "params": 0}), "params must be positive")
    one_line_error(lambda: fit_power_law([1.0, 2.0], [1.0, 0.0]), "positive")
    one_line_error(lambda: fit_power_law([1.0, 2.0], [1.0]), "one length")
    one_line_error(lambda: fit_power_law([2.0, 2.0], [1.0, 3.0]), "distinct")
    one_line_error(lambda: fit_scaling_laws([run], unit="pf-hours"), "valid: .*'pf-days'")
    one_line_error(lambda: PAPER_LAWS["tnl"].predict(1.0, unit="days"), "unknown compute unit")
    one_line_error(lambda: fit_scaling_laws([run], loss_points="some"), "loss_points")
    one_line_error(lambda: fit_scaling_laws([run], form="chinchilla"), "form")
    one_line_error(lambda: fit_scaling_laws([run, dataclasses.replace(run, arch="y")]),
                   "one architecture")
    one_line_error(lambda: fit_scaling_laws([run]), "smaller and a larger run")


def test_plot_figure1_writes_a_png(tmp_path):
    runs = {arch: synthetic_runs(PAPER_LAWS[arch], SIZES[::8], span=10)
            for arch in ("llama", "hgrn2")}
    fits = {arch: fit_scaling_laws(r, points=200) for arch, r in runs.items()}
    path = tmp_path / "figure1.png"
    plot_figure1(fits, runs, path)
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 10_000
    with pytest.raises(ValueError, match="envelope"):
        plot_figure1(PAPER_LAWS, runs, tmp_path / "paper.png")
