"""Masked language modelling data (BERT / M2 recipe): documents, WordPiece, packing, masking.

The LION paper pre-trains BERT-style encoders on C4 with the M2 recipe (Fu et al. 2023): rows
of 128 tokens, 30% of the tokens masked in training and 15% in evaluation, and tests LION-S on
longer rows than it was trained on (paper Figure 3 left). This module makes the rows; the
masking is a pure function that runs on device in the jitted step.

Sources (`source=`; nothing is ever downloaded here):

* `"embedded"` (default): the generated corpus of `experiments/data/mlm_corpus.py`, English-like
  documents with long-range structure. The splits are consecutive index ranges of the corpus
  of `seed`: test is documents `[0, num_test)`, val the next `num_val`, train the next
  `num_train` (so changing `num_train` never changes val or test). `min_chars`, `max_chars`
  set document lengths.
* `"files"`: the user's text. `data_dir` is one file or a directory searched recursively for
  `*.txt`, `*.jsonl`, `*.json` (each optionally `.gz`), read in sorted path order. **Document
  boundaries**: in `.txt` files each non-blank line is a document (`doc_boundary="line"`, the
  default) or each whole file is one (`doc_boundary="file"`); in `.jsonl` / `.json` files each
  line is a JSON object and its `"text"` field is one document (C4's released
  `c4-*.json.gz` shards are in this format). Leading/trailing whitespace is stripped and empty
  documents are skipped. Document k (0-based, over all files) goes to test if
  `u < test_fraction`, else to val if `u < test_fraction + val_fraction`, else to train, with
  `u` a hash of `(seed, k)` in [0, 1): deterministic, streamed, and adding documents at the
  end never moves earlier ones. (For C4's shards, point `data_dir` at the train shards; val
  is then held out from them.)
* `"tfds"`: tensorflow-datasets' `tfds_name` (default `"c4/en"`), already prepared under
  `data_dir` ("" = tfds' default directory); each example's `text` is one document. Train is
  `train[:num_train]`, val `validation[:num_val]`, test `validation[num_val:num_val +
  num_test]`, streamed in order. `tensorflow_datasets` is imported only for this source.

A split with no documents requested (`num_test=0`, `test_fraction=0`, ...) is absent from
`load_mlm`'s result; train and val always exist. Missing data raises `FileNotFoundError` with
one line that says what to get, from where, and which `config.data` key points to it.

Tokenizer (`WordPieceTokenizer`): BERT's WordPiece (BERT normaliser: clean text, optional
lowercasing with accent stripping; BERT pre-tokeniser: split on whitespace and punctuation;
"##" continuation prefix), from a vocab file in BERT's format (one token per line, line number
= id). Special tokens `[PAD]`=0, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]` must be in the file
(`[PAD]` on line 0, so zero-padded rows are padding); `special_ids` also counts any other
bracketed entry such as BERT's `[unused0]`. Specials are not matched inside text (the
pre-tokeniser splits "[MASK]" into "[", "mask", "]"), so encoded text holds no special id but
`[UNK]`. `vocab_file=` takes the user's file (e.g. bert-base-uncased's vocab.txt with
`lowercase=True`, M2's tokenizer); otherwise a vocabulary of `vocab_size` entries is trained
with the `tokenizers` library on the first `tokenizer_documents` train documents and cached as
`<cache_dir>/mlm_vocab_<hash>.txt`, the hash covering the source, the training settings and
the `tokenizers` version. (Its WordPiece trainer breaks ties between equally frequent pairs in
hash-map order, so two trainings on the same text may differ in a few entries: the cache makes
a vocabulary stable on one machine, and the same vocab file makes runs on two machines equal.)

Rows (`pack_documents`): every row is `[CLS] tokens [SEP]` then `[PAD]` up to `max_len`.
* `cross_document=True` (default): documents are concatenated with one `[SEP]` between
  consecutive ones and the stream is cut into rows of `max_len - 2` tokens, so a row may end
  one document and start the next. A separator that falls on a cut is not repeated (the row's
  closing `[SEP]` ends the document; a row that would end on one gets one `[PAD]` instead),
  so no row starts with `[CLS] [SEP]` or ends with `[SEP] [SEP]`, and only the split's last
  row is short.
* `cross_document=False`: a row holds tokens of one document only; a document longer than
  `max_len - 2` tokens continues in the next rows, and its last row is padded.
  `truncate=True` keeps only each document's first row, which is what M2 actually does (its
  C4 pipeline tokenises each document with truncation and pads it to 128; no concatenation).
Rows are in document order (the trainer's iterator shuffles). Besides `ids` the arrays hold
`attention_mask` (1 on real tokens, 0 on padding) and `document_ids` (the split-local index of
the document each content token came from, -1 on `[CLS]`, `[SEP]` and `[PAD]`).

Caches (under `cache_dir`, written with `common.cached`, atomic): the token ids of every split
per (source, vocabulary, lowercase) in `mlm_tokens_<hash>.npz`, and the packed rows per (those,
`max_len`, `cross_document`, `truncate`) in `mlm_<hash>.npz`; so evaluating at another
`max_len` re-packs without re-tokenising.

Masking (`mask_tokens` in JAX, `mask_tokens_np` its numpy twin): BERT's dynamic masking. Each
maskable token (not special, not padding) is selected independently with probability
`mask_prob` (0.3 in training, 0.15 in evaluation: `TRAIN_MASK_PROB`, `EVAL_MASK_PROB`); a
selected token becomes `[MASK]` with probability 0.8, a uniformly random non-special token with
0.1, and stays as it is with 0.1. The loss counts the selected positions only (`weights`).
Masks are drawn in the train step from the step's key, so every epoch sees new masks (as
HuggingFace's collator, which M2 uses); evaluation should use a fixed key (e.g.
`fold_in(key, batch index)`) so that every evaluation scores the same masks.
"""

