"""Parameter and training-FLOPs counts of the scaling-laws paper's models: LLaMA, TNL, HGRN2,
cosFormer2 ("Scaling Laws for Linear Complexity Language Models", digest
``papers/digests/scaling-laws-linear-lms.md`` sections 2.1-2.3).

Notation (App. A.1): ``l`` layers, width ``d``, ``h`` heads, GLU width ``g``, vocabulary ``v``,
``b`` sequences of ``n`` tokens per step, output-gate rank ``t``, Lightning Attention / FLA block
``B``, TPE states ``e``; the paper takes ``t = B = e = d/h`` (128), the keyword defaults here.

Units and conventions, as the paper counts (digest 2.1):

* parameters are plain counts (not millions);
* FLOPs are **training FLOPs per step** (``b`` sequences of ``n`` tokens), forward + backward
  = 3 x forward, 2 FLOPs per multiply-accumulate; the full ``n x n`` attention matrix is
  counted (no causal halving), and so are the linear models' whole ``B x B`` intra-block
  products;
* the input and output embeddings are tied: ``d v`` parameters once, but ``4 n d v`` forward
  FLOPs per sequence (the lookup is counted as a matmul).

Two forms of each count:

* :func:`table1_params`, :func:`table1_flops_per_step`: Table 1's simplified forms, which the
  paper fits with (``g = 8/3 d``, ``t = B = e = d/h``, no embedding, no subleading terms);
  Table 7's PFLOPs/step column is exactly this FLOPs form with ``h = d/128`` (digest 2.3, also
  at 1B, where Table 7 prints 16 heads and the FLOPs need 12).
* :func:`full_params`, :func:`flops_breakdown` / :func:`full_flops_per_step`: every App. A.1
  term, with the actual ``g`` and optional embedding. Table 7's non-embedding parameter column
  is :func:`full_params` with the actual ``g`` (LLaMA, TNL, HGRN2 within 0.05M; cosFormer2
  prints 0.0-0.9M more, which no term we know of explains, digest 2.3).

Printed inconsistencies of App. A.1 (digest 2.2 [INCONSISTENT] and 8) and the reading taken:

* LLaMA's training total drops the RoPE term (3 x 4nd) in one line and has it in the next, and
  Table 1's ``5/(18d)`` needs it: counted.
* LLaMA's softmax term is printed ``h/(8d^2)`` inside ``72bnld^2(...)``; the algebra needs
  ``nh/(8d^2)``, i.e. ``3 n^2 h`` forward per layer: that is what we count.
* The embedding term appears as both ``12ndv`` and ``12bndv``; we count ``12bndv`` (``4ndv``
  forward per sequence, like every other term, times ``3b``).
* cosFormer2's ``C_tm`` is printed with ``2nd`` though its listed parts (LRPE's ``4nd``
  included) sum to ``6nd``, and Table 1's ``23/(72d)`` follows the printed ``2nd``: we count the
  parts (LRPE included), so cosFormer2's full form exceeds Table 1 by ``12bnld`` beyond the
  terms Table 1 drops (a relative ``1/(6d)``).
* HGRN2's lower bound costs ``12ld`` per step as printed, not times ``b``: it depends on the
  parameters only.
* ``W_o`` is missing from the TNL, HGRN2 and cosFormer2 equations but counted in parameters
  and FLOPs: counted. HGRN2's printed block declares an output gate it does not have: not
  counted (Table 7 agrees).
* LLaMA's Table 7 counts need ``4d`` per layer beyond ``4d^2 + 3dg`` (digest 2.3), which the
  paper never names: counted, read as two LayerNorms (scale and bias), as
  :class:`lion_jax.models.lm.CausalLM`'s LLaMA has them (``lm.DEFAULT_NORM``).
* Table 7 prints ``g = 5632`` and 16 heads at 1B; its own counts need ``g = 4096`` and its
  FLOPs 12 heads: the sizes are :data:`lion_jax.models.lm.SIZES` (the reconciled ones).

Real models: :func:`flax_param_count` counts a :class:`~lion_jax.models.lm.CausalLM`'s
parameter tree; it equals :func:`full_params` plus :func:`model_extra_params` (norms and LRPE
frequencies the paper does not count). :func:`xla_train_step_flops` is XLA's count of a compiled
training step (``cost_analysis``). At ``l=2, d=128, h=2, g=344, v=512, b=2, n=256`` on CPU (the
linear mixers chunked with ``C = B = d/h``), XLA counts 0.91-0.96 of :func:`full_flops_per_step`
with the embedding (LLaMA 0.91, TNL 0.94, HGRN2 0.96, cosFormer2 0.93). The shortfall is the
input lookup, a gather for XLA and ``6bndv`` of matmul for the paper (10% of these totals).
Without it XLA counts 1.01-1.08 (1.01, 1.05, 1.08, 1.03): the elementwise work the paper omits
(norms, activations, gates, softmax and loss reductions, the chunked forms' decay masks, HGRN2's
per key feature) and, in TNL, CausalLM's LRPE on layer 0 (the TNL paper's), which widens that
layer's queries and keys. ``tests/test_scaling_counts.py`` holds these ratios to within 15% and
10%.
"""

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lion_jax.models.lm import SIZES, VOCAB_SIZE, lm_size
from lion_jax.scaling.fit import UNITS, unit_factor

