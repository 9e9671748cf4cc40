"""Datasets and input pipelines (numpy only; the trainer places batches on devices)."""
