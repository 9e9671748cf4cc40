"""bench_vision's CPU-testable parts: the train sides, the lion_dense backend switch, the
timing in rounds and the train table."""

import jax
import jax.numpy as jnp
import numpy as np

import pallas_kernels
from experiments import bench_vision


def test_train_sides_name_every_model_multiple_and_backend():
    sides = bench_vision.train_sides("tiny", (1, 8), ("triton", "mosaic"))
    names = [name for name, _, _ in sides]
    assert len(names) == len(set(names)) == 2 + 4 * 2 * 2
    assert "LION-S (v2) (tokens to a multiple of 8, lion_dense on mosaic)" in names
    assert "LION-LIT (lion_dense on triton)" in names
    by_name = {name: (net, backend) for name, net, backend in sides}
    net, backend = by_name["LION-S (tokens to a multiple of 8, lion_dense on mosaic)"]
    assert (net.token_multiple, backend, net.orders) == (8, "mosaic", ("raster",))
    assert [name for name, _, _ in bench_vision.train_sides("tiny")][2:] == [
        f"{n} (tokens to a multiple of 8)" for n in ("LION-LIT", "LION-D", "LION-S",
                                                     "LION-S (v2)")]
    sides = bench_vision.train_sides("tiny", (8,), ("mosaic",), ("s_v2",))
    assert [name for name, _, _ in sides][2:] == [
        "LION-S (v2) (tokens to a multiple of 8, lion_dense on mosaic)"]
    assert sides[2][1].orders == ("row_snake", "col_snake")
    # LION-S as the vision configs build it (bf16 gate products) and with float32 ones
    sides = bench_vision.train_sides("tiny", (8,), (None,), ("s", "s_gate32"))
    assert [net.mixer.get("gate_products", "float32") for _, net, _ in sides[2:]] == [
        "compute", "float32"]


def test_dense_backend_switches_the_kernels_while_tracing():
    x = jnp.zeros((1, 40, 2, 64), jnp.bfloat16)
    g = jnp.zeros((1, 40, 2), jnp.float32)

    def traced():
        return str(jax.make_jaxpr(lambda *a: pallas_kernels.lion_dense(*a))(x, x, x, g))

    with bench_vision.dense_backend("mosaic"):
        assert "wgmma" in traced()
    assert "wgmma" not in traced()  # restored: on CPU the default is Triton's interpreter
    with bench_vision.dense_backend(None):
        assert "wgmma" not in traced()


def test_timed_in_rounds_and_the_train_table():
    rng = np.random.default_rng()
    x = jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)
    steps = {"small": (jax.jit(lambda a: a @ a), (x,)),
             "large": (jax.jit(lambda a: a @ a @ a @ a), (x,))}
    times = bench_vision.timed_in_rounds(steps, calls=3)
    assert set(times) == {"small", "large"}
    for median, fastest in times.values():
        assert 0 < fastest <= median
    train = [("ViT (cuDNN flash softmax)", (10.0, 8.0, 30.0)), ("LION-S", (12.0, 9.0, 101.4)),
             ("LION-D", "out of memory")]
    table = bench_vision.markdown("CPU", "tiny", train, 4, [], {}, [], 2, 3)
    assert "| LION-S | 12.00 | 9.00 | 1.20x | 1.12x | 101 |" in table
    assert "| LION-D | out of memory | | | | |" in table
    assert "Inference" not in table  # no inference sides ran: no empty table


def test_train_step_plot(tmp_path):
    train = [("ViT (cuDNN flash softmax)", (10.0, 8.0, 30.0)), ("LION-S", (12.0, 9.0, 101.4)),
             ("LION-D", "out of memory")]
    path = tmp_path / "train_step.png"
    bench_vision.plot_train(str(path), train)
    assert path.stat().st_size > 1000
