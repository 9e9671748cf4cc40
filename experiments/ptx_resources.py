"""Registers, spill bytes and shared memory of our Pallas Triton kernels on an H100 (sm_90a),
read on any machine (no GPU needed).

    python -m experiments.ptx_resources [--kernel per_feature_grads] [--dims 64,128]
        [--warps 4,8] [--variant bk64:per_feature_grads.BLOCK_K=64 ...]

For each kernel, K = V = dim, warp count and variant (settings as ``experiments.ab_settings``
takes them; "default" is the settings as they are):

1. the op is lowered for CUDA under an abstract H100 (``jax.sharding.use_abstract_mesh`` with
   an ``AbstractDevice``, which Pallas' Triton lowering takes as its compute capability);
2. the kernel's Triton IR is read from its ``__gpu$xla.gpu.triton`` custom call: the
   ``ir`` field of ``mhlo.backend_config`` holds it as MLIR bytecode
   (``jax/_src/pallas/triton/pallas_call_registration.py``), which jaxlib's own Triton dialect
   turns back into text, with ``num_warps`` and ``num_stages`` beside it;
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
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

from experiments.ab_settings import parse_variant
from experiments.bench_kernels import setting_place

TRITON_CALL = "__gpu$xla.gpu.triton"
TRITON_FIX = ("pip install --target /tmp/tritonsite triton==3.9.0, then run with "
              "PYTHONPATH=/tmp/tritonsite:.")
H100 = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu")
BF16, F32 = jnp.bfloat16, jnp.float32


class MissingTool(Exception):
    """triton or its ptxas is not there (the message names the fix)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """What to lower: ``fn`` at ``args`` (shapes and dtypes), and the name of the
    ``pallas_call`` (``name=``) of the kernel to measure in it."""
    fn: Callable
    args: tuple
    kernel: str


@dataclasses.dataclass(frozen=True)
class Resources:
    """A kernel's resources on sm_90a: ptxas' registers and spills, Triton's shared memory."""
    registers: int
    spill_stores: int
    spill_loads: int
    shared: int


@contextlib.contextmanager
def module_global(module, name, value):
    """``module.name`` set to ``value`` inside the block (e.g. a kernel module's NUM_WARPS)."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def per_feature_grads_case(dim, warps, settings):
    """``per_feature_grads`` at B = H = 1, L = 128, chunk 64, K = V = ``dim``, bf16, under
    ``settings`` (``{"module.NAME": value}``)."""
    from pallas_kernels import per_feature_grads as module

    def fn(q, k, v, g, dy, d_state):
        with contextlib.ExitStack() as stack:
            stack.enter_context(module_global(module, "NUM_WARPS", warps))
            for key, value in settings.items():
                stack.enter_context(module_global(*setting_place(key), value))
            return module.per_feature_grads(q, k, v, g, None, dy, d_state, chunk=64,
                                            interpret=False)
    tok = jax.ShapeDtypeStruct((1, 128, 1, dim), BF16)
    g = jax.ShapeDtypeStruct((1, 128, 1, dim), F32)
    d_state = jax.ShapeDtypeStruct((1, 1, dim, dim), F32)
    return Case(fn, (tok, tok, tok, g, tok, d_state), "per_feature_grads")


# name -> builder(dim, warps, settings) -> Case; add a kernel here
KERNELS = {
    "per_feature_grads": per_feature_grads_case,
}


def triton_calls(case):
    """``[(ttir text, num_warps, num_stages)]`` of the Triton calls named ``case.kernel`` in
    ``case.fn``'s CUDA lowering for an (abstract) H100."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.triton import dialect as tt_dialect

    jax.clear_caches()  # the kernels' jits key on shapes, not on a changed NUM_WARPS
    mesh = AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=H100)
    with use_abstract_mesh(mesh):
        lowered = jax.jit(case.fn).trace(*case.args).lower(lowering_platforms=("cuda",))
    configs = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    attrs = inner.operation.attributes
                    if (inner.operation.name == "stablehlo.custom_call"
                            and ir.StringAttr(attrs["call_target_name"]).value == TRITON_CALL):
                        config = ir.DictAttr(attrs["mhlo.backend_config"])
                        if ir.StringAttr(config["name"]).value == case.kernel:
                            configs.append(config)
                    walk(inner.operation)
    walk(lowered.compiler_ir("stablehlo").operation)
    if not configs:
        raise ValueError(f"no Triton call named {case.kernel!r} in the lowering")
    context = ir.Context()
    tt_dialect.register_dialect(context)
    calls = []
    with context:
        for config in configs:
            module = ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes)
            calls.append((module.operation.get_asm(enable_debug_info=False),
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


def measure(kernel, dim, warps, settings=None):
    """``[Resources]`` of each Triton call of ``kernel`` at K = V = ``dim`` and ``warps``
    under ``settings`` (``{"module.NAME": value}``)."""
    import_triton()  # fail before the lowering, not after it
    rows = []
    for ttir, num_warps, num_stages in triton_calls(KERNELS[kernel](dim, warps,
                                                                    settings or {})):
        if num_warps != warps:
            raise ValueError(f"{kernel} lowered with {num_warps} warps, not {warps}")
        rows.append(sm90_resources(ttir, num_warps, num_stages))
    return rows


def ints(text):
    """Comma-separated ints."""
    return [int(n) for n in text.split(",")]


def main():
    """Print the table of ``--kernel`` at each of ``--dims`` and ``--warps``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default=",".join(KERNELS), help="of " + ", ".join(KERNELS))
    parser.add_argument("--dims", type=ints, default=[64, 128], help="K = V, comma-separated")
    parser.add_argument("--warps", type=ints, default=[4, 8], help="comma-separated")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:SETTING=VALUE[,...] as experiments.ab_settings takes it")
    args = parser.parse_args()
    try:
        variants = dict([("default", {})] + [parse_variant(v) for v in args.variant])
    except ValueError as e:
        parser.error(str(e))
    kernels = args.kernel.split(",")
    if set(kernels) - set(KERNELS):
        parser.error(f"unknown --kernel {sorted(set(kernels) - set(KERNELS))}; "
                     f"choose from {list(KERNELS)}")
    try:
        triton = import_triton()[0]
    except MissingTool as e:
        sys.exit(f"error: {e}")
    print(f"jax {jax.__version__}, triton {triton.__version__}: sm_90a (H100), ptxas -v")
    print("| kernel | variant | K = V | warps | registers | spill stores (B) | spill loads (B) "
          "| shared memory (B) |")
    print("|---|---|---|---|---|---|---|---|")
    for kernel in kernels:
        for (name, settings), dim, warps in itertools.product(variants.items(), args.dims,
                                                              args.warps):
            try:
                rows = measure(kernel, dim, warps, settings)
            except MissingTool as e:
                sys.exit(f"error: {e}")
            for r in rows:
                print(f"| {kernel} | {name} | {dim} | {warps} | {r.registers} "
                      f"| {r.spill_stores} | {r.spill_loads} | {r.shared} |", flush=True)


if __name__ == "__main__":
    main()
