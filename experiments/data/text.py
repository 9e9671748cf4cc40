"""IMDb sentiment for the Long Range Arena ("Text"), byte level, as numpy arrays.

The task (Tay et al. 2021): binary sentiment of a movie review, read byte by byte. How LRA and
S5 define it, and what we do:

* Input. LRA (`lra_benchmarks/text_classification/input_pipeline.py`) encodes each review with
  tfds' `ByteTextEncoder`, which maps byte b to id b + 1 (0 = padding, vocabulary 257), cuts it
  to `max_length` ids and appends no EOS (`max_length` 1000 in its base config, 4000 in
  `transformer_tlb_base`). S5 (`s5/dataloaders/lra.py`, class IMDB) splits the decoded text
  into Unicode characters, keeps those seen at least 15 times in train (about 135 ids), cuts
  each review to `l_max - 1 = 4095` characters and appends EOS. **We** read UTF-8 bytes as LRA
  does and append EOS as S5 does: ids 0 = padding, 1 = EOS, byte b -> b + 2 (`VOCAB_SIZE` =
  258, LRA's ids shifted by one to make room for EOS); each review is cut to `max_length - 1`
  bytes (possibly inside a multi-byte character, as LRA), followed by EOS and padded to
  `max_length` (default 4096, S5's l_max). A causal model thus has one position that has read
  the whole (truncated) review; bidirectional models may mean-pool.
* Text. A review is its file's bytes with leading and trailing ASCII whitespace removed, which
  is how tfds' `imdb_reviews` builder stores it, so both sources give identical tokens. HTML
  such as `<br />` is kept (neither LRA nor S5 removes it).
* Labels: 0 = negative, 1 = positive (tfds' ClassLabel names `["neg", "pos"]`; the `neg/` and
  `pos/` folders of the files).
* Splits: "train" (25,000 reviews) and "test" (25,000). IMDb has no validation set: LRA
  evaluates on test and uses test for validation too, and S5 does the same (`val_split` 0.0).
  With the default `val_fraction=0.0`, **"val" is the test split**, so validation accuracy is
  test accuracy. With `val_fraction > 0`, a seeded random `round(val_fraction * 25000)`
  reviews of train form "val" and "train" is the rest (both kept in source order).

Sources (nothing is ever downloaded here):
* `source="tfds"`: tensorflow-datasets' `imdb_reviews` (default config `plain_text`), already
  built (`tfds build imdb_reviews`) under `data_dir` (empty: tfds' default directory).
  `tensorflow_datasets` is imported only then.
* `source="files"`: Stanford's `aclImdb` folder (`aclImdb_v1.tar.gz` unpacked), reviews at
  `<data_dir>/{train,test}/{neg,pos}/*.txt`, read in sorted file-name order, neg first.

Data is cached: the encoded bytes of a source split are stored in
`<cache_dir>/text_<split>_<hash>.npz` (the hash covers source, absolute data_dir, max_length
and `_VERSION`), so the reviews are parsed once; the held-out val split is drawn on load.

The byte encoding here is shared with `retrieval.py`; argument checks, the tfds reader, the
held-out split and the npz cache are in `common.py`.
"""

import os

import numpy as np

from experiments.data import common

PAD_ID = 0
EOS_ID = 1
BYTE_OFFSET = 2  # id of byte b is b + BYTE_OFFSET
VOCAB_SIZE = 256 + BYTE_OFFSET  # 258
NUM_CLASSES = 2
MAX_LENGTH = 4096  # S5's l_max for IMDb, EOS included

_VERSION = 1  # bump whenever the cached arrays change, so old cache files are not reused

TEXT_HELP = (
    "get IMDb with pip install -e '.[data]' and `tfds build imdb_reviews` (it downloads; for a "
    "non-default tfds directory add --data_dir=DIR and pass --config.data.data_dir=DIR), or "
    "download aclImdb_v1.tar.gz from https://ai.stanford.edu/~amaas/data/sentiment/, unpack it "
    "(tar xzf aclImdb_v1.tar.gz) and pass --config.data.source=files "
    "--config.data.data_dir=/path/to/aclImdb")


# --------------------------------------------------------------------------------------------
# The byte encoding (shared with retrieval.py)
# --------------------------------------------------------------------------------------------














