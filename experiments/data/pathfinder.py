"""Pathfinder and Path-X for the Long Range Arena, generated locally with numpy.

LRA's Pathfinder (32x32) and Path-X (128x128) are the `curv_contour_length_14` sets of the
Pathfinder challenge (Linsley et al. 2018; Kim, Linsley et al. 2020), made by `snakes2.py` of
github.com/drewlinsley/pathfinder, run by `snakes2_wrapper.py`, with the settings listed in the
Pathfinder32 / Pathfinder128 docstrings of LRA's `lra_benchmarks/data/pathfinder.py`
(`LRA_SETTINGS`). This module is our own implementation of that generator, written from reading
its code; it reproduces its images (not its bytes). How we read the original:

* Paddles. A contour ("snake") is a chain of paddles: segments paddle_length pixels long and
  paddle_thickness wide, each drawn with Pillow's `ImageDraw.line` at antialias_scale times the
  resolution in a small patch and shrunk with Pillow's LANCZOS filter (anti-aliasing). Each
  paddle also has a soft mask (0..1): the paddle dilated by a disc of the paddle margin at the
  same scale, shrunk the same way. Every image draws its margin from paddle_margin_list.
* Growth. A contour starts with a seed paddle in a random whole-degree direction. Each
  extension moves a pivot paddle_length + 2 margin along the last direction; the next paddle's
  head is drawn among the integer points on the circle of radius paddle_length + margin around
  the pivot, with weight cos(min(continuity * turn, 90 deg))^2 * (1 - mask dilated by the
  margin disc at that point) (turn: the change of direction, so turns beyond 90 / continuity
  degrees are excluded), and the paddle is drawn from the head back towards the pivot. Paddles
  are therefore dashes separated by gaps of about 2 margins.
* No-overlap rule. A drawn head is kept iff max(mask + the new paddle's mask) < 1.8; up to
  max_paddle_retrial + 1 heads are drawn, then the contour fails. A paddle's mask joins the
  mask only when the next paddle of its contour is placed, so it constrains later paddles but
  not its successor, and two contours growing in turn do not see each other's latest paddle.
  With soft masks and the 1.8 limit, contours can touch and cross through each other's gaps
  (at 32 px, paddles of different contours may even lie in adjacent pixel rows).
* Target contours. Two contours of contour_length paddles. The first seed's tail is a free
  pixel drawn uniformly at least 2 seed_distance from the border (free: no mask value > 0.3
  under the saturated part of the seed paddle's mask); the second's is seed_distance away from
  it in a random whole-degree direction, without a mask test; a seed is redrawn (up to
  max_paddle_retrial + 1 times) when its head or its pivot (margin behind its tail) leaves the
  image. The two grow in turn, one paddle each. If anything fails, both are redrawn from
  scratch until they fit: that takes about 26 attempts at 32 px, 70 at 128 px with margin 2
  and 650 with margin 3.
* Distractors. num_distractor_snakes contours of distractor_length paddles, seeded at free
  pixels of the whole image (inside a one-pixel frame), with max_distractor_contour_retrial + 1
  tries each, left out when all fail; none is seeded once less than 1% of the image is free.
* Markers. Discs of marker_radius, drawn at antialias_scale and shrunk with LANCZOS, on the
  tail of one target contour (chosen at random) and on the head of the last paddle of the same
  contour (label 1) or of the other one (label 0).
* Contrast. Target paddles have intensity paddle_contrast * snake_contrast (32: 1.5, 128: 0.9),
  distractors snake_contrast (32: 2.0, 128: 0.9), markers 1; everything combines by maximum
  and the image is byte-scaled from its min..max to 0..255 (`scipy.misc.imsave`), so at 32 px
  the brightest paddles, not the markers, are 255.

What the label means: 1 iff the markers sit on the two ends of one contour. It is not a
topological property of the image: paddles of one contour are separated by gaps and contours may
come as close as that, touch or cross. At 32 px a one-pixel dilation of the image joins the two
markers of essentially every image; at 128 px a dilation that joins the markers of 9 positives
in 10 also joins those of about half the negatives. A viewer follows the smooth contour
(tests/test_pathfinder.py states the property it checks).

Deliberate differences from the original:
* Labels are exactly balanced: each consecutive pair of images holds one positive and one
  negative in random order (the original draws every label independently), so every split is
  balanced to within one image.
* The last paddles of both target contours join the mask before the distractors are drawn (the
  original adds only the second contour's, so distractors could touch the first one's end).
* Randomness: numpy Generators, one per block of _BLOCK_SIZE images seeded from (seed, block
  index), instead of the global RandomState; same distributions, different draws. Attempts at
  target pairs run as parallel copies and an image keeps its first success, and free seed
  tails are drawn by rejection (uniform draws in their bounding box until one is free; after
  _FREE_ROUNDS rounds of _FREE_DRAWS the box is enumerated): the same laws as the original's
  sequential retries and uniform choice among enumerated free pixels.
* Pixels outside the image count as occupied for seed tails (the original's `cv2.dilate`
  ignores them, which only ever offers tails whose head leaves the image and is retried).
* Pillow's line drawing, LANCZOS resize and `cv2.dilate` are reimplemented in numpy; drawing and
  resize match Pillow 13 pixel for pixel (tests/test_pathfinder.py). The original ran a 2018
  Pillow, whose polygon fill for wide lines may differ from today's at corners. Paddle patches
  and the marker are rendered once per direction (the original renders each; the marker is
  shifted, identical except within 3 pixels of the border, where Pillow renormalises its
  filter).

Difficulty: LRA's sets are `curv_contour_length_14`; `difficulty` also generates the challenge's
easier `curv_baseline` (contour length 6) and `curv_contour_length_9` (`settings`), e.g. to check
that a model learns the task at all.

Data: tokens are the image bytes row-major (uint8, 0..255), labels int32 (`NUM_CLASSES` = 2).
Generation runs in `num_workers` spawned processes (default: the CPU count; a script calling it
needs the `if __name__ == "__main__":` guard). Measured on a 2-core CPU: 1,330 32x32 images/s
on one worker and 2,900/s on two; 35 128x128 images/s on one, 70/s on two. 200,000 32x32 images
take 73 s there (measured, with the cache write) and about 48 min for Path-X; about 10 s and
6 min on 16 cores (extrapolated). `load_pathfinder` generates once per (resolution,
num_examples, seed) and caches `<cache_dir>/pathfinder<resolution>_<hash>.npz` (uncompressed:
205 MB for Pathfinder, 3.3 GB for Path-X; the hash covers every setting and
_GENERATOR_VERSION); splits are carved from it in generation order.

LRA's official images: `load_pathfinder_images` reads lra_release/pathfinder<resolution> and
caches the decoded arrays. CLI: `python -m experiments.data.pathfinder --resolution 32
[--num_examples N --seed S --cache_dir DIR --num_workers W --examples_png FILE]`.
"""

