"""The generic train / evaluate loop. A task (experiments/tasks/) supplies data, model, loss.

One call of the jitted train step is one optimizer update on ``config.batch_size`` examples.
**Gradient accumulation** is a manual micro-batch loop inside that step (``lax.scan`` over
``grad_accum_steps`` micro-batches, gradients of the *summed* loss added up and divided by
the number of real examples once): the step count, the schedules, the checkpoints and the
data-iterator state all stay in optimizer steps, and the result equals the full-batch
gradient up to float summation order. (``optax.MultiSteps`` would count micro-steps instead
and keep an extra gradient buffer in the optimizer state.) Micro-batch ``i`` takes rows
``i, i + A, i + 2A, ...`` of the batch, so every device keeps its own rows (no communication).

Mixed precision comes from the model: parameters in ``param_dtype`` (float32), compute in
``dtype`` (e.g. bfloat16); gradients, optimizer state, losses and metrics are float32.

Each step at which something happens (``log_every``, ``eval_every``, ``checkpoint_every``,
the last step), in this order: train metrics averaged since the last log are written;
``eval_splits`` are evaluated (EMA parameters when enabled) and the best checkpoint is
replaced when ``best_metric`` improved; a periodic checkpoint is saved. The host reads each
step's loss one step late (so the device never waits) and stops at the first NaN/Inf loss or
gradient norm, before that state could be saved. With ``max_run_seconds`` set, the run stops at
the first checkpoint after that much wall time (a segment of a long run on a machine lent for
minutes). Resuming (with the run's model settings: other ones stop with an error, see
``_check_same_model``) restores state, data position and the best-so-far record: a resumed run
computes exactly what the uninterrupted run computes (the train-metric averages match when
``checkpoint_every`` is a multiple of ``log_every``).
"""

import dataclasses
import json
import os
import time
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import optim, sharding
from experiments.checkpointing import Checkpointer
from experiments.errors import UserError
from experiments.progress import MetricsWriter, ProgressBar, echo
from experiments.tasks import get_task


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 []: optimizer updates done
    params: Any
    opt_state: Any
    ema_params: Any  # None when config.optim.ema_decay == 0
    rng: jax.Array  # base key; the step and micro-batch index are folded in
    # {collection: variables} of the task's ``state_collections`` (BatchNorm's running
    # statistics), updated by every micro-batch in order; None for tasks without any
    model_state: Any = None


