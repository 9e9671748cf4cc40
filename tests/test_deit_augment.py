"""DeiT's augmentation (experiments/data/deit_augment.py, randaugment.py) and the worker pipeline
(experiments/data/image_pipeline.py): each op's documented behaviour, determinism per seed,
pooled batches equal to single-threaded ones, exact resumption, config checks."""

import concurrent.futures
import json
import math

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from experiments.data import deit_augment as da
from experiments.data.image_pipeline import ImageBatches
from experiments.data.randaugment import FILL, MAX_LEVEL, OP_NAMES, RandAugment

PLAIN = dict(randaugment=dict(num_ops=0), color_jitter=0.0, erase_prob=0.0, flip=False)


def _seed(rng):
    return int(rng.integers(2**31))


def _images(rng, n, h, w):
    return rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)


# --------------------------------------------------------------------------------------------
# Random resized crop, flip, eval crop
# --------------------------------------------------------------------------------------------


def test_random_resized_crop_ranges(rng):
    height = width = int(rng.integers(201, 301)) | 1  # square: ratios symmetric about 1
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    fractions, ratios, corners = [], [], set()
    for _ in range(2000):
        top, left, h, w = da.random_resized_crop_box(height, width, scale, ratio, rng)
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
        fractions.append(h * w / (height * width))
        ratios.append(w / h)
        corners.add((top, left))
    fractions, ratios = np.array(fractions), np.array(ratios)
    tol = 2 * 0.5 / math.sqrt(0.08 * height * width)  # rounding of w and h to pixels
    assert fractions.min() >= scale[0] * (1 - tol) and fractions.max() <= 1.0
    assert ratios.min() >= ratio[0] * (1 - tol) and ratios.max() <= ratio[1] * (1 + tol)
    assert fractions.min() < 0.1 and fractions.max() > 0.8  # the whole range is used
    assert abs(np.mean(np.log(ratios))) < 0.03  # log-uniform ratio, centred on 1 (SE 0.004)
    height, width = int(rng.integers(201, 301)), int(rng.integers(201, 301))
    for _ in range(200):
        top, left, h, w = da.random_resized_crop_box(height, width, scale, ratio, rng)
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
    assert len(corners) > 1000  # placed anywhere


def test_random_resized_crop_fallback_is_centred_and_clamped(rng):
    """A 9 x 97 strip (ratio 10.8) fits no 3/4..4/3 crop: the centred 9 x 12 one is taken."""
    for _ in range(20):
        assert da.random_resized_crop_box(9, 97, (0.9, 1.0), (3 / 4, 4 / 3), rng) == (
            0, 42, 9, 12)
    assert da.random_resized_crop_box(101, 7, (0.9, 1.0), (3 / 4, 4 / 3), rng) == (
        46, 0, 9, 7)  # tall: height = round(7 / (3/4))


def test_train_crop_is_the_box_resized_bicubic(rng):
    image = _images(rng, 1, int(rng.integers(20, 40)), int(rng.integers(20, 40)))[0]
    size = int(rng.integers(9, 30))
    deit = da.Deit(image_size=size, **PLAIN)
    seed = _seed(rng)
    out = deit.train_image(image, np.random.default_rng(seed))
    top, left, h, w = da.random_resized_crop_box(*image.shape[:2], deit.crop_scale,
                                                 deit.crop_ratio, np.random.default_rng(seed))
    want = Image.fromarray(image).crop((left, top, left + w, top + h)).resize(
        (size, size), Image.Resampling.BICUBIC)
    assert out.dtype == np.uint8 and out.shape == (size, size, 3)
    np.testing.assert_array_equal(out, np.asarray(want))


def test_flip_probability_one_half(rng):
    size = int(rng.integers(5, 12))
    deit = da.Deit(image_size=size, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0),
                   **dict(PLAIN, flip=True))
    image = _images(rng, 1, size, size)[0]
    flips = 0
    for i in range(400):
        out = deit.train_image(image, np.random.default_rng([_seed(rng), i]))
        same, mirrored = np.array_equal(out, image), np.array_equal(out, image[:, ::-1])
        assert same != mirrored
        flips += mirrored
    assert 150 < flips < 250  # Binomial(400, 1/2): 10 standard deviations wide


