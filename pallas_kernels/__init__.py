"""Pallas GPU kernels (Triton lowering) for chunked linear attention, with custom VJPs.

Imports nothing from lion_jax. Shapes follow ARCHITECTURE.md section 3: ``[B, L, H, D]``,
``log_decay [B, L, H]`` (entries ``<= 0``), per key feature ``[B, L, H, K]`` (causal only), per
value feature ``[B, L, H, V]`` (LION, ``lion_value_decay``) or None. On CPU the kernels run in the
Pallas interpreter (``interpret=None`` picks it when the default backend is CPU).

Lowered once: every kernel launch sits inside a function jitted with its static layout (the
``custom_vjp`` ops wrapped by ``jax.jit`` with their static arguments, the inner passes
decorated), so a model whose layers call an op with one shape traces and lowers its kernels
once rather than once per layer (``tests/test_lowered_once.py``). ``python -m
experiments.lowering_cost`` measures it: the gradient of 12 calls of the Mosaic ``lion_dense``
at ViT-T's layer lowered for CUDA in 13.78 s with 36 kernel calls before, 1.46 s with 3 after
(docs/benchmarks.md, "Lowering the kernels").
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
