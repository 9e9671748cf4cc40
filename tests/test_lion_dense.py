"""pallas_kernels.lion_dense (LION for L <= 256, flash-attention style) against a float64
reference materialised from the formulas (ARCHITECTURE.md section 3), and against
lion_jax.ops.lion_attention(impl="attention"): outputs and the gradients of a random linear
loss in q, k, v and log_decay.

CPU (default): the Pallas interpreter. GPU: ``LION_TEST_GPU=1 pytest tests/test_lion_dense.py``.
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from lion_jax import ops

ON_GPU = jax.default_backend() == "gpu"
# as tests/test_lion_walk.py and tests/test_value_decay_kernel.py (ARCHITECTURE.md section 6)
TOL = {jnp.float32: 1e-3 if ON_GPU else 1e-5, jnp.bfloat16: 5e-3}
NAMES = ["y", "dq", "dk", "dv", "dlog_decay"]


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)), "non-finite values in the kernel's result"
    norm = np.linalg.norm(b)
    if norm == 0:  # dlog_decay at L = 1: compare the absolute RMS error instead
        return float(np.linalg.norm(a) / np.sqrt(a.size))
    return float(np.linalg.norm(a - b) / norm)


def make_inputs(rng, B, L, H, K, V, dtype, decay):
    """Positive q, k (LION's feature maps), normal v, a log-decay and a cotangent dy.
    decay: None, "zero", "moderate" (-softplus(N(0, 1))), "mixed" (uniform in [-20, 0]) or
    "strong" (-20 + U(-1, 1) per token)."""
    q = jnp.asarray(np.abs(rng.standard_normal((B, L, H, K))) * K ** -0.5, dtype)
    k = jnp.asarray(np.abs(rng.standard_normal((B, L, H, K))), dtype)
    v = jnp.asarray(rng.standard_normal((B, L, H, V)), dtype)
    g = {None: lambda s: None, "zero": np.zeros,
         "moderate": lambda s: -np.logaddexp(0.0, rng.standard_normal(s)),
         "mixed": lambda s: rng.uniform(-20.0, 0.0, s),
         "strong": lambda s: rng.uniform(-21.0, -19.0, s)}[decay]((B, L, H))
    g = None if g is None else jnp.asarray(g, jnp.float32)
    dy = jnp.asarray(rng.standard_normal((B, L, H, V)), dtype)
    return (q, k, v, g), dy


def formula(q, k, v, g, normalize=True, eps=1e-6):
    """The materialised definition: ``P_ij = (q_i . k_j) exp(-|A_i - A_j|)``."""
    A = jnp.zeros(q.shape[:3], q.dtype) if g is None else jnp.cumsum(g, axis=1)
    A = jnp.moveaxis(A, 1, -1)  # [B, H, L]
    P = jnp.einsum("bihk,bjhk->bhij", q, k) * jnp.exp(-jnp.abs(A[..., :, None]
                                                                - A[..., None, :]))
    y = jnp.einsum("bhij,bjhv->bihv", P, v)
    if normalize:
        y = y / (jnp.moveaxis(P.sum(-1), 1, 2)[..., None] + eps)
    return y


def value_and_grads(fn, args, dy):
    """``[y, dq, dk, dv(, dlog_decay)]`` for the cotangent dy (None args skipped), in one jit
    (one compilation: op by op, the interpreter's compilations took twice as long)."""
    def run(dy, *args):
        y, vjp = jax.vjp(fn, *args)
        return [y, *vjp(dy.astype(y.dtype))]
    return jax.jit(run)(dy, *[a for a in args if a is not None])


def reference(args, dy, **kwargs):
    """float64 ``formula`` on the (rounded) inputs."""
    with jax.enable_x64(True):
        f64 = [jnp.asarray(np.asarray(x, np.float64)) for x in args if x is not None]
        fn = lambda *a: formula(*a, *([None] * (4 - len(a))), **kwargs)  # noqa: E731
        return [np.asarray(x) for x in value_and_grads(fn, f64, jnp.asarray(
            np.asarray(dy, np.float64)))]


def kernel_fn(g, **kwargs):
    if g is None:
        return lambda q, k, v: pallas_kernels.lion_dense(q, k, v, None, **kwargs)
    return lambda q, k, v, g: pallas_kernels.lion_dense(q, k, v, g, **kwargs)


def summand_scales(args, dy, eps=1e-6):
    """Normalised: the norms of ``sum_j |dS_ij| |k_j|`` and ``sum_i |dS_ij| |q_i|`` with
    ``|dS_ij| <= r_i (|dy_i . v_j| + |dy_i . y_i|) M_ij``, the size of the terms that dq and
    dk sum before they cancel (float64)."""
    q, k, v, g = (None if x is None else np.asarray(x, np.float64) for x in args)
    dy = np.asarray(dy, np.float64)
    A = np.moveaxis(np.zeros(q.shape[:3]) if g is None else np.cumsum(g, axis=1), 1, -1)
    M = np.exp(-np.abs(A[..., :, None] - A[..., None, :]))  # [B, H, L, L]
    P = np.einsum("bihk,bjhk->bhij", q, k) * M
    r = 1.0 / (P.sum(-1) + eps)  # [B, H, L]
    y = np.einsum("bhij,bjhv->bhiv", P, v) * r[..., None]
    dyv = np.abs(np.einsum("bihv,bjhv->bhij", dy, v))
    dyy = np.abs(np.einsum("bihv,bhiv->bhi", dy, y))
    bound = r[..., None] * (dyv + dyy[..., None]) * M
    return (np.linalg.norm(np.einsum("bhij,bjhk->bihk", bound, np.abs(k))),
            np.linalg.norm(np.einsum("bhij,bihk->bjhk", bound, np.abs(q))))


CASES = [  # L, K, V, decay, normalize, block
    (1, 16, 24, None, True, None),  # dq, dk: against the size of their summands
    (7, 16, 24, "moderate", True, None),
    (7, 5, 3, "strong", False, None),  # head dims below 16 (masked columns)
    (33, 16, 24, "mixed", True, 16),  # three programs of 16 rows, the last with one token
    (33, 16, 24, None, False, None),
    (33, 8, 12, "strong", True, None),  # dq, dk: against the size of their summands
    (197, 8, 12, "moderate", True, None),  # ViT's length: 3 blocks of 64 and a tail of 16
    (197, 6, 10, "strong", False, None),
    (255, 16, 16, "mixed", False, None),
    (256, 8, 8, "moderate", True, 128),
]


@pytest.mark.parametrize("L,K,V,decay,normalize,block", CASES)
def test_matches_formula(rng, L, K, V, decay, normalize, block):
    """float32: the output and its four gradients against the float64 formula."""
    B, H = (2, 2) if L < 100 else (1, 1)
    args, dy = make_inputs(rng, B, L, H, K, V, jnp.float32, decay)
    fn = kernel_fn(args[3], normalize=normalize, block=block)
    got = value_and_grads(fn, args, dy)
    assert got[0].shape == args[2].shape and got[0].dtype == jnp.float32
    want = reference(args, dy, normalize=normalize)
    # normalised at -20 per token (or L = 1) each row is its own token's v up to ~1e-9 (or
    # eps), and the true dq, dk are what is left after their terms cancel: their error is
    # measured against the size of those terms (float32 rounding), not against themselves
    cancel = normalize and (decay == "strong" or L == 1)
    scales = summand_scales(args, dy) if cancel else None
    for i, (name, a, b) in enumerate(zip(NAMES, got, want)):
        if scales is not None and name in ("dq", "dk"):
            err = float(np.linalg.norm(np.asarray(a, np.float64) - b)) / scales[i - 1]
            assert np.all(np.isfinite(np.asarray(a)))
        else:
            err = rel_err(a, b)
        print(f"{name}: {err:.2e}")
        assert err <= TOL[jnp.float32], f"{name}: {err:.3e}"


@pytest.mark.parametrize("normalize", [True, False])
def test_bf16(rng, normalize):
    """bf16 in and out: the output (differentiated and not) and the gradients within bf16's
    tolerance of float64 on the rounded inputs, decays uniform in [-20, 0]."""
    args, dy = make_inputs(rng, 1, 100, 2, 32, 32, jnp.bfloat16, "mixed")
    fn = kernel_fn(args[3], normalize=normalize)
    got = value_and_grads(fn, args, dy)
    assert got[0].dtype == jnp.bfloat16
    assert [x.dtype for x in got[1:]] == [jnp.bfloat16] * 3 + [jnp.float32]
    want = reference(args, dy, normalize=normalize)
    for name, a, b in zip(NAMES, got, want):
        err = rel_err(a, b)
        print(f"{name}: {err:.2e}")
        assert err <= TOL[jnp.bfloat16], f"{name}: {err:.3e}"
    y = jax.jit(fn)(*[a for a in args if a is not None])  # not differentiated: one part
    assert rel_err(y, want[0]) <= TOL[jnp.bfloat16]


def test_bf16_decay_gradient(rng):
    """Normalised bf16 at ViT-T's head shape: d log_decay (float32) to ~16 bits. Off the
    diagonal block dA comes from dq's and dk's steps, whose dS is rounded to bf16; in two
    parts that kept 3.1e-6 to 4.4e-6 of relative RMS error over seeds 0-9, with dk's step in
    one part 1.4e-3 to 4.1e-3 (docs/benchmarks.md, "lion_dense's d log_decay in bf16")."""
    args, dy = make_inputs(rng, 1, 197, 2, 64, 64, jnp.bfloat16, "moderate")
    got = value_and_grads(kernel_fn(args[3]), args, dy)
    err = rel_err(got[4], reference(args, dy)[4])
    print(f"dlog_decay: {err:.2e}")
    assert err <= 1e-4


@pytest.mark.parametrize("L,dim,backend", [(197, 16, None), (197, 64, "mosaic")])
def test_strong_decay_is_finite(rng, L, dim, backend):
    """bf16, log-decays of -20 and -200 per token (|A| up to 4e4) and a bf16 log_decay: no
    NaN or inf anywhere, the gradient of log_decay in its dtype (Triton's kernels, and Mosaic
    GPU's at head dim 64)."""
    (q, k, v, _), dy = make_inputs(rng, 1, L, 2, dim, dim, jnp.bfloat16, None)
    g = jnp.asarray(np.stack([np.full((1, L), -20.0), np.full((1, L), -200.0)], -1),
                    jnp.bfloat16)
    got = value_and_grads(kernel_fn(g, backend=backend), (q, k, v, g), dy)
    assert got[4].dtype == jnp.bfloat16
    for name, x in zip(NAMES, got):
        assert np.all(np.isfinite(np.asarray(x, np.float32))), name
    # each row is its own token's value (every other weight is below exp(-20))
    np.testing.assert_allclose(np.asarray(got[0], np.float32), np.asarray(v, np.float32),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("decay,normalize", [("moderate", True), ("zero", False)])
def test_matches_lion_attention(rng, decay, normalize):
    """float32 against the library's reference form (impl="attention", float32), forward and
    gradients: the same conventions, the order's sign of d|A_i - A_j| included ("zero":
    log-decays of exactly 0, where that sign is the only information)."""
    args, dy = make_inputs(rng, 2, 50, 2, 16, 24, jnp.float32, decay)
    got = value_and_grads(kernel_fn(args[3], normalize=normalize), args, dy)
    want = value_and_grads(
        lambda *a: ops.lion_attention(*a, normalize=normalize, impl="attention"), args, dy)
    for name, a, b in zip(NAMES, got, want):
        err = rel_err(a, b)
        print(f"{name}: {err:.2e}")
        assert err <= TOL[jnp.float32], f"{name}: {err:.3e}"


def formula_in_orders(q, k, v, g, orders, normalize=True, eps=1e-6):
    """The materialised definition with token orders: ``M = mean_p exp(-|A^p_i - A^p_j|)``,
    ``A^p`` the cumsum of the log-decays taken in order p, read back in token order."""
    masks = []
    for order in orders:
        A = jnp.take(jnp.cumsum(jnp.take(g, order, axis=1), axis=1), np.argsort(order), axis=1)
        A = jnp.moveaxis(A, 1, -1)  # [B, H, L]
        masks.append(jnp.exp(-jnp.abs(A[..., :, None] - A[..., None, :])))
    P = jnp.einsum("bihk,bjhk->bhij", q, k) * (sum(masks) / len(masks))
    y = jnp.einsum("bhij,bjhv->bihv", P, v)
    if normalize:
        y = y / (jnp.moveaxis(P.sum(-1), 1, 2)[..., None] + eps)
    return y


ORDER_CASES = [  # L, orders, decay, normalize, block, dtype
    (37, "random+reversed", "moderate", True, None, jnp.float32),
    (70, "random+random", "mixed", False, 16, jnp.float32),
    (197, "snakes", "moderate", True, None, jnp.float32),  # ViT-T's two v2 orders + CLS
    (21, "random", "strong", False, None, jnp.float32),  # one order, not the token order
    (100, "random+reversed", "mixed", True, None, jnp.bfloat16),
]


def make_orders(rng, L, kind):
    if kind == "snakes":  # CLS first, then a 14 x 14 grid by row snake and by column snake
        from lion_jax.models.vit import token_orders
        return token_orders(14, 14, ("row_snake", "col_snake"))
    make = {"random": lambda: rng.permutation(L), "reversed": lambda: np.arange(L)[::-1]}
    return tuple(make[part]() for part in kind.split("+"))


@pytest.mark.parametrize("L,kind,decay,normalize,block,dtype", ORDER_CASES)
def test_orders_match_formula(rng, L, kind, decay, normalize, block, dtype):
    """Several token orders in one launch: the output and its four gradients against the
    float64 formula with the orders' masks averaged (float32 and bf16 tolerances)."""
    orders = make_orders(rng, L, kind)
    args, dy = make_inputs(rng, 1 if L > 100 else 2, L, 2, 16, 24, dtype, decay)
    got = value_and_grads(kernel_fn(args[3], normalize=normalize, block=block, orders=orders),
                          args, dy)
    with jax.enable_x64(True):
        f64 = [jnp.asarray(np.asarray(x, np.float64)) for x in args]
        want = value_and_grads(lambda *a: formula_in_orders(*a, orders, normalize=normalize),
                               f64, jnp.asarray(np.asarray(dy, np.float64)))
    for name, a, b in zip(NAMES, got, want):
        err = rel_err(a, np.asarray(b))
        print(f"{name}: {err:.2e}")
        assert err <= TOL[dtype], f"{name}: {err:.3e}"


def test_orders_through_lion_attention(rng):
    """ops.lion_attention(impl="pallas", orders=...) takes lion_dense's one launch and agrees
    with the materialised form, forward and gradients, log-decays of exactly 0 included
    (where the sign of d|A_i - A_j| comes from each order's positions alone)."""
    orders = (rng.permutation(30), np.arange(30)[::-1])
    for decay in ("moderate", "zero"):
        args, dy = make_inputs(rng, 2, 30, 2, 16, 8, jnp.float32, decay)
        run = lambda impl: value_and_grads(  # noqa: E731
            lambda *a: ops.lion_attention(*a, impl=impl, orders=orders), args, dy)
        for name, a, b in zip(NAMES, run("pallas"), run("attention")):
            assert rel_err(a, b) <= TOL[jnp.float32], (decay, name)
    x, g = args[0], args[3]
    jaxpr = str(jax.make_jaxpr(lambda *a: ops.lion_attention(*a, impl="pallas",
                                                              orders=orders))(x, x, x, g))
    assert jaxpr.count("pallas_call") == 1 and "lion_dense_forward" in jaxpr
    with pytest.raises(ValueError, match=r"lion_dense: orders\[1\] is not a permutation"):
        pallas_kernels.lion_dense(x, x, x, g, orders=(np.arange(30), np.zeros(30, int)))


def test_launches():
    """One forward launch; two backward launches."""
    x = jnp.zeros((2, 40, 2, 16), jnp.bfloat16)
    g = jnp.zeros((2, 40, 2), jnp.float32)
    fwd = str(jax.make_jaxpr(lambda *a: pallas_kernels.lion_dense(*a))(x, x, x, g))
    assert fwd.count("pallas_call") == 1 and "lion_dense_forward" in fwd
    grads = str(jax.make_jaxpr(jax.grad(lambda *a: jnp.sum(
        pallas_kernels.lion_dense(*a).astype(jnp.float32)), (0, 1, 2, 3)))(x, x, x, g))
    assert grads.count("pallas_call") == 3
    assert "lion_dense_dq" in grads and "lion_dense_dkv" in grads


def test_launch_settings_give_the_same_results(rng):
    """Other launch settings (forward / backward warps, stages, block) compute the same
    output and gradients (compiled on a GPU; on CPU the interpreter ignores warps and
    stages, so this checks that they reach the launches)."""
    args, dy = make_inputs(rng, 2, 33, 2, 16, 24, jnp.float32, "moderate")
    default = value_and_grads(kernel_fn(args[3]), args, dy)
    other = value_and_grads(kernel_fn(args[3], num_warps=8, backward_warps=2, num_stages=1,
                                      block=16), args, dy)
    for name, a, b in zip(NAMES, other, default):
        assert rel_err(a, np.asarray(b, np.float64)) <= TOL[jnp.float32], name
    with pytest.raises(ValueError, match="num_warps, backward_warps and num_stages must be"):
        pallas_kernels.lion_dense(*args, num_stages=0)


def test_bad_inputs():
    reason = pallas_kernels.lion_dense_unsupported_reason
    q = jnp.zeros((1, 8, 2, 16), jnp.float32)
    assert reason(q, q, q, None) is None
    assert reason(q, q, q, jnp.zeros((1, 8, 2), jnp.bfloat16)) is None
    long = jnp.zeros((1, 257, 2, 16), jnp.float32)
    assert "sequence length" in reason(long, long, long, None)
    wide = jnp.zeros((1, 8, 2, 256), jnp.float32)
    assert "head dims" in reason(wide, wide, q, None)
    assert "head dims" in reason(q, q, wide, None)
    per_feature = jnp.zeros((1, 8, 2, 16), jnp.float32)
    assert "one decay per token and head" in reason(q, q, q, per_feature)
    assert "share one dtype" in reason(q, q, q.astype(jnp.bfloat16), None)
    for args, match in [((long, long, long), "sequence length must be in"),
                        ((wide, wide, q), "head dims must be in"),
                        ((q, q, q, per_feature), r"log_decay must be None or \[B, L, H\]")]:
        with pytest.raises(ValueError, match=f"lion_dense: {match}"):
            pallas_kernels.lion_dense(*args)
        assert reason(*(args + (None,))[:4]) is not None


@pytest.mark.skipif(not ON_GPU, reason="the compiled Triton kernels at ViT-T's shape")
def test_vit_shape_on_gpu(rng):
    """B = 256, L = 197, H = 3, K = V = 64 in bf16 against impl="attention" in float32 (exact
    float32 matmuls) on the same rounded inputs: output and gradients within bf16's tolerance."""
    args, dy = make_inputs(rng, 256, 197, 3, 64, 64, jnp.bfloat16, "moderate")
    got = value_and_grads(jax.jit(kernel_fn(args[3])), args, dy)
    f32 = [x.astype(jnp.float32) for x in args]
    with jax.default_matmul_precision("highest"):
        want = value_and_grads(jax.jit(lambda *a: ops.lion_attention(*a, impl="attention")),
                               f32, dy.astype(jnp.float32))
    for name, a, b in zip(NAMES, got, want):
        err = rel_err(a, b)
        print(f"{name}: {err:.2e}")
        assert err <= TOL[jnp.bfloat16], f"{name}: {err:.3e}"


MOSAIC_CASES = [  # L, K, V, decay, normalize, orders
    (197, 64, 64, "moderate", True, None),  # ViT-T's layer: padded to 200 rows for TMA
    (104, 64, 128, "mixed", False, None),
    (32, 128, 64, None, True, None),  # shorter than one block
    (197, 64, 64, "moderate", True, "snakes"),  # LION-S (v2): two orders' masks averaged
    (200, 64, 64, "moderate", False, "random"),  # one order, not the token order
]


@pytest.mark.parametrize("L,K,V,decay,normalize,kind", MOSAIC_CASES)
def test_mosaic_forward(rng, L, K, V, decay, normalize, kind):
    """backend="mosaic" (the Mosaic GPU kernels, forward and backward, in their interpreter
    on CPU), bf16: the output, differentiated (P in two parts, y's low part out) and not, and
    the four gradients against the float64 formula, within bf16's tolerance."""
    orders = None if kind is None else make_orders(rng, L, kind)
    args, dy = make_inputs(rng, 1, L, 2, K, V, jnp.bfloat16, decay)
    fn = kernel_fn(args[3], normalize=normalize, orders=orders, backend="mosaic")
    got = value_and_grads(fn, args, dy)
    with jax.enable_x64(True):
        f64 = [jnp.asarray(np.asarray(x, np.float64)) for x in args if x is not None]
        if orders is None:
            form = lambda *a: formula(  # noqa: E731
                *a, *([None] * (4 - len(a))), normalize=normalize)
        else:
            form = lambda *a: formula_in_orders(*a, orders, normalize=normalize)  # noqa: E731
        want = value_and_grads(form, f64, jnp.asarray(np.asarray(dy, np.float64)))
    for name, a, b in zip(NAMES, got, want):
        err = rel_err(a, np.asarray(b))
        print(f"{name}: {err:.2e}")
        assert err <= TOL[jnp.bfloat16], f"{name}: {err:.3e}"
    y = jax.jit(fn)(*[a for a in args if a is not None])  # not differentiated: one part
    assert rel_err(y, np.asarray(want[0])) <= TOL[jnp.bfloat16]


def test_mosaic_backend_choice():
    """backend="mosaic" takes the Mosaic kernels forward and backward (no Triton launch) and
    refuses what it cannot take in one line; a bad backend names the choices."""
    x = jnp.zeros((1, 40, 2, 64), jnp.bfloat16)
    g = jnp.zeros((1, 40, 2), jnp.float32)
    fwd = str(jax.make_jaxpr(lambda *a: pallas_kernels.lion_dense(*a, backend="mosaic"))(
        x, x, x, g))
    assert "wgmma" in fwd and "pallas_call" not in fwd
    grads = str(jax.make_jaxpr(jax.grad(lambda *a: jnp.sum(pallas_kernels.lion_dense(
        *a, backend="mosaic").astype(jnp.float32)), (0, 1, 2, 3)))(x, x, x, g))
    assert "pallas_call" not in grads  # the backward on Mosaic GPU too
    orders = [np.arange(40), np.arange(40)[::-1]]
    grads = str(jax.make_jaxpr(jax.grad(lambda *a: jnp.sum(pallas_kernels.lion_dense(
        *a, orders=orders, backend="mosaic").astype(jnp.float32)), (0, 1, 2, 3)))(x, x, x, g))
    assert "pallas_call" not in grads and "lion_dense_dkv_mosaic" in grads  # orders too
    with pytest.raises(ValueError, match=r"backend='mosaic': .*bf16 or fp16 inputs"):
        pallas_kernels.lion_dense(*(x.astype(jnp.float32),) * 3, g, backend="mosaic")
    with pytest.raises(ValueError, match=r"backend='mosaic': .*head dims 64 or 128"):
        pallas_kernels.lion_dense(x[..., :32], x[..., :32], x, g, backend="mosaic")
    with pytest.raises(ValueError, match=r"backend must be None, 'mosaic' or 'triton'"):
        pallas_kernels.lion_dense(x, x, x, g, backend="cuda")


def test_default_backend(monkeypatch):
    """backend=None takes the Mosaic kernels on a Hopper GPU for 16-bit inputs with a decay at
    a length that is a multiple of 8, and Triton otherwise (traced with Hopper faked)."""
    module = importlib.import_module("pallas_kernels.lion_dense")  # the package's name is the op

    def kernels(*args, hopper=True, **kw):
        monkeypatch.setattr(module, "hopper", lambda: hopper)
        fwd = str(jax.make_jaxpr(lambda *a: pallas_kernels.lion_dense(*a, interpret=False,
                                                                      **kw))(*args))
        return "mosaic" if "wgmma" in fwd else "triton" if "pallas_call" in fwd else None

    x = jnp.zeros((1, 40, 2, 64), jnp.bfloat16)
    g = jnp.zeros((1, 40, 2), jnp.float32)
    assert kernels(x, x, x, g) == "mosaic"
    assert kernels(x, x, x, g, orders=[np.arange(40), np.arange(40)[::-1]]) == "mosaic"
    assert kernels(x, x, x, g, hopper=False) == "triton"
    assert kernels(x, x, x, g, backend="triton") == "triton"
    assert kernels(x, x, x) == "triton"  # no decay: LION-LIT's kernels are no faster
    assert kernels(x[:, :39], x[:, :39], x[:, :39], g[:, :39]) == "triton"  # L % 8: copies
    assert kernels(*(x.astype(jnp.float32),) * 3, g) == "triton"
    assert kernels(x[..., :32], x[..., :32], x, g) == "triton"
    assert module.default_backend(x, x, x, g, interpret=True) == "triton"