ARCHS = ("llama", "tnl", "hgrn2", "cosformer2")
CONVENTIONS = ("table1", "non_embedding", "with_embedding")
# The paper's training step (Table 7; digest 4): b sequences of n tokens (3,932,160 tokens).
# configs/lm/common.py has the same numbers (BATCH_ROWS, CONTEXT); the library cannot import it.
BATCH_SEQS = 480
SEQ_LEN = 8192
HEAD_DIM = 128  # d/h at every paper size (digest 1.6)
PF_DAY = UNITS["pf-days"]  # FLOPs in one petaFLOP/s-day: 1e15 * 86,400


def _check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; valid: {list(ARCHS)}")


def table1_params(arch: str, l: int, d: int, h: int) -> float:
    """Table 1's parameter count ``N`` (non-embedding, ``g = 8/3 d``, ``t = e = d/h``).

    LLaMA ``12ld^2``; TNL ``12ld^2 + 2ld^2/h``; HGRN2 ``12ld^2 + ld``; cosFormer2
    ``12ld^2 + 2ld^2/h + d^2/h``.
    """
    _check_arch(arch)
    base = 12 * l * d**2
    return base + {"llama": 0, "tnl": 2 * l * d**2 / h, "hgrn2": l * d,
                   "cosformer2": 2 * l * d**2 / h + d**2 / h}[arch]


def table1_flops_per_step(arch: str, l: int, d: int, h: int, b: int = BATCH_SEQS,
                          n: int = SEQ_LEN) -> float:
    """Table 1's training FLOPs per step ``C = 72bnld^2 (1 + ...)`` (module docstring's
    conventions; non-embedding, ``g = 8/3 d``, ``B = t = e = d/h``).

    The bracket: LLaMA ``n/(6d) + 5/(18d)``; TNL ``1/(2h) + 5/(18d)``; HGRN2
    ``1/(3h) + 29/(72d)``; cosFormer2 ``3/(4h) + 23/(72d)``. With ``b = 480``, ``n = 8192`` and
    ``h = d/128`` this is Table 7's PFLOPs/step column (times 1e15).
    """
    _check_arch(arch)
    bracket = {"llama": n / (6 * d) + 5 / (18 * d), "tnl": 1 / (2 * h) + 5 / (18 * d),
               "hgrn2": 1 / (3 * h) + 29 / (72 * d), "cosformer2": 3 / (4 * h) + 23 / (72 * d)}
    return 72 * b * n * l * d**2 * (1 + bracket[arch])


def full_params(arch: str, l: int, d: int, h: int, g: int, v: int = VOCAB_SIZE, *,
                embedding: bool = False, t: float | None = None,
                e: float | None = None) -> float:
    """App. A.1's parameter count with the actual GLU width ``g``.

    Per layer ``4d^2`` (token-mixer projections, ``W_o`` included) ``+ 3dg`` (GLU), plus:
    LLaMA ``4d`` (two LayerNorms' scale and bias: Table 7 needs them, digest 2.3); TNL and
    cosFormer2 ``2dt`` (the low-rank output gate); HGRN2 ``d`` (its lower-bound table, ``ld`` in
    all); cosFormer2 ``de`` once (the TPE). ``embedding=True`` adds the tied ``dv``.
    ``t``, ``e``: default ``d/h``.
    """
    _check_arch(arch)
    t = d / h if t is None else t
    e = d / h if e is None else e
    per_layer = 4 * d**2 + 3 * d * g + {"llama": 4 * d, "tnl": 2 * d * t, "hgrn2": d,
                                        "cosformer2": 2 * d * t}[arch]
    once = d * e if arch == "cosformer2" else 0
    return l * per_layer + once + (d * v if embedding else 0)


