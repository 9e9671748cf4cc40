"""d log_decay of the per-feature causal op from bf16 operands: two ways to sum it, emulated,
and the kernel that takes the second.

    python -m experiments.dlog_decay_forms [--length 512] [--dims 32,32] [--seeds 3]

Per-feature causal linear attention (``y_i = sum_{j <= i} q_i^T diag(exp(A_i - A_j)) k_j
v_j^T``, one head), gradient of ``<y, dy>`` in the log-decays. Both forms below are computed in
float64 from the same pieces, rounded to bf16 where a kernel rounds its operands (the chunk's
decayed q and k, ``dy v^T``, the chunk states) and to float32 where it accumulates:

- "scans" (``pallas_kernels.linear_attention._per_feature_bwd``'s form): per chunk, the tail
  sums of ``q . dq - k . dk`` with whole-sequence dq and dk, plus ``S_after . D`` at the
  chunk's end: terms cancel across chunks.
- "chunks" (``pallas_kernels.per_feature_grads``'s form): in-chunk pairs, keys before the
  chunk, queries after it, and both, of which only the in-chunk sum cancels, between
  products of the same rounded tiles.

Prints, per log-decay range and chunk, the largest relative error ``||d - d64|| /
||d64||`` over the seeds of each form against float64 autodiff of the materialised op, and of
``per_feature_grads`` itself (the Pallas kernel, interpret mode on CPU). Every chunk's
log-decays sum to at least -20 (the "chunks" form's range).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

# (name, lowest log-decay per token, chunk): the chunk sums stay >= -20
CASES = (("U[-0.1, 0]", 0.1, 64), ("U[-0.3, 0]", 0.3, 64), ("U[-1.2, 0]", 1.2, 16))


def _bf16(x):
    return x.astype(jnp.bfloat16).astype(jnp.float64)


def _f32(x):
    return x.astype(jnp.float32).astype(jnp.float64)


def _reverse_cumsum(x):
    return jnp.flip(jnp.cumsum(jnp.flip(x, 1), 1), 1)


def reference(q, k, v, g, dy):
    """float64 d log_decay ``[L, K]`` of ``<y, dy>`` by autodiff of the materialised op."""
    L = q.shape[0]

    def loss(g):
        A = jnp.cumsum(g, axis=0)
        causal = (jnp.arange(L)[:, None] >= jnp.arange(L)[None, :])[..., None]
        mask = jnp.exp(jnp.where(causal, A[:, None] - A[None, :], -jnp.inf))  # [i, j, K]
        return jnp.sum(jnp.einsum("ik,jk,ijk->ij", q, k, mask) @ v * dy)
    return jax.grad(loss)(g)


def emulated_forms(q, k, v, g, dy, chunk):
    """``(scans, chunks)``: d log_decay ``[L, K]`` by each form, emulated (module docstring)."""
    L, K = q.shape
    N, C = L // chunk, chunk
    q, k, v, g, dy = (x.reshape(N, C, -1) for x in (q, k, v, g, dy))
    b = _f32(jnp.cumsum(g.astype(jnp.float32), axis=1).astype(jnp.float64))  # chunk-local
    last = b[:, -1]  # [N, K]
    qt, kt = _bf16(q * jnp.exp(b)), _bf16(k * jnp.exp(-b))
    kg = _bf16(k * jnp.exp(last[:, None] - b))
    m = _bf16(_f32(jnp.einsum("nid,njd->nij", dy, v))) * jnp.tril(jnp.ones((C, C)))
    dqt = _f32(jnp.einsum("nij,njk->nik", m, kt))
    dkt = _f32(jnp.einsum("nij,nik->njk", m, qt))
    entering, s = [], jnp.zeros((K, v.shape[-1]))
    for n in range(N):  # the states entering each chunk, float32, kept in bf16
        entering.append(s)
        s = _f32(jnp.exp(last[n])[:, None] * s + kg[n].T @ v[n])
    leaving, d = [None] * N, jnp.zeros_like(s)
    for n in reversed(range(N)):  # the queries' states leaving each chunk
        leaving[n] = d
        d = _f32(jnp.exp(last[n])[:, None] * d + qt[n].T @ dy[n])
    entering, leaving = _bf16(jnp.stack(entering)), _bf16(jnp.stack(leaving))
    after = _bf16(jnp.exp(last)[..., None] * entering + jnp.einsum("nck,ncv->nkv", kg, v))
    q_inter = _f32(jnp.einsum("nkv,ncv->nck", entering, dy))
    k_inter = _f32(jnp.einsum("nkv,ncv->nck", leaving, v))
    k_terms = _f32(kg * k_inter)
    chunks = (_reverse_cumsum(_f32(qt * dqt - kt * dkt)) + _reverse_cumsum(_f32(qt * q_inter))
              + jnp.cumsum(k_terms, 1) - k_terms
              + (jnp.exp(last) * jnp.sum(entering * leaving, -1))[:, None])
    dq = _f32(jnp.exp(b) * (dqt + q_inter))
    dk = _f32(jnp.exp(-b) * dkt + jnp.exp(last[:, None] - b) * k_inter)
    scans = _reverse_cumsum(_f32(q * dq - k * dk)) + jnp.sum(after * leaving, -1)[:, None]
    return scans.reshape(L, K), chunks.reshape(L, K)


def kernel_form(q, k, v, g, dy, chunk):
    """d log_decay ``[L, K]`` of ``pallas_kernels.per_feature_grads`` (interpret mode on CPU)."""
    from pallas_kernels.per_feature_grads import per_feature_grads
    L, K = q.shape
    V = v.shape[-1]
    q, k, v, dy = (jnp.asarray(x, jnp.bfloat16)[None, :, None] for x in (q, k, v, dy))
    g = jnp.asarray(g, jnp.float32)[None, :, None]
    grads = per_feature_grads(q, k, v, g, None, dy, jnp.zeros((1, 1, K, V), jnp.float32),
                              chunk=chunk, interpret=jax.default_backend() == "cpu")
    return grads[3][0, :, 0]


def errors(rng, length, dims, low, chunk):
    """``{form: relative error}`` of one random case (inputs rounded to bf16)."""
    K, V = dims
    with jax.enable_x64(True):
        q, k, v, dy = (_bf16(jnp.asarray(rng.standard_normal((length, d))))
                       for d in (K, K, V, V))
        g = _f32(jnp.asarray(rng.uniform(-low, 0.0, (length, K))))
        want = reference(q, k, v, g, dy)
        scans, chunks = emulated_forms(q, k, v, g, dy, chunk)
        rel = lambda a: float(jnp.linalg.norm(a - want) / jnp.linalg.norm(want))  # noqa: E731
        out = {"scans": rel(scans), "chunks": rel(chunks)}
    kernel = np.asarray(kernel_form(q, k, v, g, dy, chunk), np.float64)
    out["per_feature_grads"] = float(np.linalg.norm(kernel - np.asarray(want))
                                     / np.linalg.norm(np.asarray(want)))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--dims", default="32,32", help="K,V")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        dims = tuple(int(d) for d in args.dims.split(","))
        assert len(dims) == 2
    except (ValueError, AssertionError):
        parser.error(f"--dims takes K,V; got {args.dims!r}")
    if args.length % 64:
        parser.error(f"--length must be a multiple of 64; got {args.length}")
    print(f"d log_decay from bf16 operands, L {args.length}, K, V = {dims}, largest relative "
          f"error over {args.seeds} seeds")
    print("| log-decay per token | chunk | scans' form | chunks' form | per_feature_grads |")
    print("| --- | --- | --- | --- | --- |")
    for name, low, chunk in CASES:
        worst = {}
        for seed in range(args.seeds):
            for form, err in errors(np.random.default_rng(seed), args.length, dims, low,
                                    chunk).items():
                worst[form] = max(worst.get(form, 0.0), err)
        print(f"| {name} | {chunk} | {worst['scans']:.2e} | {worst['chunks']:.2e} | "
              f"{worst['per_feature_grads']:.2e} |", flush=True)


if __name__ == "__main__":
    main()
