"""lion_jax: LION and linear-attention sequence models in JAX/Flax.

Sub-packages:
  ops     pure-JAX math (masks, reference/recurrent/chunked forms, impl dispatcher)
  layers  Flax linen modules (token mixers, MLPs, norms)
  models  sequence classifier and other task models
"""

__version__ = "0.1.0"
