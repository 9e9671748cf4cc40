"""Causal language-modelling data: documents, a byte-level BPE tokenizer, packed rows.

Sources (`source=`; nothing is ever downloaded here). The embedded and files sources are
`experiments/data/mlm.py`'s, read through its helpers, with the same settings and split rules:

* `"embedded"` (default): the generated corpus of `experiments/data/mlm_corpus.py` (English-like
  documents with long-range structure; no download). Test is documents `[0, num_test)`, val
  the next `num_val`, train the next `num_train`; `min_chars`, `max_chars` set their lengths.
* `"files"`: the user's text, `data_dir` a file or a directory searched for `*.txt`, `*.jsonl`,
  `*.json` (optionally `.gz`; JSON lines carry a `"text"` field, as C4's json.gz shards);
  `.txt` documents are lines (`doc_boundary="line"`) or whole files (`"file"`); each document
  goes to test / val / train by a hash of `(seed, its index)` against `test_fraction`,
  `val_fraction`.
* `"tfds"`: tensorflow-datasets' `tfds_name`, already prepared under `data_dir` ("" = tfds'
  default), one of :data:`TFDS_SPLITS`' families (`lm1b`, `c4/en`, `wiki40b/en`, or another
  config / version of them such as `wiki40b/de` or `c4/en:3.1.0`). Train is
  `train[:num_train]`; val and test are the first `num_val` and the next `num_test` examples
  of the held-out split (lm1b: `test`; C4: `validation`), or for wiki40b `validation[:num_val]`
  and `test[:num_test]`. Each example's `text` is one document, as is (lm1b: one sentence;
  wiki40b keeps its `_START_ARTICLE_` / `_START_PARAGRAPH_` / `_NEWLINE_` markers).

A missing dataset raises `FileNotFoundError` with one line saying what to build or download
and which `config.data` key points to it.

Tokenizer (`BpeTokenizer`): a `tokenizers` JSON file, used as is (`tokenizer_file=`, e.g. a
Hugging Face `tokenizer.json`), or a byte-level BPE (GPT-2 style: the 256 byte symbols, no
normaliser, no unknown token, so `decode(encode(text)) == text` for any text) of `vocab_size`
entries trained with `tokenizers` on the first `tokenizer_documents` train documents and cached
as `<cache_dir>/lm_tokenizer_<hash>.json` (the hash covers the source, the training settings
and the `tokenizers` version). The end-of-document token `eod_token` (default
`"<|endoftext|>"`, id 0 in a trained tokenizer) must be in a given file. Special tokens are
not matched inside text (`encode_special_tokens`): a document that contains the string
`<|endoftext|>` is encoded as ordinary bytes, so the only end-of-document ids are the packer's.

Rows (`pack_documents`): each split's documents, in order, form one stream
`EOD doc_0 EOD doc_1 EOD ... doc_n EOD` (every document is preceded and followed by the
end-of-document token; empty documents are skipped), cut into rows of `max_len + 1` tokens
that overlap by one: row `k` is `stream[k*max_len : k*max_len + max_len + 1]`, its inputs
`row[:-1]` and its targets `row[1:]`. So every token of the stream after the first is a target
exactly once (the last target of row `k` is the first input of row `k + 1`), and a document's
first token is predicted from the end-of-document token, as a prompt is at generation time.
The tail that does not fill a row (fewer than `max_len` tokens) is dropped (`info["dropped"]`).
Packing is deterministic (no randomness; the trainer's iterator shuffles training rows).

Caches (under `cache_dir`, written with `common.cached`, atomic): the tokenizer, and the token
ids of every split per (source, tokenizer) in `lm_tokens_<hash>.npz`; rows are re-packed from
them on each load (a reshape, fast), so another `max_len` does not re-tokenise. Token ids are
kept as uint16 when the vocabulary fits (2 bytes a token) and cast to int32 per batch.
"""

import hashlib
import json
import os