@pytest.mark.parametrize("ratio", [0.875, 0.9, 1.0])
def test_eval_resize_and_centre_crop(rng, ratio):
    size = int(rng.integers(9, 40))
    deit = da.Deit(image_size=size, eval_crop_ratio=ratio)
    assert deit.eval_resize == int(size / ratio)
    # A short side already at eval_resize is not resampled: the crop is exact.
    h, w = deit.eval_resize, deit.eval_resize + int(rng.integers(0, 30))
    if rng.random() < 0.5:
        h, w = w, h
    image = _images(rng, 1, h, w)[0]
    out = deit.eval_image(image)
    top, left = int(round((h - size) / 2)), int(round((w - size) / 2))
    np.testing.assert_array_equal(out, image[top:top + size, left:left + size])
    # Any other size: the shorter side goes to eval_resize (torchvision's Resize(int) rule).
    h, w = int(rng.integers(5, 200)), int(rng.integers(5, 200))
    resized = da.resize_shorter(Image.fromarray(_images(rng, 1, h, w)[0]), deit.eval_resize,
                                deit.resample)
    short, long_ = (w, h) if w <= h else (h, w)
    want = (deit.eval_resize, int(deit.eval_resize * long_ / short))
    assert resized.size == (want if w <= h else want[::-1])
    assert deit.eval_image(_images(rng, 1, h, w)[0]).shape == (size, size, 3)


# --------------------------------------------------------------------------------------------
# RandAugment
# --------------------------------------------------------------------------------------------


def test_randaugment_sampling(rng):
    ra = RandAugment()  # rand-m9-mstd0.5-inc1
    plans = [ra.sample(np.random.default_rng([_seed(rng), i])) for i in range(3000)]
    applied = [op for plan in plans for op in plan]
    assert abs(len(applied) / (2 * len(plans)) - 0.5) < 0.03  # each of 2 ops with prob 1/2
    names, levels = zip(*applied)
    counts = np.array([names.count(n) for n in OP_NAMES])
    assert set(names) == set(OP_NAMES) and counts.min() > 0.6 * counts.mean()
    levels = np.array(levels)
    assert abs(levels.mean() - 9.0) < 0.05 and abs(levels.std() - 0.5) < 0.05
    assert levels.max() <= MAX_LEVEL
    clipped = np.array([lvl for plan in (RandAugment(magnitude=9.9).sample(
        np.random.default_rng([_seed(rng), i])) for i in range(500)) for _, lvl in plan])
    assert clipped.max() == MAX_LEVEL and np.mean(clipped == MAX_LEVEL) > 0.3
    assert RandAugment(num_ops=0).sample(rng) == []
    assert all(lvl == 4.0 for _, lvl in RandAugment(magnitude=4, magnitude_std=0).sample(rng))


