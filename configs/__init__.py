"""Experiment configs: configs/<family>/<name>.py, each with get_config(arg) and VARIANTS."""
