"""ListOps generator (labels, bounds, structure, determinism, caching, argument checks) and the
reader of LRA's official TSV files."""

import os

import numpy as np
import pytest

from experiments.data import listops


def _structure(tokens):
    """(maximum operator nesting depth, argument count of every operator) of one sequence."""
    open_counts, max_depth, counts = [], 0, []  # argument counts of the open operators
    for t in tokens.tolist():
        if t in (listops.PAD_ID, listops.EOS_ID):
            break
        if t == listops.CLOSE_ID:
            counts.append(open_counts.pop())
            continue
        if open_counts:
            open_counts[-1] += 1
        if listops.FIRST_OP_ID <= t < listops.CLOSE_ID:
            open_counts.append(0)
            max_depth = max(max_depth, len(open_counts))
    return max_depth, counts


def _check_split(d, *, min_length, max_length, max_depth, max_args):
    tokens, lengths, labels = d["tokens"], d["lengths"], d["labels"]
    n = labels.shape[0]
    assert tokens.shape == (n, max_length) and lengths.shape == (n,)
    assert np.all((tokens >= 0) & (tokens < listops.VOCAB_SIZE))
    expr = lengths - 1  # without EOS
    assert np.all((expr > min_length) & (expr < max_length))
    cols = np.arange(max_length)
    assert np.all((tokens != listops.PAD_ID) == (cols < lengths[:, None]))
    assert np.all(tokens[np.arange(n), expr] == listops.EOS_ID)
    assert np.all((tokens == listops.EOS_ID).sum(1) == 1)
    assert np.all((labels >= 0) & (labels < listops.NUM_CLASSES))
    for row, label in zip(tokens, labels):
        assert listops.evaluate(row) == label
        depth, counts = _structure(row)
        assert depth <= max_depth - 1  # the root is at depth 1, leaves down to max_depth
        assert all(2 <= c <= max_args for c in counts)


@pytest.mark.parametrize("cfg", [
    dict(num_train=200, num_val=50, num_test=50, min_length=50, max_length=300),
    dict(num_train=150, num_val=20, num_test=20, min_length=5, max_length=40, max_depth=4,
         max_args=3),
    dict(num_train=10, num_val=5, num_test=5),  # LRA bounds: 500 < length < 2000
])
def test_generated_samples_are_valid(rng, cfg):
    seed = int(rng.integers(2**31))
    data = listops.generate_listops(seed=seed, **cfg)
    bounds = dict(min_length=500, max_length=2000, max_depth=10, max_args=10)
    bounds.update({k: v for k, v in cfg.items() if k in bounds})
    for split in listops.SPLITS:
        assert data[split]["labels"].shape == (cfg[f"num_{split}"],)
        _check_split(data[split], **bounds)
    rows = np.concatenate([data[s]["tokens"] for s in listops.SPLITS])
    assert len({r.tobytes() for r in rows}) == rows.shape[0]  # unique across all splits


def test_tree_size_distribution_matches_lra_recursion(rng):
    """Unfiltered trees: root leaf rate and mean size equal LRA's recursion's expectations."""
    max_depth, max_args = 6, 10
    levels = listops._draw_levels(rng, 16384, max_depth, max_args)
    sizes, _ = listops._sizes_and_values(levels)
    root = sizes[0]
    # E[size at depth d] = 0.75 * 1 + 0.25 * (2 + E[#args] * E[size at d + 1]); 1 at max_depth.
    expected = 1.0
    for _ in range(max_depth - 1):
        expected = 0.75 + 0.25 * (2 + (2 + max_args) / 2 * expected)
    stderr = root.std() / np.sqrt(root.size)
    assert abs(root.mean() - expected) < 5 * stderr
    leaf_rate = (root == 1).mean()
    assert abs(leaf_rate - 0.75) < 5 * np.sqrt(0.75 * 0.25 / root.size)


def test_determinism(rng):
    seed = int(rng.integers(2**31))
    cfg = dict(num_train=30, num_val=5, num_test=5, min_length=20, max_length=100)
    a = listops.generate_listops(seed=seed, **cfg)
    b = listops.generate_listops(seed=seed, **cfg)
    c = listops.generate_listops(seed=seed + 1, **cfg)
    for split in listops.SPLITS:
        for key in ("tokens", "lengths", "labels"):
            np.testing.assert_array_equal(a[split][key], b[split][key])
    assert not np.array_equal(a["train"]["tokens"], c["train"]["tokens"])


def test_cache(rng, tmp_path, capsys):
    seed = int(rng.integers(2**31))
    cfg = dict(num_train=40, num_val=10, num_test=10, seed=seed, min_length=20, max_length=128)
    first = {s: listops.load_listops(s, cache_dir=str(tmp_path), **cfg) for s in listops.SPLITS}
    out = capsys.readouterr().out
    assert out.count("Generating ListOps") == 1 and "Generated ListOps in" in out
    path = listops.cache_path(str(tmp_path), **cfg)
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # no temp file left behind
    second = listops.load_listops("test", cache_dir=str(tmp_path), **cfg)
    assert capsys.readouterr().out == ""
    reference = listops.generate_listops(**cfg)
    for split in listops.SPLITS:
        for key in ("tokens", "lengths", "labels"):
            assert first[split][key].dtype == np.int32
            np.testing.assert_array_equal(first[split][key], reference[split][key])
    for key in ("tokens", "lengths", "labels"):
        np.testing.assert_array_equal(second[key], first["test"][key])
    assert first["train"]["tokens"].shape == (40, 128)
    assert listops.cache_path(str(tmp_path), **dict(cfg, seed=seed + 1)) != path


