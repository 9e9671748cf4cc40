"""Loaders of LRA Text (IMDb), Retrieval (AAN) and Image (CIFAR-10) on small stand-in files in
the real formats, written to tmp_path; the tensorflow-datasets path runs against a fake
`tensorflow_datasets` module (no TensorFlow needed)."""

import os
import pickle
import sys
import types

import numpy as np
import pytest

from experiments.data import image, retrieval, text

_SNIPPETS = ["great film", "<br /><br />", "terrible plot", "café", "naïve", "日本映画", "🎬",
             "a\tb"]


def _row(doc, max_length):
    """Expected ids of one document: bytes + 2, EOS (1), padding (0)."""
    kept = list(doc[:max_length - 1])
    return np.array([b + 2 for b in kept] + [1] + [0] * (max_length - 1 - len(kept)), np.int32)


def _rows(docs, max_length):
    return np.stack([_row(d, max_length) for d in docs])


class _FakeTfds(types.ModuleType):
    """Stands in for `tensorflow_datasets`: `builder(name, data_dir=)` with `is_prepared()`,
    `data_dir` and `as_dataset(split=, batch_size=-1)`, and `as_numpy` (the identity here; tfds
    turns the batch of tensors into a dict of numpy arrays: bytes objects for text, int64
    labels, uint8 images)."""

    def __init__(self, datasets, prepared=True):
        super().__init__("tensorflow_datasets")
        self.datasets, self.prepared, self.calls = datasets, prepared, []

    def builder(self, name, *, data_dir=None):
        def as_dataset(*, split, batch_size):
            assert batch_size == -1
            self.calls.append((name, split, data_dir))
            return {k: v.copy() for k, v in self.datasets[name][split].items()}

        root = data_dir or os.path.expanduser("~/tensorflow_datasets")
        return types.SimpleNamespace(is_prepared=lambda: self.prepared, as_dataset=as_dataset,
                                     data_dir=os.path.join(root, name, "1.0.0"))

    @staticmethod
    def as_numpy(batch):
        return batch


def _assert_one_line(error, *parts):
    message = str(error.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)


# --------------------------------------------------------------------------------------------
# Text (IMDb)
# --------------------------------------------------------------------------------------------

MAX_LEN = 48


def _review(rng, i):
    """A review with its index (unique), random snippets, surrounding whitespace; some are
    longer than MAX_LEN bytes."""
    words = rng.choice(_SNIPPETS, size=rng.integers(0, 12))
    return f" \n review {i}: {' '.join(words)}\n ".encode()


@pytest.fixture
def imdb(tmp_path, rng):
    """An aclImdb tree; returns (its path, {split: (stripped reviews, labels)} in the loader's
    order: neg then pos, by file name)."""
    root = tmp_path / "aclImdb"
    counts = {"train": (7, 5), "test": (4, 6)}
    expected, i = {}, 0
    for split, (num_neg, num_pos) in counts.items():
        docs, labels = [], []
        for label, (folder, num) in enumerate(zip(("neg", "pos"), (num_neg, num_pos))):
            (root / split / folder).mkdir(parents=True)
            files = {}
            for _ in range(num):
                files[f"{i}_{rng.integers(1, 11)}.txt"] = _review(rng, i)
                i += 1
            for name in sorted(files):
                (root / split / folder / name).write_bytes(files[name])
                docs.append(files[name].strip())
                labels.append(label)
        (root / split / "urls_pos.txt").write_text("ignored: not in a label folder")
        expected[split] = (docs, np.array(labels))
    return root, expected


def _load_text(split, imdb, tmp_path, **kwargs):
    kwargs = dict(dict(source="files", data_dir=str(imdb[0]), max_length=MAX_LEN,
                       cache_dir=str(tmp_path / "cache")), **kwargs)
    return text.load_text(split, **kwargs)