def test_randaugment_pixel_ops(rng):
    ra, old = RandAugment(), RandAugment(increasing=False)
    array = _images(rng, 1, int(rng.integers(7, 30)), int(rng.integers(7, 30)))[0]
    img = Image.fromarray(array)
    x = array.astype(int)

    def op(name, level, policy=ra):
        return np.asarray(policy.apply(img, name, level, rng)).astype(int)

    np.testing.assert_array_equal(op("invert", 9), 255 - x)
    assert set(np.unique(op("posterize", 9))) <= {0, 128}  # 4 - int(3.6) = 1 bit
    assert np.all(op("posterize", 0) % 16 == 0)  # 4 bits
    assert np.all(op("posterize", 10) == 0)  # 0 bits: black
    assert np.all(op("posterize", 9, old) % 32 == 0)  # inc0: int(3.6) = 3 bits
    np.testing.assert_array_equal(op("solarize", 9), np.where(x >= 26, 255 - x, x))  # 256-230
    np.testing.assert_array_equal(op("solarize", 9, old), np.where(x >= 230, 255 - x, x))
    np.testing.assert_array_equal(op("solarize_add", 10),
                                  np.where(x < 128, np.minimum(x + 110, 255), x))
    for name in ("auto_contrast", "equalize", "shear_x", "shear_y", "rotate"):
        assert op(name, 9).shape == x.shape
    np.testing.assert_array_equal(op("rotate", 0), x)
    for name, kind in (("brightness", "Brightness"), ("color", "Color"),
                       ("contrast", "Contrast"), ("sharpness", "Sharpness")):
        options = [np.asarray(getattr(ImageEnhance, kind)(img).enhance(f)).astype(int)
                   for f in (1.9, 0.1)]  # 1 +- 0.9 at level 10
        got = op(name, 10)
        assert any(np.array_equal(got, o) for o in options), name
        np.testing.assert_array_equal(op(name, 10, old), options[0])  # inc0: 0.1 + 1.8 t


def test_randaugment_translate_and_rotate(rng):
    width, height = 20 * int(rng.integers(1, 3)), 20 * int(rng.integers(1, 3))
    array = _images(rng, 1, height, width)[0]
    img = Image.fromarray(array)
    shift = int(0.45 * width)  # level 10: 45% of the width, either way
    out = np.asarray(RandAugment().apply(img, "translate_x", 10.0, rng))
    if np.array_equal(out[:, :width - shift], array[:, shift:]):
        assert np.all(out[:, width - shift:] == FILL)
    else:
        np.testing.assert_array_equal(out[:, shift:], array[:, :width - shift])
        assert np.all(out[:, :shift] == FILL)
    rotated = np.asarray(RandAugment().apply(img, "rotate", 10.0, rng))
    assert any(np.array_equal(rotated, np.asarray(img.rotate(
        a, resample=Image.Resampling.BICUBIC, fillcolor=FILL))) for a in (30.0, -30.0))


def test_randaugment_bad_values():
    for kwargs, name in ((dict(num_ops=-1), "num_ops"), (dict(magnitude=11), "magnitude"),
                         (dict(magnitude_std=-1), "magnitude_std"), (dict(prob=2), "prob")):
        with pytest.raises(ValueError, match=f"randaugment.{name} must be"):
            RandAugment(**kwargs)


# --------------------------------------------------------------------------------------------
# Random erasing, colour jitter, determinism
# --------------------------------------------------------------------------------------------


def test_erase_box_geometry(rng):
    size = int(rng.integers(60, 90)) | 1
    areas, ratios = [], []
    for _ in range(2000):
        top, left, h, w = da.erase_box(size, size, rng)
        assert 0 <= top and top + h <= size and 0 <= left and left + w <= size
        areas.append(h * w / size**2)
        ratios.append(h / w)
    # h and w are rounded to integers: each side off by at most 0.5 px, relative to the
    # smallest side the box can have (area 0.02, aspect 0.3)
    t = 0.5 / (math.sqrt(0.02 * 0.3) * size)
    assert min(areas) >= 0.02 * (1 - t) ** 2 and max(areas) <= (1 / 3) * (1 + t) ** 2
    assert min(ratios) >= 0.3 * (1 - t) / (1 + t) and max(ratios) <= (1 / 0.3) * (1 + t) / (1 - t)


