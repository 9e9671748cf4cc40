"""Tasks: what the generic trainer (experiments/trainer.py) needs from a problem.

A task supplies the data, the model and the per-example loss; the trainer does everything
else (optimisation, sharding, masking and averaging, evaluation, checkpoints, logging).
``config.task`` names the module; :func:`get_task` builds it from the config.
"""

import importlib
import os
from typing import Any, Iterator, Protocol

import jax

from experiments.errors import UserError

TASKS = {"classification": "experiments.tasks.classification:ClassificationTask",
         "vision": "experiments.tasks.vision:VisionTask",
         "mlm": "experiments.tasks.mlm:MLMTask",
         "glue": "experiments.tasks.glue:GlueTask",
         "lm": "experiments.tasks.lm:LMTask"}


class Task(Protocol):
    """Interface of a task. Batches are dicts of numpy arrays ``[batch, ...]`` with a float
    ``mask`` ``[batch]`` (1 = real example, 0 = padding); see experiments/data/pipeline.py."""

    eval_splits: tuple[str, ...]

    def init(self, rng: jax.Array) -> Any:
        """Model variables ``{"params": ...}``, with flax logical-axis annotations."""

    def loss(self, params, batch, rng, *, train: bool) -> tuple[jax.Array, dict]:
        """``(loss [batch], {metric name: [batch]})``, per example, unmasked; the trainer
        reports the loss itself as metric ``loss``.

        The trainer averages both over the real examples (``mask``); ``rng`` is the dropout
        key (distinct per step and micro-batch).
        """

    def train_batches(self, batch_size: int, seed: int) -> Iterator[dict]:
        """Endless, shuffled, resumable iterator (``get_state`` / ``set_state``)."""

    def eval_batches(self, split: str, batch_size: int) -> Iterator[dict]:
        """One pass over ``split`` in a fixed order, the last batch padded (``mask`` 0)."""

    def summary(self) -> dict[str, float]:
        """Extra numbers for the final summary (e.g. a baseline accuracy)."""

    # Optional hooks (experiments/tasks/glue.py has all three):
    #
    # gathered_metrics: tuple[str, ...] -- names of :meth:`loss`'s metrics that evaluation
    #   gathers per example (real examples, in split order) instead of averaging, and passes
    #   to ``split_metrics(split, {name: np.ndarray [N]}) -> {metric: float}`` (metrics of the
    #   whole split, e.g. a rank correlation); ``split_metric_names`` lists the keys it
    #   returns (``config.best_metric`` may name one).
    # warm_start(params, model_state) -> (params, model_state): called once on the fresh
    #   parameters and model state (host numpy arrays, unboxed; model_state None for a task
    #   without one) before the first step of a new run, e.g. to load a pre-trained encoder.
    # state_collections: tuple[str, ...] -- model variables other than "params" that training
    #   updates (BatchNorm's "batch_stats"). When not empty, ``init`` returns them too and
    #   ``loss(params, batch, rng, *, train, model_state)`` takes ``{collection: variables}``
    #   and returns ``(loss, metrics, new model_state)`` (evaluation: the same state back);
    #   the trainer keeps the state in its TrainState and checkpoints.


def model_size_and_dtypes(kwargs, dims_of, size_keys, sizes):
    """``kwargs`` (a model config as a dict, changed in place and returned) with the dimensions
    ``size_keys`` left at 0 filled from ``dims_of(kwargs.pop("size"))`` when a size is given,
    and ``dtype`` / ``param_dtype`` names turned into dtypes.

    Raises:
      UserError: an unknown size (``sizes`` names the valid ones), a dimension neither given
        nor implied by a size, or a bad dtype name.
    """
    import jax.numpy as jnp

    size = kwargs.pop("size", "")
    if size:
        try:
            dims = dims_of(size)
        except ValueError as e:
            raise UserError(f"bad config.model.size: {e}") from None
        for key in size_keys:
            if not kwargs.get(key):
                kwargs[key] = dims[key]
    missing = [k for k in size_keys if not kwargs.get(k)]
    if missing:
        raise UserError(f"config.model.{missing[0]} is 0: give it or config.model.size "
                        f"({sizes})")
    for key in ("dtype", "param_dtype"):
        if key in kwargs:
            try:
                kwargs[key] = jnp.dtype(kwargs[key])
            except TypeError as e:
                raise UserError(f"bad config.model.{key}: {e}") from None
    return kwargs


def load_dataset(datasets, data_config, eval_splits=()):
    """``({split: arrays}, info)`` from the loader ``datasets[config.data.name]``, called with
    the other keys of ``config.data`` (``~`` expanded in ``data_dir`` and ``cache_dir``).

    Raises:
      UserError: an unknown dataset, bad settings, data that is not there, or one of
        ``eval_splits`` (``config.eval_splits``) missing from the data.
    """
    splits, info = _load(datasets, data_config)
    for split in eval_splits:
        if split not in splits:
            raise UserError(f"config.eval_splits has {split!r}; the dataset has "
                            f"{', '.join(splits)}")
    return splits, info


def _load(datasets, data_config):
    kwargs = data_config.to_dict()
    name = kwargs.pop("name")
    if name not in datasets:
        raise UserError(f"unknown dataset config.data.name={name!r} (known: "
                        f"{', '.join(datasets)})")
    for key in ("data_dir", "cache_dir"):
        if kwargs.get(key):
            kwargs[key] = os.path.expanduser(kwargs[key])
    try:
        return datasets[name](**kwargs)
    except FileNotFoundError as e:
        raise UserError(str(e)) from e
    except (TypeError, ValueError) as e:
        raise UserError(f"bad {name} settings in config.data: {e}") from e


def get_task(config):
    """Builds the task named by ``config.task``."""
    if config.task not in TASKS:
        raise UserError(f"unknown task {config.task!r} (known: {', '.join(TASKS)})")
    module, name = TASKS[config.task].split(":")
    return getattr(importlib.import_module(module), name)(config)
