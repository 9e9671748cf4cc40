"""MLM data (experiments/data/mlm.py, mlm_corpus.py): the embedded corpus, the WordPiece
tokenizer, the three sources (text files written to tmp_path; the tensorflow-datasets path
against a fake `tensorflow_datasets` module, no TensorFlow needed), packing and masking."""

import gzip
import json
import os
import re
import sys
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments import tasks
from experiments.data import mlm, mlm_corpus
from experiments.errors import UserError

SPECIALS = dict(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)


def _assert_one_line(error, *parts):
    message = str(error.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)


# --------------------------------------------------------------------------------------------
# Embedded corpus
# --------------------------------------------------------------------------------------------


def test_corpus_deterministic_per_seed_and_index(rng, tmp_path):
    seed, start = int(rng.integers(0, 2**31)), int(rng.integers(0, 10**6))
    texts = list(mlm_corpus.iter_documents(6, seed=seed, start=start))
    again = [mlm_corpus.generate_document(i, seed=seed).text
             for i in reversed(range(start, start + 6))][::-1]  # any order, one at a time
    assert texts == again
    assert len(set(texts)) == 6 and all("\n" not in t for t in texts)
    other = list(mlm_corpus.iter_documents(6, seed=seed + 1, start=start))
    assert not set(other) & set(texts)
    path = mlm_corpus.write_corpus(str(tmp_path / "c" / "corpus.txt"), 6, seed=seed,
                                   start=start)
    with open(path, encoding="utf-8") as f:
        assert f.read() == "".join(t + "\n" for t in texts)
    read = [d for s in ("train", "val") for d in mlm.iter_documents(
        s, source="files", data_dir=path, val_fraction=0.5)]  # the file is a corpus
    assert sorted(read) == sorted(texts)
    with pytest.raises(ValueError, match="min_chars"):
        mlm_corpus.generate_document(0, min_chars=10, max_chars=5)


def _sentences(text):
    return [s for s in re.split(r"(?<=\.) ", text) if s]


def test_corpus_long_range_structure(rng):
    seed = int(rng.integers(0, 2**31))
    lengths = []
    for index in rng.integers(0, 10**6, size=25).tolist():
        doc = mlm_corpus.generate_document(index, seed=seed)
        text = doc.text
        lengths.append(len(text))
        head, tail = text[:doc.body_start], text[doc.closing_start:]
        assert text == " ".join([head[:-1], text[doc.body_start:doc.closing_start - 1], tail]) \
            or doc.body_start == doc.closing_start
        body_length = doc.closing_start - doc.body_start
        if len(text) > 2000:
            assert body_length > len(text) / 4
        # Every person, home town, pet and fact is introduced in the opening and restated in
        # the closing, the whole body apart.
        for p in doc.people:
            for word in (p.first, p.family, p.home, p.pet, str(p.age)):
                assert word in head and word in tail, (word, text)
                assert text.rfind(word) - text.find(word) >= body_length
            assert f"{p.first} {p.family} is {'an' if p.profession[0] in 'aeiou' else 'a'} " \
                   f"{p.profession} from {p.home}." in head
        for key, value in doc.facts.items():
            assert f"{key} " in head.lower() and f"{key} " in tail.lower()
            assert value in head and value in tail
            assert text.rfind(value) - text.find(value) >= body_length
        # Names are new in every document (made up, not from a list).
        assert len({p.first for p in doc.people}) == len(doc.people)
        # Visit ordinals count over the whole document; the closing's totals match.
        counts = {}
        sentences = _sentences(text)
        for s, nxt in zip(sentences, sentences[1:]):
            m = re.search(r", (\w+) went to the ([a-z ]+)\.$", s)
            if m:
                key = (m[1], m[2])
                counts[key] = counts.get(key, 0) + 1
                ordinal = mlm_corpus._ORDINALS[counts[key] - 1]
                assert re.fullmatch(rf"It was (his|her) {ordinal} visit to the {m[2]}\.", nxt)
        assert counts == doc.visits
        for (first, place), n in doc.visits.items():
            assert f"the {place} {mlm_corpus._times(n)}" in tail
        # The inventory's total is the sum of its shelves; removals keep the running count.
        total = sum(n for _, n in doc.shelves)
        assert f"Altogether the shelves hold {mlm_corpus._number(total)} things." in head
        left = {i: n for i, (_, n) in enumerate(doc.shelves)}
        for s in sentences:
            m = re.search(r"took (\S+) \S+ from the (\w+) shelf, so (\S+) ", s)
            if m:
                i = mlm_corpus._ORDINALS.index(m[2])
                left[i] -= mlm_corpus._NUMBERS.index(m[1])
                assert m[3] == ("no" if left[i] == 0 else mlm_corpus._number(left[i]))
        # The topic's own sentences only: ambient text comes from one lexicon.
        topic = next(t for t in mlm_corpus._TOPICS if t.name == doc.topic)
        others = {a for t in mlm_corpus._TOPICS if t is not topic for a in t.ambient}
        assert not any(a in text for a in others - set(topic.ambient))
    assert 900 < min(lengths) and max(lengths) < 4500