def test_erasing_probability_and_noise(rng):
    size, prob = int(rng.integers(9, 20)), float(rng.uniform(0.15, 0.35))
    deit = da.Deit(image_size=size, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0),
                   **dict(PLAIN, erase_prob=prob))
    image = np.full((size, size, 3), 7, np.uint8)
    erased, noise = 0, []
    n = 800
    for i in range(n):
        out = deit.train_image(image, np.random.default_rng([_seed(rng), i]))
        changed = np.any(out != 7, axis=-1)
        if changed.any():
            erased += 1
            rows, cols = np.nonzero(changed)
            box = out[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
            noise.append(box.reshape(-1))
    sigma = math.sqrt(n * prob * (1 - prob))
    assert abs(erased - n * prob) < 5 * sigma
    noise = np.concatenate(noise).astype(float)
    assert abs(noise.mean() - 127.5) < 3  # 127.5 (1 + z), z ~ N(0, 1), clipped to bytes
    assert abs(np.mean((noise == 0) | (noise == 255)) - 0.3173) < 0.03  # |z| > 1


def test_color_jitter_only_without_randaugment(rng):
    size = int(rng.integers(5, 12))
    image = _images(rng, 1, size, size)[0]
    base = dict(image_size=size, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), erase_prob=0.0,
                flip=False)
    jitter = da.Deit(**base, randaugment=dict(num_ops=0), color_jitter=0.3)
    outs = [jitter.train_image(image, np.random.default_rng([_seed(rng), i])) for i in range(5)]
    assert all(not np.array_equal(o, image) for o in outs)
    plain = da.Deit(**base, randaugment=dict(num_ops=0), color_jitter=0.0)
    np.testing.assert_array_equal(plain.train_image(image, rng), image)


def test_train_image_is_a_function_of_the_seed(rng):
    deit = da.Deit(image_size=int(rng.integers(9, 33)))
    image = _images(rng, 1, int(rng.integers(20, 50)), int(rng.integers(20, 50)))[0]
    seed = _seed(rng)
    a = deit.train_image(image, np.random.default_rng(seed))
    np.testing.assert_array_equal(a, deit.train_image(image, np.random.default_rng(seed)))
    others = [deit.train_image(image, np.random.default_rng(seed + k)) for k in (1, 2, 3)]
    assert not all(np.array_equal(a, o) for o in others)


# --------------------------------------------------------------------------------------------
# Mixup / cutmix
# --------------------------------------------------------------------------------------------


def _constant_batch(batch, size):
    """Image i filled with the value 10 + i; labels 0..B-1 (distinct)."""
    values = 10 + np.arange(batch)
    images = np.broadcast_to(values[:, None, None, None], (batch, size, size, 3))
    return images.astype(np.uint8).copy(), np.arange(batch)


@pytest.mark.parametrize("kind", ["cutmix", "mixup"])
def test_mix_targets_match_the_images(rng, kind):
    batch, size = 2 * int(rng.integers(2, 6)) + int(rng.integers(0, 2)), int(rng.integers(7, 30))
    alphas = dict(mixup_alpha=0.0, cutmix_alpha=1.0) if kind == "cutmix" else dict(
        mixup_alpha=0.8, cutmix_alpha=0.0)
    deit = da.Deit(image_size=size, **alphas)
    images, labels = _constant_batch(batch, size)
    num_classes = batch + int(rng.integers(0, 3))
    for trial in range(20):
        out, targets = deit.mix(images, labels, np.random.default_rng([_seed(rng), trial]),
                                num_classes=num_classes)
        assert out.dtype == np.uint8 and out.shape == images.shape
        assert targets.dtype == np.float32 and targets.shape == (batch, num_classes)
        np.testing.assert_allclose(targets.sum(1), 1.0, rtol=1e-6)
        for i in range(batch):
            j = batch - 1 - i
            own = targets[i, i] if i != j else 1.0
            if i == j:  # the middle of an odd batch is mixed with itself
                assert targets[i, i] == pytest.approx(1.0)
                continue
            assert targets[i, i] + targets[i, j] == pytest.approx(1.0, abs=1e-6)
            if kind == "cutmix":  # the pasted area is exactly the partner's weight
                pasted = np.mean(out[i, :, :, 0] == 10 + j)
                assert np.all((out[i] == 10 + i) | (out[i] == 10 + j))
                assert pasted == pytest.approx(targets[i, j], abs=1e-6)
            else:  # every pixel lam x_i + (1 - lam) x_j, rounded
                want = own * (10 + i) + (1 - own) * (10 + j)
                assert np.all(np.abs(out[i].astype(float) - want) <= 0.5 + 1e-4)