def test_text_files_ids_truncation_and_labels(imdb, tmp_path):
    for split in ("train", "test"):
        docs, labels = imdb[1][split]
        d = _load_text(split, imdb, tmp_path)
        assert d["tokens"].dtype == np.int32 and d["labels"].dtype == np.int32
        assert d["tokens"].shape == (len(docs), MAX_LEN)
        np.testing.assert_array_equal(d["tokens"], _rows(docs, MAX_LEN))
        np.testing.assert_array_equal(d["labels"], labels)
        lengths = np.array([min(len(doc), MAX_LEN - 1) for doc in docs])
        assert np.all(d["tokens"][np.arange(len(docs)), lengths] == text.EOS_ID)
        assert np.all(d["tokens"].max(1) < text.VOCAB_SIZE)
    assert max(len(doc) for doc in docs) >= MAX_LEN  # some reviews were cut
    assert any(max(doc) >= 128 for doc in docs)  # non-ASCII reviews, as UTF-8 bytes


def test_text_val_is_test_by_default(imdb, tmp_path):
    val, test = _load_text("val", imdb, tmp_path), _load_text("test", imdb, tmp_path)
    for k in ("tokens", "labels"):
        np.testing.assert_array_equal(val[k], test[k])


def test_text_held_out_val(imdb, tmp_path):
    docs, labels = imdb[1]["train"]
    all_rows = _rows(docs, MAX_LEN)
    train = _load_text("train", imdb, tmp_path, val_fraction=0.25, seed=3)
    val = _load_text("val", imdb, tmp_path, val_fraction=0.25, seed=3)
    assert val["tokens"].shape == (3, MAX_LEN) and train["tokens"].shape == (9, MAX_LEN)
    rows = {r.tobytes(): i for i, r in enumerate(all_rows)}  # reviews are unique (index)
    train_idx = [rows[r.tobytes()] for r in train["tokens"]]
    val_idx = [rows[r.tobytes()] for r in val["tokens"]]
    assert sorted(train_idx + val_idx) == list(range(len(docs)))  # disjoint, complete
    assert train_idx == sorted(train_idx) and val_idx == sorted(val_idx)  # source order
    np.testing.assert_array_equal(val["labels"], labels[val_idx])
    again = _load_text("val", imdb, tmp_path, val_fraction=0.25, seed=3)
    np.testing.assert_array_equal(again["tokens"], val["tokens"])
    other = _load_text("val", imdb, tmp_path, val_fraction=0.25, seed=4)
    assert not np.array_equal(other["tokens"], val["tokens"])


def test_text_tfds_source_matches_files(imdb, tmp_path, monkeypatch):
    fake = _FakeTfds({"imdb_reviews": {
        split: dict(text=np.array(docs, dtype=object), label=labels.astype(np.int64))
        for split, (docs, labels) in imdb[1].items()}})
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    tfds_dir = tmp_path / "tfds"
    for split in ("train", "test"):
        got = _load_text(split, imdb, tmp_path, source="tfds", data_dir=str(tfds_dir))
        want = _load_text(split, imdb, tmp_path)
        for k in ("tokens", "labels"):
            np.testing.assert_array_equal(got[k], want[k])
    assert fake.calls == [("imdb_reviews", "train", str(tfds_dir)),
                          ("imdb_reviews", "test", str(tfds_dir))]