import argparse
import functools
import hashlib
import json
import math
import multiprocessing
import os
import time
from typing import NamedTuple

import numpy as np

from experiments.data import common

NUM_CLASSES = 2
SPLITS = ("train", "val", "test")

# LRA's generation settings (the Pathfinder32 / Pathfinder128 docstrings of
# lra_benchmarks/data/pathfinder.py over the defaults of snakes2_wrapper.py). Names are the
# original's; distractor_length = contour_length // 3 and num_distractor_snakes = 20 (32) or
# 35 (128) // distractor_length, as Python 2 evaluated them.
LRA_SETTINGS = {
    32: dict(window_size=32, padding=1, antialias_scale=2, paddle_margin_list=(1,),
             seed_distance=7, marker_radius=1.5, contour_length=14, paddle_length=2,
             paddle_thickness=0.5, continuity=1.0, distractor_length=4, num_distractor_snakes=5,
             snake_contrast_list=(2.0,), paddle_contrast_list=(0.75,), max_paddle_retrial=2,
             max_distractor_contour_retrial=4),
    128: dict(window_size=128, padding=1, antialias_scale=2, paddle_margin_list=(2, 3),
              seed_distance=20, marker_radius=3.0, contour_length=14, paddle_length=5,
              paddle_thickness=1.5, continuity=1.8, distractor_length=4, num_distractor_snakes=8,
              snake_contrast_list=(0.9,), paddle_contrast_list=(1.0,), max_paddle_retrial=2,
              max_distractor_contour_retrial=4),
}
RESOLUTIONS = tuple(LRA_SETTINGS)

# The Pathfinder challenge's difficulties (its folder names -> contour_length, in paddles); LRA
# uses the hardest. Distractors follow from the contour length as in LRA_SETTINGS.
DIFFICULTIES = {"curv_baseline": 6, "curv_contour_length_9": 9, "curv_contour_length_14": 14}
DEFAULT_DIFFICULTY = "curv_contour_length_14"
_DISTRACTOR_BUDGET = {32: 20, 128: 35}  # num_distractor_snakes = budget // distractor_length


