"""RandAugment (Cubuk et al. 2020) as DeiT trains with it: timm's ``rand-m9-mstd0.5-inc1``, on PIL.

Written from the policy's documented behaviour (the RandAugment paper, timm's docs and DeiT's
recipe), with an explicit ``np.random.Generator`` so an image's augmentation is a function of
its seed (experiments/data/image_pipeline.py draws one per image).

Per image (:meth:`RandAugment.__call__`):

* ``num_ops`` ops (2) are drawn uniformly, **with replacement**, from the op set;
* each drawn op is applied with probability ``prob`` (0.5; timm's RandAugment default), at a
  magnitude drawn afresh per op from ``N(magnitude, magnitude_std^2)`` (9, 0.5), clipped to
  ``[0, MAX_LEVEL]`` (10);
* ops with a direction (rotate, shear, translate, the enhancements of the increasing set) take
  either sign with probability 1/2.

The op set ("inc1": ``increasing=True``), 15 ops, ``m`` the magnitude, ``t = m / 10``:

===================  =====================================================================
auto_contrast        ``ImageOps.autocontrast`` (no magnitude)
equalize             ``ImageOps.equalize`` (no magnitude)
invert               ``ImageOps.invert`` (no magnitude)
rotate               ``+-30 t`` degrees about the centre
posterize            keep ``4 - int(4 t)`` bits (increasing: fewer bits as ``m`` grows; 0 bits
                     is black)
solarize             invert the pixels ``>= 256 - int(256 t)``
solarize_add         add ``int(110 t)`` to the pixels ``< 128`` (saturating at 255)
color, contrast,     ``ImageEnhance.<op>`` with factor ``1 +- 0.9 t`` (in [0.1, 1.9])
brightness,
sharpness
shear_x, shear_y     affine shear ``+-0.3 t``
translate_x,         shift by ``+-0.45 t`` of the image width (height)
translate_y
===================  =====================================================================

With ``increasing=False`` (timm's "inc0", the original RandAugment op set) posterize keeps
``int(4 t)`` bits, solarize inverts the pixels ``>= int(256 t)`` and the enhancements take the
factor ``0.1 + 1.8 t`` (so a larger ``m`` is not always a stronger change).

Geometric ops resample bicubically (DeiT's train interpolation) and fill the uncovered pixels
with :data:`FILL`, the ImageNet mean in bytes (what DeiT passes as ``img_mean``).
Images are RGB ``PIL.Image``s; every op returns an image of the same size.
"""

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

MAX_LEVEL = 10.0
FILL = (124, 116, 104)  # round(255 * (0.485, 0.456, 0.406)): DeiT's fill colour
_RESAMPLE = Image.Resampling.BICUBIC


def _signed(value, rng):
    """``value`` or ``-value``, each with probability 1/2."""
    return -value if rng.random() < 0.5 else value


def _affine(img, coeffs):
    """``img`` under PIL's affine map (output pixel (x, y) reads input (a x + b y + c,
    d x + e y + f))."""
    return img.transform(img.size, Image.Transform.AFFINE, coeffs, resample=_RESAMPLE,
                         fillcolor=FILL)


def _posterize(img, bits):
    """Keep the ``bits`` high bits; 0 bits is black (what the mask ``~255`` gives; Pillow's
    ``posterize`` takes 1 to 8 only)."""
    if bits >= 8:
        return img
    if bits <= 0:
        return Image.new(img.mode, img.size)
    return ImageOps.posterize(img, int(bits))


def _solarize_add(img, add, threshold=128):
    lut = [min(255, i + add) if i < threshold else i for i in range(256)]
    return img.point(lut * len(img.getbands()))


def _enhance(kind):
    return lambda img, factor: getattr(ImageEnhance, kind)(img).enhance(factor)