def test_mix_switch_and_lambda_distributions(rng):
    deit = da.Deit()
    params = [deit.mix_params(np.random.default_rng([_seed(rng), i])) for i in range(4000)]
    cut = np.array([c for _, c in params])
    lams = np.array([lam for lam, _ in params])
    assert abs(cut.mean() - 0.5) < 0.04
    assert abs(lams[cut].var() - 1 / 12) < 0.01  # Beta(1, 1): uniform
    assert abs(lams[~cut].var() - 1 / (4 * (2 * 0.8 + 1))) < 0.01  # Beta(0.8, 0.8)
    assert da.Deit(mix_prob=0.0).mixes is False
    assert da.Deit(mixup_alpha=0.0, cutmix_alpha=0.0).mixes is False
    half = [da.Deit(mix_prob=0.5).mix_params(np.random.default_rng([_seed(rng), i]))[0]
            for i in range(2000)]
    assert abs(np.mean(np.array(half) == 1.0) - 0.5) < 0.05


def test_cutmix_box(rng):
    size = int(rng.integers(10, 60))
    for _ in range(200):
        lam = float(rng.uniform())
        y0, y1, x0, x1 = da.cutmix_box(size, lam, rng)
        cut = int(size * math.sqrt(1 - lam))
        assert 0 <= y0 <= y1 <= size and 0 <= x0 <= x1 <= size
        assert y1 - y0 <= 2 * (cut // 2) and x1 - x0 <= 2 * (cut // 2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(crop_scale=(0.5, 0.1)), "config.augment.crop_scale must be"),
    (dict(crop_ratio=(0.0, 1.0)), "config.augment.crop_ratio must be"),
    (dict(interpolation="lanczos"), "config.augment.interpolation must be one of bicubic"),
    (dict(erase_prob=1.5), "config.augment.erase_prob must be in [0, 1], got 1.5"),
    (dict(mixup_alpha=-1.0), "config.augment.mixup_alpha must be >= 0"),
    (dict(repeated_aug=0), "config.augment.repeated_aug must be an int >= 1"),
    (dict(image_size=0), "config.augment.image_size must be an int >= 1"),
    (dict(eval_crop_ratio=1.2), "config.augment.eval_crop_ratio must be in (0, 1]"),
    (dict(num_workers=-2), "config.augment.num_workers must be an int >= -1"),
    (dict(randaugment=dict(magnitude=12)), "config.augment.randaugment.magnitude must be"),
    (dict(randaugment=dict(ops=2)), "config.augment.randaugment: got an unexpected keyword"),
])
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError) as e:
        da.Deit(**kwargs)
    assert "\n" not in str(e.value) and str(e.value).startswith(message), str(e.value)


# --------------------------------------------------------------------------------------------
# The worker pipeline
# --------------------------------------------------------------------------------------------


class Counting:
    """A sequence of images of varying sizes that counts its reads (decode on access)."""

    def __init__(self, rng, n):
        self.images = [_images(rng, 1, int(rng.integers(12, 30)), int(rng.integers(12, 30)))[0]
                       for _ in range(n)]
        self.reads = 0

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        self.reads += 1
        return self.images[i]


