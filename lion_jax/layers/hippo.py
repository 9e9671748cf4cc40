"""HiPPO initialisations shared by the LRA recipe's mixers (LION paper App. D.2, after S5):
the eigen-decomposition of HiPPO-LegS's normal part (S5's init), the real per-channel decays and
ZOH value scales of our first reading of D.2, and S5's complex input matrix in the eigenbasis
(:class:`lion_jax.layers.lion.LionAttention` ``decay_init``, :class:`lion_jax.layers.s5.S5Mixer`).
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np


def hippo_normal(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues ``[n]`` and unitary eigenvectors ``[n, n]`` (complex128) of the normal part
    of HiPPO-LegS, ``A + p p^T`` with ``p_k = sqrt(k + 1/2)``: ``-1/2 I`` plus a skew-symmetric
    matrix, so every eigenvalue is ``-1/2 + i omega``."""
    k = np.arange(n, dtype=np.float64)
    root = np.sqrt(2 * k + 1)
    skew = 0.5 * np.outer(root, root)
    skew = np.where(k[:, None] > k[None, :], -skew, np.where(k[:, None] < k[None, :], skew, 0.0))
    omega, vectors = np.linalg.eigh(-1j * skew)  # skew = V diag(i omega) V^H
    return -0.5 + 1j * omega, vectors


def hippo_log_decays(num_heads: int, channels_per_head: int,
                     dt_range: tuple[float, float]) -> np.ndarray:
    """Non-selective log-decays ``a = Lambda * dt`` of the HiPPO init, ``[num_heads, channels]``.

    Our reading of LION Appendix D.2 ("the non-selective parts of Lambda were initialized
    based on the HiPPO matrix", after S5) for a real decay: channel ``n`` of a head takes
    S4D-Real's HiPPO-LegS eigenvalue ``Lambda_n = -(n + 1)`` and head ``h`` the step
    ``dt_h``, log-spaced over ``dt_range`` across heads (S5 samples ``dt`` log-uniformly in
    (0.001, 0.1); we space it evenly so the init is deterministic and the value init below can
    use the same numbers). With 8 heads of 16 channels the decays span timescales from under
    one token to 1000 tokens. A scalar decay per head is the ``channels_per_head = 1`` case.
    """
    dt = np.geomspace(dt_range[0], dt_range[1], num_heads)
    eigenvalues = -np.arange(1, channels_per_head + 1, dtype=np.float64)
    return dt[:, None] * eigenvalues[None, :]


def zoh_value_scales(log_decays: np.ndarray) -> np.ndarray:
    """ZOH input scales ``Lambda^-1 (exp(Lambda dt) - 1)`` of :func:`hippo_log_decays`' decays.

    Paper D.2 initialises ``W_v`` by zero-order hold, ``Lambda^-1 (Lambda_bar - I)``: the
    discretised input matrix of S5, ``B_bar = Lambda^-1 (exp(Lambda dt) - I) B``. We scale
    column ``c`` of a lecun-normal ``W_v`` (``B``) by this factor, ``~dt`` for small steps.
    """
    eigenvalues = -np.arange(1, log_decays.shape[-1] + 1, dtype=np.float64)
    return np.expm1(log_decays) / eigenvalues


def complex_value_init(num_heads: int, channels_per_head: int):
    """Initializer of ``W_v``'s kernel ``[D, 2 * H * V]`` for ``decay_init="hippo_complex"``:
    S5's ``B`` (lecun normal in the original basis, then into each head's HiPPO-N eigenbasis,
    ``B = V^H B0``; :func:`hippo_normal`), as ``x @ W``'s real parts then imaginary parts,
    each ``[H, V]`` head-major."""
    _, vectors = hippo_normal(channels_per_head)

    def init(key, shape, dtype=jnp.float32):
        b0 = nn.initializers.lecun_normal()(key, (shape[0], num_heads * channels_per_head),
                                            jnp.float32).reshape(shape[0], num_heads, -1)
        b = jnp.einsum("dhm,mn->dhn", b0.astype(jnp.complex64),
                       jnp.asarray(vectors.conj(), jnp.complex64))
        return jnp.concatenate([b.real, b.imag], axis=1).reshape(shape).astype(dtype)
    return init
