"""A run's own config, read from the config.json the trainer writes into every workdir.

    python -m experiments.train --config configs/recorded.py:RUN --workdir W [--config.k=v]

``RUN`` is a run's workdir or a run record of the repository (``docs/lra_runs/<run>``: its
``config.json``), or the path of a config.json. Every key comes back as that run had it,
command-line overrides included, so the same command resumes the run in its own workdir (for
a record of ``docs/lra_runs``, unpack its ``workdir.tar`` into ``workdir/lra`` first) or runs
it again from scratch in a new one; ``--config.key=value`` still overrides, e.g.
``--config.max_run_seconds=480`` for a segment of a long run. JSON has no tuples: lists come
back as tuples, as the config files write sequences. Trainer keys added since the run was
recorded take their defaults (``configs/common.py``), as a resumed run takes them.
"""

import json
import os

import ml_collections

from configs import common

VARIANTS = {}  # the variant is a path (see the module docstring), not a name
EXAMPLE = "docs/lra_runs/lra_listops_lit"  # a record in the repository (the tests build it)


def _tuples(value):
    """JSON's lists as tuples, recursively."""
    if isinstance(value, dict):
        return {key: _tuples(v) for key, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _merged(defaults, recorded):
    """``defaults`` (a dict) with ``recorded``'s keys set over them, recursively."""
    merged = dict(defaults)
    for key, value in recorded.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            value = _merged(merged[key], value)
        merged[key] = value
    return merged


def get_config(arg=None):
    if not arg:
        raise ValueError("configs/recorded.py takes a run: --config "
                         "configs/recorded.py:docs/lra_runs/<run> (or a workdir, or a "
                         "config.json)")
    path = os.path.join(arg, "config.json") if os.path.isdir(arg) else arg
    if not os.path.isfile(path):
        raise ValueError(f"configs/recorded.py: {path} not found; give a run's workdir, a "
                         "record of docs/lra_runs, or the path of a config.json")
    with open(path) as f:
        recorded = _tuples(json.load(f))
    return ml_collections.ConfigDict(_merged(common.base_config().to_dict(), recorded))
