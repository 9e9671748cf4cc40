"""CIFAR-10 for the Long Range Arena ("Image"): 1024-pixel grayscale sequences, as numpy arrays.

The task (Tay et al. 2021): classify a 32 x 32 CIFAR-10 image (10 classes) read as a sequence of
1024 grayscale pixels. How LRA and S5 define it, and what we do:

* Grayscale. LRA (`lra_benchmarks/image/input_pipeline.py`, `get_cifar10_datasets`) applies
  `tf.image.rgb_to_grayscale` to the uint8 image and casts the result to int32. That op scales
  to float32 (`p * float32(1/255)`), takes the dot product with the weights
  (0.2989, 0.5870, 0.1140) and converts back to uint8 by multiplying by 255.5 and casting, which
  **truncates**: gray = floor(255.5 * y) for the float32 luma y in [0, 1] (neither rounding nor
  truncating 255 * y). `grayscale` computes exactly this in float32 numpy, summing in the order
  (r w_r + g w_g) + b w_b; it equals TensorFlow 2.21's op on all 2^24 RGB colours. S5
  (`s5/dataloaders/basic.py`, CIFAR10 with grayscale=True) uses torchvision's `Grayscale`
  (PIL's rounded integer luma), which is 1 higher than LRA's on about 26% of colours, and then
  feeds normalised real values.
* Sequence: the grayscale image flattened row-major (pixel (i, j) at position 32 i + j), uint8
  0..255. Models embed it as 256 tokens (LRA) or as a real value (S5); that choice is theirs.
* Labels: 0..9 in CIFAR-10's class order (airplane, automobile, bird, cat, deer, dog, frog,
  horse, ship, truck), for both sources.
* Splits: "test" is the 10,000 test images. LRA validates on tfds' `train[90%:]` (the last 5,000
  images of tfds' stored order); S5 holds out a random 10% of train (`val_split` 0.1, seed 42).
  **We** hold out a seeded random `round(val_fraction * 50000)` images as "val" (default 0.1:
  5,000) and "train" is the rest (45,000), both in source order. With `val_fraction=0`, "train"
  is all 50,000 images and there is no "val".

Sources (nothing is ever downloaded here):
* `source="tfds"`: tensorflow-datasets' `cifar10`, already built (`tfds build cifar10`) under
  `data_dir` (empty: tfds' default directory). `tensorflow_datasets` is imported only then.
* `source="files"`: the python version of CIFAR-10 (`cifar-10-python.tar.gz` unpacked), folder
  `cifar-10-batches-py`: pickled dicts `data_batch_1` .. `data_batch_5` (train, in this order)
  and `test_batch`, each with b"data" uint8 [10000, 3072] (1024 red values, then green, then
  blue, each image row-major) and b"labels" (a list of ints).
The two sources store the images in different orders, so the same seed holds out different
images from each.

Data is cached: the grayscale images of a source split are stored in
`<cache_dir>/image_<split>_<hash>.npz` (the hash covers source, absolute data_dir and
`_VERSION`), so the images are converted once; the held-out val split is drawn on load.
"""

import os
import pickle

import numpy as np

from experiments.data import common

NUM_CLASSES = 10
IMAGE_SIZE = 32
SEQ_LENGTH = IMAGE_SIZE * IMAGE_SIZE  # 1024
GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], np.float32)  # tf.image.rgb_to_grayscale's
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"

_VERSION = 1  # bump whenever the cached arrays change, so old cache files are not reused
_CHUNK = 5000  # images converted at a time (bounds the float32 temporaries)

IMAGE_HELP = (
    "get CIFAR-10 with pip install -e '.[data]' and `tfds build cifar10` (it downloads; for a "
    "non-default tfds directory add --data_dir=DIR and pass --config.data.data_dir=DIR), or "
    "download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, unpack "
    "it (tar xzf cifar-10-python.tar.gz) and pass --config.data.source=files "
    "--config.data.data_dir=/path/to/cifar-10-batches-py")


