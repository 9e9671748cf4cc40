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
    try:
        ptx_resources.import_triton()
    except ptx_resources.MissingTool as e:
        pytest.skip(str(e))
    [whole] = ptx_resources.measure("per_feature_grads", dim=64, warps=4)
    assert whole.registers > 0 and whole.shared > 0
    assert whole.spill_stores >= 0 and whole.spill_loads >= 0
    # K in blocks of 32 and twice the warps: each thread holds a quarter of the tiles
    [split] = ptx_resources.measure("per_feature_grads", dim=64, warps=8,
                                    settings={"per_feature_grads.BLOCK_K": 32})
    assert split.spill_stores < whole.spill_stores and split.shared < whole.shared
