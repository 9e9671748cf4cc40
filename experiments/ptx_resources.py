"""Registers, spill bytes and shared memory of the Pallas Triton kernels of an op on an H100
(sm_90a), read on any machine (no GPU needed).

    python -m experiments.ptx_resources [--op pallas_causal_per_feature] [--dims 64,128]
        [--pass fwd+bwd] [--variant w8:per_feature_grads.NUM_WARPS=8 ...]
        [--kernels per_feature_grads,prefix_states]

The op is one of ``bench_kernels.jax_cases`` (bf16, B = H = 1, L = 128, K = V = dim); each
variant's settings as ``experiments.ab_settings`` takes them ("default": as they are). For every
Triton kernel in the op's lowering, one row:

1. the op is lowered for CUDA under an abstract H100 (``jax.sharding.use_abstract_mesh`` with
   an ``AbstractDevice``, which Pallas' lowerings take as the compute capability) with
   ``jax.default_backend()`` answering "gpu", so that the op takes compiled kernels, not the
   interpreter. The op sees a CPU device, so it takes the kernels it takes off Hopper: on an
   H100 some of them run on Mosaic GPU instead (not Triton calls: not listed);
2. each kernel's Triton IR is read from its ``__gpu$xla.gpu.triton`` custom call: the
   ``ir`` field of ``mhlo.backend_config`` holds it as MLIR bytecode
   (``jax/_src/pallas/triton/pallas_call_registration.py``), which jaxlib's own Triton dialect
   turns back into text, with ``name``, ``num_warps`` and ``num_stages`` beside it;
3. the ``triton`` package compiles that text for ``GPUTarget("cuda", 90, 32)`` to PTX, and its
   bundled ptxas assembles the PTX with ``-v`` (the flags of Triton's own cubin step), whose
   log gives the registers and spills; shared memory is Triton's (dynamic) allocation.

The numbers are those of the ``triton`` package's passes and ptxas: XLA compiles the same IR
with the Triton, LLVM and ptxas it was built with, so on the GPU they may differ somewhat.

Needs the ``triton`` package, which is not a dependency of the project (3.9.0 parses the IR of
jax 0.11.2): ``pip install --target /tmp/tritonsite triton==3.9.0``, then run with
``PYTHONPATH=/tmp/tritonsite:.`` (or install it into any other environment).
"""

import argparse
import contextlib
import dataclasses
import itertools
import os
import re
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

from experiments.ab_settings import parse_variant
from experiments.bench_kernels import jax_cases, traced_under, with_grads

TRITON_CALL = "__gpu$xla.gpu.triton"
TRITON_FIX = ("pip install --target /tmp/tritonsite triton==3.9.0, then run with "
              "PYTHONPATH=/tmp/tritonsite:.")
H100 = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu")
BF16, F32 = jnp.bfloat16, jnp.float32


class MissingTool(Exception):
    """triton or its ptxas is not there (the message names the fix)."""


@dataclasses.dataclass(frozen=True)
class Resources:
    """A kernel's resources on sm_90a: ptxas' registers and spills, Triton's shared memory."""
    registers: int
    spill_stores: int
    spill_loads: int
    shared: int


def lowered_module(op, dim, kind, settings):
    """The StableHLO of ``op`` (a ``bench_kernels.jax_cases`` name; ``kind`` "fwd" or
    "fwd+bwd") at bf16, B = H = 1, L = 128, K = V = ``dim``, lowered for CUDA under an abstract
    H100 with ``settings`` in place."""
    fn = jax_cases(quick=False)[op]
    tok = jax.ShapeDtypeStruct((1, 128, 1, dim), BF16)
    args = (tok, tok, tok, jax.ShapeDtypeStruct((1, 128, 1), F32))
    if kind == "fwd+bwd":
        fn = with_grads(fn, jnp.zeros(tok.shape, tok.dtype))
    mesh = AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=H100)
    with traced_under(settings), use_abstract_mesh(mesh), gpu_default_backend():
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).compiler_ir(
            "stablehlo")


@contextlib.contextmanager
def gpu_default_backend():
    """``jax.default_backend()`` answering "gpu" inside the block: the ops read it when traced
    to choose the Pallas interpreter on a CPU, and here their compiled kernels are wanted.
    (JAX's own code asks ``xla_bridge`` directly, not this attribute.)"""
    saved = jax.default_backend
    jax.default_backend = lambda: "gpu"
    try:
        yield
    finally:
        jax.default_backend = saved