import numpy as np

from experiments.data import common, mlm

EOD_TOKEN = "<|endoftext|>"  # GPT-2's end-of-document token
SOURCES = mlm.SOURCES
MAX_LEN = 2048
NUM_BYTES = 256  # the byte-level alphabet

# tfds dataset family -> (held-out split of val, split of test, test follows val in it).
TFDS_SPLITS = {"lm1b": ("test", "test"), "c4": ("validation", "validation"),
               "wiki40b": ("validation", "test")}

_VERSION = 1  # bump whenever tokenised arrays or the trained tokenizer change

TOKENIZER_HELP = ("pass --config.data.tokenizer_file=<a tokenizers JSON file, e.g. a Hugging "
                  "Face tokenizer.json> or leave it empty to train a byte-level BPE on the "
                  "corpus")


def tfds_help(name):
    """The one-line advice for a missing tfds dataset `name`."""
    return (f"prepare it with pip install -e '.[data]' and `tfds build {name} --data_dir=DIR` "
            f"(https://www.tensorflow.org/datasets/catalog/{_family(name)}) and pass "
            f"--config.data.data_dir=DIR (--config.data.tfds_name names the dataset: "
            f"{', '.join(('lm1b', 'c4/en', 'wiki40b/en'))}); or point "
            "--config.data.source=files --config.data.data_dir at text or json(.gz) files; or "
            "use the embedded corpus (--config.data.source=embedded, the default)")


def _family(name):
    return name.split(":")[0].split("/")[0]


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


class BpeTokenizer:
    """A `tokenizers` tokenizer from a JSON file, with an end-of-document token.

    Args:
      path: the tokenizer JSON (`Tokenizer.save` / Hugging Face `tokenizer.json`).
      eod_token: the end-of-document token; must be in the file's vocabulary.

    Attributes:
      path; eod_token; eod_id (int); vocab_size (int: the largest id + 1, the model's
      vocabulary at least); tokenizer_hash (str: sha256 of the file).

    Raises:
      FileNotFoundError: no such file.
      ValueError: not a tokenizers JSON file, or no `eod_token` in it.
    """

    def __init__(self, path, *, eod_token=EOD_TOKEN):
        from tokenizers import Tokenizer

        path = os.path.abspath(os.path.expanduser(path))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer file {path} not found: {TOKENIZER_HELP}")
        with open(path, "rb") as f:
            data = f.read()
        try:
            tok = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(f"{path} is not a tokenizers JSON file ({reason}): "
                             f"{TOKENIZER_HELP}") from None
        eod_id = tok.token_to_id(eod_token)
        if eod_id is None:
            raise ValueError(f"{path} has no end-of-document token {eod_token!r}: pass "
                             "--config.data.eod_token=<its end-of-document token, e.g. '</s>'>")
        tok.encode_special_tokens = True  # specials in the text stay text
        self.path = path
        self.eod_token = eod_token
        self.eod_id = int(eod_id)
        self.vocab_size = max(tok.get_vocab(with_added_tokens=True).values()) + 1
        self.tokenizer_hash = hashlib.sha256(data).hexdigest()
        self._tok = tok

    def __repr__(self):
        return f"BpeTokenizer({self.path!r}, vocab_size={self.vocab_size})"

    def encode(self, text):
        """str -> list of int ids (no special tokens added)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts):
        """list of str -> list of lists of int ids (as `encode`; in parallel)."""
        return [e.ids for e in self._tok.encode_batch_fast(list(texts),
                                                           add_special_tokens=False)]

    def decode(self, ids, *, skip_special=True):
        """Ids (any int sequence or array) -> str; special tokens (the end-of-document token)
        dropped unless `skip_special` is False."""
        ids = [int(i) for i in np.asarray(ids).ravel()]
        return self._tok.decode(ids, skip_special_tokens=skip_special)


def train_tokenizer(texts, path, *, vocab_size=8192, min_frequency=2, eod_token=EOD_TOKEN):
    """Trains a byte-level BPE with the `tokenizers` library and writes it (atomically).

    Args:
      texts: iterable of str (documents), read once.
      path: the tokenizer JSON to write.
      vocab_size: entries at most: the end-of-document token (id 0), the 256 bytes and the
        merges (fewer when the text has fewer pairs of `min_frequency`).
      min_frequency: a merge must occur at least this often.
      eod_token: the end-of-document token.

    Returns:
      The `BpeTokenizer` of the written file.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    mlm._check_count("vocab_size", vocab_size, NUM_BYTES + 2)
    mlm._check_count("min_frequency", min_frequency, 0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size), min_frequency=int(min_frequency),
        special_tokens=[eod_token], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(texts, trainer)
    mlm._write_text_atomic(path, tok.to_str())
    return BpeTokenizer(path, eod_token=eod_token)


