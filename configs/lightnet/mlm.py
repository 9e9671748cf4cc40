"""LightNet bidirectional encoder (BERT skeleton, the non-causal LightNet mixer with 1-D LRPE,
the TPE after the embeddings, pre-norm) pre-trained by masked language modelling: BERT-BASE
size with the M2 recipe on the embedded corpus, as configs/mlm/c4.py's LION models.

Run:  python -m experiments.train --config configs/lightnet/mlm.py[:variant] [--workdir DIR]

LightNet digest 4.1 (the bidirectional LM: non-causal LNA with 1-D TPE / LRPE); the paper's
own run is Cramming-BERT for 24 h on one A100 (lr 1e-3, sequence 128, batch 8192), which this
project does not have: the data, recipe, variants and GLUE fine-tuning (configs/glue/) are the
LION BERTs', so the encoders compare on the same tokens. Channel mixer: BERT's GELU MLP (the
LightNet layer's GLU is the ViT's ``channel_mixer="swiglu"``; BERT's block has only the MLP).
"""

from configs import common
from configs.mlm import c4

VARIANTS = {
    "large": "LightNet BERT-LARGE (peak learning rate 2e-4)",
    "small": "a short GPU run: 4 layers of width 256, 128-token rows of the embedded corpus, "
             "3000 steps of 128 (as configs/mlm/c4.py:small)",
    "tiny": "seconds-long run for tests: a 1-layer width-16 encoder on 32-token rows, 4 steps",
}


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = c4.get_config(variant)
    c.model.update(mixer_kind="lightnet", pos_emb="tpe", max_len=0, post_norm=False)
    c.model.mixer = dict(lrpe=True)
    size = "LARGE" if variant == "large" else "BASE"
    c.label = {"small": "LightNet small", "tiny": "LightNet tiny"}.get(
        variant, f"LightNet BERT-{size}")
    return c
