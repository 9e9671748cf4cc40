"""The scaling-law fitter of "Scaling Laws for Linear Complexity Language Models" (digest
``scaling-laws-linear-lms.md`` 3): pure power laws of compute fitted to training-loss curves.

Input: one :class:`Run` per model size of one architecture, each holding arrays over its logged
steps (tokens seen, cumulative training FLOPs, training loss) and its non-embedding parameter
count ``N`` (the caller's convention: Table 1's formula or Table 7's counts, digest 2.3).

Method (digest 3.2; the paper follows Hoffmann et al.'s "minimal loss for each FLOP"):

1. :func:`compute_grid`: a log-spaced grid over the compute range the runs cover.
2. :func:`envelope`: at each grid compute ``C``, every run logged at ``C`` (no extrapolation
   beyond a run's first and last logged point) gives its loss and tokens by linear
   interpolation in ``(log C, log L)`` and ``(log C, log D)``; the lowest loss over runs is
   ``L_min(C)``, the run achieving it gives ``N_opt(C)`` (its ``params``) and ``D_opt(C)`` (its
   tokens at ``C``). With ``bracketed=True`` (default) only grid points whose winning run has
   both a smaller and a larger run logged at that ``C`` are kept: elsewhere the optimum may lie
   outside the sizes trained (below the smallest run, every ``C`` is won by it), which biases
   ``a``. ``bracketed=False`` keeps every covered point (needed with two or three sizes).
   ``smooth`` (odd, default 1 = off) is a centred running mean of each run's ``log L`` over that
   many logged points (shrinking at the ends), taken before interpolation.
3. Least squares in log space (:func:`fit_power_law`): ``L(C) = beta_C C^alpha_C`` on the
   envelope (``loss_points="envelope"``, the Hoffmann reading) or on every logged point
   (``"all"``); ``N_opt(C) = beta_N C^a`` and ``D_opt(C) = beta_D C^b`` on the envelope.
   ``form="offset"`` fits ``L = eps + beta_C C^alpha_C`` instead (:func:`fit_offset_power_law`;
   the paper dropped ``eps``, digest 3.1); ``N_opt``, ``D_opt`` stay pure.

Units: runs hold compute in FLOPs; a fit's ``C`` is in its ``unit`` (:data:`UNITS`), and its
betas mean nothing without it: ``beta`` in ``unit`` u is ``beta_flops * UNITS[u]^alpha``. Table
3 (:data:`PAPER_LAWS`) reads as PF-days (digest 3.4: only PF-days or ~1e20 FLOPs give a 7B-run
optimum near 7B parameters and 300B tokens).

Discretisation: ``N_opt`` on the envelope is a staircase (one step per winning run), and
``D_opt`` a sawtooth (a run's tokens grow as ``C`` within its step). A least-squares line
through ``M`` whole steps of a staircase is flatter by about ``a / M^2`` than the law through
the steps' centres (and ``D_opt``'s steeper by about ``(1 - b) / M^2``), so ``a`` and ``b`` are
only as good as the number of sizes on the envelope allows: the paper's six sizes leave
``M = 4`` bracketed steps, a bias of about -0.04 in ``a`` and +0.03 in ``b``.

:func:`synthetic_runs` makes curves whose lower envelope touches a given law, for tests and
smoke demos; :func:`plot_figure1` draws the paper's Figure 1 layout.
"""

import dataclasses
from typing import Mapping, NamedTuple, Optional, Sequence

import numpy as np

# FLOPs per compute unit. "pf-days": one petaFLOP/s for a day (1e15 * 86,400).
UNITS = {"flops": 1.0, "pflops": 1e15, "pf-days": 8.64e19, "1e20": 1e20}
PAPER_UNIT = "pf-days"  # the digest's reading of Table 3 (3.4); the paper does not say
LOSS_POINTS = ("envelope", "all")
FORMS = ("pure", "offset")


def unit_factor(unit):
    """FLOPs in one ``unit`` (a key of :data:`UNITS`)."""
    if unit not in UNITS:
        raise ValueError(f"unknown compute unit {unit!r}; valid: {list(UNITS)}")
    return UNITS[unit]