def test_tokenize_and_evaluate_known_expressions():
    lra_source = "( ( ( [MAX 2 ) 9 ) ] )"  # LRA's to_string of [MAX 2 9 ]
    assert listops.detokenize(listops.tokenize(lra_source)) == "[MAX 2 9 ]"
    cases = {
        "[MAX 2 9 ]": 9,
        "[MIN 4 7 [MAX 0 1 ] ]": 1,
        "[MED 1 2 ]": 1,  # int(np.median) truncates 1.5
        "[MED 1 2 3 4 ]": 2,
        "[MED 9 1 5 ]": 5,
        "[SM 9 9 7 ]": 5,
        "[MAX 2 9 [MIN 4 7 ] 0 ]": 9,
        "[SM [MED 3 8 ] [MIN 2 6 ] 1 ]": 8,
        "7": 7,
    }
    for source, value in cases.items():
        tokens = listops.tokenize(source) + [listops.EOS_ID, listops.PAD_ID]
        assert listops.evaluate(tokens) == value, source
    with pytest.raises(ValueError):
        listops.evaluate(listops.tokenize("[MAX 2 9"))


def test_vocabulary_constants():
    assert listops.PAD_ID == 0 and listops.NUM_CLASSES == 10 and listops.MAX_LENGTH == 2000
    assert listops.VOCAB_SIZE == len(listops.TOKENS) == 17
    assert len(set(listops.TOKENS)) == listops.VOCAB_SIZE


def test_majority_class_rate():
    assert listops.majority_class_rate(np.array([1, 1, 2, 3])) == 0.5
    with pytest.raises(ValueError):
        listops.majority_class_rate(np.array([], np.int32))


@pytest.mark.parametrize("bad, name", [
    (dict(min_length=300, max_length=300), "max_length"),
    (dict(min_length=300, max_length=200), "max_length"),
    (dict(min_length=-1), "min_length"),
    (dict(num_train=0), "num_train"),
    (dict(num_val=-5), "num_val"),
    (dict(num_test=1.5), "num_test"),
    (dict(seed=-1), "seed"),
    (dict(max_depth=1), "max_depth"),
    (dict(max_args=1), "max_args"),
    (dict(max_depth=3, max_args=2, min_length=10, max_length=20), "min_length"),
])
def test_bad_arguments(tmp_path, bad, name):
    with pytest.raises(ValueError, match=name):
        listops.load_listops("train", cache_dir=str(tmp_path), **bad)
    with pytest.raises(ValueError, match="split"):
        listops.load_listops("validation", cache_dir=str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_impossible_configuration_raises_runtime_error():
    # With max_depth=2, max_args=2 every tree is a digit or `[OP d d ]`: 400 trees of length 4.
    with pytest.raises(RuntimeError, match="unique"):
        listops.generate_listops(num_train=500, num_val=1, num_test=1, min_length=3,
                                 max_length=5, max_depth=2, max_args=2)


def _lra_source(expression):
    """LRA's TSV `Source` of an expression `[OP a b ... ]`: its nested pairs, parenthesised
    (`to_string` of LRA's generator: `[OP a b c ]` is the pair (((OP, a), b), c), END))."""
    words = iter(expression.split())

    def node(word):
        if not word.startswith("["):
            return word
        pair = f"( {word} {node(next(words))} )"
        for word in words:
            if word == "]":
                return f"( {pair} ] )"
            pair = f"( {pair} {node(word)} )"

    return node(next(words))


def _write_tsv(path, sources, labels):
    """A TSV file as LRA's `csv.writer` writes it (header row, CRLF line ends)."""
    with open(path, "w", newline="") as f:
        f.write("Source\tTarget\r\n")
        f.writelines(f"{s}\t{y}\r\n" for s, y in zip(sources, labels))


def test_tsv_matches_generated_data(tmp_path):
    assert _lra_source("[MAX 2 9 ]") == "( ( ( [MAX 2 ) 9 ) ] )"
    assert _lra_source("[MIN 4 [SM 1 2 ] ]") == "( ( ( [MIN 4 ) ( ( ( [SM 1 ) 2 ) ] ) ) ] )"
    cfg = dict(num_train=30, num_val=5, num_test=5, min_length=5, max_length=64)
    data = listops.generate_listops(**cfg)
    for split, d in data.items():
        expressions = [listops.detokenize(row[:n - 1]) for row, n in zip(d["tokens"], d["lengths"])]
        _write_tsv(tmp_path / f"basic_{split}.tsv", map(_lra_source, expressions), d["labels"])
    for split, d in data.items():
        loaded = listops.load_listops_tsv(split, data_dir=str(tmp_path), max_length=64)
        for key in ("tokens", "lengths", "labels"):
            assert loaded[key].dtype == np.int32
            np.testing.assert_array_equal(loaded[key], d[key])
    with pytest.raises(ValueError, match=r"basic_train\.tsv has sequences of up to \d+ tokens"):
        listops.load_listops_tsv("train", data_dir=str(tmp_path), max_length=20)


def test_tsv_errors(tmp_path):
    for data_dir, name in [(tmp_path / "missing", "basic_train.tsv"), ("", "data_dir")]:
        with pytest.raises(FileNotFoundError) as error:
            listops.load_listops_tsv("train", data_dir=str(data_dir))
        message = str(error.value)
        assert name in message and "\n" not in message
        for instruction in ("lra_release.gz", "github.com/google-research/long-range-arena",
                            "lra_release/listops-1000", "--config.data.source=tsv",
                            "--config.data.data_dir=", "--config.data.source=generate"):
            assert instruction in message
    _write_tsv(tmp_path / "basic_val.tsv", ["( ( ( [MAX 2 ) 9 ) ] )", "[MAX 2 X ]"], [9, 9])
    with pytest.raises(ValueError, match=r"basic_val\.tsv:3: not a ListOps sample"):
        listops.load_listops_tsv("val", data_dir=str(tmp_path))
