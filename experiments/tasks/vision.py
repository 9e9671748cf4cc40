"""Image classification with Vision Transformers (the LION ViTs and the ViT baseline).

Data: ``config.data.name`` picks a dataset of :data:`DATASETS`; the other keys of
``config.data`` are its loader's arguments (``~`` expanded in ``data_dir`` and ``cache_dir``).
Every dataset gives ``{split: {"images": ..., "labels": int32 [N]}}``, the images uint8
``[N, H, W, 3]`` in memory or, for ImageNet, a sequence of uint8 ``[h, w, 3]`` images decoded
on access. Datasets: ``shapes`` (the embedded procedurally drawn images,
``experiments/data/shapes.py``; no download), ``cifar10`` and ``cifar100``
(``experiments/data/cifar.py``), ``imagenet`` (``experiments/data/imagenet.py``). Missing data
stops with one ``error:`` line saying what to download and which flag points to it.

Model: ``lion_jax.models.VisionTransformer`` with ``config.model`` (``dtype`` /
``param_dtype`` given as names); the class count comes from the dataset and, for learned
positions, ``image_size`` from the images. A bad model key or value stops with one line naming
it, before anything is compiled.

Augmentation, by ``config.augment.pipeline``:

* ``"device"`` (the default, and the shapes configs): the stored images as they are, with
  ``flip``, a random horizontal flip per image on the device, drawn from the step's key.
* ``"deit"``: DeiT's recipe on the host, in a pool of worker threads that prefetch batches
  while the device trains (``experiments/data/deit_augment.py``, ``image_pipeline.py``):
  random resized crop to ``config.augment.image_size``, flip, RandAugment, random erasing,
  mixup / cutmix with soft targets (batch key ``targets``, float32 ``[B, num_classes]``), and
  for evaluation a resize and centre crop. Every other key of ``config.augment`` is a field of
  :class:`~experiments.data.deit_augment.Deit`. The batches depend only on the seed and the
  position in the data, so a resumed run sees the batches the uninterrupted one would.

Inputs are normalised on the device, ``(x / 255 - 0.5) / 0.5`` per channel (DeiT normalises
by ImageNet's channel means and deviations instead; a fixed affine map the first layer absorbs).
Loss: softmax cross-entropy against the batch's soft ``targets`` when it has them, else the
one-hot labels, smoothed by ``config.label_smoothing`` in training; metrics: loss, accuracy of
the argmax against ``labels`` (with mixing: each image's own label, whatever its share).
"""

import concurrent.futures
import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.data.cifar import load_cifar10, load_cifar100
from experiments.data.deit_augment import Deit
from experiments.data.image_pipeline import ImageBatches
from experiments.data.imagenet import load_imagenet
from experiments.data.listops import majority_class_rate
from experiments.data.pipeline import BatchIterator
from experiments.data.shapes import load_shapes
from experiments.errors import UserError
from experiments.tasks import load_dataset

DATASETS = {"shapes": load_shapes, "cifar10": load_cifar10, "cifar100": load_cifar100,
            "imagenet": load_imagenet}
PIPELINES = ("device", "deit")


def normalise(images):
    """uint8 ``[B, H, W, C]`` -> float32 in ``[-1, 1]``."""
    return (images.astype(jnp.float32) / 255.0 - 0.5) / 0.5


def random_flip(images, key):
    """Each image of ``[B, H, W, C]`` mirrored left-right with probability 1/2."""
    flip = jax.random.bernoulli(key, 0.5, (images.shape[0], 1, 1, 1))
    return jnp.where(flip, images[:, :, ::-1], images)


