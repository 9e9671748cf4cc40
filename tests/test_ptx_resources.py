"""experiments.ptx_resources: registers and spills of a Pallas Triton kernel for sm_90a, read
on the CPU (the real case needs the ``triton`` package, not a project dependency)."""

import pytest

from experiments import ptx_resources

# a ptxas -v log (triton 3.9.0's ptxas, per_feature_grads at K = V = 64, 4 warps)
PTXAS_LOG = """\
ptxas info    : 11 bytes gmem
ptxas info    : Compiling entry function 'per_feature_grads' for 'sm_90a'
ptxas info    : Function properties for per_feature_grads
    872 bytes stack frame, 920 bytes spill stores, 940 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 872 bytes cumulative stack size
"""


def test_parse_ptxas():
    assert ptx_resources.parse_ptxas(PTXAS_LOG) == (255, 920, 940)
    with pytest.raises(ValueError, match="no register or spill counts"):
        ptx_resources.parse_ptxas("ptxas info    : 11 bytes gmem\n")


def test_per_feature_grads_registers():
    """The per-feature op's Triton kernels are in its fwd+bwd lowering, and K in blocks
    of 32 with twice the warps spills less in its gradients kernel (a quarter of the tiles per
    thread)."""
    try:
        ptx_resources.import_triton()
    except ptx_resources.MissingTool as e:
        pytest.skip(str(e))

    module = ptx_resources.lowered_module("pallas_causal_per_feature", 64, "fwd+bwd", {})
    names = {name for name, _, _, _ in ptx_resources.triton_calls(module)}
    assert {"chunk_outputs_per_feature", "prefix_states", "per_feature_grads"} <= names

    def grads(settings):
        [(_, warps, r)] = ptx_resources.measure("pallas_causal_per_feature", 64,
                                                settings=settings, kernels=["per_feature_grads"])
        assert r.registers > 0 and r.spill_stores >= 0
        return warps, r
    whole_warps, whole = grads({"per_feature_grads.NUM_WARPS": 4})
    split_warps, split = grads({"per_feature_grads.NUM_WARPS": 8,
                                "per_feature_grads.BLOCK_K": 32})
    assert (whole_warps, split_warps) == (4, 8)
    with pytest.raises(ValueError, match="no Triton kernel named \\['nope'\\]; it has"):
        ptx_resources.measure("pallas_causal_per_feature", 64, kernels=["nope"])
    assert split.spill_stores < whole.spill_stores and split.shared < whole.shared