def _source_spec(tfds_name="lm1b", **source):
    """mlm's checked source spec, with the tfds name checked against :data:`TFDS_SPLITS`."""
    if source.get("source") == "tfds" and (not isinstance(tfds_name, str)
                                           or _family(tfds_name) not in TFDS_SPLITS):
        raise ValueError(f"tfds_name must be lm1b, c4/... or wiki40b/... (e.g. 'lm1b', "
                         f"'c4/en', 'wiki40b/en'), got {tfds_name!r}")
    return mlm._source_spec(tfds_name=tfds_name, **source)


def _documents(spec, split):
    """Yields the documents (str) of `split` of a source spec, in order (mlm's reader, with
    this dataset's tfds splits and advice)."""
    if spec["source"] != "tfds":
        return mlm._documents(spec, split)
    name = spec["name"]
    return mlm._documents(spec, split, tfds_splits=TFDS_SPLITS[_family(name)],
                          tfds_help=tfds_help(name))


def iter_documents(split, **source):
    """Yields the documents of one split of a source, in order (module docstring).

    Args:
      split: "train", "val" or "test" (test only when the source has one).
      **source: the source settings of `load_lm` (source, data_dir, seed, num_train, num_val,
        num_test, val_fraction, test_fraction, doc_boundary, tfds_name, min_chars, max_chars).

    Raises:
      FileNotFoundError: the data is missing (one line saying how to get it).
      ValueError: bad settings or split.
    """
    return _documents(_source_spec(**source), split)


def load_tokenizer(*, tokenizer_file="", eod_token=EOD_TOKEN, vocab_size=8192, min_frequency=2,
                   tokenizer_documents=20_000, cache_dir="~/.cache/lion_jax/lm", **source):
    """The tokenizer of a source: the user's `tokenizer_file`, or a byte-level BPE trained on
    the source's first `tokenizer_documents` train documents (cached under `cache_dir`).

    `**source`: the source settings of `load_lm`. Raises FileNotFoundError (missing file or
    data, one line) or ValueError (bad settings or file).
    """
    if tokenizer_file:
        return BpeTokenizer(tokenizer_file, eod_token=eod_token)
    from tokenizers import __version__ as tokenizers_version

    mlm._check_count("tokenizer_documents", tokenizer_documents, 1)
    mlm._check_count("vocab_size", vocab_size, NUM_BYTES + 2)
    mlm._check_count("min_frequency", min_frequency, 0)
    if not isinstance(eod_token, str) or not eod_token:
        raise ValueError(f"eod_token must be a non-empty string, got {eod_token!r}")
    spec = _source_spec(**source)
    key = dict(source=mlm._identity(spec), vocab_size=int(vocab_size),
               min_frequency=int(min_frequency), documents=int(tokenizer_documents),
               eod_token=eod_token, tokenizers=tokenizers_version, version=_VERSION)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = os.path.join(os.path.expanduser(cache_dir), f"lm_tokenizer_{digest}.json")
    if os.path.exists(path):
        return BpeTokenizer(path, eod_token=eod_token)
    texts = mlm.training_texts(_documents(spec, "train"), tokenizer_documents, spec["source"])
    print(f"Training a byte-level BPE ({vocab_size} entries) on the first "
          f"{tokenizer_documents} train documents of {spec['source']} into {path} ...",
          flush=True)
    tokenizer = train_tokenizer(texts, path, vocab_size=vocab_size,
                                min_frequency=min_frequency, eod_token=eod_token)
    print(f"Trained a tokenizer of {tokenizer.vocab_size} entries", flush=True)
    return tokenizer