def settings(resolution, difficulty=DEFAULT_DIFFICULTY):
    """Generation settings of `difficulty` at `resolution`: LRA_SETTINGS[resolution] (which is
    curv_contour_length_14) with its contour_length, distractor_length = contour_length // 3
    and num_distractor_snakes = (20 at 32 px, 35 at 128 px) // distractor_length."""
    length = DIFFICULTIES[difficulty]
    return dict(LRA_SETTINGS[resolution], contour_length=length, distractor_length=length // 3,
                num_distractor_snakes=_DISTRACTOR_BUDGET[resolution] // (length // 3))

# Constants of the original code.
_FREE_LEVEL = 0.3  # a mask pixel is free iff its value <= 0.3 (`ceil(mask - 0.3) == 0`)
_MIN_FREE_FRACTION = 0.01  # distractor seeds stop once < 1% of the image is free
_OVERLAP_LIMIT = 1.8  # a new paddle fits iff max(mask + its mask) < 1.8
_MIN_WEIGHT = 1e-4  # an extension is a dead end when its candidates' total weight is < 1e-4

_GENERATOR_VERSION = 1  # bump whenever generation changes, so old cache files are not reused
_BLOCK_SIZE = {32: 1024, 128: 256}  # images per seeded block (the data depends on it)
_FREE_ROUNDS, _FREE_DRAWS = 4, 8  # rejection sampling of seed positions (module docstring)
_ROUND_ATTEMPTS = 4096  # most parallel attempts at target pairs (`_target_pairs`)
_MAX_ATTEMPT_ROUNDS = 1000  # guard against settings where target pairs never fit


# --------------------------------------------------------------------------------------------
# Stamps: paddles and markers rendered once per setting, as the original renders each one
# --------------------------------------------------------------------------------------------


def _lanczos_matrix(n_in, n_out):
    """Pillow's LANCZOS resampling weights [n_out, n_in] for shrinking n_in pixels to n_out."""
    scale = n_in / n_out
    support = 3.0 * scale
    weights = np.zeros((n_out, n_in))
    for o in range(n_out):
        centre = (o + 0.5) * scale
        lo, hi = max(int(centre - support + 0.5), 0), min(int(centre + support + 0.5), n_in)
        x = (np.arange(lo, hi) - centre + 0.5) / scale
        w = np.where(np.abs(x) < 3.0, np.sinc(x) * np.sinc(x / 3.0), 0.0)
        weights[o, lo:hi] = w / w.sum()
    return weights


def _shrink(images, n_out):
    """Binary images [..., n, n] drawn at 0/255 -> [..., n_out, n_out] in 0..1, as the original's
    `scipy.misc.imresize(..., interp='lanczos') / 255`: Pillow's 8-bit LANCZOS resize, rows
    then columns, each pass rounded and clipped to 0..255."""
    m = _lanczos_matrix(images.shape[-1], n_out)
    rows = np.clip(np.floor(255.0 * images @ m.T + 0.5), 0, 255)
    return np.clip(np.floor(m @ rows + 0.5), 0, 255) / 255.0


def _disc(radius):
    """Integer offsets [k, 2] (dy, dx) with dy^2 + dx^2 <= radius^2 (the original's disc)."""
    r = int(radius)
    dy, dx = np.mgrid[-r:r + 1, -r:r + 1]
    keep = dy**2 + dx**2 <= radius**2
    return np.stack([dy[keep], dx[keep]], axis=1)


def _translate(pos, angle, distance):
    """The original's `translate_coord`: int ceil(pos + distance * (sin, cos)(angle)) [..., 2]."""
    step = np.stack([distance * np.sin(angle), distance * np.cos(angle)], axis=-1)
    return np.ceil(pos + step).astype(np.int64)


def _flip(angle):
    """Angle + pi in [-pi, pi), as the original's `flip_by_pi`."""
    return np.where(angle < 0, angle + np.pi, angle - np.pi)


def _round_away(f):
    """Pillow's ROUND_UP: to the nearest integer, halves away from zero."""
    return np.sign(f) * np.floor(np.abs(f) + 0.5)


def _round_toward(f):
    """Pillow's ROUND_DOWN: to the nearest integer, halves towards zero."""
    return np.sign(f) * np.ceil(np.abs(f) - 0.5)


def _draw_lines(angles, length, width, size):
    """bool [n, size, size]: Pillow's `ImageDraw.line` of `width` from the centre pixel to
    `_translate(centre, angle, length)`, one line per image.

    Width 1 is Bresenham's line as Pillow steps it (the minor coordinate after i steps along
    the major axis is i * |d_minor| / |d_major| rounded half up, in magnitude). A wider line is
    Pillow's quadrilateral with integer corners, filled row by row from its left edge rounded
    half away from zero to its right edge rounded half towards zero (Pillow's scanline fill).
    Both match Pillow 13 pixel for pixel on every paddle direction of LRA_SETTINGS.
    """
    c = size // 2
    d = _translate(np.array([c, c]), angles, length) - c  # [n, 2] (dy, dx)
    dy, dx = (d[:, i, None, None].astype(float) for i in (0, 1))
    y, x = (g[None].astype(float) for g in np.mgrid[:size, :size])  # absolute, as Pillow rounds
    if width == 1:
        steep = np.abs(dy) >= np.abs(dx)
        major, minor = np.where(steep, y - c, x - c), np.where(steep, x - c, y - c)
        d_major, d_minor = np.where(steep, dy, dx), np.where(steep, dx, dy)
        step = major * np.sign(d_major)
        expected = np.sign(d_minor) * np.floor(step * np.abs(d_minor) / np.abs(d_major) + 0.5)
        return (step >= 0) & (step <= np.abs(d_major)) & (minor == expected)
    hyp, half = np.hypot(dx, dy), (width - 1) / 2
    far, near = _round_away(half) / hyp, _round_toward(half) / hyp
    corners = c + np.stack([  # [n, 1, 1, 4, 2] (x, y), in Pillow's order
        np.stack([-_round_toward(near * dy), _round_toward(far * dx)], -1),
        np.stack([dx - _round_toward(near * dy), dy + _round_toward(far * dx)], -1),
        np.stack([dx + _round_toward(far * dy), dy - _round_toward(near * dx)], -1),
        np.stack([_round_toward(far * dy), -_round_toward(near * dx)], -1)], axis=-2)
    (ax, ay), (bx, by) = np.moveaxis(corners, -1, 0), np.moveaxis(np.roll(corners, -1, -2), -1, 0)
    row = y[..., :1, None]  # [1, size, 1, 1]
    flat = ay == by
    slope = np.where(flat, 0, (bx - ax) / np.where(flat, 1, by - ay)).astype(np.float32)
    cross = ((row - ay).astype(np.float32) * slope + ax.astype(np.float32)).astype(float)
    hit = (row >= np.minimum(ay, by)) & (row <= np.maximum(ay, by))
    lo = np.where(hit, np.where(flat, np.minimum(ax, bx), cross), np.inf).min(-1)
    hi = np.where(hit, np.where(flat, np.maximum(ax, bx), cross), -np.inf).max(-1)
    return (x >= _round_away(lo)) & (x <= _round_toward(hi))


def _dilate(images, radius):
    """Max filter of images [n, s, s] over the disc of `radius`, zeros outside; same shape."""
    r = int(radius)
    s = images.shape[-1]
    padded = np.pad(images, ((0, 0), (r, r), (r, r)))
    out = np.zeros_like(images)
    for dy, dx in _disc(radius):
        np.maximum(out, padded[:, r + dy:r + dy + s, r + dx:r + dx + s], out=out)
    return out


def _window(half):
    """Offsets [(2 half + 1)^2, 2] of a square stamp around its centre, row-major."""
    dy, dx = np.mgrid[-half:half + 1, -half:half + 1]
    return np.stack([dy.ravel(), dx.ravel()], axis=1)


def _sparse(window, *stamps):
    """Dense stamps [n, len(window)] -> (offsets [n, K, 2], *stamps [n, K]) over the pixels
    where any stamp is non-zero, padded with distinct zero pixels to a common K."""
    support = np.any([a > 0 for a in stamps], axis=0)
    order = np.argsort(~support, axis=1, kind="stable")[:, :support.sum(1).max()]
    return (window[order], *(np.take_along_axis(a, order, axis=1) for a in stamps))


_NUM_SEED = 360  # seed paddle directions: whole degrees
_LEVELS = np.arange(256) / 255  # mask level k's value, in float64 as the original computes it
_FREE_MAX_LEVEL = int(np.flatnonzero(_LEVELS <= _FREE_LEVEL)[-1])
# _FIT_LIMIT[b]: the highest level a with _LEVELS[a] + _LEVELS[b] < 1.8 (float64, as the
# original computes it), so a paddle fits iff the mask under it is <= _FIT_LIMIT[its mask].
_FIT_LIMIT = np.array([np.flatnonzero(_LEVELS + v < _OVERLAP_LIMIT)[-1] for v in _LEVELS],
                      np.uint8)


class _Tables(NamedTuple):
    """Everything one resolution and paddle margin needs, rendered once.

    Images live on canvases of width^2 pixels: the image plus `pad` pixels per side, flattened
    row-major; offsets are flat (dy * width + dx). Paddles are indexed by a direction id:
    0..359 are seed paddles drawn from their tail at (id - 180) degrees; _NUM_SEED + c is the
    extension paddle of candidate c, drawn from its head back towards the pivot.
    """
    margin: int
    pad: int
    width: int
    frame: np.ndarray  # [width^2] uint8 empty mask: 255 on the padding frame and outside
    frame_near: np.ndarray  # [width^2] `frame` dilated by the margin disc
    stamp: np.ndarray  # [n, K] offsets of each paddle's pixels (padded with distinct pixels)
    line: np.ndarray  # [n, K] paddle intensity in 0..1 (before contrast)
    mask: np.ndarray  # [n, K] uint8 level of the paddle's mask: the paddle dilated by the margin
    limit: np.ndarray  # [n, K] uint8 highest mask level under each pixel that lets it fit
    near_stamp: np.ndarray  # [n, K'] offsets of `mask` dilated by the margin disc
    near: np.ndarray  # [n, K'] uint8 levels of `mask` dilated by the margin disc
    heading: np.ndarray  # [n] direction of travel after each paddle (radians)
    turn_weight: np.ndarray  # [n, C] cos(min(continuity * turn, pi/2))^2 of each candidate
    struct: np.ndarray  # [360, k] offsets a seed's tail needs free (padded by repetition)
    struct_min: np.ndarray  # [360, 2] smallest (dy, dx) of `struct`
    struct_max: np.ndarray  # [360, 2] largest (dy, dx) of `struct`
    step: np.ndarray  # [C, 2] extension candidates: head - pivot (dy, dx)
    marker_stamp: np.ndarray  # [M] offsets of the marker disc
    marker: np.ndarray  # [M] marker disc in 0..1


def _steps(radius, continuity):
    """Extension candidates and turn weights for a circle of `radius` (the original's
    `get_coords_cmf`): the distinct integer points floor(radius * (sin, cos)(a)) for a sampled
    every pixel of arc. Returns (step [C, 2] (dy, dx), heading [360 + C] radians: the direction
    of travel of every paddle direction id, turn_weight [360 + C, C])."""
    arc = np.arange(0, 360, 360.0 / (2 * radius * np.pi)) * np.pi / 180
    step = np.unique(np.floor(radius * np.stack([np.sin(arc), np.cos(arc)], 1)), axis=0)
    heading = np.concatenate([(np.arange(_NUM_SEED) - 180) * np.pi / 180,
                              np.arctan2(step[:, 0], step[:, 1])])
    turn = np.abs(heading[_NUM_SEED:] - heading[:, None])
    turn = np.minimum(turn, 2 * np.pi - turn)
    weight = np.maximum(np.cos(np.minimum(turn * continuity, np.pi / 2)), 0) ** 2
    return step.astype(np.int64), heading, weight


def _seed_structs(window, mask, radius):
    """Offsets a seed's tail needs free, per seed direction: the saturated pixels of the seed
    paddle's mask [360, len(window)], drawn one pixel below-right of the centre of a
    (2 radius + 1)^2 kernel (the original's head-centric `struct` for cv2.dilate).

    Returns (struct [360, k, 2] padded by repetition, its min [360, 2], its max [360, 2]).
    """
    struct = []
    for i in range(_NUM_SEED):
        offsets = window[mask[i] == 255] + 1
        struct.append(offsets[(np.abs(offsets) <= radius).all(1)])
    k = max(len(o) for o in struct)
    padded = np.stack([np.concatenate([o, np.repeat(o[:1], k - len(o), 0)]) for o in struct])
    return padded, np.array([o.min(0) for o in struct]), np.array([o.max(0) for o in struct])


def _marker(radius, aa):
    """(window [M, 2], values [M] in 0..1): a disc of `radius` drawn at aa times the resolution
    and shrunk by aa, centred on a pixel (as the original's `draw_circle`; a shift by whole
    pixels commutes with the shrink, so one stamp serves every position)."""
    half = math.ceil(radius) + 4  # with the filter's reach
    yy, xx = np.mgrid[:(2 * half + 1) * aa, :(2 * half + 1) * aa] - half * aa
    disc = yy**2 + xx**2 <= (radius * aa) ** 2
    return _window(half), _shrink(disc[None], 2 * half + 1).reshape(-1)


@functools.lru_cache(maxsize=None)
def _tables(resolution, margin):
    s = LRA_SETTINGS[resolution]
    length, aa, size = s["paddle_length"], s["antialias_scale"], s["window_size"]
    half = length + math.ceil(s["paddle_thickness"]) + margin  # stamp radius (as the original)
    step, heading, turn_weight = _steps(length + margin, s["continuity"])
    angles = np.concatenate([heading[:_NUM_SEED], _flip(heading[_NUM_SEED:])])  # as drawn
    blown = _draw_lines(angles, length * aa, round(s["paddle_thickness"] * aa), 2 * half * aa + 1)
    line = _shrink(blown, 2 * half + 1).reshape(len(angles), -1)
    mask = np.rint(255 * _shrink(_dilate(blown, margin * aa), 2 * half + 1)).astype(np.uint8)
    near = _dilate(np.pad(mask, ((0, 0), (margin, margin), (margin, margin))), margin)
    mask = mask.reshape(len(angles), -1)
    struct, struct_min, struct_max = _seed_structs(_window(half), mask, length + margin)
    stamp, line, mask = _sparse(_window(half), line, mask)
    near_stamp, near = _sparse(_window(half + margin), near.reshape(len(angles), -1))
    marker_window, marker = _marker(s["marker_radius"], aa)
    # Pivots stay within margin + 1 of the image; candidates reach paddle_length + margin
    # further, their dilated mask the margin beyond that.
    pad = max(length + 3 * margin + 2, half + 1, np.abs(marker_window).max() + 1)
    width = size + 2 * pad
    frame = np.full((1, width, width), 255, np.uint8)
    inner = slice(pad + s["padding"], pad + size - s["padding"])
    frame[:, inner, inner] = 0
    flat = lambda offsets: offsets[..., 0] * width + offsets[..., 1]  # noqa: E731
    return _Tables(
        margin=margin, pad=pad, width=width, frame=frame.reshape(-1),
        frame_near=_dilate(frame, margin).reshape(-1), stamp=flat(stamp), line=line, mask=mask,
        limit=_FIT_LIMIT[mask], near_stamp=flat(near_stamp), near=near, heading=heading,
        turn_weight=turn_weight, struct=flat(struct), struct_min=struct_min,
        struct_max=struct_max, step=step, marker_stamp=flat(marker_window), marker=marker)


# --------------------------------------------------------------------------------------------
# Growing contours, vectorised over the images of a group (one paddle margin)
# --------------------------------------------------------------------------------------------


class _Canvas:
    """The masks of n images as uint8 levels (value level / 255, exactly the original's values)
    in the flat layout of `_Tables`, and the same dilated by the margin disc (`near`).

    Image layers (float64 [n * width^2]) share the layout and its indices (`index`).
    """

    def __init__(self, t, n, size):
        self.n, self.size, self.pad, self.width = n, size, t.pad, t.width
        self.mask, self.near = np.tile(t.frame, n), np.tile(t.frame_near, n)

    def index(self, idx, pos):
        """Flat indices [...] of pixels pos [..., 2] (image coordinates) of images idx [...]."""
        return idx * self.width**2 + (pos[..., 0] + self.pad) * self.width + pos[..., 1] + self.pad

    def rows(self, idx):
        """Copies [k, width^2] of the mask and near mask of images idx."""
        return [a.reshape(self.n, -1)[idx] for a in (self.mask, self.near)]

    def set_rows(self, idx, rows):
        for a, r in zip((self.mask, self.near), rows):
            a.reshape(self.n, -1)[idx] = r

    def inner(self, layer, idx=slice(None)):
        """View [k, size, size] of a layer of this layout (images idx), padding cut off."""
        inner = slice(self.pad, self.pad + self.size)
        return layer.reshape(self.n, self.width, self.width)[idx, inner, inner]


def _paint(layer, where, values):
    """layer = max(layer, values) at the flat indices `where` (no index twice)."""
    layer[where] = np.maximum(layer[where], values)


class _Snake:
    """One contour per image of a group: paddle stamp centres and direction ids, grown in place.

    pos[:, 0] is the seed paddle's tail, pos[:, j > 0] the head of extension j; paddle j is the
    stamp of direction ids[:, j] centred on pos[:, j].
    """

    def __init__(self, n, num_paddles):
        self.pos = np.zeros((n, num_paddles, 2), np.int64)
        self.ids = np.zeros((n, num_paddles), np.int64)
        self.pivot = np.zeros((n, 2), np.int64)

    def set_seed(self, idx, tail, theta, pivot):
        self.pos[idx, 0], self.ids[idx, 0], self.pivot[idx] = tail, theta, pivot

    def add_to_mask(self, t, canvas, idx, j):
        """Adds paddle j of images idx to the mask (and the near mask)."""
        ids, base = self.ids[idx, j], canvas.index(idx, self.pos[idx, j])[:, None]
        _paint(canvas.mask, base + t.stamp[ids], t.mask[ids])
        _paint(canvas.near, base + t.near_stamp[ids], t.near[ids])

    def draw(self, t, canvas, image, idx, contrast):
        """Paints every paddle of images idx into `image` at `contrast`."""
        for j in range(self.pos.shape[1]):
            ids, base = self.ids[idx, j], canvas.index(idx, self.pos[idx, j])[:, None]
            _paint(image, base + t.stamp[ids], t.line[ids] * contrast)


def _inside(pos, size):
    """bool [...]: pos [..., 2] lies in the size x size image."""
    return ((pos >= 0) & (pos < size)).all(-1)


def _free(t, canvas, idx, points, theta):
    """bool [k, m]: the mask is free at points [k, m, 2] + struct of seed direction theta [k]."""
    where = canvas.index(idx[:, None], points)[..., None] + t.struct[theta][:, None]
    return (canvas.mask[where] <= _FREE_MAX_LEVEL).all(-1)


def _free_tail(rng, t, canvas, idx, theta, frame):
    """A uniform draw from the free seed tails of each image idx [k] (seed directions theta).

    Tails p must keep p + struct inside the square [frame, size - frame)^2 (the original's
    frame of the seed mask) and on free mask pixels. Draws are uniform in the bounding box of
    such p and rejected until free; images with no success after _FREE_ROUNDS rounds of
    _FREE_DRAWS draws enumerate their box. Returns (tail [k, 2], found [k]).
    """
    k, size = idx.size, canvas.size
    lo = np.maximum(frame - t.struct_min[theta], 0)
    hi = np.minimum(size - frame - t.struct_max[theta], size)  # exclusive
    tail, found = np.zeros((k, 2), np.int64), np.zeros(k, bool)
    possible = (hi > lo).all(1)
    for _ in range(_FREE_ROUNDS):
        todo = np.flatnonzero(possible & ~found)
        if todo.size == 0:
            break
        points = rng.integers(lo[todo, None], hi[todo, None], (todo.size, _FREE_DRAWS, 2))
        free = _free(t, canvas, idx[todo], points, theta[todo])
        hit = free.any(1)
        tail[todo[hit]] = points[hit, free[hit].argmax(1)]
        found[todo[hit]] = True
    for i in np.flatnonzero(possible & ~found):
        yy, xx = np.mgrid[lo[i, 0]:hi[i, 0], lo[i, 1]:hi[i, 1]]
        box = np.stack([yy.ravel(), xx.ravel()], 1)
        free = np.flatnonzero(_free(t, canvas, idx[i:i + 1], box[None], theta[i:i + 1])[0])
        if free.size:
            tail[i], found[i] = box[rng.choice(free)], True
    return tail, found


def _seed(rng, s, t, canvas, snake, idx, frame, min_free):
    """The original's `seed_snake` (and first target seed) for images idx [k]: ok [k].

    Up to max_paddle_retrial + 1 tries of a random direction and a free tail; a try whose head
    or pivot leaves the image is retried, no free tail at all fails. With `min_free`, images
    with less than that fraction of free pixels fail at once.
    """
    ok = np.ones(idx.size, bool)
    if min_free:
        inner = canvas.inner(canvas.mask, idx)
        ok = (inner <= _FREE_MAX_LEVEL).mean((1, 2)) >= min_free
    done = np.zeros(idx.size, bool)
    for _ in range(s["max_paddle_retrial"] + 1):
        todo = np.flatnonzero(ok & ~done)
        theta = rng.integers(0, _NUM_SEED, todo.size)
        tail, found = _free_tail(rng, t, canvas, idx[todo], theta, frame)
        ok[todo[~found]] = False
        angle = t.heading[theta]
        head = _translate(tail, angle, s["paddle_length"])
        pivot = _translate(head, _flip(angle), s["paddle_length"] + t.margin)
        good = found & _inside(head, canvas.size) & _inside(pivot, canvas.size)
        snake.set_seed(idx[todo[good]], tail[good], theta[good], pivot[good])
        done[todo[good]] = True
    return ok & done


def _seed_near(rng, s, t, canvas, snake, other, idx):
    """The original's second target seed: its tail at seed_distance from `other`'s tail, in a
    random direction (whole degrees, rounded half to even), with no free-mask test."""
    ok = np.zeros(idx.size, bool)
    for _ in range(s["max_paddle_retrial"] + 1):
        todo = np.flatnonzero(~ok)
        theta = rng.integers(0, _NUM_SEED, todo.size)
        away = rng.integers(0, 360, todo.size) * np.pi / 180
        offset = s["seed_distance"] * np.stack([np.sin(away), np.cos(away)], 1)
        tail = np.round(other.pos[idx[todo], 0] + offset).astype(np.int64)
        angle = t.heading[theta]
        head = _translate(tail, angle, s["paddle_length"])
        pivot = _translate(head, _flip(angle), s["paddle_length"] + t.margin)
        good = _inside(head, canvas.size) & _inside(pivot, canvas.size)
        snake.set_seed(idx[todo[good]], tail[good], theta[good], pivot[good])
        ok[todo[good]] = True
    return ok


def _extend(rng, s, t, canvas, snake, idx, j):
    """Adds paddle j to `snake` in images idx [k] (the original's `extend_snake`): ok [k].

    The pivot moves paddle_length + 2 margin along the last direction; a candidate head on the
    circle of radius paddle_length + margin around it gets weight
    cos(min(continuity * turn, pi/2))^2 * (1 - mask dilated by the margin disc). Up to
    max_paddle_retrial + 1 heads are drawn from those weights; the first whose paddle mask fits
    (max(mask + paddle mask) < 1.8) is taken, and paddle j - 1's mask joins the mask.
    """
    last = snake.ids[idx, j - 1]
    pivot = _translate(snake.pivot[idx], t.heading[last], s["paddle_length"] + 2 * t.margin)
    near = _LEVELS[canvas.near[canvas.index(idx[:, None], pivot[:, None] + t.step)]]  # [k, C]
    weight = t.turn_weight[last] * (1 - near)
    total = weight.sum(1)
    ok = total >= _MIN_WEIGHT
    cmf = np.cumsum(weight / np.where(ok, total, 1.0)[:, None], axis=1)
    draws = rng.random((idx.size, s["max_paddle_retrial"] + 1))
    choice = np.argmax(cmf[:, None, :] - draws[:, :, None] > 0, axis=-1)  # [k, tries]
    picked = np.full(idx.size, -1)
    for i in range(choice.shape[1]):
        todo = np.flatnonzero(ok & (picked < 0))
        ids = _NUM_SEED + choice[todo, i]
        head = pivot[todo] + t.step[choice[todo, i]]
        under = canvas.mask[canvas.index(idx[todo], head)[:, None] + t.stamp[ids]]
        fits = (under <= t.limit[ids]).all(-1)
        picked[todo[fits]] = choice[todo[fits], i]
    ok &= picked >= 0
    good, picked = idx[ok], picked[ok]
    snake.add_to_mask(t, canvas, good, j - 1)
    snake.pos[good, j], snake.ids[good, j] = pivot[ok] + t.step[picked], _NUM_SEED + picked
    snake.pivot[good] = pivot[ok]
    return ok


def _grow(rng, s, t, canvas, snakes, ok):
    """Extends `snakes` in turn, one paddle each per round, in the images where ok [n] holds
    (updated in place); where all succeed, the last paddles' masks join the mask."""
    for j in range(1, snakes[0].pos.shape[1]):
        for snake in snakes:
            alive = np.flatnonzero(ok)
            ok[alive] = _extend(rng, s, t, canvas, snake, alive, j)
    for snake in snakes:
        snake.add_to_mask(t, canvas, np.flatnonzero(ok), -1)


def _target_pairs(rng, s, t, canvas):
    """Two target contours in every image of `canvas` (the original's `two_snakes`).

    A failed attempt is redrawn from scratch, as the original's retry loop does. Attempts run
    in rounds of at most _ROUND_ATTEMPTS (memory), several independent copies for each image
    still without a pair: 1 / (success rate so far), so about one success is expected per image
    and round. An image takes its first successful copy (the law of sequential retries).
    Returns the two _Snakes; their masks are written into `canvas`.
    """
    n, length = canvas.n, s["contour_length"]
    pair = (_Snake(n, length), _Snake(n, length))
    todo = np.arange(n)
    tried = succeeded = 0
    for _ in range(_MAX_ATTEMPT_ROUNDS):
        copies = max(1, _ROUND_ATTEMPTS // todo.size)
        if succeeded:
            copies = min(copies, -(-tried // succeeded))
        trial = _Canvas(t, todo.size * copies, canvas.size)
        attempts = np.arange(trial.n)
        a, b = _Snake(trial.n, length), _Snake(trial.n, length)
        frame = max(2 * s["seed_distance"], s["padding"])
        ok = _seed(rng, s, t, trial, a, attempts, frame, min_free=None)
        ok[ok] = _seed_near(rng, s, t, trial, b, a, attempts[ok])
        _grow(rng, s, t, trial, (a, b), ok)
        tried, succeeded = tried + ok.size, succeeded + ok.sum()
        ok = ok.reshape(todo.size, copies)
        done = ok.any(1)
        first = np.flatnonzero(done) * copies + ok[done].argmax(1)
        canvas.set_rows(todo[done], trial.rows(first))
        for full, part in zip(pair, (a, b)):
            full.pos[todo[done]], full.ids[todo[done]] = part.pos[first], part.ids[first]
        todo = todo[~done]
        if todo.size == 0:
            return pair
    raise RuntimeError(f"target contours did not fit in {_MAX_ATTEMPT_ROUNDS} rounds")


def _distractors(rng, s, t, canvas, image, contrast):
    """The original's `make_many_snakes` of num_distractor_snakes short contours per image:
    each gets max_distractor_contour_retrial + 1 tries and is left out when all fail."""
    frame = max(1, s["padding"])  # the seed mask's one-pixel frame
    for _ in range(s["num_distractor_snakes"]):
        todo = np.arange(canvas.n)
        for _ in range(s["max_distractor_contour_retrial"] + 1):
            snake = _Snake(canvas.n, s["distractor_length"])
            saved = canvas.rows(todo)
            ok = np.zeros(canvas.n, bool)
            ok[todo] = _seed(rng, s, t, canvas, snake, todo, frame, _MIN_FREE_FRACTION)
            _grow(rng, s, t, canvas, (snake,), ok)
            failed = ~ok[todo]
            canvas.set_rows(todo[failed], [r[failed] for r in saved])
            snake.draw(t, canvas, image, todo[~failed], contrast)
            todo = todo[failed]
            if todo.size == 0:
                break


def _generate_group(rng, resolution, margin, labels, origin, difficulty=DEFAULT_DIFFICULTY):
    """Images of one paddle margin: (float64 [n, size, size] before the final byte scaling,
    the two target contours as _Snakes).

    labels [n]: 1 puts the second marker on the end of the origin contour, 0 on the end of the
    other one; origin [n] in {0, 1}: the target contour whose tail gets the first marker.
    """
    s, t = settings(resolution, difficulty), _tables(resolution, margin)
    n = labels.size
    canvas = _Canvas(t, n, s["window_size"])
    image = np.zeros(canvas.mask.size)
    every = np.arange(n)
    pair = _target_pairs(rng, s, t, canvas)
    for snake in pair:
        snake.draw(t, canvas, image, every,
                   s["paddle_contrast_list"][0] * s["snake_contrast_list"][0])
    _distractors(rng, s, t, canvas, image, s["snake_contrast_list"][0])
    ends = np.stack([snake.pos[:, [0, -1]] for snake in pair], 1)  # [n, 2 snakes, 2 ends, 2]
    other = np.where(labels == 1, origin, 1 - origin)
    for tip in (ends[every, origin, 0], ends[every, other, 1]):
        _paint(image, canvas.index(every, tip)[:, None] + t.marker_stamp, t.marker)
    return canvas.inner(image), pair


def _to_bytes(images):
    """float [n, h, w] -> uint8, each image scaled from its min..max to 0..255 and rounded (the
    original saves with `scipy.misc.imsave`, which byte-scales that way)."""
    lo = images.min((1, 2), keepdims=True)
    span = images.max((1, 2), keepdims=True) - lo
    scaled = (images - lo) * (255.0 / np.where(span > 0, span, 1.0))
    return (np.clip(scaled, 0, 255) + 0.5).astype(np.uint8)


def _generate_block(resolution, seed, block, difficulty):
    """Block `block` of the data set of `seed`: (uint8 [B, size^2], int32 labels [B])."""
    s = LRA_SETTINGS[resolution]
    size, margins = s["window_size"], s["paddle_margin_list"]
    b = _BLOCK_SIZE[resolution]
    rng = np.random.default_rng([seed, block])
    labels = rng.permuted(np.tile([0, 1], (b // 2, 1)), axis=1).reshape(-1).astype(np.int32)
    origin = rng.integers(0, 2, b)
    margin_index = rng.integers(0, len(margins), b)
    images = np.empty((b, size, size))
    for i, margin in enumerate(margins):
        members = np.flatnonzero(margin_index == i)
        if members.size == 0:  # every image of the block drew another margin
            continue
        images[members], _ = _generate_group(rng, resolution, margin, labels[members],
                                             origin[members], difficulty)
    return _to_bytes(images).reshape(b, size * size), labels


def _block_job(args):
    """`_generate_block(*args)`, for Pool.imap."""
    return _generate_block(*args)


def generate_pathfinder(*, resolution=32, num_examples=200_000, seed=0, num_workers=None,
                        difficulty=DEFAULT_DIFFICULTY):
    """Generates Pathfinder images (no caching; see `load_pathfinder`).

    Images come in blocks of _BLOCK_SIZE[resolution], block i drawn from
    `np.random.default_rng([seed, i])`, so the result is the same for any `num_workers` and the
    first examples are the same for any `num_examples`. With num_workers > 1 the blocks run in
    spawned processes (a calling script needs the `if __name__ == "__main__":` guard).

    Returns:
      (tokens uint8 [num_examples, resolution^2]: the images row-major, 0..255;
       labels int32 [num_examples]: 1 iff the two markers are on one contour).
    """
    _validate_generation(resolution, num_examples, seed, num_workers, difficulty)
    b = _BLOCK_SIZE[resolution]
    jobs = [(resolution, seed, i, difficulty) for i in range(-(-num_examples // b))]
    tokens = np.empty((len(jobs) * b, resolution**2), np.uint8)
    labels = np.empty(len(jobs) * b, np.int32)
    workers = min(num_workers or os.cpu_count() or 1, len(jobs))

    def collect(blocks):
        for i, (block_tokens, block_labels) in enumerate(blocks):
            tokens[i * b:(i + 1) * b], labels[i * b:(i + 1) * b] = block_tokens, block_labels

    if workers == 1:
        collect(map(_block_job, jobs))
    else:  # spawn: a forked child of a process running JAX's threads may deadlock
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            collect(pool.imap(_block_job, jobs))
    return tokens[:num_examples], labels[:num_examples]


# --------------------------------------------------------------------------------------------
# Arguments, splits, cache
# --------------------------------------------------------------------------------------------


def _check_int(name, value, minimum):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _validate_generation(resolution, num_examples, seed, num_workers, difficulty):
    if resolution not in LRA_SETTINGS:
        raise ValueError(f"resolution must be one of {RESOLUTIONS} (Pathfinder, Path-X), "
                         f"got {resolution!r}")
    _validate_difficulty(difficulty)
    _check_int("num_examples", num_examples, 1)
    _check_int("seed", seed, 0)
    if num_workers is not None:
        _check_int("num_workers", num_workers, 1)


def _validate_difficulty(difficulty):
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {', '.join(DIFFICULTIES)}, "
                         f"got {difficulty!r}")


def _validate_split(split, val_fraction, test_fraction):
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
            raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    if val_fraction + test_fraction >= 1:
        raise ValueError(f"val_fraction + test_fraction = {val_fraction + test_fraction} leaves "
                         "no training examples")


def _split_range(split, n, val_fraction, test_fraction):
    """(start, stop) of `split` in n examples ordered train, val, test; val and test have
    round(n * fraction) examples, train the rest (arguments checked by `_validate_split`)."""
    num_val, num_test = round(n * val_fraction), round(n * test_fraction)
    if num_val + num_test >= n:
        raise ValueError(f"val_fraction + test_fraction ({val_fraction} + {test_fraction}) "
                         f"leave no training examples of {n}")
    bounds = np.cumsum([0, n - num_val - num_test, num_val, num_test])
    i = SPLITS.index(split)
    return int(bounds[i]), int(bounds[i + 1])


def cache_path(cache_dir, *, resolution, num_examples, seed, difficulty=DEFAULT_DIFFICULTY):
    """Path of the cache file of a generated data set (every generation parameter is hashed;
    the default difficulty's key is the one of the files cached before difficulties existed)."""
    key = json.dumps(dict(resolution=resolution, num_examples=num_examples, seed=seed,
                          settings=settings(resolution, difficulty),
                          block=_BLOCK_SIZE[resolution],
                          version=_GENERATOR_VERSION), sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return os.path.join(os.path.expanduser(cache_dir), f"pathfinder{resolution}_{digest}.npz")


def _read_split(path, start, stop, order=None):
    """dict(tokens, labels) of examples start:stop (of `order` when given) of a cache file."""
    with np.load(path) as f:
        tokens, labels = f["tokens"], f["labels"]
    pick = slice(start, stop) if order is None else order[start:stop]
    return dict(tokens=np.ascontiguousarray(tokens[pick]), labels=labels[pick].astype(np.int32))


def load_pathfinder(split, *, resolution=32, num_examples=200_000, val_fraction=0.1,
                    test_fraction=0.1, seed=0, cache_dir="~/.cache/lion_jax/pathfinder",
                    num_workers=None, difficulty=DEFAULT_DIFFICULTY):
    """One split of a generated Pathfinder (32) or Path-X (128) set, cached under cache_dir.

    The `num_examples` images are generated once (`generate_pathfinder`) and split in
    generation order: train first, then val (round(N * val_fraction)), then test. Labels are
    balanced to within one example in every split.

    Args:
      split: "train", "val" or "test".
      resolution: 32 (Pathfinder) or 128 (Path-X); `settings(resolution, difficulty)` are the
        generation settings.
      num_examples: size of the whole set (LRA: 200,000).
      val_fraction, test_fraction: fractions of the set in val and test.
      seed: generation seed; the data is a deterministic function of resolution,
        num_examples and seed.
      cache_dir: directory of the cache files (created if missing).
      num_workers: generation processes (default: the CPU count); does not change the data.
      difficulty: one of DIFFICULTIES (`settings`); LRA's is the default.

    Returns:
      dict(tokens=uint8 [n, resolution^2] row-major pixels 0..255, labels=int32 [n] in {0, 1}).
    """
    _validate_generation(resolution, num_examples, seed, num_workers, difficulty)
    _validate_split(split, val_fraction, test_fraction)
    start, stop = _split_range(split, num_examples, val_fraction, test_fraction)
    path = cache_path(cache_dir, resolution=resolution, num_examples=num_examples, seed=seed,
                      difficulty=difficulty)
    if not os.path.exists(path):
        name = "Pathfinder" if resolution == 32 else "Path-X"
        print(f"Generating {name} ({num_examples} images of {resolution}x{resolution}, "
              f"{difficulty}, seed {seed}) into {path} ...", flush=True)
        begin = time.perf_counter()
        tokens, labels = generate_pathfinder(resolution=resolution, num_examples=num_examples,
                                             seed=seed, num_workers=num_workers,
                                             difficulty=difficulty)
        common.write_npz(path, dict(tokens=tokens, labels=labels), compressed=False)
        print(f"Generated {name} in {time.perf_counter() - begin:.1f} s", flush=True)
    return _read_split(path, start, stop)


# --------------------------------------------------------------------------------------------
# LRA's official files
# --------------------------------------------------------------------------------------------

FILES_HELP = (
    "download lra_release.gz (linked in the README of "
    "https://github.com/google-research/long-range-arena: "
    "https://storage.googleapis.com/long-range-arena/lra_release.gz), unpack it "
    "(tar xzf lra_release.gz) and point --config.data.data_dir at its pathfinder32 folder "
    "(pathfinder128 for Path-X), the one holding curv_contour_length_14; or use "
    "--config.data.source=generate (the default), which generates the data locally and needs "
    "no download")


def _read_metadata(root):
    """[(relative image path, label)] from root/metadata/<k>.npy (text, one image a line:
    `imgs/<k> sample_<i>.png <i> <label> ...`), files in the order of k."""
    files = [f for f in os.listdir(os.path.join(root, "metadata")) if f.endswith(".npy")]
    if not files:
        raise FileNotFoundError(f"no metadata files {os.path.join(root, 'metadata', '*.npy')}: "
                                f"{FILES_HELP}")
    samples = []
    for name in sorted(files, key=lambda f: int(f[:-4])):
        with open(os.path.join(root, "metadata", name)) as f:
            for line_number, line in enumerate(f, start=1):
                fields = line.split()
                if not fields:
                    continue
                if len(fields) < 4 or fields[3] not in ("0", "1"):
                    raise ValueError(f"{os.path.join(root, 'metadata', name)}:{line_number}: "
                                     f"not a Pathfinder metadata line: {line.strip()!r}")
                samples.append((os.path.join(fields[0], fields[1]), int(fields[3])))
    return samples


def _decode_images(root, samples, resolution):
    """Decodes the PNGs (Pillow) -> (uint8 [n, resolution^2], int32 labels [n]); empty files
    are skipped (LRA's release has one, pathfinder32/curv_baseline/imgs/0/sample_172.png)."""
    from PIL import Image

    tokens, labels = [], []
    for relative, label in samples:
        path = os.path.join(root, relative)
        if os.path.getsize(path) == 0:
            continue
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L"))
        if pixels.shape != (resolution, resolution):
            raise ValueError(f"{path} is {pixels.shape[1]}x{pixels.shape[0]}, expected "
                             f"{resolution}x{resolution}")
        tokens.append(pixels.reshape(-1))
        labels.append(label)
    return np.stack(tokens), np.array(labels, np.int32)


def load_pathfinder_images(split, *, data_dir, resolution=32,
                           difficulty=DEFAULT_DIFFICULTY, val_fraction=0.1,
                           test_fraction=0.1, seed=0, cache_dir="~/.cache/lion_jax/pathfinder"):
    """One split of LRA's official Pathfinder images (lra_release/pathfinder<resolution>).

    Reads `<data_dir>/<difficulty>/metadata/*.npy` and the PNGs they list (decoded once, then
    cached under cache_dir), shuffles the examples with `default_rng(seed)` and splits them
    train / val / test by the fractions (as S4/S5 split LRA's single set).

    Returns:
      dict(tokens=uint8 [n, resolution^2] row-major pixels 0..255, labels=int32 [n] in {0, 1}),
      as `load_pathfinder`.

    Raises:
      FileNotFoundError: no such folder or no metadata; the message says how to get the data.
      ValueError: bad arguments, a malformed metadata line or an image of the wrong size.
    """
    if resolution not in LRA_SETTINGS:
        raise ValueError(f"resolution must be one of {RESOLUTIONS}, got {resolution!r}")
    _validate_difficulty(difficulty)
    _check_int("seed", seed, 0)
    _validate_split(split, val_fraction, test_fraction)
    root = os.path.join(os.path.abspath(os.path.expanduser(data_dir or "")), difficulty)
    if not data_dir or not os.path.isdir(os.path.join(root, "metadata")):
        where = f"{os.path.join(root, 'metadata')} not found" if data_dir else "no data_dir"
        raise FileNotFoundError(f"{where}: {FILES_HELP}")
    key = json.dumps(dict(root=root, resolution=resolution, version=_GENERATOR_VERSION))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = os.path.join(os.path.expanduser(cache_dir), f"pathfinder_files_{digest}.npz")
    if not os.path.exists(path):
        samples = _read_metadata(root)
        print(f"Decoding {len(samples)} Pathfinder images of {root} into {path} ...", flush=True)
        begin = time.perf_counter()
        tokens, labels = _decode_images(root, samples, resolution)
        common.write_npz(path, dict(tokens=tokens, labels=labels), compressed=False)
        print(f"Decoded in {time.perf_counter() - begin:.1f} s", flush=True)
    with np.load(path) as f:
        n = f["labels"].size
    start, stop = _split_range(split, n, val_fraction, test_fraction)
    return _read_split(path, start, stop, order=np.random.default_rng(seed).permutation(n))


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def example_grid(tokens, labels, per_class=8):
    """Images tokens [n, s * s] -> uint8 grid [2 (s + 1), per_class (s + 1)]: the first
    per_class positives on the top row, negatives below, each followed by a grey line."""
    side = math.isqrt(tokens.shape[1])
    rows = []
    for label in (1, 0):
        picks = tokens[labels == label][:per_class].reshape(-1, side, side)
        padded = np.pad(picks, ((0, 0), (0, 1), (0, 1)), constant_values=64)
        rows.append(np.concatenate(list(padded), axis=1))
    return np.concatenate(rows, axis=0)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Generate (and cache) LRA Pathfinder / Path-X.")
    parser.add_argument("--resolution", type=int, default=32, choices=RESOLUTIONS)
    parser.add_argument("--num_examples", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache_dir", default="~/.cache/lion_jax/pathfinder")
    parser.add_argument("--num_workers", type=int, default=None)
    parser.add_argument("--difficulty", default=DEFAULT_DIFFICULTY, choices=list(DIFFICULTIES))
    parser.add_argument("--examples_png", default=None,
                        help="also save 8 positive and 8 negative test images as a PNG grid")
    args = parser.parse_args(argv)
    if args.examples_png:
        try:
            from PIL import Image
        except ImportError:
            parser.error("--examples_png needs Pillow: pip install -e '.[data]' (or pillow)")
    for split in SPLITS:
        d = load_pathfinder(split, resolution=args.resolution, num_examples=args.num_examples,
                            seed=args.seed, cache_dir=args.cache_dir,
                            num_workers=args.num_workers, difficulty=args.difficulty)
        print(f"{split}: {d['labels'].size} images; positive fraction "
              f"{d['labels'].mean():.4f}; mean pixel {d['tokens'].mean():.2f}")
    if args.examples_png:
        Image.fromarray(example_grid(d["tokens"], d["labels"])).save(args.examples_png)
        print(f"examples (top: positive, bottom: negative) in {args.examples_png}")


if __name__ == "__main__":
    main()
