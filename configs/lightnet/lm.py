"""LightNet causal LM (causal LNA with 1-D LRPE, TPE after the embedding, SwiGLU): scaling-laws
160M dims and recipe on the embedded corpus; the LightNet paper's Table 10 LLMs as variants.

Run:  python -m experiments.train --config configs/lightnet/lm.py[:variant] [--workdir DIR]
Then: python -m experiments.generate --workdir DIR --prompt "The harbor of"

The recipe, data and the shared variants (sizes, ``small``, ``tiny``) are configs/lm/common.py's,
as for the other causal LMs, so LightNet compares with TNL, HGRN2, cosFormer2 and LLaMA on the
same tokens; ``lightnet_150m`` ... ``lightnet_3b`` are the paper's own models
(``common.LIGHTNET_MODELS``).
"""

from configs.lm import common

ARCH = "lightnet"
VARIANTS = common.variants(ARCH)


def get_config(arg=None):
    return common.make_config(ARCH, arg)