class PowerLaw(NamedTuple):
    """``y = beta * x^alpha``: a ``(beta, alpha)`` pair."""

    beta: float
    alpha: float

    def __call__(self, x):
        return self.beta * np.asarray(x, dtype=np.float64) ** self.alpha


@dataclasses.dataclass(eq=False)
class Run:
    """One training run of one model size, over its logged steps.

    ``params``: the model's non-embedding parameter count ``N``. ``tokens``, ``flops``,
    ``loss``: 1-D arrays of one length (>= 2), positive; ``tokens`` seen and cumulative training
    ``flops`` (in FLOPs, strictly increasing) at each logged step, and the training loss there.
    """

    name: str
    arch: str
    params: float
    tokens: np.ndarray
    flops: np.ndarray
    loss: np.ndarray

    def __post_init__(self):
        if not (np.isfinite(self.params) and self.params > 0):
            raise ValueError(f"Run {self.name!r}: params must be positive, got {self.params}")
        arrays = {k: np.asarray(getattr(self, k), np.float64) for k in ("tokens", "flops", "loss")}
        shapes = {a.shape for a in arrays.values()}
        if len(shapes) != 1 or len(shapes.pop()) != 1 or len(arrays["loss"]) < 2:
            raise ValueError(f"Run {self.name!r}: tokens, flops and loss must be 1-D arrays of "
                             f"one length >= 2, got shapes "
                             f"{ {k: a.shape for k, a in arrays.items()} }")
        for k, a in arrays.items():
            if not np.all(np.isfinite(a) & (a > 0)):
                raise ValueError(f"Run {self.name!r}: {k} must be positive and finite")
            setattr(self, k, a)
        if np.any(np.diff(self.flops) <= 0):
            raise ValueError(f"Run {self.name!r}: flops must increase strictly (cumulative)")


@dataclasses.dataclass(eq=False)
class Envelope:
    """The lower envelope over runs on a compute grid: arrays over the kept grid points.

    ``flops``: the grid compute (FLOPs); ``loss``: ``L_min``; ``params``: ``N_opt`` (the winning
    run's ``params``); ``tokens``: ``D_opt`` (the winning run's tokens at that compute); ``run``:
    the winning run's index into the runs given.
    """

    flops: np.ndarray
    loss: np.ndarray
    params: np.ndarray
    tokens: np.ndarray
    run: np.ndarray


@dataclasses.dataclass(eq=False)
class ScalingFit:
    """Fitted laws of one architecture, ``C`` in ``unit``: ``L(C) = eps + loss(C)`` (``eps = 0``
    for the paper's pure form), ``N_opt(C) = params(C)``, ``D_opt(C) = tokens(C)``.

    ``envelope``: the :class:`Envelope` the fits used (its ``flops`` in FLOPs; ``None`` for
    :data:`PAPER_LAWS`); ``loss_points``: which points ``loss`` was fitted to.
    """

    arch: str
    unit: str
    loss: PowerLaw
    params: PowerLaw
    tokens: PowerLaw
    eps: float = 0.0
    envelope: Optional[Envelope] = None
    loss_points: str = "envelope"

    def predict(self, compute, unit=None):
        """``(L, N_opt, D_opt)`` at ``compute`` in ``unit`` (default: the fit's own)."""
        c = np.asarray(compute, np.float64) * unit_factor(unit or self.unit) / unit_factor(
            self.unit)
        return self.eps + self.loss(c), self.params(c), self.tokens(c)


def _paper(arch, loss, params, tokens):
    return ScalingFit(arch, PAPER_UNIT, PowerLaw(*loss), PowerLaw(*params), PowerLaw(*tokens))


# Table 3 verbatim (digest 3.3), C in PF-days (the digest's reading, 3.4).
PAPER_LAWS = {
    "llama": _paper("llama", (3.7087, -0.0798), (1.82e8, 0.7118), (2.56e10, 0.5102)),
    "tnl": _paper("tnl", (3.5391, -0.0768), (2.74e8, 0.6470), (4.43e10, 0.4684)),
    "hgrn2": _paper("hgrn2", (3.4788, -0.0753), (2.66e8, 0.6427), (4.80e10, 0.4500)),
    "cosformer2": _paper("cosformer2", (3.5877, -0.0756), (2.65e8, 0.6516), (4.23e10, 0.4529)),
}


