"""Pallas GPU kernels (Triton lowering) for chunked linear attention, with custom VJPs.

Imports nothing from lion_jax. Shapes follow ARCHITECTURE.md section 3: ``[B, L, H, D]``,
``log_decay [B, L, H]`` (entries ``<= 0``) or None. On CPU the kernels run in the Pallas
interpreter (``interpret=None`` picks it when the default backend is CPU).
"""

from pallas_kernels.chunk_scan import chunk_scan
from pallas_kernels.linear_attention import (bidirectional_linear_attention,
                                             causal_linear_attention, unsupported_reason)

__all__ = ["bidirectional_linear_attention", "causal_linear_attention", "chunk_scan",
           "unsupported_reason"]
