"""S5 (Smith, Warrington and Linderman, ICLR 2023), the state-space layer whose LRA recipe the
LION paper takes (App. D.2): a reference mixer for the LRA runs, written from the paper.

One diagonal complex linear recurrence per direction over a state of ``P`` channels::

    x_t = Lambda_bar * x_{t-1} + B_bar u_t,     y_t = Re(C_f x^f_t + C_b x^b_t) + D * u_t

(``x^f`` walks forward, ``x^b`` backward: bidirectional, as S5's LRA models), discretised by
zero-order hold with a learnable step ``Delta`` per state channel: ``Lambda_bar = exp(Lambda
Delta)``, ``B_bar = Lambda^-1 (Lambda_bar - 1) B``. Both walks are
:func:`lion_jax.ops.linear_scan` in float32 (complex64).

Initialisation (paper Sec. 4.3 and App. B): ``Lambda`` are the eigenvalues of the normal part
of HiPPO-LegS, ``-1/2 + i omega_n``, on ``num_heads`` blocks of ``head_dim`` channels (the
block-diagonal init, ``P = num_heads * head_dim``); ``B`` and ``C`` are drawn in the original
basis and taken into the eigenbasis ``V`` (``B = V^H B0``, ``C = C0 V``); ``Delta``
log-uniform in ``dt_range``; ``D`` standard normal. ``Re(Lambda)`` is kept negative as
``-exp(.)`` (S5 optionally clips it; a departure that keeps every walk stable).
``real_eigenvalues=True`` is the ablation without oscillation: ``Lambda = -1/2`` (learnable
real parts, no imaginary parts), the same bases and steps. ``tied_readout=True`` reads both
walks with one ``C`` (``C_b = C_f``): with real eigenvalues the layer is then a symmetric
filter, as LION's mask is. ``feedthrough=False`` drops ``D * u`` (no ``D``), leaving the walks
alone, as LION's mixer has no such term.

Shapes: ``x [B, L, D] -> [B, L, D]``; ``mask [B, L]`` (True = real token, a prefix per row):
padding enters neither walk, so real tokens' outputs do not depend on it.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lion_jax import ops
from lion_jax.layers.hippo import hippo_normal


def _walk(decay, inputs, reverse):
    """``x_t = decay * x_{t-1} + inputs_t`` over axis 1 of ``inputs [B, L, P]`` from zero
    (``reverse``: from the end); ``decay [P]``."""
    return ops.linear_scan(jnp.broadcast_to(decay, inputs.shape), inputs, axis=1,
                           reverse=reverse)[1]


class S5Mixer(nn.Module):
    """S5's bidirectional diagonal state-space mixer ``[B, L, D] -> [B, L, D]`` (module
    docstring).

    Attributes:
      num_heads: HiPPO blocks of the initialisation. head_dim: state channels per block.
      dt_range: range of the log-uniform initial steps ``Delta``.
      real_eigenvalues: drop the eigenvalues' imaginary parts (module docstring).
      tied_readout: one ``C`` for both walks (module docstring).
      feedthrough: keep S5's ``D * u`` term (module docstring).
      dtype: the output's dtype (None: the input's); the walks run in float32.
      param_dtype: float32.
    """

    num_heads: int
    head_dim: int
    dt_range: tuple[float, float] = (0.001, 0.1)
    real_eigenvalues: bool = False
    tied_readout: bool = False
    feedthrough: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        for name in ("num_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 < self.dt_range[0] <= self.dt_range[1]:
            raise ValueError(f"dt_range must be (min, max) with 0 < min <= max; got "
                             f"{self.dt_range}")
        super().__post_init__()

    def _eigen(self):
        """Block-diagonal HiPPO-N: eigenvalues ``[P]`` and eigenvectors ``[P, P]``."""
        values, vectors = hippo_normal(self.head_dim)
        blocks = self.num_heads
        return np.tile(values, blocks), np.kron(np.eye(blocks), vectors)

    def _param(self, name, init, shape):
        return self.param(name, nn.with_logical_partitioning(init, (None,) * len(shape)),
                          shape, self.param_dtype)

    def _complex_param(self, name, draw, shape, basis):
        """A complex parameter stored as ``[..., 2]`` (real, imaginary): ``draw`` in the
        original basis, then ``basis(drawn)`` (the eigenbasis)."""
        def init(key, full_shape, dtype):
            value = basis(draw(key, shape).astype(jnp.complex64))
            return jnp.stack([value.real, value.imag], -1).astype(dtype)
        value = self._param(name, init, shape + (2,))
        return jax.lax.complex(value[..., 0], value[..., 1])

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
        B, L, D = x.shape
        P = self.num_heads * self.head_dim
        values, vectors = self._eigen()
        basis = jnp.asarray(vectors, jnp.complex64)
        log_re = self._param("lambda_log_re",
                             lambda key, shape, dtype: jnp.asarray(np.log(-values.real), dtype),
                             (P,))
        im = 0.0 if self.real_eigenvalues else self._param(
            "lambda_im", lambda key, shape, dtype: jnp.asarray(values.imag, dtype), (P,))
        lo, hi = np.log(self.dt_range[0]), np.log(self.dt_range[1])
        log_step = self._param(
            "log_step", lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, lo, hi),
            (P,))
        lecun = nn.initializers.lecun_normal()
        b = self._complex_param("B", lambda key, s: lecun(key, s[::-1]).T, (P, D),
                                lambda b0: basis.conj().T @ b0)
        c_init = nn.initializers.normal(P ** -0.5)
        def readout(name):
            return self._complex_param(name, c_init, (D, P), lambda c0: c0 @ basis)
        c_forward = readout("C_forward")
        c_backward = c_forward if self.tied_readout else readout("C_backward")

        lam = jax.lax.complex(-jnp.exp(log_re), jnp.broadcast_to(im, log_re.shape))
        step = jnp.exp(log_step)
        lam_bar = jnp.exp(lam * step)
        b_bar = ((lam_bar - 1) / lam)[:, None] * b  # [P, D]
        u = x.astype(jnp.float32)
        if mask is not None:
            u = jnp.where(mask[..., None], u, 0.0)
        drive = jnp.einsum("bld,pd->blp", u.astype(jnp.complex64), b_bar)
        y = sum(jnp.einsum("blp,dp->bld", _walk(lam_bar, drive, reverse), cw).real
                for reverse, cw in ((False, c_forward), (True, c_backward)))
        if self.feedthrough:
            y = y + self._param("D", nn.initializers.normal(1.0), (D,)) * u
        return y.astype(self.dtype or x.dtype)
