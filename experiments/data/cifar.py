"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009) as in-memory RGB images, for the vision task.

(LRA's grayscale CIFAR-10 sequences are experiments/data/image.py.)

What a loader returns: ``(splits, info)`` with ``splits = {split: {"images": uint8
[N, 32, 32, 3] RGB, "labels": int32 [N]}}`` and ``info = {"num_classes": 10 or 100,
"resolution": 32}``. Labels are the datasets' own: CIFAR-10's 10 classes (airplane ...
truck), CIFAR-100's 100 *fine* labels, in the order of the dataset's label names (the same in
both sources).

Splits: ``test`` is the 10,000 test images; ``val`` is a seeded random ``round(val_fraction *
50000)`` of the training images (:func:`experiments.data.common.holdout`) and ``train`` the
rest, both in source order; ``val_fraction=0`` gives no ``val`` and all 50,000 in ``train``.
The two sources store the training images in different orders, so one seed holds out different
images from each.

Sources (nothing is downloaded here):

* ``source="tfds"``: tensorflow-datasets' ``cifar10`` / ``cifar100``, already built (``tfds
  build cifar100``) under ``data_dir`` (empty: tfds' default directory); tensorflow-datasets is
  imported only then.
* ``source="files"``: the python versions (``cifar-10-python.tar.gz``,
  ``cifar-100-python.tar.gz`` unpacked), ``data_dir`` the folder ``cifar-10-batches-py``
  (pickled dicts ``data_batch_1`` .. ``data_batch_5`` and ``test_batch`` with b"labels") or
  ``cifar-100-python`` (``train`` and ``test`` with b"fine_labels"); each dict's b"data" is
  uint8 ``[N, 3072]``: the 1024 red values of an image (row-major), then green, then blue.

Cache: each source split's arrays are stored once in ``<cache_dir>/<name>_<split>_<hash>.npz``
(the hash covers the source, the absolute ``data_dir`` and ``_VERSION``); the held-out split is
drawn on load.
"""

import os
import pickle

import numpy as np

from experiments.data import common

RESOLUTION = 32
_VERSION = 1  # bump whenever the cached arrays change
_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"


def _help(name, tarball, folder):
    tfds_name = name.lower().replace("-", "")
    return (f"get {name} with pip install -e '.[data]' and `tfds build {tfds_name}` "
            f"(it downloads; for a non-default tfds directory add --data_dir=DIR and pass "
            f"--config.data.data_dir=DIR), or download {tarball} from {_URL}, unpack it (tar xzf "
            f"{tarball}) and pass --config.data.source=files "
            f"--config.data.data_dir=/path/to/{folder}")


# name -> (tfds name, classes, train files, test files, label key, help)
DATASETS = {
    "cifar10": ("cifar10", 10, tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",),
                b"labels", _help("CIFAR-10", "cifar-10-python.tar.gz", "cifar-10-batches-py")),
    "cifar100": ("cifar100", 100, ("train",), ("test",), b"fine_labels",
                 _help("CIFAR-100", "cifar-100-python.tar.gz", "cifar-100-python")),
}


def _read_pickle(path, label_key, help_text):
    """One pickled CIFAR file -> (uint8 [N, 32, 32, 3] images, labels [N])."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {help_text}")
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    data = np.asarray(d[b"data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * RESOLUTION**2:
        raise ValueError(f"{path}: b'data' is {data.dtype} {data.shape}, expected uint8 "
                         f"[N, {3 * RESOLUTION**2}]")
    if label_key not in d:
        raise ValueError(f"{path} has no {label_key!r} (is it the other CIFAR?)")
    images = data.reshape(-1, 3, RESOLUTION, RESOLUTION).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), np.asarray(d[label_key])


def _build(name, source, data_dir, split):
    """Images and labels of a source split ("train" or "test")."""
    tfds_name, num_classes, train_files, test_files, label_key, help_text = DATASETS[name]
    if source == "files":
        if not data_dir:
            raise FileNotFoundError(f"no {name} data_dir given: {help_text}")
        files = train_files if split == "train" else test_files
        parts = [_read_pickle(os.path.join(os.path.expanduser(data_dir), f), label_key,
                              help_text) for f in files]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
    else:
        d = common.tfds_split(tfds_name, split, data_dir, help_text)
        images, labels = np.asarray(d["image"], np.uint8), d["label"]
        if images.shape[1:] != (RESOLUTION, RESOLUTION, 3):
            raise ValueError(f"tfds {tfds_name} {split} images are {images.shape[1:]}, expected "
                             f"({RESOLUTION}, {RESOLUTION}, 3)")
    return dict(images=images, labels=common.check_labels(
        labels, num_classes, f"{name} {split} ({source})"))


def load_cifar(name, *, source="tfds", data_dir="", val_fraction=0.1, seed=0,
               cache_dir="~/.cache/lion_jax/cifar"):
    """The splits of CIFAR-10 (``name="cifar10"``) or CIFAR-100 (``"cifar100"``).

    Args:
      name: ``cifar10`` or ``cifar100``.
      source: ``tfds`` or ``files`` (module docstring).
      data_dir: tfds' data directory ("" = its default), or the unpacked python folder.
      val_fraction: fraction of train held out as ``val`` (0: no ``val``).
      seed: seed of the held-out draw.
      cache_dir: directory of the cache files (created if missing).

    Returns:
      ``(splits, info)`` (module docstring).

    Raises:
      FileNotFoundError: the data is missing; one line saying what to download, from where, and
        which config flags point to it.
      ValueError: a bad argument or malformed files.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown CIFAR {name!r}; valid: {', '.join(DATASETS)}")
    common.check_source(source)
    common.check_holdout(val_fraction, seed)
    splits = {}
    for raw in ("train", "test"):
        key = dict(source=source, data_dir=common.abs_dir(data_dir), split=raw,
                   version=_VERSION)
        splits[raw] = common.cached(cache_dir, f"{name}_{raw}", key,
                                    lambda raw=raw: _build(name, source, data_dir, raw))
    if val_fraction > 0:
        train = splits["train"]
        rows = common.holdout(train["labels"].size, val_fraction, seed)
        splits["train"], splits["val"] = ({k: v[r] for k, v in train.items()} for r in rows)
    info = {"num_classes": DATASETS[name][1], "resolution": RESOLUTION}
    return {k: splits[k] for k in ("train", "val", "test") if k in splits}, info


def load_cifar10(**kwargs):
    """CIFAR-10: :func:`load_cifar` with ``name="cifar10"``."""
    return load_cifar("cifar10", **kwargs)


def load_cifar100(**kwargs):
    """CIFAR-100 (fine labels): :func:`load_cifar` with ``name="cifar100"``."""
    return load_cifar("cifar100", **kwargs)
