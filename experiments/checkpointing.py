"""Checkpoints with orbax: the last N periodic ones plus the best one by an eval metric.

Layout under the workdir::

    checkpoints/<step>/state   train state: step, params, opt_state, ema_params, rng (and
                               model_state for tasks with state_collections, e.g. BatchNorm)
    checkpoints/<step>/meta    JSON: data-iterator state, best-so-far record, last eval
    best/<step>/...            the same two items, for the step with the best eval metric

A checkpoint directory appears only once completely written (orbax writes to a temporary
directory and renames it), so a run killed at any moment leaves its earlier checkpoints
intact. Saves are asynchronous; :meth:`Checkpointer.close` waits for them.
"""

import json
import os

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from experiments.errors import UserError


class Checkpointer:
    """Saves and restores ``(train state, JSON meta)`` pairs in ``workdir``."""

    def __init__(self, workdir, keep):
        workdir = os.path.abspath(workdir)
        self.latest_dir = os.path.join(workdir, "checkpoints")
        self.best_dir = os.path.join(workdir, "best")
        self._latest = _manager(self.latest_dir, max_to_keep=keep, name="latest")
        self._best = _manager(self.best_dir, max_to_keep=1, name="best")

    def latest_step(self):
        """Step of the newest complete periodic checkpoint, or None."""
        return self._latest.latest_step()

    def save(self, step, state, meta, best=False):
        """Saves a periodic checkpoint (``best=False``) or replaces the best one."""
        manager = self._best if best else self._latest
        if step in manager.all_steps():
            return
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                   meta=ocp.args.JsonSave(meta)))

    def restore_latest(self, abstract_state):
        """``(state, meta)`` of the newest periodic checkpoint, or None when there is none.

        ``abstract_state`` is a pytree of ``jax.ShapeDtypeStruct`` with shardings: the state
        comes back with that structure, dtype and device layout (whatever mesh it was saved
        with).
        """
        step = self._latest.latest_step()
        if step is None:
            return None
        metadata = self._latest.item_metadata(step)["state"]
        saved, wanted = _shapes(metadata), _shapes(abstract_state)
        if saved != wanted:
            name = min((k for k in saved.keys() | wanted.keys() if saved.get(k) != wanted.get(k)),
                       key=lambda k: (not k.startswith("params/"), k))  # params first
            raise UserError(
                f"checkpoint {step} in {self.latest_dir} does not fit this config: {name} has "
                f"shape {saved.get(name, 'none')} there and {wanted.get(name, 'none')} here "
                "(changed model or optimizer?); use a new --workdir")
        # Restored in the saved tree, leaf by leaf path, then put into the wanted one: the two
        # may differ in nodes that hold no array (e.g. an optimizer step with an empty state).
        wanted_leaves = _by_path(abstract_state)
        target = jax.tree_util.tree_map_with_path(
            lambda path, _: wanted_leaves[_key(path)], metadata)
        restored = self._latest.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
        leaves = _by_path(restored.state)
        state = jax.tree_util.tree_map_with_path(lambda path, _: leaves[_key(path)],
                                                 abstract_state)
        return state, restored.meta

    def restore_params(self, which="best"):
        """``(step, params, model_state)`` of the ``which`` ("best" or "latest") checkpoint as
        host arrays in the structure they were saved with: ``params`` are the ones the trainer
        evaluates (the EMA parameters when the run keeps them), ``model_state`` None for a
        task without one. None when there is no such checkpoint."""
        manager = {"best": self._best, "latest": self._latest}[which]
        step = manager.latest_step()
        if step is None:
            return None
        # Numpy targets: read whole on the host, whatever mesh and processes saved it (without
        # a target orbax re-creates the saved sharding, and refuses another process layout).
        target = jax.tree.map(lambda m: np.zeros(m.shape, m.dtype),
                              manager.item_metadata(step)["state"])
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target))).state
        params = restored.get("ema_params")
        return (step, restored["params"] if params is None else params,
                restored.get("model_state"))

    def close(self):
        """Waits for pending saves and releases the managers."""
        for manager in (self._latest, self._best):
            manager.wait_until_finished()
            manager.close()


def load_best_run(workdir, task, program, *, model_state=False, which="best"):
    """``(config, step, params)``: ``workdir``'s config and best checkpoint (``which="latest"``:
    its newest periodic one), for ``program`` (a name for the messages), which applies to
    ``task`` runs (None: any task); the params are those the trainer evaluates (EMA ones when
    the run keeps them); ``model_state=True`` adds the checkpoint's model state (e.g.
    BatchNorm statistics; None when the task has none). UserError (one line) when the workdir
    is not a run, is another task's, or has no such checkpoint."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise UserError(f"{path} not found: {program} needs the workdir of a training run")
    with open(path) as f:
        config = ml_collections.ConfigDict(json.load(f))
    if task is not None and config.task != task:
        raise UserError(f"{workdir} is a {config.task!r} run; {program} applies to {task} runs")
    checkpoints = Checkpointer(workdir, keep=1)
    try:
        restored = checkpoints.restore_params(which)
    finally:
        checkpoints.close()
    if restored is None:
        raise UserError(f"{workdir} has no best checkpoint yet (it appears at the first "
                        "evaluation)" if which == "best" else
                        f"{workdir} has no checkpoint in {checkpoints.latest_dir}")
    return config, *(restored if model_state else restored[:2])


def fit_params(fresh, saved, source):
    """``saved`` (a tree of host arrays) in the structure and dtypes of ``fresh``, e.g. a
    pre-trained run's weights for a new run's freshly initialised ones. UserError (one line)
    naming the first leaf whose shape differs (or that only one side has); ``source`` says
    where ``saved`` came from, e.g. "the encoder of config.init_from"."""
    want, have = _shapes(fresh), _shapes(saved)
    if want != have:
        name = min(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))
        raise UserError(f"{source} does not fit this model: {name} has shape "
                        f"{have.get(name, 'none')} there and {want.get(name, 'none')} here "
                        "(different config.model or data?)")
    leaves = _by_path(saved)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: np.asarray(leaves[_key(path)], dtype=x.dtype), fresh)


def _manager(directory, max_to_keep, name):
    """An orbax manager whose cross-process barriers carry ``name``: the periodic and the best
    manager both save at an evaluated checkpoint step, and orbax's ``barrier_sync_key_prefix``
    is for managers used concurrently. Without it a 2-process CPU run under load hung in
    ``close`` (2026-11-26); that shared keys were the cause is inferred, not isolated."""
    return ocp.CheckpointManager(
        directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True,
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                barrier_sync_key_prefix=name)),
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "meta": ocp.JsonCheckpointHandler()})


def _key(path):
    """A leaf's path as ``"params/block_0/.../kernel"``."""
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _by_path(tree):
    """``{path: leaf}`` of a tree's leaves (:func:`_key`)."""
    return {_key(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _shapes(tree):
    """{"params/block_0/.../kernel": shape} of a tree of arrays or array metadata."""
    return {key: tuple(leaf.shape) for key, leaf in _by_path(tree).items()}