def _layer_forward_flops(arch: str, n: int, d: int, h: int, g: int, t: float,
                         B: float) -> dict:
    """App. A.1's forward FLOPs of one layer for one sequence, by component."""
    glu = {"glu_projections": 6 * n * d * g, "glu_gating": n * g}
    if arch == "llama":
        return {"qkv": 6 * n * d**2, "rope": 4 * n * d, "scores": 2 * n**2 * d,
                "softmax": 3 * n**2 * h, "attention_values": 2 * n**2 * d,
                "out_proj": 2 * n * d**2, **glu}
    # Lightning Attention / FLA in n/B blocks. LRPE doubles cosFormer2's query/key head width
    # (its 6B^2 d intra-block, 4Bd^2/h inter-block and 4Bd^2/h + 2d^2/h state terms).
    w = 2 if arch == "cosformer2" else 1
    blocks = n / B
    terms = {"qkv": 6 * n * d**2,
             "intra_block": blocks * (2 * (w + 1) * B**2 * d + B**2 * h),
             "inter_block": blocks * 2 * w * B * d**2 / h,
             "state_update": blocks * w * (2 * B * d**2 / h + d**2 / h),
             "output_update": blocks * B * d,
             "out_proj": 2 * n * d**2}
    if arch == "hgrn2":
        terms["forget_gate"] = 4 * n * d
    else:  # TNL, cosFormer2: sigmoid(x W_gdown W_gup) times the normalised output
        terms.update(output_gate=4 * n * t * d, gating=n * d)
    if arch == "cosformer2":
        terms["lrpe"] = 4 * n * d
    return {**terms, **glu}


def flops_breakdown(arch: str, l: int, d: int, h: int, g: int, b: int = BATCH_SEQS,
                    n: int = SEQ_LEN, v: int = VOCAB_SIZE, *, t: float | None = None,
                    B: float | None = None, e: float | None = None) -> dict:
    """App. A.1's training FLOPs per step (forward + backward), by component.

    Each layer component is ``3 b l`` times its per-sequence forward count; the model-level
    ones: ``"embedding"`` ``12bndv``, HGRN2's ``"lower_bound"`` ``12ld`` (once per step, not per
    sequence), cosFormer2's ``"tpe"`` ``12bnde``. ``t``, ``B``, ``e``: default ``d/h``.
    """
    _check_arch(arch)
    t, B, e = (d / h if x is None else x for x in (t, B, e))
    out = {name: 3 * b * l * f
           for name, f in _layer_forward_flops(arch, n, d, h, g, t, B).items()}
    out["embedding"] = 3 * b * 4 * n * d * v
    if arch == "hgrn2":
        out["lower_bound"] = 3 * 4 * l * d
    if arch == "cosformer2":
        out["tpe"] = 3 * b * 4 * n * d * e
    return out


def full_flops_per_step(arch: str, l: int, d: int, h: int, g: int, b: int = BATCH_SEQS,
                        n: int = SEQ_LEN, v: int = VOCAB_SIZE, *, embedding: bool = False,
                        t: float | None = None, B: float | None = None,
                        e: float | None = None) -> float:
    """App. A.1's training FLOPs per step: the sum of :func:`flops_breakdown`, the embedding's
    ``12bndv`` only with ``embedding=True``."""
    parts = flops_breakdown(arch, l, d, h, g, b, n, v, t=t, B=B, e=e)
    if not embedding:
        del parts["embedding"]
    return sum(parts.values())


def _dims(arch: str, size_or_dims) -> tuple:
    """``(l, d, h, g)`` of a size name (:data:`lion_jax.models.lm.SIZES`) or of a tuple."""
    if isinstance(size_or_dims, str):
        dims = lm_size(size_or_dims, arch)
        return dims["num_layers"], dims["d_model"], dims["num_heads"], dims["mlp_dim"]
    if not isinstance(size_or_dims, (tuple, list)) or len(size_or_dims) != 4:
        raise ValueError(f"dims must be (layers, width, heads, glu_width), got {size_or_dims!r}")
    return tuple(size_or_dims)