def test_text_cache_reuse(imdb, tmp_path, capsys):
    first = _load_text("train", imdb, tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("Building text_train") and " s" in out[1]
    for path in (imdb[0] / "train").rglob("*.txt"):
        path.unlink()  # a second load must not read the files again
    second = _load_text("train", imdb, tmp_path)
    assert capsys.readouterr().out == ""
    np.testing.assert_array_equal(first["tokens"], second["tokens"])
    with pytest.raises(FileNotFoundError):  # another max_length is another cache file
        _load_text("train", imdb, tmp_path, max_length=MAX_LEN + 1)
    files = os.listdir(tmp_path / "cache")
    assert len(files) == 1 and files[0].startswith("text_train_") and files[0].endswith(".npz")


def test_text_missing_data_errors(tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    hint = ("aclImdb_v1.tar.gz", "https://ai.stanford.edu/~amaas/data/sentiment/",
            "--config.data.source=files", "--config.data.data_dir", "tfds build imdb_reviews",
            "pip install -e '.[data]'")
    with pytest.raises(FileNotFoundError) as e:
        text.load_text("train", source="files", cache_dir=cache)
    _assert_one_line(e, "no aclImdb data_dir", *hint)
    with pytest.raises(FileNotFoundError) as e:
        text.load_text("test", source="files", data_dir=str(tmp_path / "nowhere"),
                       cache_dir=cache)
    _assert_one_line(e, str(tmp_path / "nowhere" / "test" / "neg"), *hint)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import fails
    with pytest.raises(FileNotFoundError) as e:
        text.load_text("train", cache_dir=cache)
    _assert_one_line(e, "tensorflow-datasets is not installed", *hint)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", _FakeTfds({}, prepared=False))
    with pytest.raises(FileNotFoundError) as e:
        text.load_text("train", data_dir=str(tmp_path / "tfds"), cache_dir=cache)
    _assert_one_line(e, "no prepared imdb_reviews", str(tmp_path / "tfds"), *hint)
    assert not os.listdir(cache)


@pytest.mark.parametrize("kwargs", [
    dict(split="dev"), dict(source="hub"), dict(max_length=1), dict(max_length=4.0),
    dict(val_fraction=1.0), dict(val_fraction=-0.1), dict(seed=-1), dict(val_fraction=1e-6)])
def test_text_bad_arguments(imdb, tmp_path, kwargs):
    kwargs = dict(dict(split="val", source="files", data_dir=str(imdb[0]),
                       cache_dir=str(tmp_path / "cache")), **kwargs)
    with pytest.raises(ValueError) as e:
        text.load_text(kwargs.pop("split"), **kwargs)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------------------------
# Retrieval (AAN)
# --------------------------------------------------------------------------------------------

AAN_LEN = 40


@pytest.fixture
def aan(tmp_path, rng):
    """LRA's tsv_data folder; returns (path, {split: (texts1, texts2, labels)})."""
    root = tmp_path / "tsv_data"
    root.mkdir()
    expected = {}
    for split, name in retrieval.FILES.items():
        texts1, texts2, labels, lines = [], [], [], []
        for i in range(int(rng.integers(3, 8))):
            label = int(rng.integers(0, 2))
            t1, t2 = (repr(f"{split} {i}{k}: {' '.join(rng.choice(_SNIPPETS, size=n))}".encode())
                      .encode() for k, n in (("a", rng.integers(0, 3)), ("b", 6)))
            label_field = ("1.0" if label else "0.0") if i % 2 else str(label)
            lines.append(b"\t".join([label_field.encode(), b"W0%d-1" % i, b"P1%d-2" % i,
                                     t1, t2]))
            texts1.append(t1)
            texts2.append(t2)
            labels.append(label)
        (root / name).write_bytes(b"\n".join(lines) + b"\n")
        expected[split] = (texts1, texts2, np.array(labels))
    return root, expected


def _load_aan(split, aan, tmp_path, **kwargs):
    return retrieval.load_retrieval(split, data_dir=str(aan[0]), max_length=AAN_LEN,
                                    cache_dir=str(tmp_path / "cache"), **kwargs)


def test_retrieval_ids_and_labels(aan):
    root, expected = aan
    for split in retrieval.FILES:
        texts1, texts2, labels = expected[split]
        d = _load_aan(split, aan, root.parent)
        for k, texts in (("tokens1", texts1), ("tokens2", texts2)):
            assert d[k].dtype == np.int32 and d[k].shape == (len(labels), AAN_LEN)
            np.testing.assert_array_equal(d[k], _rows(texts, AAN_LEN))  # b'...' verbatim
        assert d["labels"].dtype == np.int32
        np.testing.assert_array_equal(d["labels"], labels)
    assert any(len(t) >= AAN_LEN for t in texts2)  # some documents were cut
    assert all(t.startswith((b"b'", b'b"')) for t in texts1)


def test_retrieval_val_is_eval_file_and_cache_reuse(aan, tmp_path, capsys):
    val = _load_aan("val", aan, tmp_path)
    assert "Building retrieval_val" in capsys.readouterr().out
    np.testing.assert_array_equal(val["labels"], aan[1]["val"][2])
    with open(aan[0] / "new_aan_pairs.eval.tsv", "ab") as f:
        f.write(b"1\tX\tY\tb'new'\tb'pair'\n")  # not seen: the cached arrays are used
    again = _load_aan("val", aan, tmp_path)
    assert capsys.readouterr().out == ""
    np.testing.assert_array_equal(again["tokens1"], val["tokens1"])


@pytest.mark.parametrize("line, problem", [
    (b"1\tX\tY\tb'only four'", "4 tab-separated fields"),
    (b"2\tX\tY\tb'a'\tb'b'", "label 2.0 is not 0 or 1"),
    (b"yes\tX\tY\tb'a'\tb'b'", "could not convert")])
def test_retrieval_malformed_line(aan, tmp_path, line, problem):
    path = aan[0] / "new_aan_pairs.test.tsv"
    num_lines = len(path.read_bytes().splitlines())
    with open(path, "ab") as f:
        f.write(line + b"\n")
    with pytest.raises(ValueError) as e:
        _load_aan("test", aan, tmp_path)
    _assert_one_line(e, f"{path}:{num_lines + 1}", problem)


def test_retrieval_missing_data_errors(tmp_path):
    hint = ("lra_release.gz", "google-research/long-range-arena", "--config.data.data_dir",
            "tsv_data")
    with pytest.raises(FileNotFoundError) as e:
        retrieval.load_retrieval("train", data_dir="", cache_dir=str(tmp_path))
    _assert_one_line(e, "no AAN data_dir", *hint)
    with pytest.raises(FileNotFoundError) as e:
        retrieval.load_retrieval("val", data_dir=str(tmp_path), cache_dir=str(tmp_path))
    _assert_one_line(e, str(tmp_path / "new_aan_pairs.eval.tsv"), *hint)
    with pytest.raises(ValueError):
        retrieval.load_retrieval("eval", data_dir=str(tmp_path), cache_dir=str(tmp_path))


# --------------------------------------------------------------------------------------------
# Image (CIFAR-10)
# --------------------------------------------------------------------------------------------

# tf.image.rgb_to_grayscale on uint8 pixels, computed with tensorflow-cpu 2.21.0: colours where
# rounding, float64 arithmetic or a different float32 summation order give another value.
TF_GRAY = {(86, 201, 44): 149, (152, 103, 253): 135, (225, 85, 93): 128, (181, 255, 226): 230,
           (3, 49, 247): 57, (194, 17, 251): 96, (35, 138, 124): 105, (147, 89, 162): 114,
           (230, 134, 134): 162, (244, 47, 55): 107, (216, 221, 213): 218, (223, 65, 245): 133,
           (0, 0, 0): 0, (255, 255, 255): 255, (255, 0, 0): 76, (0, 255, 0): 149,
           (0, 0, 255): 29}

BATCH = 8  # images per stand-in train batch (5 batches) and in the test batch


@pytest.fixture
def cifar(tmp_path, rng):
    """A cifar-10-batches-py folder; returns (path, {split: (data [N, 3072], labels [N])})."""
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    expected = {"train": ([], []), "test": ([], [])}
    for name in (*image.TRAIN_FILES, image.TEST_FILE):
        data = rng.integers(0, 256, size=(BATCH, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=BATCH).tolist()
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                 b"filenames": [b"img_%d.png" % i for i in range(BATCH)]}
        with open(root / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
        split = "test" if name == image.TEST_FILE else "train"
        expected[split][0].append(data)
        expected[split][1].extend(labels)
    return root, {k: (np.concatenate(d), np.array(lbl)) for k, (d, lbl) in expected.items()}


def _direct_gray(data):
    """Channel-major CIFAR rows [N, 3072] -> [N, 1024]: LRA's grayscale, written out."""
    red, green, blue = (data[:, c * 1024:(c + 1) * 1024].astype(np.float32) * np.float32(1 / 255)
                        for c in range(3))
    luma = (red * np.float32(0.2989) + green * np.float32(0.5870)) + blue * np.float32(0.1140)
    return np.floor(luma * np.float32(255.5)).astype(np.uint8)


def _load_image(split, cifar, tmp_path, **kwargs):
    kwargs = dict(dict(source="files", data_dir=str(cifar[0]), cache_dir=str(tmp_path / "cache")),
                  **kwargs)
    return image.load_image(split, **kwargs)


def test_grayscale_matches_tensorflow():
    colours = np.array(list(TF_GRAY), np.uint8)
    np.testing.assert_array_equal(image.grayscale(colours), list(TF_GRAY.values()))
    assert image.grayscale(np.zeros((2, 3, 3), np.uint8)).shape == (2, 3)


def test_image_files_conversion_and_labels(cifar, tmp_path):
    data, labels = cifar[1]["test"]
    d = _load_image("test", cifar, tmp_path)
    assert d["tokens"].dtype == np.uint8 and d["tokens"].shape == (BATCH, 1024)
    assert d["labels"].dtype == np.int32
    np.testing.assert_array_equal(d["tokens"], _direct_gray(data))
    np.testing.assert_array_equal(d["labels"], labels)
    rgb = data.reshape(-1, 3, 32, 32)[0, :, 5, 7]  # pixel (5, 7) of image 0 -> position 167
    assert d["tokens"][0, 5 * 32 + 7] == image.grayscale(rgb)


def test_image_held_out_val(cifar, tmp_path):
    data, labels = cifar[1]["train"]
    full = _direct_gray(data)
    train = _load_image("train", cifar, tmp_path)
    val = _load_image("val", cifar, tmp_path)
    assert train["tokens"].shape == (36, 1024) and val["tokens"].shape == (4, 1024)  # 10%
    rows = {r.tobytes(): i for i, r in enumerate(full)}
    train_idx = [rows[r.tobytes()] for r in train["tokens"]]
    val_idx = [rows[r.tobytes()] for r in val["tokens"]]
    assert sorted(train_idx + val_idx) == list(range(len(full)))  # disjoint, complete
    np.testing.assert_array_equal(train["labels"], labels[train_idx])
    np.testing.assert_array_equal(val["labels"], labels[val_idx])
    np.testing.assert_array_equal(_load_image("val", cifar, tmp_path)["tokens"], val["tokens"])
    assert not np.array_equal(_load_image("val", cifar, tmp_path, seed=1)["tokens"],
                              val["tokens"])
    everything = _load_image("train", cifar, tmp_path, val_fraction=0.0)
    np.testing.assert_array_equal(everything["tokens"], full)
    with pytest.raises(ValueError) as e:
        _load_image("val", cifar, tmp_path, val_fraction=0.0)
    _assert_one_line(e, "val_fraction > 0")


def test_image_tfds_source_matches_files(cifar, tmp_path, monkeypatch):
    fake = _FakeTfds({"cifar10": {
        split: dict(image=data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(),
                    label=labels.astype(np.int64), id=np.array([b"x"] * len(labels), object))
        for split, (data, labels) in cifar[1].items()}})
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    for split in ("train", "val", "test"):
        got = _load_image(split, cifar, tmp_path, source="tfds", data_dir="")
        want = _load_image(split, cifar, tmp_path)
        for k in ("tokens", "labels"):
            np.testing.assert_array_equal(got[k], want[k])
    assert fake.calls == [("cifar10", "train", None), ("cifar10", "test", None)]  # cached


def test_image_cache_reuse(cifar, tmp_path, capsys):
    first = _load_image("test", cifar, tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("Building image_test")
    os.remove(cifar[0] / image.TEST_FILE)
    second = _load_image("test", cifar, tmp_path)
    assert capsys.readouterr().out == ""
    np.testing.assert_array_equal(first["tokens"], second["tokens"])


def test_image_missing_data_errors(cifar, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    hint = ("cifar-10-python.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar.html",
            "--config.data.source=files", "--config.data.data_dir", "tfds build cifar10",
            "pip install -e '.[data]'")
    with pytest.raises(FileNotFoundError) as e:
        image.load_image("train", source="files", cache_dir=cache)
    _assert_one_line(e, "no cifar-10-batches-py data_dir", *hint)
    os.remove(cifar[0] / "data_batch_3")
    with pytest.raises(FileNotFoundError) as e:
        _load_image("train", cifar, tmp_path)
    _assert_one_line(e, str(cifar[0] / "data_batch_3"), *hint)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(FileNotFoundError) as e:
        image.load_image("test", cache_dir=cache)
    _assert_one_line(e, "tensorflow-datasets is not installed", *hint)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", _FakeTfds({}, prepared=False))
    with pytest.raises(FileNotFoundError) as e:
        image.load_image("test", cache_dir=cache)
    _assert_one_line(e, "no prepared cifar10", *hint)


def test_image_malformed_batch(cifar, tmp_path):
    with open(cifar[0] / image.TEST_FILE, "wb") as f:
        pickle.dump({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(ValueError) as e:
        _load_image("test", cifar, tmp_path)
    _assert_one_line(e, "expected uint8 [N, 3072]")


# --------------------------------------------------------------------------------------------
# Every LRA config's `tiny` variant trains and evaluates (on stand-in data where the real data
# needs a download)
# --------------------------------------------------------------------------------------------


def _train_tiny(config_module, workdir, batch_length_multiple=None, **data):
    from experiments.trainer import train_and_evaluate

    config = config_module.get_config("tiny")
    config.data.update(data)
    if batch_length_multiple is not None:
        config.batch_length_multiple = batch_length_multiple
    summary = train_and_evaluate(config, str(workdir))
    assert summary["final"]["step"] == 4
    assert all(np.isfinite(v) for k, v in summary["final"].items())
    return summary


def test_tiny_text_trains(imdb, tmp_path):
    from configs.lra import text as config

    _train_tiny(config, tmp_path / "w", source="files", data_dir=str(imdb[0]),
                cache_dir=str(tmp_path / "cache"))


def test_tiny_retrieval_trains_a_dual_encoder(aan, tmp_path):
    from configs.lra import retrieval as config

    train = aan[0] / retrieval.FILES["train"]
    train.write_bytes(train.read_bytes() * 4)  # at least two batches of 8 pairs
    _train_tiny(config, tmp_path / "w", data_dir=str(aan[0]), cache_dir=str(tmp_path / "cache"))


def test_tiny_image_trains(cifar, tmp_path):
    from configs.lra import image as config

    _train_tiny(config, tmp_path / "w", source="files", data_dir=str(cifar[0]),
                cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("name", ["pathfinder", "pathx", "listops"])
def test_tiny_generated_tasks_train(name, tmp_path):
    import importlib

    config = importlib.import_module(f"configs.lra.{name}")
    # listops: training batches of several lengths (batch_length_multiple 8, lengths 8-32)
    extra = dict(batch_length_multiple=8) if name == "listops" else dict(num_workers=1)
    _train_tiny(config, tmp_path / "w", cache_dir=str(tmp_path / "cache"), **extra)


def test_listops_training_batches_are_cut_to_their_lengths(tmp_path):
    """``config.batch_length_multiple``: training batches cut to their longest example rounded up
    to the multiple (only padding cut; several lengths), evaluation batches whole (a run on
    them: test_tiny_generated_tasks_train[listops])."""
    import itertools

    from configs.lra import listops as config_module
    from experiments.errors import UserError
    from experiments.tasks import get_task
    from experiments.tasks.classification import real_lengths

    np.testing.assert_array_equal(  # up to the last non-padding token, any block of rows
        real_lengths(np.array([[3, 0, 2, 0], [0, 0, 0, 0], [1, 1, 1, 1]]), 0, rows=2), [3, 0, 4])
    config = config_module.get_config("tiny")
    config.data.cache_dir = str(tmp_path / "cache")
    config.batch_length_multiple = 8
    task = get_task(config)
    full = task.splits["train"]["tokens"]
    lengths = real_lengths(full, 0)
    np.testing.assert_array_equal(lengths, task.splits["train"]["lengths"])  # EOS included
    widths = set()
    for batch in itertools.islice(task.train_batches(8, seed=0), 30):
        cut = batch["tokens"].shape[1]
        longest = real_lengths(batch["tokens"], 0).max()
        assert cut == min(full.shape[1], -(-longest // 8) * 8)
        widths.add(cut)
    assert len(widths) > 1
    assert next(task.eval_batches("val", 8))["tokens"].shape[1] == full.shape[1]
    config.batch_length_multiple = -1
    with pytest.raises(UserError, match="config.batch_length_multiple must be an int >= 0"):
        get_task(config)


@pytest.mark.parametrize("name", ["text", "retrieval", "image"])
def test_missing_download_is_one_error_line(name, tmp_path):
    """The real run without the data: one `error:` line with the download hint and the flag."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "experiments.train", "--config", f"configs/lra/{name}.py:tiny",
         "--workdir", str(tmp_path / "w"), f"--config.data.data_dir={tmp_path / 'none'}",
         f"--config.data.cache_dir={tmp_path / 'cache'}"]
        + ([] if name == "retrieval" else ["--config.data.source=files"]),
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("error: ")
    assert "--config.data.data_dir" in result.stderr and "Traceback" not in result.stderr
