"""LLaMA causal LM (RoPE softmax attention, SwiGLU): scaling-laws 160M and recipe; embedded corpus.

Run:  python -m experiments.train --config configs/lm/llama.py[:variant] [--workdir DIR]
Then: python -m experiments.generate --workdir DIR --prompt "The harbor of"

Everything (recipe, data, variants, which settings are the paper's and which are ours) is in
configs/lm/common.py, shared by the five architectures' files.
"""

from configs.lm import common

ARCH = "llama"
VARIANTS = common.variants(ARCH)


def get_config(arg=None):
    return common.make_config(ARCH, arg)
