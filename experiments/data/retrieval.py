"""AAN document matching for the Long Range Arena ("Retrieval"), byte level, as numpy arrays.

The task (Tay et al. 2021): given two papers of the ACL Anthology Network, decide whether one
cites the other (binary). Each paper is read byte by byte; a model encodes the two documents
separately and classifies the pair.

The data is LRA's release (`lra_release.gz`, folder `lra_release/tsv_data/`), files
`new_aan_pairs.{train,eval,test}.tsv`: one pair per line, tab-separated, no header, columns
label, id1, id2, text1, text2. LRA reads them with `make_csv_dataset(field_delim='\\t',
use_quote_delim=False, header=False)`, the label as a float cast to int32
(`lra_benchmarks/matching/input_pipeline.py`); S5 (`s5/dataloaders/lra.py`, class AAN) reads
the same five columns with Hugging Face's csv loader and uses train / eval / test as its train /
val / test. We read them the same way: split "val" is the eval file; the label is parsed as a
number and must be 0 or 1; any line without exactly five fields is an error.

Text fields are stored in the release as Python bytes literals (`b'...'`, with non-ASCII bytes
and newlines written as backslash escapes; other loaders decode them with `ast.literal_eval`).
LRA and S5 both tokenise the field as it stands, prefix, quotes and escapes included (LRA by
bytes, S5 by characters; the field is ASCII, so the two agree), and so do we: no decoding.

Token ids are text.py's: 0 = padding, 1 = EOS, byte b -> b + 2 (`VOCAB_SIZE` = 258; LRA's
`ByteTextEncoder` uses b -> b + 1 without EOS, S5 the characters seen in train, about 98 ids).
Each document is cut to `max_length - 1` bytes, followed by EOS and padded to `max_length`.
Default 4000, S5's l_max for AAN (3999 characters + EOS); LRA's `config.max_length` is also
4000 per document, without EOS (it first cuts at 10000 bytes, which does not matter here).

Data is cached: the cut bytes of a split are stored in `<cache_dir>/retrieval_<split>_<hash>.npz`
(the hash covers the absolute data_dir, max_length and `_VERSION`), so each TSV file is parsed
once. Memory: the full train split at max_length 4000 is about 4.7 GB as int32.
"""

import os

import numpy as np

from experiments.data import common, text

PAD_ID, EOS_ID, BYTE_OFFSET, VOCAB_SIZE = (text.PAD_ID, text.EOS_ID, text.BYTE_OFFSET,
                                           text.VOCAB_SIZE)
NUM_CLASSES = 2
MAX_LENGTH = 4000  # S5's l_max for AAN, EOS included
FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv",
         "test": "new_aan_pairs.test.tsv"}

_VERSION = 1  # bump whenever the cached arrays change, so old cache files are not reused

RETRIEVAL_HELP = (
    "download lra_release.gz (linked from the README of "
    "https://github.com/google-research/long-range-arena: "
    "https://storage.googleapis.com/long-range-arena/lra_release.gz), unpack it "
    "(tar xzf lra_release.gz) and pass --config.data.data_dir=<dir of new_aan_pairs.train.tsv> "
    "(lra_release/tsv_data in the archive)")


def _read_tsv(path, max_bytes):
    """(texts1, texts2, labels) of one `new_aan_pairs.*.tsv` file: lists of bytes cut to
    `max_bytes`, and int32 [N] labels."""
    texts1, texts2, labels = [], [], []
    with open(path, "rb") as f:
        for line_number, line in enumerate(f, start=1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            fields = line.split(b"\t")
            try:
                if len(fields) != 5:
                    raise ValueError(f"{len(fields)} tab-separated fields, expected 5")
                label = float(fields[0])
                if label not in (0, 1):
                    raise ValueError(f"label {label} is not 0 or 1")
            except ValueError as e:
                raise ValueError(f"{path}:{line_number}: not an AAN pair ({e})") from None
            labels.append(int(label))
            texts1.append(fields[3][:max_bytes])
            texts2.append(fields[4][:max_bytes])
    if not labels:
        raise ValueError(f"{path} has no pairs")
    return texts1, texts2, np.array(labels, np.int32)


def _build(path, max_length):
    """Packed document bytes (cut to max_length - 1) and labels of one TSV file."""
    texts1, texts2, labels = _read_tsv(path, max_length - 1)
    packed1, packed2 = (text.pack_bytes(t, max_length - 1) for t in (texts1, texts2))
    return dict(flat1=packed1["flat"], lengths1=packed1["lengths"], flat2=packed2["flat"],
                lengths2=packed2["lengths"], labels=labels)


def load_retrieval(split, *, data_dir, max_length=MAX_LENGTH,
                   cache_dir="~/.cache/lion_jax/retrieval"):
    """One AAN split as byte-level token ids (conventions in the module docstring).

    Args:
      split: "train", "val" (the eval file) or "test".
      data_dir: directory holding `new_aan_pairs.{train,eval,test}.tsv`.
      max_length: padded width; a document keeps at most max_length - 1 bytes, then EOS.
      cache_dir: directory of the cache files (created if missing).

    Returns:
      dict(tokens1=int32 [N, max_length], tokens2=int32 [N, max_length],
      labels=int32 [N] in {0, 1}).

    Raises:
      FileNotFoundError: no data_dir or no such file; the message says how to get the data.
      ValueError: a bad argument or a malformed line.
    """
    common.check_split(split)
    common.check_max_length(max_length)
    path = os.path.join(os.path.expanduser(data_dir), FILES[split]) if data_dir else ""
    if not os.path.isfile(path):
        where = f"{path} not found" if data_dir else "no AAN data_dir given"
        raise FileNotFoundError(f"{where}: {RETRIEVAL_HELP}")
    key = dict(data_dir=common.abs_dir(data_dir), split=split, max_length=int(max_length),
               version=_VERSION)
    d = common.cached(cache_dir, f"retrieval_{split}", key, lambda: _build(path, max_length))
    return dict(tokens1=text.byte_tokens(d["flat1"], d["lengths1"], max_length),
                tokens2=text.byte_tokens(d["flat2"], d["lengths2"], max_length),
                labels=d["labels"])