import argparse
import gzip
import hashlib
import json
import os
import tempfile

import numpy as np

from experiments.data import common, mlm_corpus

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID = 0
TRAIN_MASK_PROB = 0.3  # M2's pre-training masking rate
EVAL_MASK_PROB = 0.15  # M2's evaluation masking rate
SOURCES = ("embedded", "files", "tfds")
DOC_BOUNDARIES = ("line", "file")
SPLITS = ("train", "val", "test")
MAX_LEN = 128  # M2's pre-training row length
_FILE_SUFFIXES = (".txt", ".jsonl", ".json")

_VERSION = 1  # bump whenever tokenised or packed arrays change, so old caches are not reused
_ENCODE_CHUNK = 2048  # documents per encode_batch call
_FILL_CHUNK = 1 << 16  # rows per vectorised fill in pack_documents

FILES_HELP = (
    "point --config.data.data_dir at your text with --config.data.source=files: a .txt file or "
    "a directory of .txt files (one document per line, or per file with "
    "--config.data.doc_boundary=file), or .jsonl/.json(.gz) files with a 'text' field per line "
    "such as C4's en shards (en/c4-train.*.json.gz and en/c4-validation.*.json.gz from "
    "https://huggingface.co/datasets/allenai/c4); or use the embedded corpus "
    "(--config.data.source=embedded, the default)")
TFDS_HELP = (
    "prepare it with pip install -e '.[data]' and `tfds build c4/en --data_dir=DIR` "
    "(tensorflow-datasets builds C4 from Common Crawl with Apache Beam: "
    "https://www.tensorflow.org/datasets/catalog/c4) and pass --config.data.data_dir=DIR "
    "(--config.data.tfds_name names the dataset); or download C4's en json.gz shards from "
    "https://huggingface.co/datasets/allenai/c4 and pass --config.data.source=files "
    "--config.data.data_dir=<their directory>; or use the embedded corpus "
    "(--config.data.source=embedded, the default)")


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def _backend(vocab, lowercase):
    """A `tokenizers.Tokenizer` for the WordPiece vocabulary {token: id} (module docstring)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return tok


class WordPieceTokenizer:
    """BERT's WordPiece tokenizer from a vocab file (conventions in the module docstring).

    Args:
      vocab_file: BERT-format vocabulary: one token per line, id = line number (0-based);
        must hold the SPECIAL_TOKENS, with "[PAD]" on line 0.
      lowercase: lowercase (and strip accents) before tokenising; must match how the
        vocabulary was made (True for bert-base-uncased and for the default trained one).

    Attributes:
      vocab_file, lowercase; vocab (tuple of str, index = id); vocab_size (int);
      vocab_hash (str, sha256 of the file's tokens); pad_id (0), unk_id, cls_id, sep_id,
      mask_id (int); special_ids (tuple of int, ascending: the five specials and any other
      bracketed entry such as "[unused0]").

    Raises:
      FileNotFoundError: no such file.
      ValueError: a file without the special tokens, with "[PAD]" not on line 0, or with a
        repeated token.
    """

    def __init__(self, vocab_file, *, lowercase=True):
        vocab_file = os.path.expanduser(vocab_file)
        if not os.path.isfile(vocab_file):
            raise FileNotFoundError(
                f"vocab file {vocab_file} not found: pass --config.data.vocab_file=<a BERT "
                "vocab.txt, one token per line> or leave it empty to train a WordPiece "
                "vocabulary on the corpus")
        with open(vocab_file, encoding="utf-8") as f:
            tokens = tuple(line.rstrip("\r\n") for line in f)
        while tokens and tokens[-1] == "":
            tokens = tokens[:-1]
        ids = {t: i for i, t in enumerate(tokens)}
        if len(ids) != len(tokens):
            repeated = sorted({t for t in tokens if tokens.count(t) > 1})[:5]
            raise ValueError(f"{vocab_file} repeats tokens {repeated}")
        missing = [t for t in SPECIAL_TOKENS if t not in ids]
        if missing:
            raise ValueError(f"{vocab_file} lacks the special tokens {missing} (need all of "
                             f"{list(SPECIAL_TOKENS)})")
        if ids["[PAD]"] != PAD_ID:
            raise ValueError(f"{vocab_file} has [PAD] on line {ids['[PAD]']}; it must be on "
                             "line 0 (id 0: zero-padded rows are padding)")
        self.vocab_file = vocab_file
        self.lowercase = bool(lowercase)
        self.vocab = tokens
        self.vocab_size = len(tokens)
        self.vocab_hash = hashlib.sha256("\n".join(tokens).encode()).hexdigest()
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            ids[t] for t in SPECIAL_TOKENS)
        self.special_ids = tuple(i for i, t in enumerate(tokens)
                                 if len(t) > 2 and t[0] == "[" and t[-1] == "]")
        self._tok = _backend(ids, self.lowercase)

    def __repr__(self):
        return (f"WordPieceTokenizer({self.vocab_file!r}, lowercase={self.lowercase}, "
                f"vocab_size={self.vocab_size})")

    def encode(self, text):
        """str -> list of int ids, without [CLS] / [SEP] (packing adds them)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts):
        """list of str -> list of lists of int ids (as `encode`; in parallel)."""
        return [e.ids for e in self._tok.encode_batch_fast(list(texts),
                                                           add_special_tokens=False)]

    def decode(self, ids, *, skip_special=True):
        """Ids (any int sequence or array) -> str: tokens joined by single spaces, "##"
        continuations glued to the previous token; special tokens but [UNK] dropped unless
        `skip_special` is False. For text without [UNK], `decode(encode(text)) ==
        normalize(text)`."""
        ids = [int(i) for i in np.asarray(ids).ravel()]
        if skip_special:
            drop = set(self.special_ids) - {self.unk_id}
            ids = [i for i in ids if i not in drop]
        return self._tok.decode(ids, skip_special_tokens=False)

    def normalize(self, text):
        """The text as the tokenizer sees it: normalised (lowercased and accents stripped when
        `lowercase`, control characters removed), split on whitespace and punctuation, pieces
        joined by single spaces."""
        normed = self._tok.normalizer.normalize_str(text)
        return " ".join(piece for piece, _ in self._tok.pre_tokenizer.pre_tokenize_str(normed))