class VisionTask:
    """The image-classification task (see the module docstring and
    experiments/tasks/__init__.py)."""

    def __init__(self, config):
        from lion_jax.models import VisionTransformer

        self.eval_splits = tuple(config.eval_splits)
        augment = config.augment.to_dict()
        self.pipeline = augment.pop("pipeline", "device")
        if self.pipeline not in PIPELINES:
            raise UserError(f"config.augment.pipeline must be one of {', '.join(PIPELINES)}; "
                            f"got {self.pipeline!r}")
        self.deit = None
        if self.pipeline == "deit":
            try:
                self.deit = Deit(**augment)
            except TypeError as e:
                message = re.sub(r"^\S*\(\) ", "", str(e))  # "Deit.__init__() got ..."
                raise UserError(f"bad config.augment: {message}") from e
            except ValueError as e:
                raise UserError(str(e)) from e
        self.splits, info = load_dataset(DATASETS, config.data, self.eval_splits)
        self.flip = self.deit is None and bool(augment.get("flip", False))
        self.label_smoothing = float(config.label_smoothing)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise UserError(f"config.label_smoothing must be in [0, 1); got "
                            f"{self.label_smoothing}")
        self.num_classes = info["num_classes"]
        if self.deit is not None:
            self._image_shape = (self.deit.image_size, self.deit.image_size, 3)
        else:
            images = next(iter(self.splits.values()))["images"]
            if not isinstance(images, np.ndarray):
                raise UserError(f"{config.data.name} is decoded on access (not held in memory): "
                                "it needs config.augment.pipeline='deit'")
            self._image_shape = images.shape[1:]
        self._pool = None
        model_kwargs = config.model.to_dict()
        for key in ("dtype", "param_dtype"):
            model_kwargs[key] = jnp.dtype(model_kwargs[key])
        model_kwargs["orders"] = tuple(model_kwargs.get("orders", ("raster",)))  # JSON: a list
        if model_kwargs.get("pos_emb") == "learned" and not model_kwargs.get("image_size"):
            model_kwargs["image_size"] = self._image_shape[0]
        try:
            self.model = VisionTransformer(num_classes=self.num_classes, **model_kwargs)
        except (TypeError, ValueError) as e:
            key, _, message = str(e).partition(": ") if str(e).startswith("mixer: ") else (
                "", "", str(e))
            raise UserError(f"bad config.model{'.' + key if key else ''}: {message}") from e
        patch = self.model.patch_size
        if self._image_shape[0] % patch or self._image_shape[1] % patch:
            where = " (config.augment.image_size)" if self.deit is not None else ""
            raise UserError(f"the images are {self._image_shape[0]}x{self._image_shape[1]}"
                            f"{where}, not a multiple of config.model.patch_size={patch}")

    def init(self, rng):
        images = jnp.zeros((1, *self._image_shape), jnp.float32)
        return self.model.init({"params": rng}, images, train=False)

    def loss(self, params, batch, rng, *, train):
        images = normalise(batch["images"])
        dropout_key, flip_key = jax.random.split(rng)
        if train and self.flip:
            images = random_flip(images, flip_key)
        logits = self.model.apply({"params": params}, images, train=train,
                                  rngs={"dropout": dropout_key})
        targets = batch.get("targets")
        if targets is None:
            targets = jax.nn.one_hot(batch["labels"], self.num_classes)
        targets = optax.smooth_labels(targets, self.label_smoothing if train else 0.0)
        loss = optax.softmax_cross_entropy(logits, targets)
        accuracy = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
        return loss, {"accuracy": accuracy}

    def train_batches(self, batch_size, seed):
        if self.deit is None:
            return BatchIterator(self.splits["train"], batch_size, shuffle=True, seed=seed,
                                 drop_remainder=True)
        mix = (functools.partial(self.deit.mix, num_classes=self.num_classes)
               if self.deit.mixes else None)
        return self._image_batches("train", batch_size, self.deit.train_image, mix=mix,
                                   shuffle=True, seed=seed, drop_remainder=True,
                                   repeats=self.deit.repeated_aug)

    def eval_batches(self, split, batch_size):
        if self.deit is None:
            return BatchIterator(self.splits[split], batch_size, shuffle=False, seed=0,
                                 drop_remainder=False, num_epochs=1)
        return self._image_batches(split, batch_size, self.deit.eval_image, shuffle=False,
                                   seed=0, drop_remainder=False, num_epochs=1)

    def _image_batches(self, split, batch_size, transform, **kwargs):
        """An :class:`ImageBatches` of ``split`` on the task's worker pool (started on first
        use; ``config.augment.num_workers`` threads, -1: one per CPU, 0: no pool)."""
        workers = self.deit.num_workers
        workers = (os.cpu_count() or 1) if workers == -1 else workers
        if workers and self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(workers,
                                                               thread_name_prefix="augment")
        data = self.splits[split]
        return ImageBatches(data["images"], data["labels"], batch_size, transform=transform,
                            executor=self._pool, prefetch=self.deit.prefetch, **kwargs)

    def summary(self):
        rate = majority_class_rate(self.splits["test"]["labels"])
        return {"test majority-class rate": float(rate)}
