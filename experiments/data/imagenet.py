"""ImageNet-1k (ILSVRC 2012) for the vision task: images decoded on access, never all in memory.

What :func:`load_imagenet` returns: ``(splits, info)`` with ``splits = {split: {"images":
images, "labels": int32 [N]}}``, where ``images`` is a sequence of ``N`` images decoded when
indexed (``images[i]`` -> uint8 ``[h, w, 3]`` RGB, each image its own size; PIL decodes, and
the pipeline's worker threads do it: experiments/data/image_pipeline.py), and ``info =
{"num_classes": number of classes (1000), "classes": (wnid, ...) or None}``. So it trains only
through the host pipeline (``config.augment.pipeline="deit"``).

Labels: the index of the image's WordNet id (``n01440764`` ...) among the sorted wnids of the
training set (1000 for ImageNet-1k; a folder with fewer classes, e.g. a subset, gives fewer),
which is also tensorflow-datasets' ``imagenet2012`` label order.

Splits: ``test`` is ImageNet's official validation set (50,000 images; the set every ImageNet
top-1 number, the LION paper's included, is measured on); ``val`` is a seeded random
``round(val_fraction * N_train)`` of the training images (default 1%: 12,812, like big_vision's
``minival``), held out for model selection; ``train`` the rest, in source order.

Sources (nothing is downloaded here):

* ``source="tfds"``: tensorflow-datasets' ``imagenet2012``, which tfds cannot download: the
  user puts ``ILSVRC2012_img_train.tar`` and ``ILSVRC2012_img_val.tar`` in
  ``<data_dir>/downloads/manual/`` and builds it **as ArrayRecord** (random access; the
  default TFRecord files can only be streamed in order): ``tfds build imagenet2012
  --data_dir=DATA_DIR --file_format=array_record``. Images are read undecoded
  (``tfds.decode.SkipDecoding``) and decoded by PIL in the workers. The labels of a split are
  read once (one pass over its records) and cached in ``cache_dir``.
* ``source="folder"``: the usual extracted layout, ``data_dir/train/<wnid>/*.JPEG`` and
  ``data_dir/val/<wnid>/*.JPEG`` (the validation images sorted into class folders, as e.g.
  PyTorch's ImageNet example expects); files ending in .jpeg, .jpg or .png (any case) count,
  listed in sorted order.
"""

import io
import os

import numpy as np
from PIL import Image

from experiments.data import common

NUM_CLASSES = 1000
SOURCES = ("tfds", "folder")
EXTENSIONS = (".jpeg", ".jpg", ".png")
_VERSION = 1

_DOWNLOAD = ("ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from "
             "https://image-net.org/download-images (a free account is needed)")


