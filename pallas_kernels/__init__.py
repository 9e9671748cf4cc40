"""Pallas GPU kernels (Triton lowering) for chunked linear attention, with custom VJPs.

Imports nothing from lion_jax. Shapes follow ARCHITECTURE.md section 3: ``[B, L, H, D]``,
``log_decay [B, L, H]`` (entries ``<= 0``), per feature ``[B, L, H, K]`` (causal only) or None. On CPU the kernels run in the Pallas
interpreter (``interpret=None`` picks it when the default backend is CPU).
"""

from pallas_kernels.chunk_scan import chunk_scan
from pallas_kernels.linear_attention import (ALGORITHMS, bidirectional_linear_attention,
                                             causal_linear_attention, unsupported_reason)
from pallas_kernels.per_feature import chunk_scan_per_feature
from pallas_kernels.two_pass import chunk_scan_two_pass

__all__ = ["ALGORITHMS", "bidirectional_linear_attention", "causal_linear_attention",
           "chunk_scan", "chunk_scan_per_feature", "chunk_scan_two_pass", "unsupported_reason"]
