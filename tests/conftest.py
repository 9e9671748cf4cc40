"""Test-wide setup.

Eight host CPU devices are forced before JAX is imported, so sharding tests can build real
meshes on a CPU-only machine; single-device tests simply use the first device.

JAX's compiled executables are dropped after every test module: without that, the whole suite
in one process (CI) crashed inside XLA's CPU compiler (SIGABRT, then SIGSEGV) about 430 tests
in, at the same test each time, while that test's file alone passed (CPU CI, 2026-11-24).

On CPU, XLA compiles with most optimisations off (``jax_disable_most_optimizations``): nearly
every test compiles far more than it computes (interpret-mode kernels, several impls of one op,
tiny training runs), and unoptimised compiles took 15-36 % off the times of the files tried on
2 CPU cores (2026-11-29, docs/benchmarks.md "Test runs"). Tests that run real training (the
notebooks) are marked ``optimized_xla`` and compile as users do: the ListOps notebook ran 1.7x
slower unoptimised. On the GPU (``LION_TEST_GPU=1``) nothing changes.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
if os.environ.get("LION_TEST_GPU") != "1":  # on the GPU machine: LION_TEST_GPU=1 pytest ...
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
else:  # pytest -n workers share the GPU: none may take 75% of its memory up front
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

UNOPTIMIZED = os.environ.get("LION_TEST_GPU") != "1"
jax.config.update("jax_disable_most_optimizations", UNOPTIMIZED)


def pytest_configure(config):
    config.addinivalue_line("markers", "optimized_xla: compile with XLA's optimisations on "
                                       "(tests that train for real; see tests/conftest.py)")


@pytest.fixture(autouse=True)
def _xla_optimizations(request):
    """Optimised compiles for tests marked ``optimized_xla``, unoptimised for the rest (CPU)."""
    optimized = UNOPTIMIZED and request.node.get_closest_marker("optimized_xla") is not None
    if optimized:
        jax.config.update("jax_disable_most_optimizations", False)
    yield
    if optimized:
        jax.config.update("jax_disable_most_optimizations", True)


@pytest.fixture(autouse=True, scope="module")
def _fresh_jax_caches():
    """Frees each test module's compiled executables once the module is done."""
    yield
    jax.clear_caches()


@pytest.fixture
def spy(monkeypatch):
    """``spy(module, name)``: from then on every call of ``module.name`` still runs and
    appends its keyword arguments to the returned list; JAX's caches are cleared so that the
    next traces call it (undone at the test's end)."""
    def install(module, name):
        calls = []
        original = getattr(module, name)

        def recorded(*args, **kwargs):
            calls.append(kwargs)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)
        jax.clear_caches()
        return calls

    return install


@pytest.fixture
def rng(request):
    """A fresh numpy Generator per test; the seed is printed on failure for reproduction
    (``LION_TEST_SEED=<seed> pytest ...`` replays it)."""
    seed = int(os.environ.get("LION_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    request.node.user_properties.append(("seed", seed))
    print(f"[seed={seed}]")
    return np.random.default_rng(seed)