def grayscale(images):
    """uint8 RGB images [..., 3] -> uint8 grayscale [...], exactly as LRA (module docstring)."""
    rgb = np.asarray(images, np.float32) * np.float32(1 / 255)
    red, green, blue = (rgb[..., c] * GRAY_WEIGHTS[c] for c in range(3))
    luma = (red + green) + blue
    return (luma * np.float32(255.5)).astype(np.uint8)


def _to_sequences(images):
    """uint8 [N, 32, 32, 3] RGB images -> uint8 [N, 1024] grayscale sequences (row-major)."""
    return np.concatenate([grayscale(images[i:i + _CHUNK]).reshape(-1, SEQ_LENGTH)
                           for i in range(0, len(images), _CHUNK)])


def _read_batch(path):
    """One pickled CIFAR-10 batch -> (uint8 [N, 32, 32, 3] RGB images, labels [N])."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {IMAGE_HELP}")
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    data = np.asarray(batch[b"data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * SEQ_LENGTH:
        raise ValueError(f"{path}: b'data' is {data.dtype} {data.shape}, expected uint8 "
                         f"[N, {3 * SEQ_LENGTH}]")
    images = data.reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE).transpose(0, 2, 3, 1)
    return images, np.asarray(batch[b"labels"])


def _build(source, data_dir, split):
    """Grayscale sequences and labels of a source split ("train" or "test")."""
    if source == "files":
        if not data_dir:
            raise FileNotFoundError(f"no cifar-10-batches-py data_dir given: {IMAGE_HELP}")
        names = TRAIN_FILES if split == "train" else (TEST_FILE,)
        batches = [_read_batch(os.path.join(os.path.expanduser(data_dir), n)) for n in names]
        sequences = np.concatenate([_to_sequences(images) for images, _ in batches])
        labels = np.concatenate([labels for _, labels in batches])
    else:
        d = common.tfds_split("cifar10", split, data_dir, IMAGE_HELP)
        sequences, labels = _to_sequences(d["image"]), d["label"]
    return dict(tokens=sequences,
                labels=common.check_labels(labels, NUM_CLASSES, f"CIFAR-10 {split} ({source})"))


def load_image(split, *, source="tfds", data_dir="", val_fraction=0.1, seed=0,
               cache_dir="~/.cache/lion_jax/image"):
    """One CIFAR-10 split as grayscale pixel sequences (conventions in the module docstring).

    Args:
      split: "train", "val" (held out of train) or "test".
      source: "tfds" (tensorflow-datasets' cifar10) or "files" (cifar-10-batches-py).
      data_dir: tfds' data directory ("" = its default), or the cifar-10-batches-py folder.
      val_fraction: fraction of train held out as "val" (0: none, and "val" is an error).
      seed: seed of the held-out draw.
      cache_dir: directory of the cache files (created if missing).

    Returns:
      dict(tokens=uint8 [N, 1024] grayscale pixels, row-major, labels=int32 [N] in 0..9).

    Raises:
      FileNotFoundError: the data is missing; the message says how to get it.
      ValueError: a bad argument.
    """
    common.check_split(split)
    common.check_source(source)
    common.check_holdout(val_fraction, seed)
    if split == "val" and val_fraction == 0:
        raise ValueError("split 'val' needs val_fraction > 0 (it is held out of train)")
    raw = "test" if split == "test" else "train"
    key = dict(source=source, data_dir=common.abs_dir(data_dir), split=raw, version=_VERSION)
    d = common.cached(cache_dir, f"image_{raw}", key, lambda: _build(source, data_dir, raw))
    tokens, labels = d["tokens"], d["labels"]
    if raw == "train" and val_fraction > 0:
        rows = common.holdout(labels.size, val_fraction, seed)[split == "val"]
        tokens, labels = tokens[rows], labels[rows]
    return dict(tokens=tokens, labels=labels)
