"""Devices: the mesh, parameter and batch shardings, multi-process start-up.

The mesh has the axes ``("data", "fsdp", "model")`` with sizes from ``config.mesh`` (one
size may be -1: the devices left over). Examples of a batch are split over ``data`` and
``fsdp`` together (both are data-parallel); parameters are split by flax logical-axis
annotations mapped to mesh axes through ``config.logical_axis_rules`` (FSDP: ``embed`` ->
``fsdp``; tensor parallel: ``heads``/``mlp`` -> ``model``). The same code runs on one CPU
and on N GPUs; only the mesh sizes change.
"""

import math
import os

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils, multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from experiments.errors import UserError

MESH_AXES = ("data", "fsdp", "model")
BATCH_AXES = ("data", "fsdp")


def maybe_initialize_distributed(enabled):
    """Starts multi-process JAX when ``enabled`` or ``JAX_COORDINATOR_ADDRESS`` is set.

    With ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (what
    ``python -m experiments.launch`` sets; jax itself reads only the address) the process joins
    that group; with none of them ``jax.distributed.initialize()`` detects a cluster (SLURM,
    Open MPI, Kubernetes, Cloud TPU). Must run before JAX touches a device; a second call is a
    no-op.
    """
    names = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
    given = {name: os.environ.get(name) for name in names if os.environ.get(name)}
    if not (enabled or given) or jax.distributed.is_initialized():
        return
    if not given:
        jax.distributed.initialize()
        return
    if len(given) < len(names):
        missing = ", ".join(name for name in names if name not in given)
        raise UserError(f"{', '.join(given)} set but {missing} not: set all three (or start "
                        "the processes with python -m experiments.launch)")
    try:
        count, index = int(given["JAX_NUM_PROCESSES"]), int(given["JAX_PROCESS_ID"])
    except ValueError:
        raise UserError(f"JAX_NUM_PROCESSES={given['JAX_NUM_PROCESSES']!r} and JAX_PROCESS_ID="
                        f"{given['JAX_PROCESS_ID']!r} must be integers") from None
    if not 0 <= index < count:
        raise UserError(f"JAX_PROCESS_ID={index} must lie in [0, JAX_NUM_PROCESSES={count})")
    jax.distributed.initialize(given["JAX_COORDINATOR_ADDRESS"], num_processes=count,
                               process_id=index)


def make_mesh(mesh_config, devices=None):
    """A ``Mesh`` over ``devices`` (default: all) with sizes from ``config.mesh``."""
    devices = list(jax.devices() if devices is None else devices)
    unknown = set(mesh_config) - set(MESH_AXES)
    if unknown:
        raise UserError(f"config.mesh has unknown axes {sorted(unknown)}; "
                        f"the axes are {', '.join(MESH_AXES)}")
    sizes = [int(mesh_config.get(axis, 1)) for axis in MESH_AXES]
    described = ", ".join(f"{a}={s}" for a, s in zip(MESH_AXES, sizes))
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise UserError(f"invalid mesh ({described}): sizes must be positive, "
                        "with at most one -1 (fill the remaining devices)")
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % fixed:
            raise UserError(f"mesh ({described}) cannot fill {len(devices)} devices: "
                            f"{len(devices)} is not divisible by {fixed}")
        sizes[sizes.index(-1)] = len(devices) // fixed
    elif fixed != len(devices):
        raise UserError(f"mesh ({described}) has {fixed} devices but {len(devices)} are "
                        "available; set config.mesh.* so the product matches (or use -1)")
    return Mesh(mesh_utils.create_device_mesh(sizes, devices), MESH_AXES)


def data_parallel_size(mesh):
    """Number of shards a batch is split into (``data`` x ``fsdp``)."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def check_batch_size(batch_size, mesh, grad_accum_steps=1, name="batch_size"):
    """Each micro-batch (``batch_size / grad_accum_steps``) must split evenly over the shards."""
    dp = data_parallel_size(mesh)
    if batch_size % grad_accum_steps or (batch_size // grad_accum_steps) % dp:
        accum = f" / grad_accum_steps {grad_accum_steps}" if grad_accum_steps > 1 else ""
        raise UserError(
            f"config.{name}={batch_size}{accum} is not divisible by the {dp} data-parallel "
            f"shards (mesh data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']}); "
            f"use a multiple of {dp * grad_accum_steps}")


def axis_rules(config):
    """``config.logical_axis_rules`` as the tuple of pairs that flax expects."""
    return tuple((str(name), None if axes is None else axes if isinstance(axes, str)
                  else tuple(axes)) for name, axes in config.logical_axis_rules)


def batch_sharding(mesh):
    """Sharding of every batch array: leading (example) dimension over ``data`` x ``fsdp``."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh):
    """Sharding of an array kept whole on every device."""
    return NamedSharding(mesh, PartitionSpec())


def param_shardings(abstract_variables, mesh, rules):
    """Shardings of the (unboxed) variables from their flax logical-axis annotations.

    ``abstract_variables`` is ``jax.eval_shape`` of the model's ``init``. Unannotated
    variables are replicated, and so is any dimension whose size is not divisible by its
    mesh axes (e.g. ``embed=100`` with ``fsdp=8``), so any model runs on any mesh.
    """
    def sharding_of(leaf):
        boxed = isinstance(leaf, nn.Partitioned)
        shape = leaf.value.shape if boxed else leaf.shape
        mesh_axes = nn.logical_to_mesh_axes(leaf.names, rules) if boxed else ()
        spec = []
        for dim, axes in zip(shape, tuple(mesh_axes) + (None,) * len(shape)):
            names = (axes,) if isinstance(axes, str) else axes or ()
            spec.append(axes if dim % math.prod(mesh.shape[a] for a in names) == 0 else None)
        return NamedSharding(mesh, PartitionSpec(*spec))

    return jax.tree.map(sharding_of, abstract_variables,
                        is_leaf=lambda x: isinstance(x, nn.Partitioned))


def put_batch(batch, sharding):
    """Global numpy batch -> global ``jax.Array``s laid out with ``sharding``.

    Every process holds the same global batch (the input pipelines are deterministic) and
    contributes the slices of its own devices, so this works for any device layout, on one
    or many processes.
    """
    return put_global(batch, jax.tree.map(lambda _: sharding, batch))


def put_global(tree, shardings):
    """Host arrays (the same global values on every process) -> global ``jax.Array``s with
    ``shardings`` (a matching tree); each process fills its own devices' slices."""
    def put(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(put, tree, shardings)


def to_host(tree):
    """Global ``jax.Array``s -> whole numpy arrays on every process (gathered across processes
    when the arrays are sharded over several)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)
