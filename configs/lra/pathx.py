"""LION-S on LRA Path-X (Pathfinder at 128x128, 16,384 pixels), the paper's setting, on
generated data.

Run:  python -m experiments.train --config configs/lra/pathx.py[:variant] [--workdir DIR]

Data (experiments/data/pathfinder.py at resolution 128): 200k generated images (35 per second and
CPU core, measured on 2 cores; 3.3 GB cached), 160k / 20k / 20k; ``--config.data.source=files
--config.data.data_dir=DIR`` reads LRA's released ``pathfinder128`` folder instead.

Model and schedule: the LRA LION-S with linear pixel inputs at S5's Path-X sizes
(lindermanlab/S5 bin/run_experiments/run_lra_pathx.sh): d_model 128, 6 layers, batch 32,
75 epochs, no dropout, weight decay 0.06, 1 epoch of warmup; 8 heads of 16. The HiPPO steps
span (1e-4, 0.1) as S5's dt_min for Path-X. LION-LIT and the Transformer fail this task in the
paper (Table 2).
"""

from configs import common
from configs.lra import pathfinder

VARIANTS = {
    "tiny": "seconds-long run for tests: 16 generated images, 1-layer width-16 model, 4 steps",
    **common.LRA_VARIANTS,
    **common.LRA_IMAGE_VARIANTS,
}


def get_config(arg=None):
    c = pathfinder.get_config(None, resolution=128)
    variant = common.parse_variant(arg, VARIANTS)
    c.model.update(d_model=128, dropout=0.0)
    c.model.mlp_dim = 256
    c.model.mixer.hippo_dt_range = (1e-4, 0.1)
    common.lra_training(c, train_size=160_000, batch_size=32, epochs=75, weight_decay=0.06)
    if variant == "tiny":
        c.data.num_examples = 16
    return common.lra_variant(c, variant)