def _logs(name, x, y):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.ndim != 1 or x.shape != y.shape or len(x) < 2:
        raise ValueError(f"{name}: x and y must be 1-D arrays of one length >= 2, got shapes "
                         f"{x.shape} and {y.shape}")
    if not np.all(np.isfinite(x) & (x > 0) & np.isfinite(y) & (y > 0)):
        raise ValueError(f"{name}: x and y must be positive and finite")
    if np.ptp(x) == 0:
        raise ValueError(f"{name}: x must take at least two distinct values")
    return np.log(x), np.log(y)


def _line(u, v):
    """Least-squares ``v = c + s u`` on centred data: ``(c, s)``."""
    um, vm = u.mean(), v.mean()
    s = np.dot(u - um, v - vm) / np.dot(u - um, u - um)
    return vm - s * um, s


def fit_power_law(x, y):
    """``y = beta x^alpha`` by least squares on ``log y = log beta + alpha log x``:
    a :class:`PowerLaw` ``(beta, alpha)``. ``x``, ``y``: positive 1-D arrays."""
    c, s = _line(*_logs("fit_power_law", x, y))
    return PowerLaw(float(np.exp(c)), float(s))


def fit_offset_power_law(x, y, grid=200):
    """``y = eps + beta x^alpha`` with ``0 <= eps < min y``, by least squares on ``log y``:
    ``(eps, PowerLaw(beta, alpha))``.

    Start: the ``eps`` of a ``grid`` over ``[0, min y)`` whose pure fit of ``y - eps`` leaves the
    least residual; then ``scipy.optimize.least_squares`` on ``(eps, log beta, alpha)``.
    """
    from scipy.optimize import least_squares

    lx, ly = _logs("fit_offset_power_law", x, y)
    top = float(np.exp(ly.min()))

    def residual(p):
        return np.log(p[0] + np.exp(p[1] + p[2] * lx)) - ly

    starts = [(e, *_line(lx, np.log(np.exp(ly) - e))) for e in np.linspace(0, top, grid + 1)[:-1]]
    p0 = min(starts, key=lambda p: np.sum(residual(p) ** 2))
    p = least_squares(residual, p0, bounds=([0, -np.inf, -np.inf], [top, np.inf, np.inf]),
                      x_scale="jac", xtol=1e-15, ftol=1e-15, gtol=1e-15).x
    return float(p[0]), PowerLaw(float(np.exp(p[1])), float(p[2]))


def _check_runs(name, runs):
    runs = list(runs)
    if not runs:
        raise ValueError(f"{name}: no runs")
    return runs


def compute_grid(runs, points=2000):
    """``points`` log-spaced compute values (FLOPs) from the first to the last logged compute
    of any run. The grid should put tens of points on each envelope step: coarser, where the
    steps start and end on the grid moves the ``N_opt``, ``D_opt`` slopes."""
    runs = _check_runs("compute_grid", runs)
    return np.geomspace(min(r.flops[0] for r in runs), max(r.flops[-1] for r in runs), points)