def _stored(state):
    """``state`` as checkpoints hold it: a dict of its fields, without ``model_state`` for
    tasks that have none, so checkpoints written before that field existed still restore."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)
            if not (f.name == "model_state" and state.model_state is None)}


def split_variables(task, variables):
    """``(params, model_state)`` of a task's unboxed variables: the model state is the task's
    ``state_collections`` (None when it has none)."""
    collections = tuple(getattr(task, "state_collections", ()))
    return variables["params"], ({c: variables[c] for c in collections} if collections
                                 else None)


def host_variables(task, rng):
    """``(params, model_state)`` of a fresh ``task.init(rng)``, unboxed, as numpy arrays.

    The init program is compiled for the CPU and runs outside any mesh (so without sharding
    constraints); the trainer then places each array with its sharding. XLA's GPU backend
    compiles the init of a deep model without scanned layers in a time that grows faster than
    the depth, nearly all of it in code generation after the HLO passes (LION-S BERT-BASE, one
    H200, jax 0.11.2, 2026-11-29: 2 layers 3.9 s, 6 layers 20 s, 12 layers over 80 s), while
    the CPU compiles the 12 layers in about 20 s on 2 cores. Random bits are the same on every
    backend. Without a CPU backend (``JAX_PLATFORMS`` excluding it) the default device runs it.
    """
    try:
        device = jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        device = jax.local_devices()[0]
    init = jax.jit(lambda r: split_variables(task, nn.meta.unbox(task.init(r))))
    with jax.default_device(device):
        return jax.device_get(init(jax.device_put(rng, device)))


def _task_loss(task, params, model_state, batch, rng, train):
    """``(loss, metrics, model_state)``: the task's loss, with its model state passed through
    when it has ``state_collections`` (experiments/tasks/__init__.py) and kept otherwise."""
    if getattr(task, "state_collections", ()):
        return task.loss(params, batch, rng, train=train, model_state=model_state)
    loss, metrics = task.loss(params, batch, rng, train=train)
    return loss, metrics, model_state


def _masked_sums(loss, metrics, mask):
    """Sums over real examples of the loss and each metric, plus their count."""
    sums = {name: jnp.sum(value * mask) for name, value in {"loss": loss, **metrics}.items()}
    sums["count"] = jnp.sum(mask)
    return sums


def _averages(sums):
    count = max(float(sums["count"]), 1.0)
    return {k: float(v) / count for k, v in sums.items() if k != "count"}


def make_train_step(task, tx, schedule, config):
    """The (unjitted) train step ``(state, batch) -> (state, metrics)``."""
    accum = config.grad_accum_steps
    ema_decay = config.optim.ema_decay

    def summed_loss(params, model_state, batch, rng):
        loss, metrics, model_state = _task_loss(task, params, model_state, batch, rng, True)
        sums = _masked_sums(loss, metrics, batch["mask"])
        return sums["loss"], (sums, model_state)

    grad_fn = jax.value_and_grad(summed_loss, has_aux=True)

    def train_step(state, batch):
        step_rng = jax.random.fold_in(state.rng, state.step)
        micro = jax.tree.map(lambda x: x.reshape(-1, accum, *x.shape[1:]).swapaxes(0, 1), batch)

        def micro_step(model_state, index, micro_batch):
            (_, (sums, model_state)), grads = grad_fn(
                state.params, model_state, micro_batch, jax.random.fold_in(step_rng, index))
            return (grads, sums), model_state

        def accumulate(carry, xs):
            totals, model_state = carry
            values, model_state = micro_step(model_state, *xs)
            return (jax.tree.map(jnp.add, totals, values), model_state), None

        first = jax.tree.map(lambda x: x[0], micro)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                             jax.eval_shape(micro_step, state.model_state, 0, first)[0])
        ((grads, sums), model_state), _ = jax.lax.scan(
            accumulate, (zeros, state.model_state), (jnp.arange(accum), micro))

        count = jnp.maximum(sums["count"], 1.0)
        grads = jax.tree.map(lambda g: g / count, grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        ema = (optim.ema_update(state.ema_params, params, ema_decay, state.step)
               if ema_decay > 0 else None)
        metrics = {k: v / count for k, v in sums.items() if k != "count"}
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["learning_rate"] = schedule(state.step)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                             ema_params=ema, model_state=model_state), metrics

    return train_step


def make_eval_step(task):
    """The (unjitted) eval step ``(params, batch, model_state=None) -> (masked sums,
    gathered)``: ``gathered`` holds the per-example values ``[batch]`` of the metrics named by
    the task's optional ``gathered_metrics`` (those are not summed), padding rows included;
    ``model_state`` is the TrainState's (tasks with ``state_collections``)."""
    gather = tuple(getattr(task, "gathered_metrics", ()))

    def eval_step(params, batch, model_state=None):
        loss, metrics, _ = _task_loss(task, params, model_state, batch, jax.random.PRNGKey(0),
                                      False)
        summed = {k: v for k, v in metrics.items() if k not in gather}
        return _masked_sums(loss, summed, batch["mask"]), {k: metrics[k] for k in gather}

    return eval_step


def evaluate_split(task, eval_step, params, split, batch_size, put_batch=lambda b: b,
                   model_state=None):
    """``{metric: value}`` of ``split``: the averages over its real examples of the loss and
    the task's per-example metrics, plus ``task.split_metrics(split, gathered)`` when the task
    gathers metrics (values of the real examples, in split order, as numpy arrays)."""
    sums, gathered = None, []
    for batch in task.eval_batches(split, batch_size):
        out, values = eval_step(params, put_batch(batch), model_state)
        sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
        if values:
            real = np.asarray(batch["mask"]) > 0
            gathered.append({k: np.asarray(v)[real] for k, v in jax.device_get(values).items()})
    results = _averages(jax.device_get(sums))
    if gathered:
        results.update(task.split_metrics(split, {k: np.concatenate([g[k] for g in gathered])
                                                  for k in gathered[0]}))
    return results