def _tfds_root(data_dir):
    return common.abs_dir(data_dir) or os.path.expanduser(
        os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets"))


def tfds_help(data_dir):
    """How to get ImageNet for ``source="tfds"`` (the manual download of imagenet2012)."""
    root = _tfds_root(data_dir)
    return (f"imagenet2012 needs a manual download: get {_DOWNLOAD}, put them in "
            f"{os.path.join(root, 'downloads', 'manual')}/ and run `tfds build imagenet2012 "
            f"--data_dir={root} --file_format=array_record` (pip install -e '.[data]'), then pass "
            f"--config.data.data_dir={root}; or extract them into train/<wnid>/*.JPEG and "
            "val/<wnid>/*.JPEG and pass --config.data.source=folder "
            "--config.data.data_dir=/path/to/imagenet")


FOLDER_HELP = (f"get {_DOWNLOAD}, extract them into DIR/train/<wnid>/*.JPEG and "
               "DIR/val/<wnid>/*.JPEG (the validation images sorted into their class folders) "
               "and pass --config.data.source=folder --config.data.data_dir=DIR")


class ImageFiles:
    """``N`` image files decoded on access: ``files[i]`` -> uint8 ``[h, w, 3]`` RGB."""

    def __init__(self, paths):
        self.paths = np.asarray(paths, dtype=object)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        path = self.paths[i]
        try:
            with Image.open(path) as img:
                return np.asarray(img.convert("RGB"))
        except OSError as e:
            raise ValueError(f"cannot decode {path}: {e}") from e


class EncodedImages:
    """Records of a tfds data source with undecoded images: ``images[i]`` -> uint8
    ``[h, w, 3]`` RGB, PIL decoding ``source[i]["image"]`` (the encoded bytes)."""

    def __init__(self, source):
        self.source = source

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        with Image.open(io.BytesIO(self.source[int(i)]["image"])) as img:
            return np.asarray(img.convert("RGB"))


class Subset:
    """The images ``images[rows[i]]`` of another sequence of images."""

    def __init__(self, images, rows):
        self.images, self.rows = images, np.asarray(rows)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.images[self.rows[i]]


def _list_folder(root, wnids=None):
    """``(paths, labels, wnids)`` of ``root/<wnid>/<image files>``; ``wnids`` (the training
    classes) fixes the labels, else the sorted folders of ``root`` do."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root} not found: {FOLDER_HELP}")
    folders = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not folders:
        raise FileNotFoundError(f"{root} has no class folders <wnid>/: {FOLDER_HELP}")
    wnids = tuple(folders) if wnids is None else wnids
    index = {w: k for k, w in enumerate(wnids)}
    unknown = [f for f in folders if f not in index]
    if unknown:
        raise ValueError(f"{root} has class folders that train/ does not: {unknown[:3]}")
    paths, labels = [], []
    for folder in folders:
        names = sorted(e.name for e in os.scandir(os.path.join(root, folder))
                       if e.is_file() and e.name.lower().endswith(EXTENSIONS))
        paths += [os.path.join(root, folder, n) for n in names]
        labels += [index[folder]] * len(names)
    if not paths:
        raise FileNotFoundError(f"{root} has no image files: {FOLDER_HELP}")
    return paths, np.asarray(labels, np.int32), wnids


def _folder_splits(data_dir):
    if not data_dir:
        raise FileNotFoundError(f"no ImageNet data_dir given: {FOLDER_HELP}")
    root = common.abs_dir(data_dir)
    train_paths, train_labels, wnids = _list_folder(os.path.join(root, "train"))
    test_paths, test_labels, _ = _list_folder(os.path.join(root, "val"), wnids)
    return ((ImageFiles(train_paths), train_labels), (ImageFiles(test_paths), test_labels),
            wnids)


def _tfds_splits(data_dir, cache_dir):
    help_text = tfds_help(data_dir)
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise FileNotFoundError(f"tensorflow-datasets is not installed: {help_text}") from None
    builder = tfds.builder("imagenet2012", data_dir=common.abs_dir(data_dir) or None)
    if not builder.is_prepared():
        raise FileNotFoundError(f"tensorflow-datasets has no prepared imagenet2012 at "
                                f"{builder.data_dir}: {help_text}")
    out = []
    for split in ("train", "validation"):
        try:
            source = builder.as_data_source(split=split,
                                            decoders={"image": tfds.decode.SkipDecoding()})
        except (NotImplementedError, ValueError) as e:
            raise FileNotFoundError(
                f"imagenet2012 at {builder.data_dir} is not in a random-access format "
                f"({type(e).__name__}): rebuild it with `tfds build imagenet2012 "
                f"--data_dir={_tfds_root(data_dir)} --file_format=array_record`, or use "
                "--config.data.source=folder") from None
        key = dict(data_dir=str(builder.data_dir), split=split, num=len(source),
                   version=_VERSION)
        labels = common.cached(cache_dir, f"imagenet2012_{split}_labels", key, lambda s=source: {
            "labels": np.fromiter((s[i]["label"] for i in range(len(s))), np.int64,
                                  len(s))})["labels"]
        out.append((EncodedImages(source),
                    common.check_labels(labels, NUM_CLASSES, f"imagenet2012 {split}")))
    try:
        wnids = tuple(builder.info.features["label"].names)
    except (AttributeError, KeyError, TypeError):
        wnids = None
    return out[0], out[1], wnids


def load_imagenet(*, source="tfds", data_dir="", val_fraction=0.01, seed=0,
                  cache_dir="~/.cache/lion_jax/imagenet"):
    """ImageNet-1k's splits as images decoded on access (module docstring).

    Args:
      source: ``tfds`` (``imagenet2012`` built as ArrayRecord) or ``folder``.
      data_dir: tfds' data directory ("" = its default), or the folder holding train/ and val/.
      val_fraction: fraction of the training images held out as ``val`` (0: no ``val``).
      seed: seed of the held-out draw.
      cache_dir: where the tfds labels are cached.

    Returns:
      ``(splits, info)``.

    Raises:
      FileNotFoundError: the data is missing; one line saying what to download, from where,
        where to put it, and which config flags point to it.
      ValueError: a bad argument or a malformed folder.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    common.check_holdout(val_fraction, seed)
    if source == "folder":
        (train_images, train_labels), test, wnids = _folder_splits(data_dir)
    else:
        (train_images, train_labels), test, wnids = _tfds_splits(data_dir, cache_dir)
    splits = {"train": {"images": train_images, "labels": train_labels}}
    if val_fraction > 0:
        rows = common.holdout(len(train_labels), val_fraction, seed)
        for name, r in zip(("train", "val"), rows):
            splits[name] = {"images": Subset(train_images, r), "labels": train_labels[r]}
    splits["test"] = {"images": test[0], "labels": test[1]}
    num_classes = len(wnids) if wnids else NUM_CLASSES
    info = {"num_classes": num_classes, "classes": wnids}
    return splits, info