def _pipeline(images, labels, batch_size, seed, executor=None, **kwargs):
    deit = da.Deit(image_size=11)
    mix = lambda x, y, r: deit.mix(x, y, r, num_classes=7)  # noqa: E731
    return ImageBatches(images, labels, batch_size, transform=deit.train_image, mix=mix,
                        shuffle=True, seed=seed, drop_remainder=True, executor=executor,
                        chunk_size=3, **kwargs)


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize("repeats", [1, 3])
def test_workers_match_single_thread_and_resume_exactly(rng, repeats):
    n, batch_size, seed = int(rng.integers(23, 35)), int(rng.integers(5, 8)), _seed(rng)
    images, labels = Counting(rng, n), rng.integers(0, 7, n)
    single = _pipeline(images, labels, batch_size, seed, repeats=repeats)
    steps = 2 * single.steps_per_epoch + 1  # into a third epoch
    expected = [next(single) for _ in range(steps)]
    for b in expected:
        assert b["images"].shape == (batch_size, 11, 11, 3) and b["images"].dtype == np.uint8
        assert b["targets"].shape == (batch_size, 7) and b["labels"].dtype == np.int32
        np.testing.assert_array_equal(b["mask"], np.ones(batch_size, np.float32))
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        pooled = _pipeline(images, labels, batch_size, seed, pool, repeats=repeats, prefetch=3)
        _assert_same([next(pooled) for _ in range(steps)], expected)
        for stop in (1, single.steps_per_epoch, steps - 1):  # mid-epoch and at a boundary
            first = _pipeline(images, labels, batch_size, seed, pool, repeats=repeats)
            head = [next(first) for _ in range(stop)]
            state = json.loads(json.dumps(first.get_state()))
            resumed = _pipeline(images, labels, batch_size, seed, pool, repeats=repeats)
            resumed.set_state(state)
            _assert_same(head + [next(resumed) for _ in range(steps - stop)], expected)
            first.close()
    other = _pipeline(images, labels, batch_size, seed + 1, repeats=repeats)
    assert not np.array_equal(next(other)["images"], expected[0]["images"])


def test_repeated_augmentation_order(rng):
    """Each image of the epoch's permutation 3 times in a row, N samples an epoch, and the
    copies augmented differently."""
    n, seed = int(rng.integers(20, 40)), _seed(rng)
    deit = da.Deit(image_size=11)
    it = ImageBatches(Counting(rng, n), rng.integers(0, 7, n), 3, transform=deit.train_image,
                      shuffle=True, seed=seed, drop_remainder=True, repeats=3)
    order = it.epoch_order(int(rng.integers(0, 5)))
    assert order.size == n
    runs = order[:n // 3 * 3].reshape(-1, 3)
    assert np.all(runs == runs[:, :1]) and len(set(runs[:, 0])) == n // 3
    images = next(it)["images"]  # one image, three augmentations
    assert not np.array_equal(images[0], images[1]) and not np.array_equal(images[1], images[2])


def test_eval_pass_pads_and_stops(rng):
    n, batch_size = int(rng.integers(10, 20)), int(rng.integers(3, 6))
    images, labels = Counting(rng, n), rng.integers(0, 7, n)
    deit = da.Deit(image_size=9)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for executor in (None, pool):
            it = ImageBatches(images, labels, batch_size, transform=deit.eval_image,
                              shuffle=False, seed=0, drop_remainder=False, num_epochs=1,
                              executor=executor, chunk_size=2)
            batches = list(it)
            assert len(batches) == -(-n // batch_size) == it.steps_per_epoch
            mask = np.concatenate([b["mask"] for b in batches])
            assert mask.sum() == n and np.all(mask[n:] == 0)
            got = np.concatenate([b["images"] for b in batches])[:n]
            np.testing.assert_array_equal(got, [deit.eval_image(x) for x in images.images])
            np.testing.assert_array_equal(np.concatenate([b["labels"] for b in batches])[:n],
                                          labels)
            assert "targets" not in batches[0]
            assert np.all(batches[-1]["images"][mask[-batch_size:] == 0] == 0)


def test_set_state_before_first_batch_wastes_no_work(rng):
    n = 30
    images = Counting(rng, n)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        it = _pipeline(images, rng.integers(0, 7, n), 5, _seed(rng), pool, prefetch=2)
        it.set_state({"epoch": 2, "position": 10})
        assert images.reads == 0
        next(it)
        pool.shutdown(wait=True)
    assert images.reads <= 2 * 5
    with pytest.raises(ValueError, match="position must be a multiple of batch_size"):
        it.set_state({"epoch": 0, "position": 3})