def _check_config(config):
    if config.optim.schedule not in optim.SCHEDULES:
        raise UserError(f"config.optim.schedule={config.optim.schedule!r} is not one of "
                        f"{', '.join(optim.SCHEDULES)}")
    for key in ("num_train_steps", "batch_size", "eval_batch_size", "grad_accum_steps",
                "log_every", "checkpoint_every", "keep_checkpoints"):
        if config[key] < 1:
            raise UserError(f"config.{key} must be >= 1, got {config[key]}")
    if config.eval_every < 0:
        raise UserError(f"config.eval_every must be >= 0 (0: only at the end), got "
                        f"{config.eval_every}")
    if config.optim.decay_lr_factor <= 0:
        raise UserError(f"config.optim.decay_lr_factor must be > 0 (1: the common learning "
                        f"rate), got {config.optim.decay_lr_factor}")
    try:
        optim.parse_lr_factors(config.optim.lr_factors)
    except ValueError as e:
        raise UserError(str(e)) from None
    if "/" not in config.best_metric or config.best_metric.split("/")[0] not in config.eval_splits:
        raise UserError(f"config.best_metric={config.best_metric!r} must be 'split/metric' "
                        f"with split in config.eval_splits {tuple(config.eval_splits)}")


def _check_same_model(workdir, config):
    """Resuming: ``config.model`` must be the model in ``workdir/config.json``, or the run
    would go on as another model whose parameters happen to have the same shapes (a config
    default changed since, a flag left out). UserError names the first key that differs.
    Keys in only one of the two are not compared (a key added since is taken to default to
    the old behaviour). The training loop's settings (segments, checkpoints, batching) may
    change."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        stored = json.load(f).get("model")
    now = json.loads(config.to_json_best_effort()).get("model")
    if stored is None or now is None:
        return

    def first_difference(old, new, prefix):
        for key in sorted(set(old) & set(new)):
            a, b = old[key], new[key]
            if isinstance(a, dict) and isinstance(b, dict):
                found = first_difference(a, b, f"{prefix}.{key}")
                if found:
                    return found
            elif a != b:
                return f"{prefix}.{key}", a, b
        return None

    found = first_difference(stored, now, "model")
    if found is None:
        return
    key, old, new = found
    raise UserError(f"{workdir} holds a run with {key}={old!r}, this config has {new!r}: "
                    f"resume with the run's settings (--config.{key}={old!r}; its "
                    "config.json has them all) or train in a new --workdir")


def train_and_evaluate(config, workdir, *, task=None, devices=None, config_name=None):
    """Trains ``config`` in ``workdir`` (resuming from its latest checkpoint if any).

    Args:
      config: a config from configs/ (keys in configs/common.py).
      workdir: output directory: checkpoints/, best/, metrics.jsonl, config.json.
      task: a task object (experiments/tasks/); default: built from ``config.task``.
      devices: devices of the mesh; default: all.
      config_name: the ``--config`` argument (``path.py[:variant]``), recorded in the run's
        ``run`` records of metrics.jsonl.

    Returns:
      The summary dict that is also printed: best and final eval records, the task's extra
      numbers, wall time and paths.

    Raises:
      UserError: bad configuration or devices, missing data, or a NaN/Inf loss.
    """
    start_time = time.time()
    sharding.maybe_initialize_distributed(config.distributed)
    _check_config(config)
    mesh = sharding.make_mesh(config.mesh, devices)
    sharding.check_batch_size(config.batch_size, mesh, config.grad_accum_steps)
    sharding.check_batch_size(config.eval_batch_size, mesh, name="eval_batch_size")
    rules = sharding.axis_rules(config)
    task = get_task(config) if task is None else task
    total_steps = config.num_train_steps
    tx, schedule = optim.make_optimizer(config.optim, total_steps)
    os.makedirs(workdir, exist_ok=True)
    checkpointer = Checkpointer(workdir, keep=config.keep_checkpoints)
    if checkpointer.latest_step() is not None:
        _check_same_model(workdir, config)
    if jax.process_index() == 0:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config.to_json_best_effort(indent=2))

    init_rng, train_rng = jax.random.split(jax.random.PRNGKey(config.seed))
    fresh = None if checkpointer.latest_step() is not None else host_variables(task, init_rng)
    repl = sharding.replicated(mesh)
    data_sharding = sharding.batch_sharding(mesh)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        params_sharding = sharding.param_shardings(
            jax.eval_shape(task.init, init_rng), mesh, rules)["params"]
        names = optim.param_names(params_sharding)
        unmatched = sorted(set(optim.parse_lr_factors(config.optim.lr_factors)) - set(names))
        if unmatched:
            raise UserError(f"config.optim.lr_factors names {', '.join(unmatched)}, which no "
                            f"module or parameter of the model is called; the model's names: "
                            f"{', '.join(n for n in names if not n.isdigit())}")

        def init_state(params, model_state):
            return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                              opt_state=tx.init(params),
                              ema_params=params if config.optim.ema_decay > 0 else None,
                              rng=train_rng, model_state=model_state)

        abstract_state = jax.eval_shape(lambda: init_state(*split_variables(
            task, nn.meta.unbox(task.init(init_rng)))))
        split, metric = config.best_metric.split("/", 1)
        sums, _ = jax.eval_shape(make_eval_step(task), abstract_state.params,
                                 next(iter(task.eval_batches(split, config.eval_batch_size))),
                                 abstract_state.model_state)
        names = [k for k in sums if k != "count"] + list(getattr(task, "split_metric_names", ()))
        if metric not in names:
            raise UserError(f"config.best_metric={config.best_metric!r}: {split} has no metric "
                            f"{metric!r} (it has {', '.join(names)})")
        state_sharding = TrainState(
            step=repl, params=params_sharding,
            opt_state=optax.tree_map_params(tx, lambda _, s: s, abstract_state.opt_state,
                                            params_sharding, transform_non_params=lambda _: repl),
            ema_params=params_sharding if config.optim.ema_decay > 0 else None, rng=repl,
            model_state=jax.tree.map(lambda _: repl, abstract_state.model_state))
        train_step = jax.jit(make_train_step(task, tx, schedule, config),
                             in_shardings=(state_sharding, data_sharding),
                             out_shardings=(state_sharding, repl), donate_argnums=0)
        eval_step = jax.jit(make_eval_step(task), in_shardings=(
            params_sharding, data_sharding, state_sharding.model_state), out_shardings=repl)

        train_batches = task.train_batches(config.batch_size, config.seed)
        restored = checkpointer.restore_latest(_stored(jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            abstract_state, state_sharding)))
        if restored is None:
            params, model_state = fresh
            if hasattr(task, "warm_start"):  # e.g. a pre-trained encoder, read on the host
                params, model_state = task.warm_start(params, model_state)
            params, model_state = sharding.put_global(
                (params, model_state), (params_sharding, state_sharding.model_state))
            state = jax.jit(init_state, out_shardings=state_sharding)(params, model_state)
            record = {"best": None, "last_eval": None}
        else:
            stored, meta = restored
            state = TrainState(**stored)
            train_batches.set_state(meta["data_state"])
            record = meta["record"]
        start_step = int(state.step)

        num_params = sum(x.size for x in jax.tree.leaves(abstract_state.params))
        echo(f"{'Resuming from step ' + str(start_step) if restored else 'Starting'} in "
             f"{workdir}: {num_params:,} parameters, mesh {dict(mesh.shape)} over "
             f"{mesh.devices.size} {jax.devices()[0].platform} device(s)"
             + (f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")
             + f", {total_steps} steps of {config.batch_size} examples")
        writer = MetricsWriter(workdir, resume_step=start_step if restored else None)
        device = jax.devices()[0]
        writer.write_run_info(start_step, {
            "device": getattr(device, "device_kind", device.platform),
            "platform": device.platform, "num_devices": mesh.devices.size,
            "num_processes": jax.process_count(), "jax": jax.__version__,
            "config": config_name or ""})
        bar = ProgressBar(total_steps, start_step, config.batch_size, config.progress_bar)

        window = []  # host metrics of the steps since the last train log
        window_start = time.time()
        pending = None  # (step, device metrics) not yet read by the host

        def read_pending():
            nonlocal pending
            step, metrics = pending
            pending = None
            metrics = jax.device_get(metrics)
            if not (np.isfinite(metrics["loss"]) and np.isfinite(metrics["grad_norm"])):
                last = checkpointer.latest_step()
                raise UserError(
                    f"loss is {metrics['loss']} (gradient norm {metrics['grad_norm']}) at step "
                    f"{step}; stopped. Last good checkpoint: "
                    + (f"step {last} in {checkpointer.latest_dir}" if last is not None
                       else "none (diverged before the first checkpoint)"))
            window.append(metrics)
            bar.update(loss=f"{metrics['loss']:.4f}")

        try:
            for step in range(start_step + 1, total_steps + 1):
                batch = sharding.put_batch(next(train_batches), data_sharding)
                state, metrics = train_step(state, batch)
                if pending is not None:
                    read_pending()
                pending = (step, metrics)
                last = step == total_steps
                do_log = step % config.log_every == 0 or last
                do_eval = last or (config.eval_every > 0 and step % config.eval_every == 0)
                do_save = last or step % config.checkpoint_every == 0
                if not (do_log or do_eval or do_save):
                    continue
                read_pending()
                if do_log:
                    averaged = {k: float(np.mean([m[k] for m in window])) for k in window[0]}
                    averaged["steps_per_sec"] = len(window) / (time.time() - window_start)
                    writer.write(step, "train", averaged)
                    window = []
                if do_eval:
                    eval_params = state.ema_params if config.optim.ema_decay > 0 else state.params
                    flat = {"step": step}
                    for split in task.eval_splits:
                        results = evaluate_split(
                            task, eval_step, eval_params, split, config.eval_batch_size,
                            lambda b: sharding.put_batch(b, data_sharding), state.model_state)
                        writer.write(step, split, results)
                        flat.update({f"{split}/{k}": v for k, v in results.items()})
                    echo(f"step {step}: " + ", ".join(
                        f"{k} {v:.4f}" for k, v in flat.items() if k != "step"))
                    record["last_eval"] = flat
                    best = record["best"]
                    if best is None or flat[config.best_metric] > best[config.best_metric]:
                        record["best"] = flat
                        checkpointer.save(step, _stored(state), _meta(train_batches, record),
                                        best=True)
                if do_save:
                    checkpointer.save(step, _stored(state), _meta(train_batches, record))
                    if (config.max_run_seconds and not last
                            and time.time() - start_time > config.max_run_seconds):
                        echo(f"Stopping at step {step} of {total_steps}: this run has reached "
                             f"config.max_run_seconds={config.max_run_seconds}; run the same "
                             "command again to resume from this checkpoint")
                        break
                if do_log:  # the next window's rate excludes this step's eval and save
                    window_start = time.time()
        finally:
            bar.close()
            writer.close()
            checkpointer.close()

    summary = {
        "best": record["best"],
        "final": record["last_eval"],
        **task.summary(),
        "wall_time_s": time.time() - start_time,
        "workdir": os.path.abspath(workdir),
        "metrics": os.path.abspath(writer.path),
        "checkpoints": checkpointer.latest_dir,
        "best_checkpoint": checkpointer.best_dir,
    }
    _print_summary(summary, config.best_metric)
    return summary


def _meta(train_batches, record):
    """The JSON item of a checkpoint."""
    return {"data_state": train_batches.get_state(), "record": record}


def _print_summary(summary, best_metric):
    best, final = summary["best"], summary["final"]
    lines = ["", "Summary"]
    if best is not None:
        others = ", ".join(f"{k} {v:.4f}" for k, v in best.items()
                           if k.endswith("accuracy") and k != best_metric)
        lines.append(f"  best {best_metric:<22} {best[best_metric]:.4f} at step {best['step']}"
                     + (f" ({others} there)" if others else ""))
    if final is not None:
        lines.append(f"  final (step {final['step']}): " + ", ".join(
            f"{k} {v:.4f}" for k, v in final.items() if k != "step"))
    skip = {"best", "final", "wall_time_s", "workdir", "metrics", "checkpoints",
            "best_checkpoint"}
    lines += [f"  {k:<27} {v:.4f}" for k, v in summary.items() if k not in skip]
    lines.append(f"  {'wall time':<27} {summary['wall_time_s']:.1f} s (this run)")
    for key in ("workdir", "metrics", "checkpoints", "best_checkpoint"):
        lines.append(f"  {key.replace('_', ' '):<27} {summary[key]}")
    echo("\n".join(lines))