def triton_calls(module):
    """``[(name, ttir text, num_warps, num_stages)]``: the Triton calls of a lowered module,
    in order."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.triton import dialect as tt_dialect

    configs = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    attrs = inner.operation.attributes
                    if (inner.operation.name == "stablehlo.custom_call"
                            and ir.StringAttr(attrs["call_target_name"]).value == TRITON_CALL):
                        configs.append(ir.DictAttr(attrs["mhlo.backend_config"]))
                    walk(inner.operation)
    walk(module.operation)
    context = ir.Context()
    tt_dialect.register_dialect(context)
    calls = []
    with context:
        for config in configs:
            kernel = ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes)
            calls.append((ir.StringAttr(config["name"]).value,
                          kernel.operation.get_asm(enable_debug_info=False),
                          ir.IntegerAttr(config["num_warps"]).value,
                          ir.IntegerAttr(config["num_stages"]).value))
    return calls


def parse_ptxas(log):
    """``(registers, spill store bytes, spill load bytes)`` from a ``ptxas -v`` log."""
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if registers is None or spills is None:
        raise ValueError(f"no register or spill counts in the ptxas log:\n{log}")
    return int(registers[1]), int(spills[1]), int(spills[2])


def import_triton():
    """The ``triton`` package and its compile helpers, or MissingTool naming the fix."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError as e:
        raise MissingTool(f"triton is not importable ({e}): {TRITON_FIX}") from None
    return triton, GPUTarget, get_ptxas


def sm90_resources(ttir, num_warps, num_stages):
    """Resources of Triton IR text compiled by the ``triton`` package for sm_90a."""
    triton, GPUTarget, get_ptxas = import_triton()
    try:
        ptxas = get_ptxas(90).path
    except Exception as e:  # Triton raises RuntimeError when it finds no ptxas
        raise MissingTool(f"triton found no ptxas ({e}): {TRITON_FIX}") from None
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ttir")
        with open(src, "w") as f:
            f.write(ttir)
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(
            num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=True))
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        # the flags of Triton's cubin step (triton/backends/nvidia/compiler.py, make_cubin)
        log = subprocess.run([ptxas, "-lineinfo", "-v", "--regAllocOptLevel=2",
                              "--gpu-name=sm_90a", ptx, "-o", os.path.join(tmp, "kernel.o")],
                             capture_output=True, text=True, check=True).stderr
    return Resources(*parse_ptxas(log), shared=kernel.metadata.shared)


def measure(op, dim, kind="fwd+bwd", settings=None, kernels=None):
    """``[(kernel name, num_warps, Resources)]``, one per Triton call of ``op`` at K = V =
    ``dim`` (``kind`` "fwd" or "fwd+bwd") under ``settings`` (``{"module.NAME": value}``),
    those named in ``kernels`` only unless it is None; a kernel built several times
    (``lax.cond`` branches) gives a row per build."""
    import_triton()  # fail before the lowering, not after it
    calls = triton_calls(lowered_module(op, dim, kind, settings or {}))
    missing = set(kernels or ()) - {name for name, _, _, _ in calls}
    if missing:
        raise ValueError(f"{op} {kind} at K = V = {dim} has no Triton kernel named "
                         f"{sorted(missing)}; it has {sorted({c[0] for c in calls})}")
    return [(name, warps, sm90_resources(ttir, warps, stages))
            for name, ttir, warps, stages in calls if kernels is None or name in kernels]


def ints(text):
    """Comma-separated ints."""
    return [int(n) for n in text.split(",")]


def main():
    """Print the table of ``--op`` at each of ``--dims`` and ``--variant``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="pallas_causal_per_feature",
                        help="a bench_kernels.jax_cases name")
    parser.add_argument("--dims", type=ints, default=[64, 128], help="K = V, comma-separated")
    parser.add_argument("--pass", dest="kind", choices=("fwd", "fwd+bwd"), default="fwd+bwd")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:SETTING=VALUE[,...] as experiments.ab_settings takes it")
    parser.add_argument("--kernels", default=None,
                        help="comma-separated kernel names (pallas_call name=); default all")
    args = parser.parse_args()
    if args.op not in jax_cases(quick=False):
        parser.error(f"unknown --op {args.op!r}; choose from {list(jax_cases(quick=False))}")
    try:
        variants = dict([("default", {})] + [parse_variant(v) for v in args.variant])
        triton = import_triton()[0]
    except (ValueError, MissingTool) as e:
        sys.exit(f"error: {e}")
    print(f"jax {jax.__version__}, triton {triton.__version__}: {args.op} {args.kind}, "
          "sm_90a (H100), ptxas -v")
    print("| variant | K = V | kernel | warps | registers | spill stores (B) | spill loads (B) "
          "| shared memory (B) |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, settings), dim in itertools.product(variants.items(), args.dims):
        try:
            rows = measure(args.op, dim, args.kind, settings,
                           args.kernels and args.kernels.split(","))
        except (MissingTool, ValueError) as e:
            sys.exit(f"error: {e}")
        for kernel, warps, r in rows:
            print(f"| {name} | {dim} | {kernel} | {warps} | {r.registers} | {r.spill_stores} "
                  f"| {r.spill_loads} | {r.shared} |", flush=True)


if __name__ == "__main__":
    main()
