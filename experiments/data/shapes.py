"""Shapes: an embedded 10-class image-classification task, drawn procedurally at any resolution.

The task: name the one foreground shape of an RGB image. Nothing is downloaded; the images are
drawn with numpy, fast enough for `tiny` configs, tests and a CPU notebook.

Classes (`CLASSES`, label = index): disc, ring, square, square_outline, triangle, plus, star
(five points), half_disc, ell (an L), bars (two parallel bars, "="). They differ only by shape:
every class draws its colours, size, position and rotation from the same distributions. (An X
is not a class: under a random rotation it is a plus.)

What varies per image (every parameter drawn independently of the class):
* the shape's size: the radius of its circumscribed circle, uniform in _RADIUS (fractions of the
  image side), and its centre, uniform among the positions that keep that circle inside;
* its rotation, uniform in [0, 2 pi), and a mirror image with probability 1/2 (only the ell
  changes: L or J; so a horizontal flip maps the data distribution to itself); both are also
  drawn where they change nothing;
* the colours: the background uniform in RGB [0, 1]^3; the foreground with a Rec. 601 luma
  (0.299 R + 0.587 G + 0.114 B) uniform among the values at least _MIN_CONTRAST away from the
  background's (lighter or darker), and a random chroma that keeps exactly that luma before the
  rounding to bytes. Every colour keeps at most _SATURATION of its chroma (the background's is
  scaled towards its grey, the foreground's drawn up to that fraction of what its luma allows):
  random colours cost a small ViT much accuracy early on, muted ones less (see below);
* distractors: 1 to _MAX_BLOBS small discs (radius uniform in _BLOB_RADIUS) anywhere in the
  image except where they would touch the shape's circumscribed circle (those are left out, so
  the shape's outline is never changed), each in the foreground colour or, with probability 1/2,
  a random colour. They are drawn under the shape, so neither the foreground colour nor the
  number of its pixels isolates the shape.
Difficulty: least squares on the raw 16 x 16 pixels of 2,000 images reaches 11-13% test
accuracy (chance: 10%) and the exact area of the shape alone 17% (best binning of 20,000 images),
while position-, size- and rotation-free features of the shape's coverage reach 97% at 32 x 32
(tests/test_shapes_data.py checks the first and the last).
Learnability: `configs/vision/shapes.py:quick` (a LION-S ViT of 4 layers of width 64 on 4 x 4
patches, 600 steps of 64 images from 5,000 at 32 x 32) reached 37% test accuracy (one run on 2
CPU cores, 190 s). In a simpler training loop of the same model, 600 steps gave 26% with these
colours, 19% with full chroma and a contrast of 0.3, and 48% with white shapes on black: the
random colours are what makes the task hard early on.

Geometry is continuous: the image is the unit square, x = column and y = row (downwards), pixel
(i, j) of an R x R image is centred at ((j + 0.5) / R, (i + 0.5) / R). Each shape is a signed
distance function (SDF, negative inside) of a unit shape inside the unit disc, rotated, scaled
and moved into place; a pixel's coverage is clip(0.5 - sdf * R, 0, 1) (anti-aliasing over one
pixel). Colours are composited in this order: background, distractors, shape. Images at
resolution R and 2 R are therefore the same scene: the 2R image average-pooled 2 x 2 is close to
the R image (tests/test_shapes_data.py measures it).

Determinism: example i of a split has all its parameters drawn from
`np.random.default_rng([seed, stream, 1, i])` (stream 0, 1, 2 for train, val, test), so an image
depends on (seed, split, i) and the resolution only: not on which other examples are drawn with
it, nor on their number or order. The entropy list always has four entries (SeedSequence gives
[s] and [s, 0] the same state, so lists of different lengths could collide). Labels are exactly
balanced in every block of ten consecutive indices: example i's label is entry i % 10 of the
permutation of 0..9 drawn by `np.random.default_rng([seed, stream, 0, i // 10])`. The splits are
indices 0..n-1 of their streams, so they never share a scene.

Cache: `load_shapes(..., cache_dir=DIR)` stores the splits in
`DIR/shapes_v<_VERSION>_r<resolution>_seed<seed>_train<n>_val<n>_test<n>.npz` (written
atomically) and reads that file on later calls.

Speed (`draw`, one process; numpy uses one core): 15,000 images/s at 32 x 32, 5,500/s at 64 x 64
and 580/s at 224 x 224, measured on 2 CPU cores, Wed Nov 25 2026.
"""

