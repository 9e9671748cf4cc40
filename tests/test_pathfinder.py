"""Pathfinder / Path-X generator (markers, labels, contours, Pillow emulation, determinism,
caching, splits, arguments) and the reader of LRA's official images.

What "connected" means here. In the original generator (and so in ours) a contour is a dashed
curve: consecutive paddles are about 2 margins apart, and contours of the image may come as
close as that, touch, or cross through each other's gaps. A flood fill on the image therefore
cannot decide the label: bridging the gaps (32 px: a 1-pixel dilation) joins the markers of
essentially every image, positive or negative, and at 128 px a dilation that joins 9 in 10
positive contours also joins about half the negatives' markers. The label is about contours:
1 iff the two markers sit on the two ends of one contour. So the test finds the markers in the
image independently (threshold, morphological opening, 8-connected components), checks they sit
on the ends of the contours the label says, and checks by a flood fill on each target contour
drawn alone that the contour is one connected chain from end to end once its inter-paddle gaps
are bridged: a positive image has a drawn path between its markers along one contour; a negative
one has its markers on two different contours.
"""

import os
import sys

import numpy as np
import pytest
from PIL import Image, ImageDraw
from scipy import ndimage

from experiments.data import pathfinder as pf

EIGHT = np.ones((3, 3), bool)  # 8-connectivity


def _disc(radius):
    r = int(radius)
    y, x = np.mgrid[-r:r + 1, -r:r + 1]
    return y**2 + x**2 <= radius**2


