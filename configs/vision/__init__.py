"""Vision configs: LION ViTs and the ViT baseline (one file per dataset)."""
