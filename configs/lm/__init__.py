"""Causal language-model configs: the scaling-laws paper's LLaMA, TNL, HGRN2 and cosFormer2
and causal LION-S (one file per architecture, built by :mod:`configs.lm.common`)."""
