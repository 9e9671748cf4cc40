"""LION-S on LRA Pathfinder (32x32, 1024 pixels), the paper's setting, on generated data.

Run:  python -m experiments.train --config configs/lra/pathfinder.py[:variant] [--workdir DIR]

Data (experiments/data/pathfinder.py): LRA's ``curv_contour_length_14`` set generated locally
(200k images, 160k / 20k / 20k as S5 splits it, labels balanced; 73 s on 2 CPU cores, cached
in ``config.data.cache_dir``); ``--config.data.source=files --config.data.data_dir=DIR`` reads
LRA's released ``pathfinder32`` folder instead. ``--config.data.difficulty=curv_baseline`` (or
``curv_contour_length_9``) trains on the Pathfinder challenge's easier sets (shorter contours,
shorter distractors), generated or read from the release.

Model and schedule: the LRA LION-S with pixel intensities fed through a linear layer
(``input_encoding="pixels"``, as S5) at S5's Pathfinder sizes (lindermanlab/S5
bin/run_experiments/run_lra_pathfinder.sh): d_model 192, 6 layers, batch 64, 200 epochs,
dropout 0.05, weight decay 0.03, 1 epoch of warmup; 8 heads of 24.
"""

import ml_collections

from configs import common

VARIANTS = {
    "tiny": "seconds-long run for tests: 64 generated images, 1-layer width-16 model, 4 steps",
    **common.LRA_VARIANTS,
    **common.LRA_IMAGE_VARIANTS,
}

RESOLUTION = 32


def get_config(arg=None, resolution=RESOLUTION):
    variant = common.parse_variant(arg, VARIANTS)
    c = common.base_config()
    c.data = ml_collections.ConfigDict(dict(
        name="pathfinder", source="generate", data_dir="",
        cache_dir="~/.cache/lion_jax/pathfinder", resolution=resolution, num_examples=200_000,
        val_fraction=0.1, test_fraction=0.1, seed=0, num_workers=0,  # 0: one per CPU
        difficulty="curv_contour_length_14"))  # LRA's; also curv_baseline, curv_contour_length_9
    c.model = common.lra_model(d_model=192, num_layers=6, dropout=0.05,
                               max_len=resolution * resolution, input_encoding="pixels",
                               image_shape=(resolution, resolution))
    c.model.bn_momentum = 0.9  # S5's Pathfinder and Path-X scripts (with norm="batchnorm")
    common.lra_training(c, train_size=160_000, batch_size=64, epochs=200, weight_decay=0.03)
    if variant == "tiny":
        c.data.num_examples = 64
    return common.lra_variant(c, variant)
