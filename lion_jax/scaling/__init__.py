"""Scaling-law tools for the linear LMs (the scaling-laws paper, digest
``scaling-laws-linear-lms.md`` sections 2, 3 and 9).

* :mod:`lion_jax.scaling.counts`: parameters and training FLOPs per step of LLaMA, TNL, HGRN2
  and cosFormer2, in the paper's Table 1 and full App. A.1 forms, and from a real
  :class:`~lion_jax.models.lm.CausalLM` (its parameter tree, XLA's cost analysis).
* :mod:`lion_jax.scaling.fit`: the lower envelope of loss-vs-compute curves, power-law fits of
  ``L(C)``, ``N_opt(C)``, ``D_opt(C)`` with an explicit compute unit (PF-days by default),
  synthetic curves, and the paper's Figure 1 layout.

Two modules where ARCHITECTURE.md names one ``scaling.py``: the fitter is numpy only and stands
alone (the counters import the models, hence JAX and Flax).
"""

from lion_jax.scaling.counts import (ARCHS, CONVENTIONS, compute_in, flax_param_count,
                                     flops_breakdown, full_flops_per_step, full_params,
                                     model_extra_params, model_params, table1_flops_per_step,
                                     table1_params, table7_rows, xla_train_step_flops)
from lion_jax.scaling.fit import (PAPER_LAWS, PAPER_UNIT, UNITS, Envelope, PowerLaw, Run,
                                  ScalingFit, compute_grid, envelope, fit_offset_power_law,
                                  fit_power_law, fit_scaling_laws, ordering, plot_figure1,
                                  synthetic_runs, unit_factor)