def _generate(rng, resolution, margin, n, difficulty=pf.DEFAULT_DIFFICULTY):
    """n images of one margin with balanced labels: (uint8 [n, s, s], labels, origin, pair)."""
    labels = rng.permutation(np.tile([0, 1], n // 2))
    origin = rng.integers(0, 2, n)
    images, pair = pf._generate_group(rng, resolution, margin, labels, origin, difficulty)
    return pf._to_bytes(images), labels, origin, pair


def _marker_blobs(image, resolution):
    """8-connected components [s, s] of the marker-shaped bright regions of a uint8 image.

    Markers are the only pixels >= 70% of the image maximum that contain a 2x2 block (32 px:
    the marker's core; paddles are 1 pixel wide) or a radius-2 disc (128 px: paddles are 1.5
    pixels wide, markers have radius 3). At 32 px two touching or crossing paddles can also hold
    a 2x2 block, so there only the blobs at the markers' positions are checked.
    """
    core = np.ones((2, 2), bool) if resolution == 32 else _disc(2)
    bright = image >= 0.7 * image.max()
    return ndimage.label(ndimage.binary_opening(bright, structure=core), structure=EIGHT)[0]


def _contour_alone(resolution, margin, snake):
    """float [n, s, s]: each image's contour `snake` drawn alone at contrast 1."""
    t, size = pf._tables(resolution, margin), pf.LRA_SETTINGS[resolution]["window_size"]
    canvas = pf._Canvas(t, snake.pos.shape[0], size)
    layer = np.zeros(canvas.mask.size)
    snake.draw(t, canvas, layer, np.arange(canvas.n), 1.0)
    return canvas.inner(layer)


@pytest.mark.parametrize("resolution,margin,n,difficulty", [
    (32, 1, 600, pf.DEFAULT_DIFFICULTY), (128, 2, 100, pf.DEFAULT_DIFFICULTY),
    (128, 3, 50, pf.DEFAULT_DIFFICULTY), (32, 1, 200, "curv_baseline")])
def test_markers_sit_on_the_ends_of_contours_as_labelled(rng, resolution, margin, n,
                                                         difficulty):
    images, labels, origin, pair = _generate(rng, resolution, margin, n, difficulty)
    every = np.arange(n)
    tails = np.stack([snake.pos[:, 0] for snake in pair], 1)  # [n, 2 contours, 2]
    heads = np.stack([snake.pos[:, -1] for snake in pair], 1)
    first = tails[every, origin]
    second = heads[every, np.where(labels == 1, origin, 1 - origin)]
    # Gaps between consecutive paddles are 2 margins plus at most one pixel of rounding per
    # axis at each end, so a disc of margin + 1.5 closes them.
    bridge = _disc(margin + 1.5)
    alone = [_contour_alone(resolution, margin, snake) for snake in pair]
    for i in range(n):
        blobs = _marker_blobs(images[i], resolution)
        at_first, at_second = blobs[tuple(first[i])], blobs[tuple(second[i])]
        assert at_first and at_second, f"image {i}: no marker at a contour end"
        if resolution == 128:  # exactly the two markers (merged when they touch)
            assert set(np.unique(blobs)) <= {0, at_first, at_second}, f"image {i}"
        for c in (0, 1):
            chain = ndimage.label(ndimage.binary_dilation(alone[c][i] > 0.1, bridge),
                                  structure=EIGHT)[0]
            assert chain[tuple(tails[i, c])] == chain[tuple(heads[i, c])] != 0, f"image {i}"


def test_target_contours_have_their_length_and_stay_inside(rng):
    s, margin = pf.LRA_SETTINGS[32], 1
    _, _, _, pair = _generate(rng, 32, margin, 100)
    for snake in pair:
        assert snake.pos.shape[1] == s["contour_length"]
        assert np.all((snake.pos >= 0) & (snake.pos < 32))
        # Head j + 1 - head j = margin * u_j + (length + margin) * u_j+1 (unit directions,
        # turns under 90 degrees), up to a pixel of rounding per axis.
        hop = np.linalg.norm(np.diff(snake.pos[:, 1:], axis=1), axis=-1)
        length = s["paddle_length"]
        assert np.all((hop >= length + margin - 2) & (hop <= length + 2 * margin + 1.5))


@pytest.mark.parametrize("resolution", pf.RESOLUTIONS)
def test_drawing_and_shrinking_match_pillow(resolution):
    """Paddles are drawn and shrunk as the original does with Pillow, pixel for pixel."""
    s = pf.LRA_SETTINGS[resolution]
    aa, length = s["antialias_scale"], s["paddle_length"]
    width = round(s["paddle_thickness"] * aa)
    for margin in s["paddle_margin_list"]:
        t = pf._tables(resolution, margin)
        half = length + int(np.ceil(s["paddle_thickness"])) + margin
        size = 2 * half * aa + 1
        angles = np.concatenate([t.heading[:pf._NUM_SEED], pf._flip(t.heading[pf._NUM_SEED:])])
        ours = pf._draw_lines(angles, length * aa, width, size)
        for angle, line in zip(angles, ours):
            head = pf._translate(np.array([size // 2] * 2), angle, length * aa)
            reference = Image.new("F", (size, size), "black")
            ImageDraw.Draw(reference).line([(size // 2, size // 2), (int(head[1]), int(head[0]))],
                                           fill="white", width=width)
            np.testing.assert_array_equal(line, np.array(reference) > 0)
        shrunk = pf._shrink(ours[::7], 2 * half + 1)
        for line, small in zip(ours[::7], shrunk):
            reference = Image.fromarray(line.astype(np.uint8) * 255).resize(
                (2 * half + 1,) * 2, Image.LANCZOS)
            np.testing.assert_array_equal(np.rint(small * 255), np.array(reference))


def test_generation_is_deterministic_balanced_and_independent_of_workers(rng):
    seed = int(rng.integers(2**31))
    tokens, labels = pf.generate_pathfinder(resolution=32, num_examples=1500, seed=seed,
                                            num_workers=1)
    assert tokens.shape == (1500, 32 * 32) and tokens.dtype == np.uint8
    assert labels.shape == (1500,) and labels.dtype == np.int32
    assert np.all(tokens.max(1) == 255)  # each image is scaled to 0..255
    assert np.all(labels.reshape(-1, 2).sum(1) == 1)  # one positive per consecutive pair
    two = pf.generate_pathfinder(resolution=32, num_examples=1500, seed=seed, num_workers=2)
    np.testing.assert_array_equal(two[0], tokens)
    np.testing.assert_array_equal(two[1], labels)
    again, _ = pf.generate_pathfinder(resolution=32, num_examples=600, seed=seed, num_workers=1)
    np.testing.assert_array_equal(again, tokens[:600])  # blocks do not depend on the total
    other, _ = pf.generate_pathfinder(resolution=32, num_examples=600, seed=seed + 1,
                                      num_workers=1)
    assert (other != tokens[:600]).any(1).all()


def test_path_x_size(rng, monkeypatch):
    # blocks of 2: most draws have a block whose images share one of Path-X's two margins
    # (the other margin's group is empty: a ZeroDivisionError before that case was handled)
    monkeypatch.setitem(pf._BLOCK_SIZE, 128, 2)
    tokens, labels = pf.generate_pathfinder(resolution=128, num_examples=6,
                                            seed=int(rng.integers(2**31)), num_workers=1)
    assert tokens.shape == (6, 128 * 128) and tokens.dtype == np.uint8
    assert labels.tolist().count(1) == 3


def test_load_pathfinder_splits_and_reuses_its_cache(tmp_path, rng, capsys, monkeypatch):
    kwargs = dict(resolution=32, num_examples=1100, val_fraction=0.1, test_fraction=0.2,
                  seed=int(rng.integers(2**31)), cache_dir=str(tmp_path), num_workers=1)
    splits = {split: pf.load_pathfinder(split, **kwargs) for split in pf.SPLITS}
    assert "Generating Pathfinder" in capsys.readouterr().out
    assert [splits[s]["labels"].size for s in pf.SPLITS] == [770, 110, 220]
    tokens, labels = pf.generate_pathfinder(resolution=32, num_examples=1100,
                                            seed=kwargs["seed"], num_workers=1)
    np.testing.assert_array_equal(np.concatenate([splits[s]["tokens"] for s in pf.SPLITS]),
                                  tokens)  # disjoint, in generation order
    np.testing.assert_array_equal(np.concatenate([splits[s]["labels"] for s in pf.SPLITS]),
                                  labels)
    for d in splits.values():
        assert d["tokens"].dtype == np.uint8 and d["labels"].dtype == np.int32
        assert abs(2 * d["labels"].sum() - d["labels"].size) <= 1  # balanced within one
    monkeypatch.setattr(pf, "generate_pathfinder", None)  # a second generation would fail
    np.testing.assert_array_equal(pf.load_pathfinder("val", **kwargs)["tokens"],
                                  splits["val"]["tokens"])
    assert capsys.readouterr().out == ""
    assert len(os.listdir(tmp_path)) == 1


def _write_release(root, rng, resolution=32):
    """A stand-in for lra_release/pathfinder<resolution>/curv_contour_length_14: two metadata
    files of 5 images each, one of them an empty PNG (as in LRA's release). Returns {relative
    path: (pixels, label)} of the readable images."""
    images = {}
    for batch in range(2):
        os.makedirs(root / "curv_contour_length_14" / "imgs" / str(batch))
        lines = []
        for i in range(5):
            relative = os.path.join("imgs", str(batch), f"sample_{i}.png")
            path = root / "curv_contour_length_14" / relative
            label = int(rng.integers(2))
            lines.append(f"imgs/{batch} sample_{i}.png {i} {label} 1.0 14 4 2 0.5 1 1\n")
            if batch == 1 and i == 2:
                path.touch()
                continue
            pixels = rng.integers(0, 256, (resolution, resolution), dtype=np.uint8)
            Image.fromarray(pixels).save(path)
            images[relative] = (pixels, label)
        metadata = root / "curv_contour_length_14" / "metadata"
        metadata.mkdir(exist_ok=True)
        (metadata / f"{batch}.npy").write_text("".join(lines))
    return images


def test_load_pathfinder_images_reads_the_release_layout(tmp_path, rng, capsys):
    images = _write_release(tmp_path / "pathfinder32", rng)
    kwargs = dict(data_dir=str(tmp_path / "pathfinder32"), val_fraction=0.2, test_fraction=0.2,
                  seed=3, cache_dir=str(tmp_path / "cache"))
    splits = {split: pf.load_pathfinder_images(split, **kwargs) for split in pf.SPLITS}
    assert "Decoding 10 Pathfinder images" in capsys.readouterr().out
    assert [splits[s]["labels"].size for s in pf.SPLITS] == [5, 2, 2]  # 9 readable images
    tokens = np.concatenate([splits[s]["tokens"] for s in pf.SPLITS])
    labels = np.concatenate([splits[s]["labels"] for s in pf.SPLITS])
    assert tokens.dtype == np.uint8 and tokens.shape == (9, 32 * 32) and labels.dtype == np.int32
    expected = {pixels.tobytes(): label for pixels, label in images.values()}
    assert {t.tobytes(): int(l) for t, l in zip(tokens, labels)} == expected
    for path in (tmp_path / "pathfinder32").rglob("*.png"):  # decoded once, then cached
        path.unlink()
    again = pf.load_pathfinder_images("val", **kwargs)
    np.testing.assert_array_equal(again["tokens"], splits["val"]["tokens"])


def test_load_pathfinder_images_checks_image_size(tmp_path, rng):
    _write_release(tmp_path / "pathfinder128", rng, resolution=32)
    with pytest.raises(ValueError, match="expected 128x128"):
        pf.load_pathfinder_images("train", data_dir=str(tmp_path / "pathfinder128"),
                                  resolution=128, cache_dir=str(tmp_path / "cache"))


def test_missing_release_says_how_to_get_it(tmp_path):
    missing = tmp_path / "lra_release" / "pathfinder32"
    for data_dir in (missing, tmp_path):  # no folder; a folder without metadata
        with pytest.raises(FileNotFoundError) as e:
            pf.load_pathfinder_images("train", data_dir=str(data_dir),
                                      cache_dir=str(tmp_path / "cache"))
        message = str(e.value)
        assert "\n" not in message and str(data_dir) in message
        assert "lra_release.gz" in message and "--config.data.source=generate" in message
    (tmp_path / "curv_contour_length_14" / "metadata").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no metadata files"):
        pf.load_pathfinder_images("train", data_dir=str(tmp_path),
                                  cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("kwargs,match", [
    (dict(resolution=64), r"resolution must be one of \(32, 128\)"),
    (dict(num_examples=0), "num_examples"),
    (dict(seed=-1), "seed"),
    (dict(num_workers=0), "num_workers"),
    (dict(val_fraction=1.0), "val_fraction"),
    (dict(test_fraction=-0.1), "test_fraction"),
    (dict(val_fraction=0.5, test_fraction=0.5), "no training examples"),
    (dict(split="dev"), "split must be one of"),
    (dict(difficulty="curv_contour_length_12"), "difficulty must be one of curv_baseline"),
])
def test_bad_arguments_raise_one_line(tmp_path, kwargs, match):
    kwargs = dict(dict(split="train", num_examples=10, cache_dir=str(tmp_path)), **kwargs)
    with pytest.raises(ValueError, match=match) as e:
        pf.load_pathfinder(kwargs.pop("split"), **kwargs)
    assert "\n" not in str(e.value)
    assert not os.listdir(tmp_path)  # nothing generated


def test_cli_writes_examples_and_says_when_pillow_is_missing(tmp_path, capsys, monkeypatch):
    args = ["--num_examples", "200", "--cache_dir", str(tmp_path / "cache"), "--examples_png"]
    pf.main(args + [str(tmp_path / "grid.png")])
    grid = np.asarray(Image.open(tmp_path / "grid.png"))
    assert grid.shape == (2 * 33, 8 * 33) and grid.dtype == np.uint8
    assert "positive fraction 0.5000" in capsys.readouterr().out

    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL fails
    with pytest.raises(SystemExit):
        pf.main(args + [str(tmp_path / "again.png")])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith("--examples_png needs Pillow: pip install -e '.[data]' (or pillow)")
    assert not (tmp_path / "again.png").exists()


def test_release_reader_checks_the_difficulty(tmp_path):
    with pytest.raises(ValueError, match="difficulty must be one of curv_baseline") as e:
        pf.load_pathfinder_images("train", data_dir=str(tmp_path), difficulty="curv_12")
    assert "\n" not in str(e.value)


def test_settings_are_lra_s():
    assert pf.NUM_CLASSES == 2 and pf.RESOLUTIONS == (32, 128)
    small, large = pf.LRA_SETTINGS[32], pf.LRA_SETTINGS[128]
    assert (small["paddle_length"], small["paddle_thickness"]) == (2, 0.5)
    assert (small["seed_distance"], small["continuity"]) == (7, 1.0)
    assert small["num_distractor_snakes"] == 20 // small["distractor_length"] == 5
    assert large["paddle_margin_list"] == (2, 3) and large["marker_radius"] == 3
    assert large["num_distractor_snakes"] == 35 // large["distractor_length"] == 8
    for s in (small, large):
        assert s["distractor_length"] == s["contour_length"] // 3


def test_difficulties_set_the_contour_and_distractor_lengths(rng):
    for resolution in pf.RESOLUTIONS:
        assert pf.settings(resolution) == pf.LRA_SETTINGS[resolution]  # LRA's is the default
    easy = pf.settings(32, "curv_baseline")
    assert (easy["contour_length"], easy["distractor_length"], easy["num_distractor_snakes"]) \
        == (6, 2, 10)
    assert pf.settings(128, "curv_contour_length_9")["num_distractor_snakes"] == 35 // 3
    labels = rng.permutation(np.tile([0, 1], 20))
    _, pair = pf._generate_group(rng, 32, 1, labels, rng.integers(0, 2, 40), "curv_baseline")
    assert all(snake.pos.shape[1] == 6 for snake in pair)
    keys = {d: pf.cache_path("/c", resolution=32, num_examples=10, seed=0, difficulty=d)
            for d in pf.DIFFICULTIES}
    assert len(set(keys.values())) == 3
    seed = int(rng.integers(2**31))
    hard = pf.generate_pathfinder(num_examples=20, seed=seed, num_workers=1)
    easy_tokens, easy_labels = pf.generate_pathfinder(num_examples=20, seed=seed, num_workers=1,
                                                      difficulty="curv_baseline")
    np.testing.assert_array_equal(easy_labels, hard[1])  # same label draws, other images
    assert (easy_tokens != hard[0]).any(1).all()