def _smoothed(v, window):
    """Centred running mean over ``window`` points, shrinking at the ends."""
    if window < 1 or window % 2 != 1:
        raise ValueError(f"smooth must be an odd window >= 1, got {window}")
    sums = np.concatenate([[0.0], np.cumsum(v)])
    i = np.arange(len(v))
    lo, hi = np.maximum(i - window // 2, 0), np.minimum(i + window // 2 + 1, len(v))
    return (sums[hi] - sums[lo]) / (hi - lo)


def envelope(runs, grid, smooth=1, bracketed=True):
    """The lower envelope of the runs' loss curves on the compute ``grid`` (FLOPs): an
    :class:`Envelope` over the grid points kept (see the module docstring for the
    interpolation, ``smooth`` and ``bracketed``)."""
    runs = _check_runs("envelope", runs)
    grid = np.asarray(grid, np.float64)
    if grid.ndim != 1 or not np.all(np.isfinite(grid) & (grid > 0)):
        raise ValueError("envelope: grid must be a 1-D array of positive compute values")
    x = np.log(grid)
    log_loss = np.full((len(runs), len(grid)), np.inf)
    log_tokens = np.zeros_like(log_loss)
    for i, run in enumerate(runs):
        lf = np.log(run.flops)
        inside = (x >= lf[0]) & (x <= lf[-1])
        log_loss[i, inside] = np.interp(x[inside], lf, _smoothed(np.log(run.loss), smooth))
        log_tokens[i, inside] = np.interp(x[inside], lf, np.log(run.tokens))
    covered = np.isfinite(log_loss)
    best = np.argmin(log_loss, axis=0)
    n = np.array([r.params for r in runs])
    keep = covered.any(axis=0)
    if bracketed:
        n_best = n[best]
        keep &= (covered & (n[:, None] < n_best)).any(0) & (covered & (n[:, None] > n_best)).any(0)
    if not keep.any():
        raise ValueError("envelope: no grid point is covered by a run" + (
            " with a smaller and a larger run beside it (bracketed=True)" if bracketed else ""))
    cols = np.nonzero(keep)[0]
    run = best[cols]
    return Envelope(grid[cols], np.exp(log_loss[run, cols]), n[run],
                    np.exp(log_tokens[run, cols]), run)


def fit_scaling_laws(runs, unit=PAPER_UNIT, points=2000, loss_points="envelope", form="pure",
                     smooth=1, bracketed=True):
    """Fits ``L(C)``, ``N_opt(C)``, ``D_opt(C)`` to the runs of one architecture: a
    :class:`ScalingFit` with ``C`` in ``unit``.

    ``points``: size of the compute grid (:func:`compute_grid`); ``loss_points``: "envelope"
    or "all" (every logged point, unsmoothed); ``form``: "pure" (the paper's) or "offset"
    (``eps + beta C^alpha``); ``smooth``, ``bracketed``: see :func:`envelope`.
    """
    factor = unit_factor(unit)
    if loss_points not in LOSS_POINTS:
        raise ValueError(f"unknown loss_points {loss_points!r}; valid: {list(LOSS_POINTS)}")
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; valid: {list(FORMS)}")
    runs = _check_runs("fit_scaling_laws", runs)
    archs = sorted({r.arch for r in runs})
    if len(archs) != 1:
        raise ValueError(f"fit_scaling_laws: runs of one architecture expected, got {archs}")
    env = envelope(runs, compute_grid(runs, points), smooth, bracketed)
    c = env.flops / factor
    if loss_points == "envelope":
        lc, ll = c, env.loss
    else:
        lc = np.concatenate([r.flops for r in runs]) / factor
        ll = np.concatenate([r.loss for r in runs])
    eps, loss = (0.0, fit_power_law(lc, ll)) if form == "pure" else fit_offset_power_law(lc, ll)
    return ScalingFit(archs[0], unit, loss, fit_power_law(c, env.params),
                      fit_power_law(c, env.tokens), eps, env, loss_points)


def ordering(results: Mapping[str, ScalingFit], compute, unit=PAPER_UNIT):
    """The architectures of ``results`` sorted by predicted loss at ``compute`` (in ``unit``),
    lowest first."""
    return sorted(results, key=lambda arch: float(results[arch].predict(compute, unit)[0]))


def synthetic_runs(law: ScalingFit, sizes: Sequence[float], curvature=1.0, span=3.0,
                   points=100, noise=0.0, rng=None):
    """Synthetic training runs whose lower envelope follows ``law`` (its ``L(C)`` and
    ``N_opt(C)``, ``C`` in ``law.unit``).

    Run ``i`` of size ``N_i`` (``sizes``) touches the law at ``C_i`` with ``N_opt(C_i) = N_i``:
    ``log L_i(C) = log L_law(C) + curvature (log C - log C_i)^2``, logged at ``points``
    log-spaced compute values over ``[C_i / span, C_i * span]``; its tokens grow as compute,
    ``D_i(C) = D_opt(C_i) C / C_i``. At fixed ``C`` the runs' ``log L`` is a parabola in
    ``log N_i`` with its vertex on the law, so the envelope's argmin is the nearest size, and
    the envelope lies above the law by ``curvature * h^2 / 12`` on average (``h``: the
    ``log C`` step between neighbouring sizes' ``C_i``), which ``log beta_C`` picks up. Real
    curves bend far less (``curvature`` of order 0.01-0.05); the default 1 keeps the argmin
    stable under noise, which moves each envelope step's ends by about
    ``noise / (curvature * h)`` in ``log C``.
    ``noise``: std of a multiplicative log-normal factor on each logged loss, drawn from
    ``rng`` (a numpy Generator; default seed 0).
    """
    rng = np.random.default_rng(0) if rng is None else rng
    runs = []
    for n in sizes:
        c_i = (n / law.params.beta) ** (1 / law.params.alpha)
        c = c_i * np.geomspace(1 / span, span, points)
        log_loss = (np.log(law.predict(c)[0]) + curvature * np.log(c / c_i) ** 2
                    + noise * rng.standard_normal(points))
        runs.append(Run(f"{law.arch}-{n:.3g}", law.arch, float(n), law.tokens(c_i) * c / c_i,
                        c * unit_factor(law.unit), np.exp(log_loss)))
    return runs


def _law_text(fit):
    eps = f"{fit.eps:.3g} + " if fit.eps else ""
    return f"L = {eps}{fit.loss.beta:.4g} C^{fit.loss.alpha:.4f}"


def plot_figure1(results_by_arch: Mapping[str, ScalingFit], runs_by_arch: Mapping[str, list],
                 path):
    """The paper's Figure 1 layout as a PNG at ``path``: a master row with every architecture's
    fitted ``L(C)``, ``N_opt(C)``, ``D_opt(C)``, then per architecture its runs' training curves
    with the envelope points and the ``L(C)`` fit, and the ``N_opt``, ``D_opt`` points and fits.
    Log-log axes, ``C`` in the fits' (common) unit. The fits must come from
    :func:`fit_scaling_laws` (they need their envelope)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    archs = list(results_by_arch)
    units = {results_by_arch[a].unit for a in archs}
    if len(units) != 1 or any(results_by_arch[a].envelope is None for a in archs):
        raise ValueError(f"plot_figure1: fits need one unit and an envelope, got units {units}")
    unit = units.pop()
    factor = unit_factor(unit)
    fig, axes = plt.subplots(1 + len(archs), 3, figsize=(14, 3.6 * (1 + len(archs))),
                             squeeze=False)
    for i, arch in enumerate(archs):
        fit = results_by_arch[arch]
        c = np.geomspace(fit.envelope.flops[0], fit.envelope.flops[-1], 100) / factor
        for ax, y in zip(axes[0], fit.predict(c)):
            ax.plot(c, y, color=f"C{i % 10}", label=arch)
    for row, arch in zip(axes[1:], archs):
        fit, runs = results_by_arch[arch], runs_by_arch[arch]
        env = fit.envelope
        sizes = np.log([r.params for r in runs])
        for run, s in zip(runs, (sizes - sizes.min()) / max(np.ptp(sizes), 1e-12)):
            row[0].plot(run.flops / factor, run.loss, lw=0.7, color=plt.cm.viridis(s))
        row[0].set_ylim(env.loss.min() / 1.05, env.loss.max() * 1.5)  # early training: off top
        c = env.flops / factor
        line = np.geomspace(c[0], c[-1], 100)
        labels = (_law_text(fit), f"N = {fit.params.beta:.3g} C^{fit.params.alpha:.4f}",
                  f"D = {fit.tokens.beta:.3g} C^{fit.tokens.alpha:.4f}")
        for ax, points, y, label in zip(row, (env.loss, env.params, env.tokens),
                                        fit.predict(line), labels):
            ax.plot(c, points, ".", color="k", ms=2, label="envelope")
            ax.plot(line, y, "--", color="tab:red", label=label)
            ax.set_title(arch, fontsize=9)
    for row in axes:
        for ax, name in zip(row, ("loss", "N_opt (non-embedding params)", "D_opt (tokens)")):
            ax.set(xscale="log", yscale="log", xlabel=f"C ({unit})", ylabel=name)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
    axes[0][0].set_title("master row: fitted laws", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