def _write_text_atomic(path, text):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".vocab_", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def train_tokenizer(texts, vocab_file, *, vocab_size=8192, lowercase=True, min_frequency=2):
    """Trains a WordPiece vocabulary with the `tokenizers` library and writes it.

    Args:
      texts: iterable of str (documents), read once.
      vocab_file: path of the BERT-format vocab file to write (atomically).
      vocab_size: number of entries at most (the five specials included; fewer when the text
        has fewer distinct pieces).
      lowercase: lowercase (and strip accents) before training, and in the tokenizer returned.
      min_frequency: a merge must occur at least this often.

    Returns:
      The `WordPieceTokenizer` of the written file. The specials take ids 0..4 in
      SPECIAL_TOKENS order.
    """
    from tokenizers import trainers

    if not isinstance(vocab_size, (int, np.integer)) or vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be an int > {len(SPECIAL_TOKENS)}, got "
                         f"{vocab_size!r}")
    tok = _backend({t: i for i, t in enumerate(SPECIAL_TOKENS)}, bool(lowercase))
    trainer = trainers.WordPieceTrainer(
        vocab_size=int(vocab_size), min_frequency=int(min_frequency),
        special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##",
        show_progress=False)
    tok.train_from_iterator(texts, trainer)
    vocab = tok.get_vocab(with_added_tokens=False)
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise RuntimeError("tokenizers returned a vocabulary with non-contiguous ids")
    tokens = sorted(vocab, key=vocab.get)
    if tuple(tokens[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
        raise RuntimeError(f"tokenizers put the special tokens at {tokens[:5]}")
    _write_text_atomic(vocab_file, "".join(t + "\n" for t in tokens))
    return WordPieceTokenizer(vocab_file, lowercase=lowercase)


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


def _check_count(name, value, minimum):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _source_spec(source="embedded", data_dir="", *, seed=0, num_train=20000, num_val=1000,
                 num_test=0, val_fraction=0.05, test_fraction=0.0, doc_boundary="line",
                 tfds_name="c4/en", min_chars=1000, max_chars=3000):
    """Checked source settings -> a JSON-serialisable dict: everything the documents of every
    split depend on (the cache keys), plus the settings only needed to read them."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    _check_count("seed", seed, 0)
    spec = dict(source=source)
    if source == "embedded":
        _check_count("num_train", num_train, 1)
        _check_count("num_val", num_val, 1)
        _check_count("num_test", num_test, 0)
        _check_count("min_chars", min_chars, 0)
        _check_count("max_chars", max_chars, max(1, int(min_chars)))
        spec.update(seed=int(seed), num_train=int(num_train), num_val=int(num_val),
                    num_test=int(num_test), min_chars=int(min_chars), max_chars=int(max_chars),
                    generator=mlm_corpus.GENERATOR_VERSION)
    elif source == "files":
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not isinstance(value, (int, float, np.floating)) or not 0 <= value < 1:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if val_fraction == 0:
            raise ValueError("val_fraction must be > 0 (the val split always exists)")
        if val_fraction + test_fraction >= 1:
            raise ValueError(f"val_fraction + test_fraction must be < 1, got "
                             f"{val_fraction} + {test_fraction}")
        if doc_boundary not in DOC_BOUNDARIES:
            raise ValueError(f"doc_boundary must be one of {DOC_BOUNDARIES}, got "
                             f"{doc_boundary!r}")
        root, files = _list_files(data_dir)
        spec.update(root=root, files=files, doc_boundary=doc_boundary, seed=int(seed),
                    val_fraction=float(val_fraction), test_fraction=float(test_fraction))
    else:
        _check_count("num_train", num_train, 1)
        _check_count("num_val", num_val, 1)
        _check_count("num_test", num_test, 0)
        if not isinstance(tfds_name, str) or not tfds_name:
            raise ValueError(f"tfds_name must be a dataset name such as 'c4/en', got "
                             f"{tfds_name!r}")
        spec.update(name=tfds_name, data_dir=common.abs_dir(data_dir), num_train=int(num_train),
                    num_val=int(num_val), num_test=int(num_test))
    return spec


def _splits_of(spec):
    """The splits a source spec produces, in SPLITS order."""
    if spec["source"] == "files":
        return ("train", "val") + (("test",) if spec["test_fraction"] > 0 else ())
    return ("train", "val") + (("test",) if spec["num_test"] > 0 else ())


def _is_text_file(name):
    base = name[:-3] if name.endswith(".gz") else name
    return base.endswith(_FILE_SUFFIXES)


def _list_files(data_dir):
    """(absolute root, [[relative path, size, mtime_ns], ...] sorted) of the corpus files."""
    if not data_dir:
        raise FileNotFoundError(f"no text files given (config.data.data_dir is empty): "
                                f"{FILES_HELP}")
    root = common.abs_dir(data_dir)
    if os.path.isfile(root):
        st = os.stat(root)
        return root, [["", st.st_size, st.st_mtime_ns]]
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root} not found: {FILES_HELP}")
    files = []
    for directory, dirs, names in os.walk(root):
        dirs.sort()
        for name in names:
            if _is_text_file(name):
                path = os.path.join(directory, name)
                st = os.stat(path)
                files.append([os.path.relpath(path, root), st.st_size, st.st_mtime_ns])
    if not files:
        raise FileNotFoundError(f"no .txt, .jsonl or .json(.gz) files in {root}: {FILES_HELP}")
    return root, sorted(files)


def _file_documents(root, files, doc_boundary):
    """Yields the documents of the corpus files in order (module docstring)."""
    for rel, _, _ in files:
        path = os.path.join(root, rel) if rel else root
        opener = gzip.open if path.endswith(".gz") else open
        is_json = not (path[:-3] if path.endswith(".gz") else path).endswith(".txt")
        with opener(path, "rt", encoding="utf-8") as f:
            if is_json:
                for line_number, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        text = json.loads(line)["text"]
                    except (ValueError, KeyError, TypeError) as e:
                        raise ValueError(f"{path}:{line_number}: not a JSON object with a "
                                         f"'text' field ({e!r})") from None
                    text = text.strip()
                    if text:
                        yield text
            elif doc_boundary == "file":
                text = f.read().strip()
                if text:
                    yield text
            else:
                for line in f:
                    line = line.strip()
                    if line:
                        yield line


def _unit_hash(seed, k):
    """A uniform number in [0, 1) from (seed, k): the split draw of file document k."""
    digest = hashlib.blake2b(f"{seed}:{k}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0 ** 64


def _tfds_documents(name, data_dir, split_spec, help_text=TFDS_HELP):
    """Yields the `text` of the examples of `split_spec` (e.g. "train[:1000]") of the prepared
    tfds dataset `name`, in order; `help_text` says how to get it when it is missing."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise FileNotFoundError(f"tensorflow-datasets is not installed, so {name} cannot be "
                                f"read: {help_text}") from None
    builder = tfds.builder(name, data_dir=data_dir or None)
    if not builder.is_prepared():
        raise FileNotFoundError(f"tensorflow-datasets has no prepared {name} at "
                                f"{builder.data_dir}: {help_text}")
    dataset = builder.as_dataset(split=split_spec, shuffle_files=False)
    for example in tfds.as_numpy(dataset):
        text = example["text"]
        text = (text.decode("utf-8") if isinstance(text, bytes) else str(text)).strip()
        if text:
            yield text


def _documents(spec, split, *, tfds_splits=("validation", "validation"), tfds_help=TFDS_HELP):
    """Yields the documents (str) of `split` of a source spec, in order. tfds: the first
    `num_train` of "train", the first `num_val` of `tfds_splits[0]` and `num_test` of
    `tfds_splits[1]` (after the val examples when the two are one split)."""
    if split not in _splits_of(spec):
        raise ValueError(f"split {split!r} is not in this source's splits {_splits_of(spec)}")
    if spec["source"] == "embedded":
        start = {"test": 0, "val": spec["num_test"],
                 "train": spec["num_test"] + spec["num_val"]}[split]
        yield from mlm_corpus.iter_documents(
            spec[f"num_{split}"], seed=spec["seed"], start=start, min_chars=spec["min_chars"],
            max_chars=spec["max_chars"])
    elif spec["source"] == "files":
        lo = {"test": 0.0, "val": spec["test_fraction"],
              "train": spec["test_fraction"] + spec["val_fraction"]}[split]
        hi = {"test": spec["test_fraction"],
              "val": spec["test_fraction"] + spec["val_fraction"], "train": 1.0}[split]
        for k, text in enumerate(_file_documents(spec["root"], spec["files"],
                                                 spec["doc_boundary"])):
            if lo <= _unit_hash(spec["seed"], k) < hi:
                yield text
    else:
        val_split, test_split = tfds_splits
        n_val, n_test = spec["num_val"], spec["num_test"]
        test_start = n_val if test_split == val_split else 0
        split_spec = {"train": f"train[:{spec['num_train']}]", "val": f"{val_split}[:{n_val}]",
                      "test": f"{test_split}[{test_start}:{test_start + n_test}]"}[split]
        yield from _tfds_documents(spec["name"], spec["data_dir"], split_spec, tfds_help)


def iter_documents(split, **source):
    """Yields the documents of one split of a source, in order (module docstring).

    Args:
      split: "train", "val" or "test" (test only when the source has one).
      **source: the source settings of `load_mlm` (source, data_dir, seed, num_train, num_val,
        num_test, val_fraction, test_fraction, doc_boundary, tfds_name, min_chars, max_chars).

    Returns:
      An iterator of str, one document each (stripped, non-empty).

    Raises:
      FileNotFoundError: the data is missing (one line saying how to get it).
      ValueError: bad settings or split.
    """
    return _documents(_source_spec(**source), split)


def _identity(spec):
    """The part of a source spec that the documents depend on (for cache keys)."""
    if spec["source"] == "files":
        files = hashlib.sha256(json.dumps(spec["files"]).encode()).hexdigest()
        return dict({k: v for k, v in spec.items() if k != "files"}, files=files)
    return dict(spec)


def training_texts(documents, limit, source):
    """The first ``limit`` documents of the iterator ``documents``, for training a tokenizer.
    The first is read now, so that missing data fails here, in Python, before any training.

    Raises:
      ValueError: ``documents`` is empty.
    """
    first = next(documents, None)
    if first is None:
        raise ValueError(f"the train split of source {source!r} has no documents")

    def texts():
        yield first
        for i, text in enumerate(documents, start=1):
            if i >= limit:
                break
            yield text

    return texts()


def load_tokenizer(*, vocab_file="", vocab_size=8192, lowercase=True, min_frequency=2,
                   tokenizer_documents=100_000, cache_dir="~/.cache/lion_jax/mlm", **source):
    """The tokenizer of a source: the user's `vocab_file`, or one trained on the source.

    Args:
      vocab_file: a BERT-format vocab file to use as is ("" = train one).
      vocab_size, min_frequency: training settings (`train_tokenizer`).
      lowercase: lowercase (and strip accents) before tokenising.
      tokenizer_documents: train on the first this many train documents.
      cache_dir: where the trained vocabulary is cached (`mlm_vocab_<hash>.txt`).
      **source: the source settings (`load_mlm`).

    Returns:
      A `WordPieceTokenizer`.
    """
    if vocab_file:
        return WordPieceTokenizer(vocab_file, lowercase=lowercase)
    from tokenizers import __version__ as tokenizers_version

    _check_count("tokenizer_documents", tokenizer_documents, 1)
    _check_count("vocab_size", vocab_size, len(SPECIAL_TOKENS) + 1)
    _check_count("min_frequency", min_frequency, 0)
    spec = _source_spec(**source)
    key = dict(source=_identity(spec), vocab_size=int(vocab_size), lowercase=bool(lowercase),
               min_frequency=int(min_frequency), documents=int(tokenizer_documents),
               tokenizers=tokenizers_version, version=_VERSION)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = os.path.join(os.path.expanduser(cache_dir), f"mlm_vocab_{digest}.txt")
    if os.path.exists(path):
        return WordPieceTokenizer(path, lowercase=lowercase)
    texts = training_texts(_documents(spec, "train"), tokenizer_documents, spec["source"])
    print(f"Training a WordPiece vocabulary ({vocab_size} entries) on the first "
          f"{tokenizer_documents} train documents of {spec['source']} into {path} ...",
          flush=True)
    tokenizer = train_tokenizer(texts, path, vocab_size=vocab_size, lowercase=lowercase,
                                min_frequency=min_frequency)
    print(f"Trained a vocabulary of {tokenizer.vocab_size} entries", flush=True)
    return tokenizer


# --------------------------------------------------------------------------------------------
# Tokenising and packing
# --------------------------------------------------------------------------------------------


def _tokenize_split(tokenizer, documents):
    """Documents -> (flat int32 [total tokens], lengths int32 [num documents]); documents that
    encode to no token are kept with length 0 (packing skips them)."""
    flat, lengths, chunk = [], [], []

    def flush():
        for ids in tokenizer.encode_batch(chunk):
            flat.append(np.asarray(ids, np.int32))
            lengths.append(len(ids))
        chunk.clear()

    for text in documents:
        chunk.append(text)
        if len(chunk) == _ENCODE_CHUNK:
            flush()
    if chunk:
        flush()
    return (np.concatenate(flat) if flat else np.zeros(0, np.int32),
            np.asarray(lengths, np.int32))


def pack_documents(flat, lengths, max_len, *, cross_document=True, truncate=False, cls_id=2,
                   sep_id=3, pad_id=PAD_ID):
    """Packs tokenised documents into rows `[CLS] tokens [SEP] [PAD]...` (module docstring).

    Args:
      flat: int [T] the documents' token ids (no specials), concatenated.
      lengths: int [D] tokens per document (sum T); empty documents are skipped.
      max_len: row length, >= 3.
      cross_document: True: documents concatenated with one [SEP] between them, cut into rows;
        False: every row holds tokens of one document.
      truncate: with cross_document=False only: keep just the first row of each document.
      cls_id, sep_id, pad_id: ids of [CLS], [SEP], [PAD].

    Returns:
      dict(ids=int32 [N, max_len], attention_mask=int32 [N, max_len] (1 = not padding),
      document_ids=int32 [N, max_len]: index into `lengths` of the document of each content
      token, -1 on [CLS], [SEP] and padding). N = 0 when there are no tokens.
    """
    _check_count("max_len", max_len, 3)
    if truncate and cross_document:
        raise ValueError("truncate=True needs cross_document=False (it keeps the first row of "
                         "each document)")
    flat = np.asarray(flat, np.int32)
    lengths = np.asarray(lengths, np.int64)
    if lengths.ndim != 1 or flat.ndim != 1 or lengths.sum() != flat.size or np.any(lengths < 0):
        raise ValueError(f"lengths (sum {lengths.sum()}) must be non-negative and add up to "
                         f"the {flat.size} tokens of flat")
    width = max_len - 2  # content tokens per row
    docs = np.flatnonzero(lengths > 0)
    doc_len = lengths[docs]
    doc_start = np.cumsum(lengths) - lengths
    if not cross_document:
        # The stream is `flat` itself; each row is a slice of one document.
        stream, stream_doc = flat, np.repeat(np.arange(lengths.size), lengths).astype(np.int32)
        rows_per_doc = np.ones_like(doc_len) if truncate else -(-doc_len // width)
        row_doc = np.repeat(np.arange(docs.size), rows_per_doc)
        within = np.arange(row_doc.size) - np.repeat(np.cumsum(rows_per_doc) - rows_per_doc,
                                                     rows_per_doc)
        starts = doc_start[docs][row_doc] + within * width
        row_lens = np.minimum(width, doc_len[row_doc] - within * width)
    else:
        # The stream: non-empty documents with one [SEP] (document id -1) between them.
        n = docs.size
        total = int(doc_len.sum()) + max(n - 1, 0)
        stream = np.full(total, sep_id, np.int32)
        stream_doc = np.full(total, -1, np.int32)
        # `flat` is the non-empty documents back to back; the token of the j-th of them moves
        # right by the j separators before it.
        pos = np.arange(flat.size) + np.repeat(np.arange(n), doc_len)
        stream[pos] = flat
        stream_doc[pos] = np.repeat(docs, doc_len)
        is_sep = (stream_doc < 0).tolist()
        starts, row_lens, c = [], [], 0
        while c < total:
            e = min(c + width, total)
            if is_sep[e - 1]:  # the row would end on a separator: the closing [SEP] is it
                starts.append(c)
                row_lens.append(e - 1 - c)
                c = e
            else:  # a separator right after the row is consumed by the closing [SEP]
                starts.append(c)
                row_lens.append(e - c)
                c = e + 1 if e < total and is_sep[e] else e
        starts, row_lens = np.asarray(starts, np.int64), np.asarray(row_lens, np.int64)
    num_rows = len(starts)
    ids = np.full((num_rows, max_len), pad_id, np.int32)
    document_ids = np.full((num_rows, max_len), -1, np.int32)
    cols = np.arange(width)
    for lo in range(0, num_rows, _FILL_CHUNK):
        hi = min(lo + _FILL_CHUNK, num_rows)
        valid = cols < row_lens[lo:hi, None]
        index = (starts[lo:hi, None] + cols)[valid]
        ids[lo:hi, 1:-1][valid] = stream[index]
        document_ids[lo:hi, 1:-1][valid] = stream_doc[index]
    rows = np.arange(num_rows)
    ids[:, 0] = cls_id
    ids[rows, np.asarray(row_lens, np.int64) + 1] = sep_id
    return dict(ids=ids, attention_mask=(ids != pad_id).astype(np.int32),
                document_ids=document_ids)


def load_mlm(*, source="embedded", data_dir="", max_len=MAX_LEN, cross_document=True,
             truncate=False, vocab_file="", vocab_size=8192, lowercase=True, min_frequency=2,
             tokenizer_documents=100_000, seed=0, num_train=20000, num_val=1000, num_test=0,
             val_fraction=0.05, test_fraction=0.0, doc_boundary="line", tfds_name="c4/en",
             min_chars=1000, max_chars=3000, cache_dir="~/.cache/lion_jax/mlm"):
    """MLM rows of every split of a source, built on first use and cached (module docstring).

    Args:
      source: "embedded" (default), "files" or "tfds".
      data_dir: files: a text file or a directory of them; tfds: tfds' data directory
        ("" = its default); unused by embedded.
      max_len: row length ([CLS] and [SEP] included), >= 3; M2 trains with 128.
      cross_document: rows may span documents ([SEP] between them); False: never.
      truncate: with cross_document=False, only each document's first row (M2's recipe).
      vocab_file, vocab_size, lowercase, min_frequency, tokenizer_documents: the tokenizer
        (`load_tokenizer`).
      seed: embedded: the corpus seed; files: the seed of the split draw.
      num_train, num_val, num_test: documents per split (embedded, tfds).
      val_fraction, test_fraction: expected fraction of documents per split (files).
      doc_boundary: files: "line" (a .txt line is a document) or "file" (a .txt file is one).
      tfds_name: tfds dataset (tfds).
      min_chars, max_chars: document lengths (embedded).
      cache_dir: directory of the vocabulary, token and row caches.

    Returns:
      (splits, info):
        splits: {split: dict(ids=int32 [N, max_len], attention_mask=int32 [N, max_len],
          document_ids=int32 [N, max_len])} for "train", "val" and "test" when it has
          documents (conventions of `pack_documents`);
        info: dict(vocab_size, pad_id, unk_id, cls_id, sep_id, mask_id (ints), special_ids
          (tuple of ints), vocab_file (str), lowercase (bool), max_len (int),
          num_documents={split: int}, num_tokens={split: int} (without specials)).

    Raises:
      FileNotFoundError: data or vocab file missing (one line saying how to get it).
      ValueError: bad settings, or a split without documents.
    """
    _check_count("max_len", max_len, 3)
    if truncate and cross_document:
        raise ValueError("truncate=True needs cross_document=False (it keeps the first row of "
                         "each document)")
    source_kwargs = dict(source=source, data_dir=data_dir, seed=seed, num_train=num_train,
                         num_val=num_val, num_test=num_test, val_fraction=val_fraction,
                         test_fraction=test_fraction, doc_boundary=doc_boundary,
                         tfds_name=tfds_name, min_chars=min_chars, max_chars=max_chars)
    spec = _source_spec(**source_kwargs)
    tokenizer = load_tokenizer(vocab_file=vocab_file, vocab_size=vocab_size,
                               lowercase=lowercase, min_frequency=min_frequency,
                               tokenizer_documents=tokenizer_documents, cache_dir=cache_dir,
                               **source_kwargs)
    splits = _splits_of(spec)
    token_key = dict(source=_identity(spec), vocab=tokenizer.vocab_hash,
                     lowercase=tokenizer.lowercase, version=_VERSION)
    small = tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1

    def build_tokens():
        out = {}
        for split in splits:
            flat, lengths = _tokenize_split(tokenizer, _documents(spec, split))
            if not np.any(lengths):
                raise ValueError(f"the {split} split of source {source!r} has no documents "
                                 f"with tokens (settings {_identity(spec)})")
            out[f"{split}_flat"] = flat.astype(np.uint16 if small else np.int32)
            out[f"{split}_lengths"] = lengths
        return out

    def build_rows():
        tokens = common.cached(cache_dir, "mlm_tokens", token_key, build_tokens)
        out = {}
        for split in splits:
            rows = pack_documents(tokens[f"{split}_flat"], tokens[f"{split}_lengths"], max_len,
                                  cross_document=cross_document, truncate=truncate,
                                  cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id,
                                  pad_id=tokenizer.pad_id)
            out[f"{split}_ids"], out[f"{split}_document_ids"] = rows["ids"], rows["document_ids"]
            out[f"{split}_num_documents"] = np.int64(np.count_nonzero(
                tokens[f"{split}_lengths"]))
            out[f"{split}_num_tokens"] = np.int64(tokens[f"{split}_lengths"].sum())
        return out

    row_key = dict(token_key, max_len=int(max_len), cross_document=bool(cross_document),
                   truncate=bool(truncate))
    arrays = common.cached(cache_dir, "mlm", row_key, build_rows)
    result = {}
    for split in splits:
        ids = arrays[f"{split}_ids"]
        result[split] = dict(ids=ids, attention_mask=(ids != tokenizer.pad_id).astype(np.int32),
                             document_ids=arrays[f"{split}_document_ids"])
    info = dict(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                unk_id=tokenizer.unk_id, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id,
                mask_id=tokenizer.mask_id, special_ids=tokenizer.special_ids,
                vocab_file=tokenizer.vocab_file, lowercase=tokenizer.lowercase,
                max_len=int(max_len),
                num_documents={s: int(arrays[f"{s}_num_documents"]) for s in splits},
                num_tokens={s: int(arrays[f"{s}_num_tokens"]) for s in splits})
    return result, info


# --------------------------------------------------------------------------------------------
# Dynamic masking
# --------------------------------------------------------------------------------------------


def _special_table(vocab_size, special_ids):
    """bool [vocab_size]: True at special ids; and int32 [V'] the non-special ids."""
    if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    table = np.zeros(int(vocab_size), bool)
    special = np.asarray(list(special_ids), np.int64)
    if special.size and (special.min() < 0 or special.max() >= vocab_size):
        raise ValueError(f"special_ids must be in [0, {vocab_size}), got {special_ids}")
    table[special] = True
    candidates = np.flatnonzero(~table).astype(np.int32)
    if candidates.size == 0:
        raise ValueError("every id is special: no token to mask or to draw")
    return table, candidates


def mask_tokens(ids, key, *, mask_prob, mask_id, vocab_size, special_ids, mask_frac=0.8,
                random_frac=0.1):
    """BERT's masking of a batch, in JAX (pure; jit-able; on device).

    Each maskable position (an id in [0, vocab_size) not in `special_ids`: never [PAD], [CLS],
    [SEP], [MASK], [UNK]) is selected independently with probability `mask_prob`; a selected
    position gets `mask_id` with probability `mask_frac`, a uniformly drawn non-special id with
    probability `random_frac` (possibly its own id), and keeps its id otherwise.

    Args:
      ids: int [..., L] token ids (e.g. [B, L]).
      key: a JAX PRNG key; the result is a deterministic function of (ids, key, settings).
      mask_prob: selection probability (float, may be traced): TRAIN_MASK_PROB (0.3) in
        training, EVAL_MASK_PROB (0.15) in evaluation.
      mask_id: id of [MASK].
      vocab_size, special_ids: static: the vocabulary size and its special ids (a tokenizer's
        `special_ids`, or `info["special_ids"]` of `load_mlm`).
      mask_frac, random_frac: the 80/10/10 split (floats).

    Returns:
      (inputs, targets, weights): inputs int32 [..., L] (ids after masking), targets int32
      [..., L] (= ids), weights float32 [..., L] (1.0 at selected positions, else 0). The MLM
      loss is `sum(weights * xent(logits, targets)) / sum(weights)`, accuracy likewise.
    """
    import jax
    import jax.numpy as jnp

    table, candidates = _special_table(vocab_size, special_ids)
    ids = jnp.asarray(ids).astype(jnp.int32)
    in_range = (ids >= 0) & (ids < vocab_size)
    maskable = in_range & ~jnp.asarray(table)[jnp.clip(ids, 0, vocab_size - 1)]
    k_select, k_kind, k_token = jax.random.split(key, 3)
    selected = maskable & (jax.random.uniform(k_select, ids.shape) < mask_prob)
    kind = jax.random.uniform(k_kind, ids.shape)
    drawn = jnp.asarray(candidates)[
        jax.random.randint(k_token, ids.shape, 0, candidates.size)]
    inputs = jnp.where(selected & (kind < mask_frac), jnp.int32(mask_id),
                       jnp.where(selected & (kind < mask_frac + random_frac), drawn, ids))
    return inputs, ids, selected.astype(jnp.float32)


def mask_tokens_np(ids, rng, *, mask_prob, mask_id, vocab_size, special_ids, mask_frac=0.8,
                   random_frac=0.1):
    """The numpy twin of `mask_tokens` (same rule and outputs, numpy's random stream).

    Args:
      ids: int [..., L] token ids.
      rng: a `numpy.random.Generator`.
      (the rest as `mask_tokens`)

    Returns:
      (inputs int32 [..., L], targets int32 [..., L], weights float32 [..., L]).
    """
    table, candidates = _special_table(vocab_size, special_ids)
    ids = np.asarray(ids).astype(np.int32)
    in_range = (ids >= 0) & (ids < vocab_size)
    maskable = in_range & ~table[np.clip(ids, 0, vocab_size - 1)]
    selected = maskable & (rng.random(ids.shape) < mask_prob)
    kind = rng.random(ids.shape)
    drawn = candidates[rng.integers(0, candidates.size, ids.shape)]
    inputs = np.where(selected & (kind < mask_frac), np.int32(mask_id),
                      np.where(selected & (kind < mask_frac + random_frac), drawn, ids))
    return inputs.astype(np.int32), ids, selected.astype(np.float32)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build (and cache) MLM rows; print statistics.")
    parser.add_argument("--cache_dir", default="~/.cache/lion_jax/mlm")
    parser.add_argument("--source", default="embedded", choices=SOURCES)
    parser.add_argument("--data_dir", default="")
    parser.add_argument("--vocab_file", default="")
    parser.add_argument("--max_len", type=int, default=MAX_LEN)
    parser.add_argument("--no_cross_document", action="store_true")
    parser.add_argument("--num_train", type=int, default=20000)
    parser.add_argument("--num_val", type=int, default=1000)
    args = parser.parse_args(argv)
    splits, info = load_mlm(source=args.source, data_dir=args.data_dir,
                            vocab_file=args.vocab_file, max_len=args.max_len,
                            cross_document=not args.no_cross_document,
                            num_train=args.num_train, num_val=args.num_val,
                            cache_dir=args.cache_dir)
    print(f"vocabulary: {info['vocab_size']} entries ({info['vocab_file']})")
    for split, arrays in splits.items():
        ids = arrays["ids"]
        print(f"{split}: {info['num_documents'][split]} documents, {info['num_tokens'][split]} "
              f"tokens, {ids.shape[0]} rows of {ids.shape[1]}; padding "
              f"{1 - arrays['attention_mask'].mean():.3f}")
    tokenizer = WordPieceTokenizer(info["vocab_file"], lowercase=info["lowercase"])
    print("val row 0:", tokenizer.decode(splits["val"]["ids"][0], skip_special=False)[:400])


if __name__ == "__main__":
    main()