def tokenizer_of(data_config):
    """The tokenizer a run with data settings `data_config` (`config.data`, a dict or
    ConfigDict of `load_lm`'s arguments plus `name`) trained with: its file, or the cached
    trained one (trained again, identically, when the cache is gone)."""
    kwargs = data_config.to_dict() if hasattr(data_config, "to_dict") else dict(data_config)
    kwargs.pop("name", None)
    kwargs.pop("max_len", None)
    for key in ("data_dir", "cache_dir"):
        if kwargs.get(key):
            kwargs[key] = os.path.expanduser(kwargs[key])
    return load_tokenizer(**kwargs)


# --------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------


def pack_documents(flat, lengths, max_len, *, eod_id, dtype=np.int32):
    """Packs tokenised documents into overlapping rows of `max_len + 1` (module docstring).

    Args:
      flat: int [T] the documents' token ids, concatenated.
      lengths: int [D] tokens per document (sum T); empty documents are skipped.
      max_len: inputs per row (the context), >= 1.
      eod_id: the end-of-document id.
      dtype: dtype of the rows.

    Returns:
      (rows [N, max_len + 1] of `dtype`, dropped): row `k` is `stream[k * max_len : k * max_len
      + max_len + 1]` of the stream `EOD doc EOD doc ... EOD`; `dropped` is the number of
      stream tokens after the last row's last one (never a target). N = 0 when the stream has
      no more than `max_len` tokens.
    """
    mlm._check_count("max_len", max_len, 1)
    flat = np.asarray(flat)
    lengths = np.asarray(lengths, np.int64)
    if lengths.ndim != 1 or flat.ndim != 1 or lengths.sum() != flat.size or np.any(lengths < 0):
        raise ValueError(f"lengths (sum {lengths.sum()}) must be non-negative and add up to "
                         f"the {flat.size} tokens of flat")
    doc_len = lengths[lengths > 0]
    total = 1 + int(doc_len.sum()) + doc_len.size
    stream = np.full(total, eod_id, dtype)
    # The j-th non-empty document's tokens move right by the j + 1 separators before them.
    stream[np.arange(flat.size) + 1 + np.repeat(np.arange(doc_len.size), doc_len)] = flat
    num_rows = (total - 1) // max_len
    if num_rows == 0:
        return np.zeros((0, max_len + 1), dtype), total
    windows = np.lib.stride_tricks.sliding_window_view(stream, max_len + 1)
    rows = np.ascontiguousarray(windows[::max_len][:num_rows])
    return rows, total - 1 - num_rows * max_len


