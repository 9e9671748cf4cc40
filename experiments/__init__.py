"""Experiments: training entry point, trainer, data pipelines and benchmarks for lion_jax."""
