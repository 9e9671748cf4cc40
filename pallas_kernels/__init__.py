"""Pallas GPU kernels (Triton lowering) for chunked linear attention, with custom VJPs.

Imports nothing from lion_jax. Shapes follow ARCHITECTURE.md section 3: ``[B, L, H, D]``,
``log_decay [B, L, H]`` (entries ``<= 0``), per key feature ``[B, L, H, K]`` (causal only), per
value feature ``[B, L, H, V]`` (LION, ``lion_value_decay``) or None. On CPU the kernels run in the
Pallas interpreter (``interpret=None`` picks it when the default backend is CPU).

Lowered once: every kernel launch sits inside a function jitted with its static layout (the
``custom_vjp`` ops wrapped by ``jax.jit`` with their static arguments, the inner passes
decorated), so a model whose layers call an op with one shape traces and lowers its kernels
once rather than once per layer (``tests/test_lowered_once.py``). Lowered for CUDA on a
2-core CPU (2026-12-02, jax 0.11.2): ViT-T's LION-S gradient (12 layers, ``lion_dense`` on
Mosaic GPU) took 17.0 s and held 36 kernel calls before, 2.9 s and 3 after; 8 calls of
``lion_value_decay`` at ListOps' shape (B 50, L 1024, H 8, K = V = 16) 1.09 s and 16 kernel
calls before, 0.22 s and 3 after.
"""

from pallas_kernels.chunk_scan import chunk_scan
from pallas_kernels.linear_attention import (ALGORITHMS, bidirectional_linear_attention,
                                             causal_linear_attention, unsupported_reason)
from pallas_kernels.lion_dense import lion_dense
from pallas_kernels.lion_dense import unsupported_reason as lion_dense_unsupported_reason
from pallas_kernels.lion_walk import lion_walk
from pallas_kernels.lion_walk import unsupported_reason as lion_walk_unsupported_reason
from pallas_kernels.per_feature import chunk_scan_per_feature
from pallas_kernels.two_pass import chunk_scan_two_pass
from pallas_kernels.value_decay import lion_value_decay
from pallas_kernels.value_decay import unsupported_reason as value_decay_unsupported_reason

__all__ = ["ALGORITHMS", "bidirectional_linear_attention", "causal_linear_attention",
           "chunk_scan", "chunk_scan_per_feature", "chunk_scan_two_pass", "lion_dense",
           "lion_dense_unsupported_reason", "lion_value_decay", "lion_walk",
           "lion_walk_unsupported_reason", "unsupported_reason", "value_decay_unsupported_reason"]