def _ops(increasing):
    """``{name: fn(img, t, rng)}`` with ``t = level / MAX_LEVEL`` in [0, 1]."""
    ops = {
        "auto_contrast": lambda img, t, rng: ImageOps.autocontrast(img),
        "equalize": lambda img, t, rng: ImageOps.equalize(img),
        "invert": lambda img, t, rng: ImageOps.invert(img),
        "rotate": lambda img, t, rng: img.rotate(_signed(30.0 * t, rng), resample=_RESAMPLE,
                                                 fillcolor=FILL),
        "solarize_add": lambda img, t, rng: _solarize_add(img, int(110 * t)),
        "shear_x": lambda img, t, rng: _affine(img, (1, _signed(0.3 * t, rng), 0, 0, 1, 0)),
        "shear_y": lambda img, t, rng: _affine(img, (1, 0, 0, _signed(0.3 * t, rng), 1, 0)),
        "translate_x": lambda img, t, rng: _affine(
            img, (1, 0, _signed(0.45 * t, rng) * img.size[0], 0, 1, 0)),
        "translate_y": lambda img, t, rng: _affine(
            img, (1, 0, 0, 0, 1, _signed(0.45 * t, rng) * img.size[1])),
    }
    enhancements = {name: _enhance(kind) for name, kind in (
        ("color", "Color"), ("contrast", "Contrast"), ("brightness", "Brightness"),
        ("sharpness", "Sharpness"))}
    if increasing:
        ops["posterize"] = lambda img, t, rng: _posterize(img, 4 - int(4 * t))
        ops["solarize"] = lambda img, t, rng: ImageOps.solarize(img, 256 - int(256 * t))
        for name, fn in enhancements.items():
            ops[name] = (lambda fn: lambda img, t, rng: fn(img, 1.0 + _signed(0.9 * t, rng)))(fn)
    else:
        ops["posterize"] = lambda img, t, rng: _posterize(img, int(4 * t))
        ops["solarize"] = lambda img, t, rng: ImageOps.solarize(img, int(256 * t))
        for name, fn in enhancements.items():
            ops[name] = (lambda fn: lambda img, t, rng: fn(img, 0.1 + 1.8 * t))(fn)
    return ops


OP_NAMES = ("auto_contrast", "equalize", "invert", "rotate", "posterize", "solarize",
            "solarize_add", "color", "contrast", "brightness", "sharpness", "shear_x", "shear_y",
            "translate_x", "translate_y")


class RandAugment:
    """RandAugment policy (module docstring); ``RandAugment()`` is ``rand-m9-mstd0.5-inc1``.

    Args:
      num_ops: ops drawn per image (0: the identity).
      magnitude: mean magnitude, in ``[0, MAX_LEVEL]``.
      magnitude_std: standard deviation of the per-op magnitude (0: always ``magnitude``).
      increasing: the "increasing" op set (timm's ``inc1``) or the original one.
      prob: probability that a drawn op is applied.

    Raises:
      ValueError: a value out of range, in one line naming it.
    """

    def __init__(self, num_ops=2, magnitude=9.0, magnitude_std=0.5, increasing=True, prob=0.5):
        checks = (("num_ops", num_ops, isinstance(num_ops, (int, np.integer)) and num_ops >= 0,
                   "an int >= 0"),
                  ("magnitude", magnitude, 0 <= magnitude <= MAX_LEVEL, f"in [0, {MAX_LEVEL}]"),
                  ("magnitude_std", magnitude_std, magnitude_std >= 0, ">= 0"),
                  ("prob", prob, 0 <= prob <= 1, "in [0, 1]"))
        for name, value, ok, what in checks:
            if not ok:
                raise ValueError(f"randaugment.{name} must be {what}, got {value!r}")
        self.num_ops, self.magnitude = int(num_ops), float(magnitude)
        self.magnitude_std, self.prob = float(magnitude_std), float(prob)
        self.increasing = bool(increasing)
        self.ops = _ops(self.increasing)

    def sample(self, rng):
        """The ops one image gets: ``[(name, level), ...]`` in order, the skipped ones left
        out; ``level`` in ``[0, MAX_LEVEL]``."""
        plan = []
        for name in rng.choice(OP_NAMES, self.num_ops, replace=True):
            level = self.magnitude
            if self.magnitude_std > 0:
                level = rng.normal(self.magnitude, self.magnitude_std)
            level = float(np.clip(level, 0.0, MAX_LEVEL))
            if rng.random() < self.prob:
                plan.append((str(name), level))
        return plan

    def apply(self, img, name, level, rng):
        """Op ``name`` at ``level`` on the RGB image ``img`` (signs drawn from ``rng``)."""
        return self.ops[name](img, level / MAX_LEVEL, rng)

    def __call__(self, img, rng):
        """``img`` (RGB ``PIL.Image``) augmented by the ops of :meth:`sample`."""
        for name, level in self.sample(rng):
            img = self.apply(img, name, level, rng)
        return img
