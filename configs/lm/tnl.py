"""TNL causal LM (decayed linear attention, SGLU): scaling-laws 160M and recipe; embedded corpus.

Run:  python -m experiments.train --config configs/lm/tnl.py[:variant] [--workdir DIR]
Then: python -m experiments.generate --workdir DIR --prompt "The harbor of"

Everything (recipe, data, variants, which settings are the paper's and which are ours) is in
configs/lm/common.py, shared by the five architectures' files.
"""

from configs.lm import common

ARCH = "tnl"
VARIANTS = common.variants(ARCH)


def get_config(arg=None):
    return common.make_config(ARCH, arg)
