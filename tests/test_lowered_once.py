"""Every op's kernels are traced and lowered once per shape: a model whose layers call an op
with one shape emits each kernel once, however many layers (pallas_kernels/__init__.py,
"Lowered once"). Checked by lowering for CUDA on the CPU and counting the kernel calls
(``experiments.lowering_cost``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from experiments import lowering_cost
from experiments.lowering_cost import shapes
from pallas_kernels.feature_map import silu_l2

BF16, F32 = jnp.bfloat16, jnp.float32

# small shapes of lowering_cost.OPS' ops (odd lengths where the kernels take them)
CASES = {
    "lion_dense (Mosaic GPU)": (lowering_cost.OPS["lion_dense_mosaic"][0],
                                shapes(2, 40, 2, 64, ())),
    "lion_dense (Triton)": (lowering_cost.OPS["lion_dense_triton"][0], shapes(2, 37, 2, 32, ())),
    "lion_value_decay": (lowering_cost.OPS["lion_value_decay"][0], shapes(2, 50, 2, 16, (16,))),
    "silu_l2": (lambda x: silu_l2(x, interpret=False), [((2, 50, 2, 64), BF16)]),
    "silu_l2_qkv": (lowering_cost.OPS["silu_l2_qkv"][0], [((2, 50, 3 * 3 * 64), BF16),
                                                          ((3 * 3 * 64,), F32)]),
    "causal_linear_attention": (lowering_cost.OPS["causal"][0], shapes(2, 100, 2, 32, ())),
    "causal_linear_attention, a decay per key feature": (
        lowering_cost.OPS["causal_per_feature"][0], shapes(2, 100, 2, 32, (32,))),
    "bidirectional_linear_attention": (lowering_cost.OPS["lion"][0], shapes(2, 100, 2, 32, ())),
}


@pytest.fixture(autouse=True)
def triton_lowering_without_a_gpu():
    with lowering_cost.triton_lowering_without_a_gpu():
        yield


def kernel_calls(op, arg_shapes, layers):
    return lowering_cost.lowered(lowering_cost.layers_grad(op, layers), arg_shapes)[1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_layers_of_one_shape_lower_the_kernels_once(name):
    op, arg_shapes = CASES[name]
    two = kernel_calls(op, arg_shapes, 2)  # with one layer the forward may be dead code
    assert two > 0
    assert kernel_calls(op, arg_shapes, 4) == two


def test_lion_walk_lowers_once_forward():
    def layers(n):
        def run(q, k, v, a):
            for _ in range(n):
                q = pallas_kernels.lion_walk(q, k, v, a, interpret=False).astype(BF16)
            return q
        return lowering_cost.lowered(run, shapes(2, 50, 2, 32, ()))[1]
    assert layers(3) == layers(1) > 0


def test_the_lowering_check_sees_repeated_kernels():
    """The counter itself: an op lowered per call (a plain pallas_call, not jitted) shows one
    kernel per layer, so the equalities above are not vacuous."""
    from jax.experimental import pallas as pl

    def add_one(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + np.float32(1)
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    def run(x):
        for _ in range(3):
            x = add_one(x)
        return x
    assert lowering_cost.lowered(run, [((16, 16), F32)])[1] == 3


def test_lowering_cost_cli(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["lowering_cost", "--ops", "silu_l2", "--layers", "1,3"])
    lowering_cost.main()
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| silu_l2")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "3"]
    assert rows[0].split("|")[4].strip() == "1"  # the forward is dead code at one layer
    monkeypatch.setattr("sys.argv", ["lowering_cost", "--ops", "bogus"])
    with pytest.raises(SystemExit):
        lowering_cost.main()
    assert "unknown --ops ['bogus']" in capsys.readouterr().err
