"""DeiT's training augmentation and evaluation transform, on the host (PIL and numpy).

Written from the documented behaviour of DeiT's recipe (Touvron et al. 2021; timm's
``create_transform``, ``RandomErasing`` and ``Mixup`` as DeiT configures them), which the LION
paper's image models follow (Table 13). Conventions: an image is a uint8 numpy array
``[H, W, 3]`` (RGB) in and out; a batch is uint8 ``[B, S, S, 3]``; all randomness comes from an
explicit ``np.random.Generator``, so the result is a function of the generator's seed.

Training, per image (:meth:`Deit.train_image`), in DeiT's order:

1. **Random resized crop** (torchvision's ``RandomResizedCrop`` rule): up to 10 tries of an
   area fraction uniform in ``crop_scale`` (0.08, 1) and a log-uniform aspect ratio (w / h) in
   ``crop_ratio`` (3/4, 4/3), ``w = round(sqrt(area * ratio))``, ``h = round(sqrt(area /
   ratio))``, kept when it fits and placed uniformly; else the largest centred crop whose ratio
   is clamped into ``crop_ratio``. The crop is resized to ``image_size`` squared
   (``interpolation``, bicubic). Small images (CIFAR's 32 px) are upsampled by this step.
2. **Horizontal flip** with probability 1/2 (``flip``).
3. **RandAugment** (``randaugment``; experiments/data/randaugment.py), DeiT's
   ``rand-m9-mstd0.5-inc1``. When it is off (``randaugment.num_ops=0``), **colour jitter**
   instead: brightness, contrast and saturation factors uniform in ``[1 - j, 1 + j]``
   (``color_jitter``, 0.3), applied in a random order. timm applies the jitter only without
   RandAugment, so DeiT (and Table 13's "color jitter 0.3") never uses both.
4. **Random erasing** with probability ``erase_prob`` (0.25; timm's ``mode="pixel"``, one box):
   up to 10 tries of an area fraction uniform in [0.02, 1/3] and a log-uniform aspect ratio in
   [0.3, 1/0.3], ``h = round(sqrt(area * ratio))``, ``w = round(sqrt(area / ratio))``, kept
   when ``h < H`` and ``w < W``, placed uniformly; the box gets per-pixel Gaussian noise of the
   normalised space. The task normalises ``x / 127.5 - 1``, so noise ``z ~ N(0, 1)`` is the byte
   ``127.5 (1 + z)``, rounded and clipped to [0, 255] (noise beyond one standard deviation
   saturates: the price of uint8 batches).

Training, per batch (:meth:`Deit.mix`; timm's ``Mixup`` in ``mode="batch"``): with probability
``mix_prob`` (1) the batch is mixed: **cutmix** with probability ``switch_prob`` (0.5) and
``lam ~ Beta(cutmix_alpha, cutmix_alpha)`` (1.0), else **mixup** with ``lam ~
Beta(mixup_alpha, mixup_alpha)`` (0.8). Image ``i`` is mixed with image ``B - 1 - i`` (the
batch reversed). Mixup: ``lam x_i + (1 - lam) x_{B-1-i}``, rounded to bytes (the task's
normalisation is affine, so mixing bytes equals mixing normalised images up to that rounding).
Cutmix: a box of side ``int(S sqrt(1 - lam))`` centred at a uniform pixel, clipped to the image,
is pasted from the partner; ``lam`` becomes the fraction of the image that stayed. The soft
targets are ``lam onehot(y_i) + (1 - lam) onehot(y_{B-1-i})``, float32 ``[B, num_classes]``;
the task applies label smoothing to them (``config.label_smoothing``, 0.1: equal to timm's
smoothed ``mixup_target``). Only one of mixup or cutmix is enabled when the other's alpha is 0;
neither when both are 0 or ``mix_prob`` is 0 (then :meth:`Deit.mixes` is False and batches carry
no targets).

Evaluation (:meth:`Deit.eval_image`): resize the shorter side to ``int(image_size /
eval_crop_ratio)`` (bicubic; 256 for 224, as torchvision's ``Resize(int)``: the longer side
``int(size * long / short)``), then the centred ``image_size`` square (top-left at
``round((H - S) / 2)``, ``round((W - S) / 2)``).

``repeated_aug`` (1: off; DeiT's code uses 3), ``num_workers`` and ``prefetch`` are settings of
the batch pipeline (experiments/data/image_pipeline.py), which the vision task passes on.
"""

import dataclasses
import math
import re

import numpy as np
from PIL import Image, ImageEnhance

from experiments.data.randaugment import RandAugment

INTERPOLATIONS = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}
ERASE_AREA = (0.02, 1 / 3)
ERASE_RATIO = (0.3, 1 / 0.3)
_TRIES = 10