import os
import time

import numpy as np

from experiments.data import common

CLASSES = ("disc", "ring", "square", "square_outline", "triangle", "plus", "star", "half_disc",
           "ell", "bars")
NUM_CLASSES = len(CLASSES)
SPLITS = common.SPLITS
MIN_RESOLUTION = 8

_VERSION = 2  # bump whenever the images change, so old cache files are not reused
_STREAMS = {"train": 0, "val": 1, "test": 2}
_LUMA = np.array([0.299, 0.587, 0.114])  # Rec. 601 weights (sum 1)
_MIN_CONTRAST = 0.4  # least luma difference between foreground and background
_SATURATION = 0.5  # colours keep at most this fraction of their chroma (module docstring)
_RADIUS = (0.18, 0.36)  # circumscribed radius of the shape, fraction of the image side
_MAX_BLOBS = 4
_BLOB_RADIUS = (0.02, 0.05)
_PIXELS_PER_BLOCK = 2**20  # images are rendered in blocks of about this many pixels
# Uniforms each example draws (one `random` call), in this order: (name, count).
_FIELDS = (("radius", 1), ("centre", 2), ("angle", 1), ("mirror", 1), ("background", 3),
           ("luma", 1), ("chroma", 3), ("saturation", 1), ("num_blobs", 1),
           ("blobs", 7 * _MAX_BLOBS))
_NUM_UNIFORMS = sum(n for _, n in _FIELDS)


# --------------------------------------------------------------------------------------------
# Signed distance functions of the unit shapes (inside the unit disc; negative inside)
# --------------------------------------------------------------------------------------------


def _box(x, y, cx, cy, hx, hy):
    """SDF of the axis-aligned box centred at (cx, cy) with half-sizes (hx, hy)."""
    qx, qy = np.abs(x - cx) - hx, np.abs(y - cy) - hy
    return np.hypot(np.maximum(qx, 0), np.maximum(qy, 0)) + np.minimum(np.maximum(qx, qy), 0)


def _polygon(x, y, vertices):
    """SDF of the simple polygon with `vertices` [(x, y), ...] (exact; any winding)."""
    vx, vy = np.asarray(vertices, np.float32).T
    dist2 = (x - vx[0])**2 + (y - vy[0])**2
    sign = np.ones_like(x)
    for i in range(len(vx)):
        j = i - 1
        ex, ey, wx, wy = vx[j] - vx[i], vy[j] - vy[i], x - vx[i], y - vy[i]
        t = np.clip((wx * ex + wy * ey) / (ex * ex + ey * ey), 0, 1)
        dist2 = np.minimum(dist2, (wx - t * ex)**2 + (wy - t * ey)**2)
        above, below, left = y >= vy[i], y < vy[j], ex * wy > ey * wx
        sign[(above & below & left) | ~(above | below | left)] *= -1
    return sign * np.sqrt(dist2)


def _regular(radii, offset=np.pi / 2):
    """Vertices of a star-shaped polygon with len(radii) vertices at equal angles from `offset`."""
    angles = offset + 2 * np.pi * np.arange(len(radii)) / len(radii)
    return np.stack([radii * np.cos(angles), radii * np.sin(angles)], 1)


_TRIANGLE = _regular(np.full(3, 0.95))
_STAR = _regular(np.tile([0.95, 0.42], 5))
_HALF_DISC = 0.85  # radius; the flat side is at y = -radius / 2


def _sdf(name, x, y):
    """SDF of the unit shape `name` at local coordinates x, y (arrays of one shape)."""
    if name == "disc":
        return np.hypot(x, y) - 0.8
    if name == "ring":
        return np.abs(np.hypot(x, y) - 0.63) - 0.17
    if name == "square":
        return _box(x, y, 0, 0, 0.66, 0.66)
    if name == "square_outline":
        return np.maximum(_box(x, y, 0, 0, 0.66, 0.66), -_box(x, y, 0, 0, 0.38, 0.38))
    if name == "triangle":
        return _polygon(x, y, _TRIANGLE)
    if name == "plus":
        return np.minimum(_box(x, y, 0, 0, 0.9, 0.24), _box(x, y, 0, 0, 0.24, 0.9))
    if name == "star":
        return _polygon(x, y, _STAR)
    if name == "half_disc":
        y = y + _HALF_DISC / 2
        return np.maximum(np.hypot(x, y) - _HALF_DISC, -y)
    if name == "ell":
        return np.minimum(_box(x, y, -0.44, 0, 0.21, 0.65), _box(x, y, 0, 0.44, 0.65, 0.21))
    if name == "bars":
        return np.minimum(_box(x, y, 0, -0.38, 0.8, 0.17), _box(x, y, 0, 0.38, 0.8, 0.17))
    raise KeyError(name)