def pack_bytes(docs, max_bytes):
    """Byte strings cut to `max_bytes` each, concatenated.

    Returns:
      dict(flat=uint8 [sum of lengths], lengths=int32 [len(docs)]).
    """
    docs = [bytes(d[:max_bytes]) for d in docs]
    return dict(flat=np.frombuffer(b"".join(docs), np.uint8),
                lengths=np.array([len(d) for d in docs], np.int32))


def take_packed(flat, lengths, rows):
    """Rows `rows` (ascending indices) of packed byte strings -> (flat, lengths)."""
    keep = np.zeros(lengths.size, bool)
    keep[rows] = True
    return flat[np.repeat(keep, lengths)], lengths[rows]


def byte_tokens(flat, lengths, max_length):
    """Packed byte strings (each shorter than `max_length`) -> int32 [N, max_length] token ids.

    Row i holds bytes + BYTE_OFFSET, then EOS_ID at column lengths[i], then PAD_ID.
    """
    tokens = np.full((lengths.size, max_length), PAD_ID, np.int32)
    tokens[np.arange(max_length) < lengths[:, None]] = flat.astype(np.int32) + BYTE_OFFSET
    tokens[np.arange(lengths.size), lengths] = EOS_ID
    return tokens








# --------------------------------------------------------------------------------------------
# IMDb
# --------------------------------------------------------------------------------------------


def _read_files(data_dir, split):
    """Reviews and labels of `<data_dir>/<split>/{neg,pos}/*.txt`: (list of bytes, [N] ints)."""
    docs, labels = [], []
    for label, folder in enumerate(("neg", "pos")):
        path = os.path.join(data_dir, split, folder)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path} not found: {TEXT_HELP}")
        for name in sorted(n for n in os.listdir(path) if n.endswith(".txt")):
            with open(os.path.join(path, name), "rb") as f:
                docs.append(f.read().strip())
        labels += [label] * (len(docs) - len(labels))
    if not docs:
        raise FileNotFoundError(f"no reviews (*.txt) in {os.path.join(data_dir, split)}: "
                                f"{TEXT_HELP}")
    return docs, labels


def _build(source, data_dir, split, max_length):
    """Packed review bytes (cut to max_length - 1) and labels of a source split ("train"/"test")."""
    if source == "files":
        if not data_dir:
            raise FileNotFoundError(f"no aclImdb data_dir given: {TEXT_HELP}")
        docs, labels = _read_files(os.path.expanduser(data_dir), split)
    else:
        d = common.tfds_split("imdb_reviews", split, data_dir, TEXT_HELP)
        docs, labels = d["text"], d["label"]
    return dict(pack_bytes(docs, max_length - 1),
                labels=common.check_labels(labels, NUM_CLASSES, f"IMDb {split} ({source})"))


def load_text(split, *, source="tfds", data_dir="", max_length=MAX_LENGTH, val_fraction=0.0,
              seed=0, cache_dir="~/.cache/lion_jax/text"):
    """One IMDb split as byte-level token ids (conventions in the module docstring).

    Args:
      split: "train", "val" or "test" ("val" is the test split when val_fraction is 0).
      source: "tfds" (tensorflow-datasets' imdb_reviews) or "files" (the aclImdb folder).
      data_dir: tfds' data directory ("" = its default), or the aclImdb folder.
      max_length: padded width; a review keeps at most max_length - 1 bytes, then EOS.
      val_fraction: fraction of train held out as "val"; 0 = use the test split as val.
      seed: seed of the held-out draw.
      cache_dir: directory of the cache files (created if missing).

    Returns:
      dict(tokens=int32 [N, max_length], labels=int32 [N] in {0, 1}).

    Raises:
      FileNotFoundError: the data is missing; the message says how to get it.
      ValueError: a bad argument.
    """
    common.check_split(split)
    common.check_source(source)
    common.check_max_length(max_length)
    common.check_holdout(val_fraction, seed)
    raw = "train" if split == "train" or (split == "val" and val_fraction > 0) else "test"
    key = dict(source=source, data_dir=common.abs_dir(data_dir), split=raw,
               max_length=int(max_length), version=_VERSION)
    d = common.cached(cache_dir, f"text_{raw}", key,
                      lambda: _build(source, data_dir, raw, max_length))
    flat, lengths, labels = d["flat"], d["lengths"], d["labels"]
    if raw == "train" and val_fraction > 0:
        rows = common.holdout(labels.size, val_fraction, seed)[split == "val"]
        (flat, lengths), labels = take_packed(flat, lengths, rows), labels[rows]
    return dict(tokens=byte_tokens(flat, lengths, max_length), labels=labels)