def load_lm(*, source="embedded", data_dir="", max_len=MAX_LEN, tokenizer_file="",
            eod_token=EOD_TOKEN, vocab_size=8192, min_frequency=2, tokenizer_documents=20_000,
            seed=0, num_train=20_000, num_val=1000, num_test=0, val_fraction=0.05,
            test_fraction=0.0, doc_boundary="line", tfds_name="lm1b", min_chars=1000,
            max_chars=3000, cache_dir="~/.cache/lion_jax/lm"):
    """Causal-LM rows of every split of a source, tokenised on first use and cached.

    Args:
      source: "embedded" (default), "files" or "tfds".
      data_dir: files: a text file or a directory of them; tfds: tfds' data directory.
      max_len: tokens per row (the training context), >= 1.
      tokenizer_file, eod_token, vocab_size, min_frequency, tokenizer_documents: the
        tokenizer (`load_tokenizer`).
      seed, num_train, num_val, num_test, val_fraction, test_fraction, doc_boundary, tfds_name,
        min_chars, max_chars: the source (module docstring; mlm.py's meanings).
      cache_dir: directory of the tokenizer and token caches.

    Returns:
      (splits, info):
        splits: {split: dict(tokens=[N, max_len], targets=[N, max_len])} for "train", "val"
          and "test" when it has documents; uint16 when the vocabulary fits, else int32;
          `targets[k] = tokens[k]` shifted left by one (views of one array of rows).
        info: dict(vocab_size, eod_id (ints), eod_token, tokenizer_file (str: the file used),
          max_len (int), num_documents, num_tokens (document tokens, no EOD), num_rows,
          dropped ({split: int} each)).

    Raises:
      FileNotFoundError: data or tokenizer file missing (one line saying how to get it).
      ValueError: bad settings, or a split too small for one row.
    """
    mlm._check_count("max_len", max_len, 1)
    source_kwargs = dict(source=source, data_dir=data_dir, seed=seed, num_train=num_train,
                         num_val=num_val, num_test=num_test, val_fraction=val_fraction,
                         test_fraction=test_fraction, doc_boundary=doc_boundary,
                         tfds_name=tfds_name, min_chars=min_chars, max_chars=max_chars)
    spec = _source_spec(**source_kwargs)
    tokenizer = load_tokenizer(tokenizer_file=tokenizer_file, eod_token=eod_token,
                               vocab_size=vocab_size, min_frequency=min_frequency,
                               tokenizer_documents=tokenizer_documents, cache_dir=cache_dir,
                               **source_kwargs)
    splits = mlm._splits_of(spec)
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32

    def build_tokens():
        out = {}
        for split in splits:
            flat, lengths = mlm._tokenize_split(tokenizer, _documents(spec, split))
            if not np.any(lengths):
                raise ValueError(f"the {split} split of source {source!r} has no documents "
                                 f"with tokens (settings {mlm._identity(spec)})")
            out[f"{split}_flat"], out[f"{split}_lengths"] = flat.astype(dtype), lengths
        return out

    token_key = dict(source=mlm._identity(spec), tokenizer=tokenizer.tokenizer_hash,
                     eod_token=tokenizer.eod_token, version=_VERSION)
    tokens = common.cached(cache_dir, "lm_tokens", token_key, build_tokens)
    result, info = {}, dict(vocab_size=tokenizer.vocab_size, eod_id=tokenizer.eod_id,
                            eod_token=tokenizer.eod_token, tokenizer_file=tokenizer.path,
                            max_len=int(max_len), num_documents={}, num_tokens={},
                            num_rows={}, dropped={})
    for split in splits:
        lengths = tokens[f"{split}_lengths"]
        rows, dropped = pack_documents(tokens[f"{split}_flat"], lengths, max_len,
                                       eod_id=tokenizer.eod_id, dtype=dtype)
        if rows.shape[0] == 0:
            where = (f"config.data.num_{split}" if source != "files" else
                     {"train": "more text in config.data.data_dir",
                      "val": "config.data.val_fraction",
                      "test": "config.data.test_fraction"}[split])
            raise ValueError(f"the {split} split has {int(lengths.sum())} tokens, fewer than "
                             f"one row of max_len + 1 = {max_len + 1}: give it more documents "
                             f"({where}) or lower config.data.max_len")
        result[split] = dict(tokens=rows[:, :-1], targets=rows[:, 1:])
        info["num_documents"][split] = int(np.count_nonzero(lengths))
        info["num_tokens"][split] = int(lengths.sum())
        info["num_rows"][split] = int(rows.shape[0])
        info["dropped"][split] = int(dropped)
    return result, info
