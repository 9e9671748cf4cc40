"""BatchIterator and LengthBucketIterator: epoch coverage, exact resumption, eval padding and mask,
length buckets, argument checks."""

import json

import numpy as np
import pytest

from experiments.data.pipeline import BatchIterator, LengthBucketIterator


def _arrays(n):
    return {"id": np.arange(n), "x": np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) + 1}


def _take(it, k):
    return [next(it) for _ in range(k)]


def _assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_each_example_once_per_epoch(rng, drop_remainder):
    n, batch_size = int(rng.integers(20, 60)), int(rng.integers(3, 8))
    seed = int(rng.integers(2**31))
    it = BatchIterator(_arrays(n), batch_size, shuffle=True, seed=seed,
                       drop_remainder=drop_remainder, num_epochs=3)
    epochs = []
    for _ in range(3):
        batches = _take(it, it.steps_per_epoch)
        ids = np.concatenate([b["id"][b["mask"] > 0] for b in batches])
        assert len(set(ids.tolist())) == ids.size  # no example twice
        assert ids.size == (n // batch_size * batch_size if drop_remainder else n)
        for b in batches:
            assert b["id"].shape == (batch_size,) and b["x"].shape == (batch_size, 2, 3)
            assert b["mask"].dtype == np.float32
            real = b["mask"] > 0
            np.testing.assert_array_equal(b["x"][real], _arrays(n)["x"][b["id"][real]])
        epochs.append(ids)
    with pytest.raises(StopIteration):
        next(it)
    expected = np.random.default_rng([seed, 1]).permutation(n)[:epochs[1].size]
    np.testing.assert_array_equal(epochs[1], expected)
    assert not np.array_equal(epochs[0], epochs[1])


def test_resume_reproduces_uninterrupted_sequence(rng):
    n, batch_size = int(rng.integers(20, 40)), int(rng.integers(3, 7))
    kwargs = dict(shuffle=True, seed=int(rng.integers(2**31)), drop_remainder=False,
                  num_epochs=3)
    reference = BatchIterator(_arrays(n), batch_size, **kwargs)
    steps = reference.steps_per_epoch
    states, batches = [], []
    for _ in range(3 * steps):
        states.append(json.loads(json.dumps(reference.get_state())))  # plain ints
        batches.append(next(reference))
    cuts = [1, steps // 2, steps - 1, steps, steps + 1, 2 * steps + 1]  # mid-epoch, boundary
    for cut in cuts:
        resumed = BatchIterator(_arrays(n), batch_size, **kwargs)
        resumed.set_state(states[cut])
        _assert_same_batches(list(resumed), batches[cut:])
    assert states[steps] == {"epoch": 1, "position": 0}


def test_eval_padding_and_mask():
    it = BatchIterator(_arrays(10), 4, shuffle=False, seed=0, drop_remainder=False,
                       num_epochs=1)
    batches = list(it)
    assert len(batches) == it.steps_per_epoch == 3
    np.testing.assert_array_equal(np.concatenate([b["id"] for b in batches]),
                                  list(range(10)) + [0, 0])
    np.testing.assert_array_equal(batches[-1]["mask"], [1, 1, 0, 0])
    np.testing.assert_array_equal(batches[0]["mask"], [1, 1, 1, 1])
    assert np.all(batches[-1]["x"][2:] == 0) and batches[-1]["x"].dtype == np.float32
    assert sum(b["mask"].sum() for b in batches) == 10


def test_drop_remainder_train_batches(rng):
    seed = int(rng.integers(2**31))
    it = BatchIterator(_arrays(10), 4, shuffle=True, seed=seed, drop_remainder=True)
    assert it.steps_per_epoch == 2
    batches = _take(it, 6)  # three epochs, never stops without num_epochs
    assert all(b["mask"].tolist() == [1, 1, 1, 1] for b in batches)
    assert it.get_state() == {"epoch": 3, "position": 0}


@pytest.mark.parametrize("arrays, batch_size, kwargs, match", [
    (_arrays(10), 0, {}, "batch_size"),
    (_arrays(10), 2.0, {}, "batch_size"),
    (_arrays(10), 11, dict(drop_remainder=True), "batch_size"),
    ({"a": np.zeros(5), "b": np.zeros(6)}, 2, {}, "leading dimension"),
    ({"a": np.zeros(5), "b": np.float32(1)}, 2, {}, "leading dimension"),
    ({}, 2, {}, "empty"),
    ({"a": np.zeros((0, 3))}, 2, {}, "no examples"),
    ({"mask": np.zeros(5)}, 2, {}, "mask"),
    (_arrays(10), 2, dict(num_epochs=0), "num_epochs"),
    (_arrays(10), 2, dict(seed=-1), "seed"),
])
def test_bad_arguments(arrays, batch_size, kwargs, match):
    kwargs = dict(dict(shuffle=True, seed=0, drop_remainder=False), **kwargs)
    with pytest.raises(ValueError, match=match):
        BatchIterator(arrays, batch_size, **kwargs)


def test_bad_state():
    it = BatchIterator(_arrays(10), 4, shuffle=True, seed=0, drop_remainder=True)
    for state in ({"epoch": 0, "position": 8}, {"epoch": 0, "position": 3},
                  {"epoch": -1, "position": 0}):
        with pytest.raises(ValueError, match="invalid state"):
            it.set_state(state)
    it.set_state({"epoch": 5, "position": 4})  # the last full batch of epoch 5
    next(it)
    assert it.get_state() == {"epoch": 6, "position": 0}


def _padded_tokens(rng, n, width):
    """``(tokens [n, width] int32, lengths [n])``: ids in [1, 9) then padding 0."""
    lengths = rng.integers(1, width + 1, size=n)
    tokens = rng.integers(1, 9, size=(n, width)).astype(np.int32)
    tokens[np.arange(width)[None, :] >= lengths[:, None]] = 0
    return tokens, lengths


def test_length_buckets_cut_padding_only_and_sort_each_pool(rng):
    """Every training example once per epoch (full batches), token arrays cut to the batch's
    longest example rounded up to the multiple (never a real token), and each pool of batches
    a sorted run of lengths; resumption reproduces the batches."""
    n, batch_size, width = int(rng.integers(150, 300)), int(rng.integers(3, 8)), 37
    multiple, pool = int(rng.integers(2, 9)), int(rng.integers(2, 6))
    tokens, lengths = _padded_tokens(rng, n, width)
    arrays = {"id": np.arange(n), "tokens": tokens}
    kwargs = dict(lengths=lengths, multiple=multiple, crop=("tokens",),
                  seed=int(rng.integers(2**31)), pool=pool, num_epochs=2)
    it = LengthBucketIterator(arrays, batch_size, **kwargs)
    states, batches = [], []
    for _ in range(2 * it.steps_per_epoch):
        states.append(it.get_state())
        batches.append(next(it))
    with pytest.raises(StopIteration):
        next(it)
    steps = it.steps_per_epoch
    for epoch in range(2):
        epoch_batches = batches[epoch * steps:(epoch + 1) * steps]
        ids = np.concatenate([b["id"] for b in epoch_batches])
        assert ids.size == n // batch_size * batch_size == len(set(ids.tolist()))
        for b in epoch_batches:
            cut = b["tokens"].shape[1]
            assert cut == min(width, -(-lengths[b["id"]].max() // multiple) * multiple)
            np.testing.assert_array_equal(b["tokens"], tokens[b["id"], :cut])
            assert not tokens[b["id"], cut:].any()  # only padding was cut
            assert np.all(b["mask"] == 1)
        for start in range(0, steps, pool):  # each pool: batches of a sorted run of lengths
            runs = sorted((np.sort(lengths[b["id"]]) for b in epoch_batches[start:start + pool]),
                          key=lambda x: (x[0], x[-1]))
            assert all(a[-1] <= b[0] for a, b in zip(runs, runs[1:]))
    assert not np.array_equal(batches[0]["id"], batches[steps]["id"])
    for cut in (1, steps // 2, steps + 1):
        resumed = LengthBucketIterator(arrays, batch_size, **kwargs)
        resumed.set_state(states[cut])
        _assert_same_batches(list(resumed), batches[cut:])


@pytest.mark.parametrize("change,message", [
    (dict(lengths=np.ones(5, np.int64)), "lengths must be"),
    (dict(lengths=np.ones(20)), "lengths must be"),
    (dict(multiple=0), "multiple must be"),
    (dict(pool=0), "pool must be"),
    (dict(crop=("id",)), "crop must name"),
    (dict(crop=()), "crop must name"),
])
def test_length_bucket_arguments_are_checked(change, message):
    tokens = np.ones((20, 6), np.int32)
    kwargs = {**dict(lengths=np.full(20, 6), multiple=2, crop=("tokens",), seed=0), **change}
    with pytest.raises(ValueError, match=message):
        LengthBucketIterator({"id": np.arange(20), "tokens": tokens}, 4, **kwargs)