def random_resized_crop_box(height, width, scale, ratio, rng):
    """``(top, left, h, w)`` of a random resized crop of an ``height x width`` image (rule in
    the module docstring, step 1)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(_TRIES):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def erase_box(height, width, rng):
    """``(top, left, h, w)`` of a random-erasing box, or None when no try fits (module
    docstring, step 4)."""
    log_ratio = (math.log(ERASE_RATIO[0]), math.log(ERASE_RATIO[1]))
    for _ in range(_TRIES):
        target = height * width * rng.uniform(*ERASE_AREA)
        aspect = math.exp(rng.uniform(*log_ratio))
        h = int(round(math.sqrt(target * aspect)))
        w = int(round(math.sqrt(target / aspect)))
        if w < width and h < height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    return None


def cutmix_box(size, lam, rng):
    """``(y0, y1, x0, x1)``: the cutmix box of an ``size x size`` image for ``lam`` (side
    ``int(size sqrt(1 - lam))``, centre uniform, clipped)."""
    cut = int(size * math.sqrt(1.0 - lam))
    cy, cx = int(rng.integers(0, size)), int(rng.integers(0, size))
    y0, y1 = np.clip([cy - cut // 2, cy + cut // 2], 0, size)
    x0, x1 = np.clip([cx - cut // 2, cx + cut // 2], 0, size)
    return int(y0), int(y1), int(x0), int(x1)


def resize_shorter(img, size, resample):
    """``img`` (PIL) resized so its shorter side is ``size`` (torchvision's ``Resize(int)``)."""
    w, h = img.size
    if w <= h:
        new = (size, int(size * h / w))
    else:
        new = (int(size * w / h), size)
    return img if new == (w, h) else img.resize(new, resample)


def center_crop(img, size):
    """The centred ``size x size`` crop of ``img`` (PIL; top-left rounded as torchvision)."""
    w, h = img.size
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


@dataclasses.dataclass(frozen=True)
class Deit:
    """DeiT's augmentation settings (``config.augment`` of the vision configs) and the ops.

    Every field is a config key (module docstring for each); ``Deit(**keys)`` checks them and
    raises ``ValueError`` naming the first bad one. ``randaugment`` holds
    :class:`~experiments.data.randaugment.RandAugment`'s arguments (``num_ops=0``: off).
    ``num_workers`` (-1: one per CPU; 0: batches built in the training loop's thread) and
    ``prefetch`` (batches built ahead) configure experiments/data/image_pipeline.py.
    """

    image_size: int = 224
    crop_scale: tuple = (0.08, 1.0)
    crop_ratio: tuple = (3 / 4, 4 / 3)
    interpolation: str = "bicubic"
    flip: bool = True
    randaugment: dict = dataclasses.field(default_factory=lambda: dict(
        num_ops=2, magnitude=9.0, magnitude_std=0.5, increasing=True))
    color_jitter: float = 0.3
    erase_prob: float = 0.25
    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    mix_prob: float = 1.0
    switch_prob: float = 0.5
    repeated_aug: int = 1
    eval_crop_ratio: float = 0.875
    num_workers: int = -1
    prefetch: int = 4

    def __post_init__(self):
        def check(name, ok, what):
            if not ok:
                raise ValueError(f"config.augment.{name} must be {what}, got "
                                 f"{getattr(self, name)!r}")

        def is_int(x):
            return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

        def is_range(x, low, high=math.inf):
            return (isinstance(x, (tuple, list)) and len(x) == 2
                    and low < x[0] <= x[1] <= high)

        check("image_size", is_int(self.image_size) and self.image_size >= 1, "an int >= 1")
        check("crop_scale", is_range(self.crop_scale, 0.0, 1.0),
              "(low, high), 0 < low <= high <= 1")
        check("crop_ratio", is_range(self.crop_ratio, 0.0), "(low, high), 0 < low <= high")
        check("interpolation", self.interpolation in INTERPOLATIONS,
              f"one of {', '.join(INTERPOLATIONS)}")
        for name in ("color_jitter", "mixup_alpha", "cutmix_alpha"):
            check(name, getattr(self, name) >= 0, ">= 0")
        check("color_jitter", self.color_jitter < 1, "< 1 (a factor range [1 - j, 1 + j])")
        for name in ("erase_prob", "mix_prob", "switch_prob"):
            check(name, 0 <= getattr(self, name) <= 1, "in [0, 1]")
        check("repeated_aug", is_int(self.repeated_aug) and self.repeated_aug >= 1, "an int >= 1")
        check("eval_crop_ratio", 0 < self.eval_crop_ratio <= 1, "in (0, 1]")
        check("num_workers", is_int(self.num_workers) and self.num_workers >= -1,
              "an int >= -1 (-1: one per CPU, 0: none)")
        check("prefetch", is_int(self.prefetch) and self.prefetch >= 1, "an int >= 1")
        if not isinstance(self.randaugment, dict):
            check("randaugment", False, "a dict of RandAugment's arguments")
        try:
            object.__setattr__(self, "_randaugment", RandAugment(**self.randaugment))
        except TypeError as e:
            message = re.sub(r"^\S*\(\) ", "", str(e))  # "RandAugment.__init__() got ..."
            raise ValueError(f"config.augment.randaugment: {message}") from None
        except ValueError as e:
            raise ValueError(f"config.augment.{e}") from None
        object.__setattr__(self, "crop_scale", tuple(float(x) for x in self.crop_scale))
        object.__setattr__(self, "crop_ratio", tuple(float(x) for x in self.crop_ratio))

    @property
    def resample(self):
        return INTERPOLATIONS[self.interpolation]

    @property
    def eval_resize(self):
        """Shorter side before the evaluation crop: ``int(image_size / eval_crop_ratio)``."""
        return int(self.image_size / self.eval_crop_ratio)

    @property
    def mixes(self):
        """Whether training batches are mixed (and carry soft targets)."""
        return self.mix_prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    # -- per image ---------------------------------------------------------------------------

    def train_image(self, image, rng):
        """uint8 ``[H, W, 3]`` -> uint8 ``[S, S, 3]`` (``S = image_size``): steps 1-4."""
        img = Image.fromarray(np.asarray(image, np.uint8))
        top, left, h, w = random_resized_crop_box(img.height, img.width, self.crop_scale,
                                                  self.crop_ratio, rng)
        size = (self.image_size, self.image_size)
        img = img.crop((left, top, left + w, top + h)).resize(size, self.resample)
        if self.flip and rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if self._randaugment.num_ops > 0:
            img = self._randaugment(img, rng)
        elif self.color_jitter > 0:
            img = self._jitter(img, rng)
        out = np.array(img, np.uint8)
        if self.erase_prob > 0 and rng.random() < self.erase_prob:
            box = erase_box(self.image_size, self.image_size, rng)
            if box is not None:
                top, left, h, w = box
                noise = 127.5 * (1.0 + rng.standard_normal((h, w, 3)))
                out[top:top + h, left:left + w] = np.clip(np.rint(noise), 0, 255)
        return out

    def _jitter(self, img, rng):
        """Colour jitter (step 3 without RandAugment)."""
        j = self.color_jitter
        factors = rng.uniform(max(0.0, 1 - j), 1 + j, size=3)
        kinds = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)
        for k in rng.permutation(3):
            img = kinds[k](img).enhance(float(factors[k]))
        return img

    def eval_image(self, image, rng=None):
        """uint8 ``[H, W, 3]`` -> uint8 ``[S, S, 3]``: resize the shorter side to
        :attr:`eval_resize`, centre crop ``S``; deterministic (``rng`` unused)."""
        del rng
        img = Image.fromarray(np.asarray(image, np.uint8))
        img = resize_shorter(img, self.eval_resize, self.resample)
        return np.array(center_crop(img, self.image_size), np.uint8)

    # -- per batch ---------------------------------------------------------------------------

    def mix_params(self, rng):
        """``(lam, cutmix)`` of one batch: ``lam`` 1.0 when the batch is not mixed."""
        if not self.mixes or rng.random() >= self.mix_prob:
            return 1.0, False
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            cut = bool(rng.random() < self.switch_prob)
        else:
            cut = self.cutmix_alpha > 0
        alpha = self.cutmix_alpha if cut else self.mixup_alpha
        return float(rng.beta(alpha, alpha)), cut

    def mix(self, images, labels, rng, *, num_classes):
        """Mixup / cutmix of a batch (module docstring).

        Args:
          images: uint8 ``[B, S, S, 3]``; labels: int ``[B]``; rng: the batch's generator;
          num_classes: width of the targets.

        Returns:
          ``(images uint8 [B, S, S, 3], targets float32 [B, num_classes])``, each target row
          summing to 1.
        """
        lam, cut = self.mix_params(rng)
        partner = images[::-1]
        if lam < 1.0 and cut:
            y0, y1, x0, x1 = cutmix_box(images.shape[1], lam, rng)
            images = images.copy()
            images[:, y0:y1, x0:x1] = partner[:, y0:y1, x0:x1]
            lam = 1.0 - (y1 - y0) * (x1 - x0) / float(images.shape[1] * images.shape[2])
        elif lam < 1.0:  # in place, few temporaries: a convex mix of bytes stays in [0, 255]
            mixed = images.astype(np.float32)
            mixed *= lam
            other = partner.astype(np.float32)
            other *= 1.0 - lam
            mixed += other
            images = np.rint(mixed, out=mixed).astype(np.uint8)
        eye = np.eye(num_classes, dtype=np.float32)
        targets = lam * eye[labels] + (1.0 - lam) * eye[labels[::-1]]
        return images, targets.astype(np.float32)
