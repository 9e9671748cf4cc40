"""Token embeddings whose gradients avoid slow scatter-adds: a float32 gather (any vocabulary)
and a one-hot matrix product (small vocabularies)."""

import flax.linen as nn
import jax
import jax.numpy as jnp


class OneHotEmbed(nn.Embed):
    """``nn.Embed`` (same parameter, same output) computed as ``one_hot(ids) @ embedding``.

    ``jnp.take``'s gradient is a scatter-add of every token's cotangent into its row; with a
    vocabulary of a few dozen ids and 10^5 tokens per batch the atomic adds pile onto the same
    rows. Measured on one H100 for the LRA ListOps model (batch 50 x 2000 tokens, vocabulary 17,
    d_model 128, ``python -m experiments.profile_train``): that scatter took 55.8 of 75.3 ms of
    device time per train step. As a matrix product the gradient is ``one_hot^T @ cotangent``,
    a GEMM (19.9 ms per whole train step after the change, same device and command). It costs
    ``O(tokens x vocabulary x features)``: meant for the small vocabularies of LRA (17 to 258
    ids); large vocabularies want ``nn.Embed``.
    """

    def __call__(self, inputs: jnp.ndarray) -> jnp.ndarray:
        """``inputs [...]`` integer ids -> ``[..., features]``."""
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError(f"token ids must be integers; got {inputs.dtype}")
        (embedding,) = self.promote_dtype(self.embedding, dtype=self.dtype, inexact=False)
        one_hot = jax.nn.one_hot(inputs, self.num_embeddings, dtype=embedding.dtype)
        return jnp.dot(one_hot, embedding, precision=jax.lax.Precision.HIGHEST
                       if embedding.dtype == jnp.float32 else None)


class Embed(nn.Embed):
    """``nn.Embed`` (same parameter, same output) that gathers rows of the ``param_dtype``
    table and casts them to ``dtype`` afterwards.

    ``nn.Embed`` casts the whole table to ``dtype`` and gathers from it, so in bfloat16 its
    gradient is a bfloat16 scatter-add, which the GPU does with compare-and-swap loops; tokens
    that share an id (``[MASK]``, ``[PAD]``, frequent words) pile onto the same row. Measured on
    one H100 for the MLM ``small`` config (128 rows of 128 tokens, vocabulary 8,192, d_model 256,
    ``python -m experiments.profile_train --config configs/mlm/c4.py:small``): one
    ``input_scatter_fusion`` took 221 of 225 ms of device time per train step. Gathering from
    the float32 table makes the gradient a float32 scatter-add (native atomics); the output
    is the same numbers, since the cast is elementwise. ``attend`` is ``nn.Embed``'s.
    """

    def __call__(self, inputs: jnp.ndarray) -> jnp.ndarray:
        """``inputs [...]`` integer ids -> ``[..., features]`` in ``dtype``."""
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError(f"token ids must be integers; got {inputs.dtype}")
        rows = jnp.take(self.embedding, inputs, axis=0)
        return rows if self.dtype is None else rows.astype(self.dtype)