def test_corpus_is_fast():
    import time
    start = time.perf_counter()
    chars = sum(map(len, mlm_corpus.iter_documents(1000)))
    assert time.perf_counter() - start < 10  # about 0.15 s; 20k documents in a few seconds
    assert 1000 * 1500 < chars < 1000 * 3000


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A WordPiece vocabulary trained on 200 embedded documents."""
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    return mlm.train_tokenizer(mlm_corpus.iter_documents(200, seed=7), str(path),
                               vocab_size=1500)


def test_tokenizer_round_trip_on_embedded_corpus(tokenizer, rng):
    assert tokenizer.vocab[:5] == mlm.SPECIAL_TOKENS
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
            tokenizer.mask_id) == (0, 1, 2, 3, 4)
    assert tokenizer.special_ids == (0, 1, 2, 3, 4)
    assert tokenizer.vocab_size == 1500
    texts = list(mlm_corpus.iter_documents(20, seed=int(rng.integers(0, 2**31))))
    batch = tokenizer.encode_batch(texts)
    for text, ids in zip(texts, batch):
        assert ids == tokenizer.encode(text)
        assert ids and tokenizer.unk_id not in ids and min(ids) >= 5
        normal = tokenizer.normalize(text)
        assert normal == normal.lower() and "  " not in normal
        assert tokenizer.decode(ids) == normal
        assert normal.replace(" ", "") == text.lower().replace(" ", "")
    assert tokenizer.normalize("Ann's pier, (north).") == "ann ' s pier , ( north ) ."
    # Special tokens are not matched inside text.
    assert not set(tokenizer.encode("the [MASK] and [SEP] [PAD]")) & {0, 2, 3, 4}


def test_tokenizer_cased_and_unknown(tmp_path):
    texts = ["The Pier of Holm.", "the pier of holm."] * 20
    cased = mlm.train_tokenizer(texts, str(tmp_path / "cased.txt"), vocab_size=200,
                                lowercase=False)
    assert cased.normalize("The Pier") == "The Pier"
    assert cased.decode(cased.encode("The Pier of holm")) == "The Pier of holm"
    ids = cased.encode("Zebra ☃")
    assert cased.unk_id in ids


def test_vocab_file_is_loaded_as_given(tmp_path):
    words = ["the", "pier", "holm", "ann", ".", ",", "'"]
    letters = list("abcdefghijklmnopqrstuvwxyz")
    vocab = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *letters,
             *("##" + c for c in letters)]
    path = tmp_path / "vocab.txt"
    path.write_text("".join(v + "\n" for v in vocab))
    tok = mlm.WordPieceTokenizer(str(path))
    assert tok.vocab_size == len(vocab) and tok.vocab == tuple(vocab)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 2, 3, 4, 5)
    assert tok.special_ids == (0, 1, 2, 3, 4, 5)
    ids = tok.encode("The PIER, Ann's zoo.")
    assert ids[:3] == [vocab.index("the"), vocab.index("pier"), vocab.index(",")]
    assert tok.decode(ids) == "the pier , ann ' s zoo ."
    # A bad file is one line saying what is wrong.
    with pytest.raises(FileNotFoundError) as e:
        mlm.WordPieceTokenizer(str(tmp_path / "none.txt"))
    _assert_one_line(e, "none.txt", "--config.data.vocab_file")
    (tmp_path / "nomask.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(ValueError, match=r"lacks the special tokens \['\[MASK\]'\]"):
        mlm.WordPieceTokenizer(str(tmp_path / "nomask.txt"))
    (tmp_path / "pad.txt").write_text("[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    with pytest.raises(ValueError, match="line 0"):
        mlm.WordPieceTokenizer(str(tmp_path / "pad.txt"))
    # load_mlm with the user's vocab: no training, its ids.
    splits, info = mlm.load_mlm(vocab_file=str(path), num_train=3, num_val=2, max_len=32,
                                cache_dir=str(tmp_path / "cache"))
    assert info["vocab_file"] == str(path) and info["special_ids"] == (0, 1, 2, 3, 4, 5)
    assert (info["cls_id"], info["sep_id"], info["mask_id"]) == (3, 4, 5)
    assert not any(n.startswith("mlm_vocab") for n in os.listdir(tmp_path / "cache"))
    row = splits["val"]["ids"][0]
    assert row[0] == 3 and tok.decode(row).startswith("this is a story from")


def test_trained_vocabulary_is_cached(tmp_path, capsys):
    kwargs = dict(num_train=30, num_val=2, vocab_size=600, cache_dir=str(tmp_path))
    first = mlm.load_tokenizer(**kwargs)
    assert "Training a WordPiece vocabulary" in capsys.readouterr().out
    second = mlm.load_tokenizer(**kwargs)
    assert capsys.readouterr().out == ""
    assert second.vocab_file == first.vocab_file and second.vocab == first.vocab
    assert os.path.basename(first.vocab_file).startswith("mlm_vocab_")
    third = mlm.load_tokenizer(**dict(kwargs, vocab_size=700))  # other inputs, other file
    assert third.vocab_file != first.vocab_file


# --------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------


def _random_documents(rng, num_docs, width):
    """Token lists with lengths around `width` (some empty, some exactly width, some long)."""
    lengths = rng.integers(0, 3 * width, size=num_docs)
    lengths[rng.integers(0, num_docs, size=3)] = 0
    lengths[rng.integers(0, num_docs, size=3)] = width
    lengths[rng.integers(0, num_docs, size=3)] = 1
    return [rng.integers(5, 100, size=n).astype(np.int32) for n in lengths]


def _check_rows(rows, max_len):
    ids, mask, doc = rows["ids"], rows["attention_mask"], rows["document_ids"]
    assert ids.dtype == mask.dtype == doc.dtype == np.int32
    assert ids.shape == mask.shape == doc.shape and ids.shape[1] == max_len
    n = mask.sum(1)
    assert np.all(ids[:, 0] == 2) and np.all(ids[np.arange(len(ids)), n - 1] == 3)
    np.testing.assert_array_equal(mask, np.arange(max_len) < n[:, None])
    assert np.all(ids[mask == 0] == 0) and np.all(doc[mask == 0] == -1)
    assert np.all(doc[:, 0] == -1) and np.all(doc[np.arange(len(ids)), n - 1] == -1)
    np.testing.assert_array_equal(doc >= 0, ~np.isin(ids, (0, 2, 3)))  # content tokens
    return n


@pytest.mark.parametrize("truncate", [False, True])
def test_packing_never_crosses_documents(rng, truncate):
    max_len = int(rng.integers(3, 40))
    width = max_len - 2
    docs = _random_documents(rng, 60, width)
    lengths = np.array([len(d) for d in docs])
    rows = mlm.pack_documents(np.concatenate(docs), lengths, max_len, cross_document=False,
                              truncate=truncate)
    n = _check_rows(rows, max_len)
    ids, doc = rows["ids"], rows["document_ids"]
    for r in range(len(ids)):  # one document per row
        assert len(set(doc[r][doc[r] >= 0].tolist())) == 1
    row_doc = doc[:, 1]
    for d, tokens in enumerate(docs):
        mine = np.flatnonzero(row_doc == d)
        content = np.concatenate([ids[r, 1:n[r] - 1] for r in mine]) if mine.size else []
        expected = tokens[:width] if truncate else tokens
        np.testing.assert_array_equal(content, expected)
        if not truncate:
            assert mine.size == -(-len(tokens) // width)
    assert np.all(np.diff(row_doc) >= 0)


def test_packing_across_documents(rng):
    max_len = int(rng.integers(3, 40))
    width = max_len - 2
    docs = _random_documents(rng, 60, width)
    lengths = np.array([len(d) for d in docs])
    rows = mlm.pack_documents(np.concatenate(docs), lengths, max_len, cross_document=True)
    n = _check_rows(rows, max_len)
    ids, doc = rows["ids"], rows["document_ids"]
    # Content (separators dropped) is every token once, in order; document ids ascend.
    content = [ids[r, 1:n[r] - 1] for r in range(len(ids))]
    flat_content = np.concatenate(content)
    np.testing.assert_array_equal(flat_content[flat_content != 3], np.concatenate(docs))
    nonempty = [d for d, t in enumerate(docs) if len(t)]
    seen = doc[doc >= 0]
    assert np.all(np.diff(seen) >= 0) and sorted(set(seen.tolist())) == nonempty
    for r, c in enumerate(content):
        assert c[0] != 3 and c[-1] != 3  # never [CLS] [SEP] or [SEP] [SEP]
        d = doc[r, 1:n[r] - 1]
        seps = np.flatnonzero(c == 3)
        # exactly one [SEP] between two documents, each joining consecutive non-empty docs
        assert len(seps) == len(set(d[d >= 0].tolist())) - 1
        for s in seps:
            assert nonempty.index(d[s + 1]) == nonempty.index(d[s - 1]) + 1
    # Rows are full but the last (and those whose last column would have been a separator:
    # the closing [SEP] ends that document); every row takes >= width tokens of the stream.
    assert np.all(n[:-1] >= max_len - 1)
    assert len(ids) == -(-(lengths.sum() + len(nonempty) - 1) // width) or \
        len(ids) < -(-(lengths.sum() + len(nonempty) - 1) // width)


def test_packing_edge_cases():
    rows = mlm.pack_documents(np.zeros(0, np.int32), np.zeros(3, int), 8)
    assert rows["ids"].shape == (0, 8) and rows["ids"].dtype == np.int32
    rows = mlm.pack_documents(np.array([7, 8, 9, 10]), np.array([2, 2]), 4)
    np.testing.assert_array_equal(rows["ids"], [[2, 7, 8, 3], [2, 9, 10, 3]])
    rows = mlm.pack_documents(np.array([7, 8, 9]), np.array([1, 2]), 5)
    np.testing.assert_array_equal(rows["ids"], [[2, 7, 3, 8, 3], [2, 9, 3, 0, 0]])
    np.testing.assert_array_equal(rows["document_ids"], [[-1, 0, -1, 1, -1],
                                                         [-1, 1, -1, -1, -1]])
    with pytest.raises(ValueError, match="max_len"):
        mlm.pack_documents(np.array([7]), np.array([1]), 2)
    with pytest.raises(ValueError, match="truncate"):
        mlm.pack_documents(np.array([7]), np.array([1]), 4, cross_document=True, truncate=True)
    with pytest.raises(ValueError, match="add up"):
        mlm.pack_documents(np.array([7]), np.array([2]), 4)


# --------------------------------------------------------------------------------------------
# Sources and load_mlm
# --------------------------------------------------------------------------------------------


def test_load_mlm_embedded_shapes_and_caches(tmp_path, capsys):
    kwargs = dict(num_train=40, num_val=6, num_test=4, vocab_size=800, max_len=48,
                  cache_dir=str(tmp_path))
    splits, info = mlm.load_mlm(cross_document=False, **kwargs)
    out = capsys.readouterr().out
    assert "Building mlm_tokens" in out and "Training" in out
    assert set(splits) == {"train", "val", "test"}
    assert info["num_documents"] == {"train": 40, "val": 6, "test": 4}
    assert info["vocab_size"] == 800 and info["max_len"] == 48
    assert (info["pad_id"], info["cls_id"], info["sep_id"], info["mask_id"]) == (0, 2, 3, 4)
    for split, arrays in splits.items():
        ids, doc = arrays["ids"], arrays["document_ids"]
        _check_rows(arrays, 48)
        assert doc.max() == info["num_documents"][split] - 1
        for r in range(len(ids)):  # never across a document
            assert len(set(doc[r][doc[r] >= 0].tolist())) == 1
        assert (doc >= 0).sum() == info["num_tokens"][split]
    # Cached: nothing rebuilt; another max_len re-packs from the cached tokens.
    again, _ = mlm.load_mlm(cross_document=False, **kwargs)
    assert capsys.readouterr().out == ""
    np.testing.assert_array_equal(again["train"]["ids"], splits["train"]["ids"])
    longer, _ = mlm.load_mlm(cross_document=True, **dict(kwargs, max_len=96))
    out = capsys.readouterr().out
    assert "Building mlm (" in out and "mlm_tokens" not in out and "Training" not in out
    assert longer["val"]["ids"].shape[1] == 96
    assert (longer["val"]["document_ids"] >= 0).sum() == info["num_tokens"]["val"]
    assert any(len(set(r[r >= 0].tolist())) == 2 for r in longer["val"]["document_ids"])
    # No test split asked for: none returned.
    splits, _ = mlm.load_mlm(**dict(kwargs, num_test=0))
    assert set(splits) == {"train", "val"}


def test_embedded_splits_are_nested(rng):
    seed = int(rng.integers(0, 1000))
    a = dict(seed=seed, num_train=5, num_val=3, num_test=2)
    b = dict(a, num_train=9)
    for split in ("val", "test"):
        assert list(mlm.iter_documents(split, **a)) == list(mlm.iter_documents(split, **b))
    test, val = (list(mlm.iter_documents(s, **a)) for s in ("test", "val"))
    train = list(mlm.iter_documents("train", **a))
    assert test + val + train == list(mlm_corpus.iter_documents(10, seed=seed))
    assert list(mlm.iter_documents("train", **b))[:5] == train


def _write_files(root, rng):
    """A small corpus: two .txt files (documents per line, some blank lines), a .jsonl.gz in a
    subfolder and an ignored .csv; returns (documents per line in read order, per file)."""
    corpus = list(mlm_corpus.iter_documents(60, seed=int(rng.integers(0, 1000)),
                                            min_chars=100, max_chars=400))
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_text("\n".join(corpus[:20]) + "\n\n  \n")
    (root / "a.txt").write_text("  " + "\n".join(corpus[20:40]) + "\n")
    with gzip.open(root / "sub" / "c4-shard.json.gz", "wt", encoding="utf-8") as f:
        for text in corpus[40:]:
            f.write(json.dumps({"text": text, "url": "x"}) + "\n")
    (root / "ignored.csv").write_text("not,a,document\n")
    by_line = corpus[20:40] + corpus[:20] + corpus[40:]
    by_file = ["\n".join(corpus[20:40]), "\n".join(corpus[:20]), *corpus[40:]]
    return by_line, by_file


def test_files_source_documents_and_splits(tmp_path, rng):
    by_line, by_file = _write_files(tmp_path / "text", rng)
    kwargs = dict(source="files", data_dir=str(tmp_path / "text"), val_fraction=0.3,
                  test_fraction=0.2, seed=int(rng.integers(0, 1000)))
    for boundary, expected in (("line", by_line), ("file", by_file)):
        parts = {s: list(mlm.iter_documents(s, doc_boundary=boundary, **kwargs))
                 for s in ("train", "val", "test")}
        assert sorted(sum(parts.values(), [])) == sorted(expected)  # disjoint and complete
        for docs in parts.values():  # each in source order
            positions = [expected.index(d) for d in docs]
            assert positions == sorted(positions)
        again = list(mlm.iter_documents("val", doc_boundary=boundary, **kwargs))
        assert again == parts["val"]
        if boundary == "line":
            assert len(parts["train"]) > len(parts["test"])
    one_file = list(mlm.iter_documents("train", source="files", val_fraction=0.1,
                                       data_dir=str(tmp_path / "text" / "a.txt")))
    assert set(one_file) <= set(by_line[:20]) and len(one_file) >= 10
    splits, info = mlm.load_mlm(vocab_size=700, max_len=64, cache_dir=str(tmp_path / "c"),
                                **kwargs)
    assert set(splits) == {"train", "val", "test"}
    assert sum(info["num_documents"].values()) == len(by_line)
    with pytest.raises(ValueError, match="val_fraction"):
        list(mlm.iter_documents("val", **dict(kwargs, val_fraction=0.0)))


def test_files_source_bad_json_line(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"x.jsonl:2: not a JSON object with a 'text' field"):
        list(mlm.iter_documents("train", source="files", data_dir=str(tmp_path)))


class _FakeTfds(types.ModuleType):
    """Stands in for `tensorflow_datasets`: `builder(name, data_dir=)` with `is_prepared()`,
    `data_dir` and `as_dataset(split=, shuffle_files=)` (tfds' split slicing "train[:5]",
    "validation[2:4]"), and `as_numpy` (the identity here; tfds yields dicts of numpy values,
    text as bytes)."""

    def __init__(self, datasets, prepared=True):
        super().__init__("tensorflow_datasets")
        self.datasets, self.prepared, self.calls = datasets, prepared, []

    def builder(self, name, *, data_dir=None):
        def as_dataset(*, split, shuffle_files):
            assert shuffle_files is False
            self.calls.append((name, split, data_dir))
            m = re.fullmatch(r"(\w+)\[(\d*):(\d*)\]", split)
            texts = self.datasets[name][m[1]][int(m[2] or 0):int(m[3]) if m[3] else None]
            return iter([{"text": t.encode(), "url": b"u"} for t in texts])

        root = data_dir or os.path.expanduser("~/tensorflow_datasets")
        return types.SimpleNamespace(is_prepared=lambda: self.prepared, as_dataset=as_dataset,
                                     data_dir=os.path.join(root, name, "3.1.0"))

    @staticmethod
    def as_numpy(dataset):
        return dataset


def test_tfds_source_streams_c4(tmp_path, monkeypatch, rng):
    docs = list(mlm_corpus.iter_documents(20, seed=int(rng.integers(0, 1000)), min_chars=100,
                                          max_chars=300))
    fake = _FakeTfds({"c4/en": {"train": docs[:12], "validation": docs[12:]}})
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    kwargs = dict(source="tfds", data_dir=str(tmp_path / "tfds"), num_train=10, num_val=3,
                  num_test=2)
    assert list(mlm.iter_documents("train", **kwargs)) == docs[:10]
    assert list(mlm.iter_documents("val", **kwargs)) == docs[12:15]
    assert list(mlm.iter_documents("test", **kwargs)) == docs[15:17]
    assert [c[1] for c in fake.calls] == ["train[:10]", "validation[:3]", "validation[3:5]"]
    assert {c[2] for c in fake.calls} == {str(tmp_path / "tfds")}
    splits, info = mlm.load_mlm(vocab_size=500, max_len=32, cache_dir=str(tmp_path / "c"),
                                **kwargs)
    assert info["num_documents"] == {"train": 10, "val": 3, "test": 2}


def test_missing_data_is_one_line(tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    files_hint = ("--config.data.source=files", "--config.data.data_dir",
                  "https://huggingface.co/datasets/allenai/c4", "--config.data.source=embedded")
    with pytest.raises(FileNotFoundError) as e:
        mlm.load_mlm(source="files", cache_dir=cache)
    _assert_one_line(e, "config.data.data_dir is empty", *files_hint)
    with pytest.raises(FileNotFoundError) as e:
        mlm.load_mlm(source="files", data_dir=str(tmp_path / "nowhere"), cache_dir=cache)
    _assert_one_line(e, str(tmp_path / "nowhere") + " not found", *files_hint)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("no corpus here")
    with pytest.raises(FileNotFoundError) as e:
        mlm.load_mlm(source="files", data_dir=str(tmp_path / "empty"), cache_dir=cache)
    _assert_one_line(e, "no .txt, .jsonl or .json(.gz) files in", *files_hint)
    tfds_hint = ("tfds build c4/en", "pip install -e '.[data]'", "--config.data.data_dir",
                 "--config.data.source=files", "--config.data.source=embedded")
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import fails
    with pytest.raises(FileNotFoundError) as e:
        mlm.load_mlm(source="tfds", cache_dir=cache)
    _assert_one_line(e, "tensorflow-datasets is not installed", *tfds_hint)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", _FakeTfds({}, prepared=False))
    with pytest.raises(FileNotFoundError) as e:
        mlm.load_mlm(source="tfds", data_dir=str(tmp_path / "tfds"), cache_dir=cache)
    _assert_one_line(e, "no prepared c4/en", str(tmp_path / "tfds"), *tfds_hint)
    assert not os.path.exists(cache) or not os.listdir(cache)
    # Through the trainer's dataset loader: a UserError, which train.py prints as one line.
    config = ml_collections.ConfigDict(dict(name="mlm", source="files",
                                            data_dir=str(tmp_path / "nowhere"),
                                            cache_dir=cache))
    with pytest.raises(UserError) as e:
        tasks.load_dataset({"mlm": mlm.load_mlm}, config)
    _assert_one_line(e, "not found", *files_hint)
    config.data_dir, config.source = "", "hub"
    with pytest.raises(UserError) as e:
        tasks.load_dataset({"mlm": mlm.load_mlm}, config)
    _assert_one_line(e, "bad mlm settings in config.data", "source must be one of")


# --------------------------------------------------------------------------------------------
# Masking
# --------------------------------------------------------------------------------------------

VOCAB = 1000
SPECIAL_IDS = (0, 1, 2, 3, 4, 77)  # the five, and a bracketed entry such as [unused0]


def _batch(rng, shape=(128, 512)):
    """Ids with every special present, padding tails and out-of-vocabulary-free content."""
    ids = rng.integers(0, VOCAB, size=shape).astype(np.int32)
    ids[:, 0] = 2
    lengths = rng.integers(shape[1] // 4, shape[1], size=shape[0])
    ids[np.arange(shape[0]), lengths] = 3
    ids[np.arange(shape[1]) > lengths[:, None]] = 0
    return ids


def _mask(impl, ids, seed, mask_prob):
    kwargs = dict(mask_prob=mask_prob, mask_id=4, vocab_size=VOCAB, special_ids=SPECIAL_IDS)
    if impl == "jax":
        out = jax.jit(lambda x, k: mlm.mask_tokens(x, k, **kwargs))(ids, jax.random.key(seed))
        return tuple(np.asarray(a) for a in out)
    return mlm.mask_tokens_np(ids, np.random.default_rng(seed), **kwargs)


def _within(count, total, p, sigmas=6):
    """count / total is p within `sigmas` binomial standard deviations."""
    return abs(count - p * total) <= sigmas * np.sqrt(total * p * (1 - p)) + 1


@pytest.mark.parametrize("impl", ["jax", "numpy"])
@pytest.mark.parametrize("mask_prob", [mlm.TRAIN_MASK_PROB, mlm.EVAL_MASK_PROB])
def test_masking_statistics(rng, impl, mask_prob):
    ids = _batch(rng)
    inputs, targets, weights = _mask(impl, ids, int(rng.integers(0, 2**31)), mask_prob)
    assert inputs.shape == targets.shape == weights.shape == ids.shape
    assert inputs.dtype == targets.dtype == np.int32 and weights.dtype == np.float32
    np.testing.assert_array_equal(targets, ids)
    selected = weights == 1
    assert np.all((weights == 0) | selected)
    special = np.isin(ids, SPECIAL_IDS)
    assert not np.any(selected & special)  # never a special token or padding
    np.testing.assert_array_equal(inputs[~selected], ids[~selected])
    maskable = ~special
    assert _within(selected.sum(), maskable.sum(), mask_prob)
    n = selected.sum()
    masked = inputs[selected] == 4
    kept = inputs[selected] == ids[selected]
    replaced = ~masked & ~kept
    num_candidates = VOCAB - len(SPECIAL_IDS)
    assert _within(masked.sum(), n, 0.8)
    assert _within(kept.sum(), n, 0.1 + 0.1 / num_candidates)  # a draw may hit its own id
    assert _within(replaced.sum(), n, 0.1 * (1 - 1 / num_candidates))
    drawn = inputs[selected][replaced]
    assert not np.any(np.isin(drawn, SPECIAL_IDS)) and drawn.min() >= 0
    expected_unique = num_candidates * (1 - np.exp(-drawn.size / num_candidates))
    assert drawn.max() < VOCAB and len(np.unique(drawn)) > 0.8 * expected_unique
    # ids outside the vocabulary are never selected either
    odd = np.array([[-1, VOCAB, VOCAB + 5, 10]] * 64, np.int32)
    _, _, w = _mask(impl, odd, 1, 0.9)
    assert not np.any(w[:, :3]) and np.any(w[:, 3])


@pytest.mark.parametrize("impl", ["jax", "numpy"])
def test_masking_deterministic_per_key(rng, impl):
    ids = _batch(rng, (8, 64))
    seed = int(rng.integers(0, 2**31))
    first, again = _mask(impl, ids, seed, 0.3), _mask(impl, ids, seed, 0.3)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    other = _mask(impl, ids, seed + 1, 0.3)
    assert not np.array_equal(other[2], first[2])


def test_masking_in_jax_without_jit_and_traced_probability(rng):
    ids = _batch(rng, (4, 32))
    key = jax.random.key(int(rng.integers(0, 2**31)))
    kwargs = dict(mask_id=4, vocab_size=VOCAB, special_ids=SPECIAL_IDS)
    eager = mlm.mask_tokens(ids, key, mask_prob=0.3, **kwargs)
    jitted = jax.jit(lambda p: mlm.mask_tokens(jnp.asarray(ids), key, mask_prob=p,
                                               **kwargs))(0.3)
    for a, b in zip(eager, jitted):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    raw_key = jax.random.PRNGKey(0)  # legacy uint32 keys work too
    assert mlm.mask_tokens(ids, raw_key, mask_prob=0.3, **kwargs)[0].shape == ids.shape
    with pytest.raises(ValueError, match="special_ids"):
        mlm.mask_tokens(ids, key, mask_prob=0.3, mask_id=4, vocab_size=10, special_ids=(12,))
