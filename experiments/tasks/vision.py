"""Image classification with Vision Transformers (the LION ViTs and the ViT baseline).

Data: ``config.data.name`` picks a dataset of :data:`DATASETS`; the other keys of
``config.data`` are its loader's arguments (``~`` expanded in ``cache_dir``). Every dataset
gives ``{split: {"images": uint8 [N, H, W, 3], "labels": int32 [N]}}``. Today: ``shapes``, the
embedded procedurally drawn images (``experiments/data/shapes.py``; no download).

Model: ``lion_jax.models.VisionTransformer`` with ``config.model`` (``dtype`` /
``param_dtype`` given as names); the class count comes from the dataset and, for learned
positions, ``image_size`` from the images. A bad model key or value stops with one line naming
it, before anything is compiled.

Inputs are normalised on the device, ``(x / 255 - 0.5) / 0.5`` per channel. Training
augmentation (``config.augment``), also on the device and drawn from the step's key: ``flip``,
a random horizontal flip per image. Loss: softmax cross-entropy with
``config.label_smoothing``; metrics: loss, accuracy (of the unsmoothed labels).
"""

import jax
import jax.numpy as jnp
import optax

from experiments.data.listops import majority_class_rate
from experiments.data.pipeline import BatchIterator
from experiments.data.shapes import load_shapes
from experiments.errors import UserError
from experiments.tasks import load_dataset


DATASETS = {"shapes": load_shapes}


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
        self.splits, info = load_dataset(DATASETS, config.data, self.eval_splits)
        self.flip = bool(config.augment.flip)
        self.label_smoothing = float(config.label_smoothing)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise UserError(f"config.label_smoothing must be in [0, 1); got "
                            f"{self.label_smoothing}")
        self.num_classes = info["num_classes"]
        self._image_shape = next(iter(self.splits.values()))["images"].shape[1:]
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
            raise UserError(f"the images are {self._image_shape[0]}x{self._image_shape[1]}, not "
                            f"a multiple of config.model.patch_size={patch}")

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
        targets = optax.smooth_labels(jax.nn.one_hot(batch["labels"], self.num_classes),
                                      self.label_smoothing if train else 0.0)
        loss = optax.softmax_cross_entropy(logits, targets)
        accuracy = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
        return loss, {"accuracy": accuracy}

    def train_batches(self, batch_size, seed):
        return BatchIterator(self.splits["train"], batch_size, shuffle=True, seed=seed,
                             drop_remainder=True)

    def eval_batches(self, split, batch_size):
        return BatchIterator(self.splits[split], batch_size, shuffle=False, seed=0,
                             drop_remainder=False, num_epochs=1)

    def summary(self):
        rate = majority_class_rate(self.splits["test"]["labels"])
        return {"test majority-class rate": float(rate)}
