"""LightNet-T/16 on ImageNet-1k at 224 px with DeiT's recipe: LightNet paper Table 1 / 12.

Run:  python -m experiments.train --config configs/lightnet/imagenet.py[:variant] [--workdir DIR]
      [--config.data.source=folder --config.data.data_dir=/path/to/imagenet]

Model (LightNet digest 4.1, 4.2): the ViT skeleton (``lion_jax.models.VisionTransformer``, CLS
pooling) with LightNet layers: the non-causal LightNet attention (``mixer_kind="lightnet"``,
one scan, MD-LRPE over the 14 x 14 patch grid, the CLS token unrotated) and a SwiGLU of width
8/3 d; MD-TPE once after the patch embedding instead of learned positions. Table 12 sizes: T
192 x 12 layers x 6 heads, S 384 x 16 heads, B 768 x 16 heads. Unprinted, ours: the output
gate's rank 64 and biases on the attention's projections (the vision reference's), which put
the parameter counts at 5.98M / 22.57M / 87.61M against the printed 6.0 / 22.6 / 87.7M.

Recipe (digest 4.3, Table 9 IM column): AdamW (0.9, 0.98), eps 1e-8, batch 2048, 300 epochs,
20 warmup epochs, peak lr 5e-4, cosine, weight decay 0.05 (0.1 for B), gradient clipping 5.0;
DeiT's augmentation and label smoothing as configs/vision/imagenet.py (EMA off: Table 9 has
none). Data as configs/vision/imagenet.py.
"""

import ml_collections

from configs import common
from configs.vision import cifar100, imagenet

VARIANTS = {
    "s": "LightNet-S (384 x 12 layers, 16 heads, 22.6M)",
    "b": "LightNet-B (768 x 12 layers, 16 heads, 87.7M); weight decay 0.1",
    "tiny": "seconds-long CPU run for tests on a stand-in train/ val/ folder "
            "(--config.data.data_dir): 16 px, a 1-layer width-16 model, 4 steps of 8",
}
SIZES = {"t": (192, 6), "s": (384, 16), "b": (768, 16)}  # Table 12: width, heads (12 layers)
BATCH_SIZE = 2048
EPOCHS = 300
WARMUP_EPOCHS = 20
PEAK_LR = 5e-4


def lightnet_model(size="t"):
    """``config.model`` of LightNet-``size``/16 (module docstring)."""
    width, heads = SIZES[size]
    return ml_collections.ConfigDict(dict(
        patch_size=16, d_model=width, num_layers=12, num_heads=heads, mlp_dim=8 * width // 3,
        mixer_kind="lightnet", channel_mixer="swiglu",
        mixer=dict(lrpe=True, gate_rank=64, use_bias=True), orders=("raster",),
        pos_emb="md_tpe", image_size=0, pooling="cls", dropout=0.0, drop_path=0.1,
        norm="layernorm", dtype="bfloat16", param_dtype="float32"))


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = imagenet.get_config("tiny" if variant == "tiny" else None)
    size = variant if variant in SIZES else "t"
    c.model = lightnet_model(size)
    if variant == "tiny":
        c.model.update(patch_size=4, d_model=16, num_layers=1, num_heads=2, mlp_dim=32,
                       dtype="float32")
        c.label = "LightNet tiny"
        return c
    cifar100.table13_training(
        c, train_size=imagenet.TRAIN_SIZE - round(imagenet.VAL_FRACTION * imagenet.TRAIN_SIZE),
        batch_size=BATCH_SIZE, epochs=EPOCHS, warmup_epochs=WARMUP_EPOCHS,
        learning_rate=PEAK_LR, weight_decay=0.1 if size == "b" else 0.05, clip_norm=5.0,
        eval_every_epochs=5)
    c.optim.update(b1=0.9, b2=0.98, eps=1e-8, ema_decay=0.0)
    c.checkpoint_every = 600  # about an epoch
    c.label = f"LightNet-{size.upper()}/16"
    return c