# --------------------------------------------------------------------------------------------
# Scene parameters and rendering
# --------------------------------------------------------------------------------------------


def _labels(indices, seed, stream):
    """int32 [N]: entry i % 10 of the seeded permutation of block i // 10 (module docstring)."""
    blocks, inverse = np.unique(indices // NUM_CLASSES, return_inverse=True)
    perms = np.array([np.random.default_rng([seed, stream, 0, b]).permutation(NUM_CLASSES)
                      for b in blocks.tolist()], np.int32).reshape(-1, NUM_CLASSES)
    return perms[inverse.reshape(-1), indices % NUM_CLASSES]


def _mute(colours):
    """RGB colours [..., 3] with their chroma scaled by _SATURATION (same luma)."""
    grey = (colours @ _LUMA)[..., None]
    return grey + _SATURATION * (colours - grey)


def _foreground(background, luma, chroma, saturation):
    """Foreground colours [N, 3] in [0, 1] with a luma at least _MIN_CONTRAST from the
    background's [N, 3], from uniforms luma [N], chroma [N, 3], saturation [N]."""
    lb = background @ _LUMA
    darker, lighter = np.maximum(lb - _MIN_CONTRAST, 0), np.maximum(1 - _MIN_CONTRAST - lb, 0)
    t = luma * (darker + lighter)  # uniform on [0, lb - c] U [lb + c, 1], joined
    lf = np.where(t < darker, t, t - darker + lb + _MIN_CONTRAST)[:, None]
    c = 2 * chroma - 1
    c -= (c @ _LUMA)[:, None]  # zero luma: lf + s * c has luma lf for every s
    with np.errstate(divide="ignore", invalid="ignore"):  # c = 0: room is inf
        room = np.where(c > 0, (1 - lf) / c, np.where(c < 0, -lf / c, np.inf))
    return np.clip(lf + (_SATURATION * saturation * room.min(1))[:, None] * c, 0, 1)


def _scenes(indices, seed, split):
    """Parameters of the examples `indices` [N] of `split`, as a dict of arrays over N:
    label [N] int32, centre [N, 2] (x, y), radius [N], angle [N], mirror [N] bool (the unit
    shape is mirrored in x before the rotation), background and foreground
    [N, 3] RGB in [0, 1], blob_centre [N, _MAX_BLOBS, 2], blob_radius [N, _MAX_BLOBS],
    blob_colour [N, _MAX_BLOBS, 3], blob_on [N, _MAX_BLOBS] bool."""
    stream = _STREAMS[split]
    u = np.array([np.random.default_rng([seed, stream, 1, i]).random(_NUM_UNIFORMS)
                  for i in indices.tolist()]).reshape(-1, _NUM_UNIFORMS)
    bounds = np.cumsum([0] + [n for _, n in _FIELDS])
    f = {name: u[:, lo:hi].squeeze(1) if hi - lo == 1 else u[:, lo:hi]
         for (name, _), lo, hi in zip(_FIELDS, bounds[:-1], bounds[1:])}
    radius = _RADIUS[0] + (_RADIUS[1] - _RADIUS[0]) * f["radius"]
    centre = radius[:, None] + (1 - 2 * radius[:, None]) * f["centre"]
    background = _mute(f["background"])
    foreground = _foreground(background, f["luma"], f["chroma"], f["saturation"])
    blobs = f["blobs"].reshape(-1, _MAX_BLOBS, 7)
    blob_centre = blobs[..., :2]
    blob_radius = _BLOB_RADIUS[0] + (_BLOB_RADIUS[1] - _BLOB_RADIUS[0]) * blobs[..., 2]
    clear = (np.linalg.norm(blob_centre - centre[:, None], axis=-1)
             > radius[:, None] + blob_radius)
    count = 1 + np.floor(f["num_blobs"] * _MAX_BLOBS)
    own = blobs[..., 3:4] < 0.5  # a random colour instead of the foreground's
    return dict(label=_labels(indices, seed, stream), centre=centre, radius=radius,
                angle=2 * np.pi * f["angle"], mirror=f["mirror"] < 0.5, background=background,
                foreground=foreground, blob_centre=blob_centre, blob_radius=blob_radius,
                blob_colour=np.where(own, _mute(blobs[..., 4:]), foreground[:, None]),
                blob_on=clear & (np.arange(_MAX_BLOBS) < count[:, None]))


def _grid(resolution):
    """Pixel centres as x [1, 1, R] and y [1, R, 1] float32 (module docstring)."""
    g = ((np.arange(resolution) + 0.5) / resolution).astype(np.float32)
    return g[None, None, :], g[None, :, None]


def _coverage(sdf, resolution):
    """Pixel coverage in [0, 1] of a region with signed distance `sdf` (image units)."""
    return np.clip(0.5 - sdf * np.float32(resolution), 0, 1)


def _shape_coverage(s, resolution):
    """float32 [N, R, R]: coverage of the shape of each scene of `s` (`_scenes`)."""
    x, y = _grid(resolution)
    out = np.empty((s["label"].size, resolution, resolution), np.float32)
    for c, name in enumerate(CLASSES):
        sel = np.flatnonzero(s["label"] == c)
        if sel.size == 0:
            continue
        angle, flip = s["angle"][sel], np.where(s["mirror"][sel], -1, 1)
        cx, cy, r, cos, sin, flip = (v.astype(np.float32)[:, None, None] for v in (
            s["centre"][sel, 0], s["centre"][sel, 1], s["radius"][sel], np.cos(angle),
            np.sin(angle), flip))
        dx, dy = (x - cx) / r, (y - cy) / r  # rotated by -angle, then mirrored
        local_x, local_y = flip * (cos * dx + sin * dy), cos * dy - sin * dx
        out[sel] = _coverage(r * _sdf(name, local_x, local_y), resolution)
    return out


def _paint_blobs(image, centre, radius, colour):
    """Paints one disc per image over `image` [n, 3, R, R] (in place): centre [n, 2] (x, y),
    radius [n] <= _BLOB_RADIUS[1], colour [n, 3]; only a window around each disc is computed."""
    resolution = image.shape[-1]
    half = int(np.ceil(_BLOB_RADIUS[1] * resolution + 0.5))  # zero coverage beyond
    offsets = np.arange(-half, half + 1)
    cols, rows = (np.clip(np.floor(c * resolution).astype(np.int64)[:, None] + offsets, 0,
                          resolution - 1) for c in centre.T)  # [n, w] each
    x, y = ((v + np.float32(0.5)) / np.float32(resolution) for v in (cols, rows))
    sdf = np.hypot(x[:, None, :] - centre[:, 0, None, None].astype(np.float32),
                   y[:, :, None] - centre[:, 1, None, None].astype(np.float32))
    alpha = _coverage(sdf - radius[:, None, None].astype(np.float32), resolution)
    at = (np.arange(len(image))[:, None, None], slice(None), rows[:, :, None], cols[:, None, :])
    patch = image[at]  # [n, w, w, 3]; pixels clipped at the border repeat with equal values
    image[at] = patch + alpha[..., None] * (colour.astype(np.float32)[:, None, None] - patch)


def _render(s, resolution):
    """float32 [N, 3, R, R] (channels first) in [0, 1]: the scenes `s` (`_scenes`) at R x R."""
    image = np.empty((s["label"].size, 3, resolution, resolution), np.float32)
    image[:] = s["background"].astype(np.float32)[:, :, None, None]
    for k in range(_MAX_BLOBS):
        on = np.flatnonzero(s["blob_on"][:, k])
        part = image[on]
        _paint_blobs(part, s["blob_centre"][on, k], s["blob_radius"][on, k],
                     s["blob_colour"][on, k])
        image[on] = part
    alpha = _shape_coverage(s, resolution)
    image += alpha[:, None] * (s["foreground"].astype(np.float32)[:, :, None, None] - image)
    return image


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def _check_int(name, value, least):
    """ValueError unless `value` is an int >= least."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")


def draw(indices, resolution, *, seed=0, split="train"):
    """Draws examples `indices` of `split` at `resolution` x `resolution`.

    Args:
      indices: non-negative ints [N] (any order, repeats allowed); example i is the same scene
        whatever else is drawn with it.
      resolution: image side R, >= MIN_RESOLUTION.
      seed: non-negative int; with split and index it fixes the scene.
      split: "train", "val" or "test" (independent streams).

    Returns:
      (images uint8 [N, R, R, 3] RGB, row-major with y downwards; labels int32 [N] in 0..9,
      indices into CLASSES).
    """
    _check_int("resolution", resolution, MIN_RESOLUTION)
    _check_int("seed", seed, 0)
    common.check_split(split)
    indices = np.asarray(indices)
    if indices.ndim != 1 or (indices.size and (indices.dtype.kind not in "iu"
                                               or indices.min() < 0)):
        raise ValueError(f"indices must be a 1-D array of non-negative ints, got {indices!r}")
    indices = indices.astype(np.int64)
    s = _scenes(indices, int(seed), split)
    images = np.empty((indices.size, resolution, resolution, 3), np.uint8)
    block = max(1, _PIXELS_PER_BLOCK // resolution**2)
    for lo in range(0, indices.size, block):
        part = {k: v[lo:lo + block] for k, v in s.items()}
        images[lo:lo + block] = np.floor(_render(part, resolution) * 255 + 0.5).transpose(
            0, 2, 3, 1)
    return images, s["label"]


def _generate(sizes, resolution, seed):
    """{"<split>_images": uint8, "<split>_labels": int32} for the splits of non-zero size."""
    arrays = {}
    for split, n in sizes.items():
        if n:
            arrays[f"{split}_images"], arrays[f"{split}_labels"] = draw(
                np.arange(n), resolution, seed=seed, split=split)
    return arrays


def load_shapes(*, num_train, num_val, num_test, resolution, seed=0, cache_dir=None):
    """The three splits of Shapes at `resolution`, drawn (or read from the cache).

    Split s holds examples 0..num_s - 1 of its stream (`draw(range(num_s), ..., split=s)`);
    labels are exactly balanced when num_s is a multiple of 10.

    Args:
      num_train, num_val, num_test: split sizes, non-negative ints (not all zero).
      resolution: image side R, >= MIN_RESOLUTION.
      seed: non-negative int.
      cache_dir: None or "" (draw every time, printing nothing), or a directory (`~` expanded):
        the splits are drawn once, stored in an npz named after every setting and _VERSION,
        and read from it afterwards.

    Returns:
      (splits, info): splits = {split: {"images": uint8 [n, R, R, 3], "labels": int32 [n]}}
      for each split of non-zero size; info = {"num_classes": 10, "resolution": R,
      "classes": CLASSES}.
    """
    sizes = dict(train=num_train, val=num_val, test=num_test)
    for split, n in sizes.items():
        _check_int(f"num_{split}", n, 0)
    if not any(sizes.values()):
        raise ValueError("num_train, num_val and num_test must not all be 0")
    _check_int("resolution", resolution, MIN_RESOLUTION)
    _check_int("seed", seed, 0)
    sizes, resolution, seed = {k: int(v) for k, v in sizes.items()}, int(resolution), int(seed)
    if not cache_dir:
        arrays = _generate(sizes, resolution, seed)
    else:
        name = (f"shapes_v{_VERSION}_r{resolution}_seed{seed}_train{sizes['train']}_"
                f"val{sizes['val']}_test{sizes['test']}.npz")
        path = os.path.join(os.path.expanduser(cache_dir), name)
        if not os.path.exists(path):
            print(f"Generating shapes (train {sizes['train']} / val {sizes['val']} / test "
                  f"{sizes['test']}, {resolution}x{resolution}, seed {seed}) into {path} ...",
                  flush=True)
            start = time.perf_counter()
            common.write_npz(path, _generate(sizes, resolution, seed))
            print(f"Generated shapes in {time.perf_counter() - start:.1f} s", flush=True)
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
    splits = {split: {"images": arrays[f"{split}_images"], "labels": arrays[f"{split}_labels"]}
              for split in SPLITS if sizes[split]}
    return splits, {"num_classes": NUM_CLASSES, "resolution": resolution, "classes": CLASSES}
