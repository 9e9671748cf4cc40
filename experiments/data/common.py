"""Helpers shared by the LRA data loaders: argument checks, the tfds reader, the seeded held-out
split and the npz cache of the downloaded datasets (`text.py`, `retrieval.py`, `image.py`), and
the atomic npz writer every cache uses (`listops.py` and `pathfinder.py` too)."""

import hashlib
import json
import os
import tempfile
import time

import numpy as np

SPLITS = ("train", "val", "test")
SOURCES = ("tfds", "files")


def check_split(split):
    """ValueError unless `split` is one of SPLITS."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def check_source(source):
    """ValueError unless `source` is one of SOURCES."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")


def check_max_length(max_length):
    """ValueError unless `max_length` is an int >= 2."""
    if (not isinstance(max_length, (int, np.integer)) or isinstance(max_length, bool)
            or max_length < 2):
        raise ValueError(f"max_length must be an int >= 2 (room for one byte and EOS), got "
                         f"{max_length!r}")


def check_holdout(val_fraction, seed):
    """ValueError unless 0 <= val_fraction < 1 and `seed` is a non-negative int."""
    if not isinstance(val_fraction, (int, float, np.floating)) or not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def check_labels(labels, num_classes, where):
    """labels -> int32 [N]; ValueError unless every label is in 0..num_classes - 1."""
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"{where} has labels outside 0..{num_classes - 1}")
    return labels.astype(np.int32)


def abs_dir(data_dir):
    """Absolute form of a user-given directory ("" stays "")."""
    return os.path.abspath(os.path.expanduser(data_dir)) if data_dir else ""


def holdout(num_examples, val_fraction, seed):
    """Seeded split of `range(num_examples)` into (train rows, val rows), each ascending.

    Val has `round(val_fraction * num_examples)` rows; both parts must be non-empty.
    """
    num_val = round(val_fraction * num_examples)
    if not 0 < num_val < num_examples:
        raise ValueError(f"val_fraction={val_fraction} of {num_examples} examples leaves "
                         f"{num_val} for val and {num_examples - num_val} for train")
    order = np.random.default_rng(seed).permutation(num_examples)
    return np.sort(order[num_val:]), np.sort(order[:num_val])


def tfds_split(name, split, data_dir, help_text):
    """Split `split` of the built tfds dataset `name`, whole, as numpy arrays.

    Returns:
      {feature: np.ndarray [N, ...]} as `tfds.as_numpy` gives a batch (text: object array of
      bytes, labels: int64).

    Raises:
      FileNotFoundError: tensorflow-datasets is not installed, or `name` is not built under
        `data_dir` (empty: tfds' default directory); the message ends with `help_text`.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise FileNotFoundError(f"tensorflow-datasets is not installed: {help_text}") from None
    builder = tfds.builder(name, data_dir=abs_dir(data_dir) or None)
    if not builder.is_prepared():
        raise FileNotFoundError(f"tensorflow-datasets has no prepared {name} at "
                                f"{builder.data_dir}: {help_text}")
    return tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))


def cached(cache_dir, name, key, build):
    """The dict of arrays `build()`, stored in `<cache_dir>/<name>_<hash of key>.npz`.

    Builds and stores it on first use (printing one line before and one with the time taken);
    later calls read the file. `key` is a JSON-serialisable dict of everything the arrays depend
    on. The file is written to a temporary name and renamed (atomic).
    """
    cache_dir = os.path.expanduser(cache_dir)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, f"{name}_{digest}.npz")
    if not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        print(f"Building {name} ({key}) into {path} ...", flush=True)
        start = time.perf_counter()
        write_npz(path, build())
        print(f"Built {name} in {time.perf_counter() - start:.1f} s", flush=True)
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def write_npz(path, arrays, *, compressed=True):
    """Writes ``{name: array}`` to the npz file ``path`` atomically (a temporary file in the same
    directory, renamed), so a reader never sees a partial file; creates the directory."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".npz_", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            (np.savez_compressed if compressed else np.savez)(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