def model_params(arch: str, size_or_dims, convention: str = "non_embedding",
                 v: int = VOCAB_SIZE) -> float:
    """Model size ``N`` of a size name ("70m" ... "7b") or ``(l, d, h, g)``, in one of
    :data:`CONVENTIONS`.

    ``"table1"``: :func:`table1_params` (``12ld^2``-style, ``g = 8/3 d``); ``"non_embedding"``
    (default: Table 7's column, the paper's stated N): :func:`full_params` with the actual
    ``g``; ``"with_embedding"``: that plus the tied ``dv`` (``v``: the paper's 100,280 by
    default). The paper does not say which of the first two its ``N_opt`` fits use (digest
    2.3).
    """
    _check_arch(arch)
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}; valid: {list(CONVENTIONS)}")
    l, d, h, g = _dims(arch, size_or_dims)
    if convention == "table1":
        return table1_params(arch, l, d, h)
    return full_params(arch, l, d, h, g, v, embedding=convention == "with_embedding")


def compute_in(flops: float, unit: str) -> float:
    """``flops`` expressed in ``unit``, one of :data:`UNITS` ("flops", "pflops" = 1e15,
    "pf-days" = 8.64e19, "1e20"). Table 3's fits are in PF-days or ~1e20 (digest 3.4)."""
    return flops / unit_factor(unit)


class Table7Row(NamedTuple):
    """One Table 7 configuration, recomputed: non-embedding parameters (millions, actual
    ``g``) and Table 1's PFLOPs per step (``b = 480``, ``n = 8192``)."""

    arch: str
    size: str
    l: int
    d: int
    h: int
    g: int
    params_M: float
    pflops_per_step: float


def table7_rows() -> list:
    """The 24 Table 7 configurations (arch-major, as printed), from
    :data:`lion_jax.models.lm.SIZES` (``h = d/128``, 12 heads at 1B; 25 layers for TNL and
    cosFormer2 at 410M)."""
    rows = []
    for arch in ARCHS:
        for size in SIZES:
            l, d, h, g = _dims(arch, size)
            rows.append(Table7Row(arch, size, l, d, h, g, full_params(arch, l, d, h, g) / 1e6,
                                  table1_flops_per_step(arch, l, d, h) / 1e15))
    return rows


def model_extra_params(arch: str, l: int, d: int, h: int, e: float | None = None) -> float:
    """Parameters a default :class:`lion_jax.models.lm.CausalLM` holds beyond
    :func:`full_params` (non-embedding), none of which the paper counts.

    LLaMA: the final LayerNorm (``2d``); TNL: LRPE's frequencies on layer 0 (``d``; the TNL
    paper's LRPE, which the scaling-laws paper's TNL lacks); HGRN2: none; cosFormer2: LRPE's
    frequencies in every layer (``ld``) and the TPE's per-state decays (``e``, default
    ``d/h``). The linear models' norms are parameter-free SRMSNorms.
    """
    _check_arch(arch)
    e = d / h if e is None else e
    return {"llama": 2 * d, "tnl": d, "hgrn2": 0, "cosformer2": l * d + e}[arch]


def flax_param_count(params) -> dict:
    """``{"non_embedding": ..., "embedding": ...}``: the sizes of a Flax parameter tree (or of
    ``init``'s variables, whose ``"params"`` collection counts), split by whether a leaf's path
    passes through a module named ``embed``. Leaves may be arrays or ``ShapeDtypeStruct``s
    (``jax.eval_shape(model.init, ...)``); boxed (partitioned) leaves count as their value."""
    if "params" in params:
        params = params["params"]
    counts = {"non_embedding": 0, "embedding": 0}
    for path, leaf in jax.tree_util.tree_flatten_with_path(nn.meta.unbox(params))[0]:
        is_embed = any(getattr(key, "key", None) == "embed" for key in path)
        counts["embedding" if is_embed else "non_embedding"] += int(np.prod(leaf.shape))
    return counts


def xla_train_step_flops(model: nn.Module, batch: int, seq_len: int) -> float:
    """XLA's FLOPs count of one training step's forward and backward (no optimizer update):
    ``jax.value_and_grad`` of the mean next-token cross-entropy of ``model.apply(params,
    tokens)``'s logits over ``batch`` sequences of ``seq_len`` tokens, compiled for the default
    backend from abstract shapes (nothing runs); ``compiled.cost_analysis()["flops"]``."""
    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens))

    def loss(p, x, y):
        logits = model.apply(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, tokens, tokens).compile()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # one dict per device program in older jax versions
        cost = cost[0]
    return float(cost["flops"])
