"""Batches of decoded and augmented images, built by worker threads ahead of the training step.

:class:`ImageBatches` is the host pipeline of the vision task's ``config.augment.pipeline =
"deit"`` (experiments/tasks/vision.py). It has :class:`~experiments.data.pipeline.BatchIterator`'s
contract (fixed-size batches with a ``mask``, epochs that never share a batch, the position
``{"epoch", "position"}`` from ``get_state`` / ``set_state``), with images that go through a
per-image transform (DeiT's training augmentation or the evaluation crop) and, for training,
a per-batch mix (mixup / cutmix with soft targets); see experiments/data/deit_augment.py.

**Determinism.** Everything a batch holds is a function of ``(seed, epoch, position)``:

* epoch ``e`` visits the examples in the order ``default_rng([seed, e, 0, 0]).permutation(N)``
  (``arange(N)`` without shuffling); with ``repeats = r > 1`` (DeiT's repeated augmentation)
  each example of that order appears ``r`` times in a row and the order is cut to its first
  ``N`` entries, so an epoch has ``N`` samples, ``N / r`` distinct images, each in one batch
  (or two neighbouring ones) with ``r`` different augmentations;
* the example at position ``p`` of epoch ``e`` is transformed with the generator
  ``default_rng([seed, e, p, 1])``, and the batch starting at ``p`` is mixed with
  ``default_rng([seed, e, p, 2])``.

So the number of workers, the prefetch depth and the timing change nothing: a pooled run yields
exactly the batches of a single-threaded one (``executor=None``), and an iterator restored
with ``set_state`` continues exactly where the saved one was.

**Workers.** With an ``executor`` (a ``concurrent.futures`` pool; the task passes a
``ThreadPoolExecutor``: PIL decodes, resizes and filters in C with the GIL released), each
batch is split into chunks of at most ``chunk_size`` images, one job each, plus one job that
gathers the chunks and mixes; up to ``prefetch`` batches are in flight while the training step
runs. The gathering job is submitted after its chunks and pool queues are first in, first out,
so when it starts, its chunks are running or done (no job waits on one that is queued behind
it). The first ``next()`` starts the work (so ``set_state`` before it wastes nothing);
``set_state`` and ``close`` cancel the batches not yet yielded.

Batch layout: ``images`` uint8 ``[B, S, S, 3]``, ``labels`` int32 ``[B]``, ``targets``
float32 ``[B, num_classes]`` (only when ``mix`` is given), ``mask`` float32 ``[B]`` (1 real, 0
padding: zero rows, as BatchIterator pads).
"""

import collections

import numpy as np

_ORDER, _IMAGE, _MIX = 0, 1, 2  # generator streams


class ImageBatches:
    """Iterator of transformed image batches (module docstring).

    Args:
      images: uint8 ``[N, H, W, 3]``, or any sequence of ``N`` uint8 ``[h, w, 3]`` arrays
        (``images[i]``; e.g. files decoded on access: experiments/data/imagenet.py).
      labels: int ``[N]``.
      batch_size: rows per batch.
      transform: ``fn(image, rng) -> uint8 [S, S, 3]`` (``rng`` a numpy Generator).
      mix: None, or ``fn(images [B, S, S, 3], labels [B], rng) -> (images, targets [B, C])``.
      shuffle, seed, drop_remainder, num_epochs: as BatchIterator's.
      repeats: repeated augmentation count (1: off).
      executor: a ``concurrent.futures.Executor``, or None to build each batch in ``next()``.
      prefetch: batches in flight with an executor.
      chunk_size: images per worker job.
    """

    def __init__(self, images, labels, batch_size, *, transform, mix=None, shuffle, seed,
                 drop_remainder, num_epochs=None, repeats=1, executor=None, prefetch=4,
                 chunk_size=32):
        labels = np.asarray(labels)
        num = len(images)
        if labels.shape != (num,):
            raise ValueError(f"labels must be [{num}] like the images, got {labels.shape}")
        if num < 1:
            raise ValueError("no images")
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if drop_remainder and batch_size > num:
            raise ValueError(f"batch_size ({batch_size}) > number of images ({num}) with "
                             "drop_remainder=True would yield no batches")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        for name, value in (("repeats", repeats), ("prefetch", prefetch),
                            ("chunk_size", chunk_size)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self._images, self._labels, self._num = images, labels.astype(np.int32), num
        self._batch_size, self._transform, self._mix = int(batch_size), transform, mix
        self._shuffle, self._seed, self._repeats = shuffle, int(seed), int(repeats)
        self._num_epochs = num_epochs
        self._epoch_end = num // batch_size * batch_size if drop_remainder else num
        self._executor, self._prefetch, self._chunk = executor, int(prefetch), int(chunk_size)
        self._epoch, self._position = 0, 0  # the next batch to yield
        self._queue = collections.deque()  # (epoch, position, [chunk jobs..., gather job])
        self._orders = {}

    @property
    def num_examples(self):
        return self._num

    @property
    def steps_per_epoch(self):
        """Number of batches per epoch."""
        return -(-self._epoch_end // self._batch_size)

    def get_state(self):
        """``{"epoch", "position"}`` of the next batch ``next()`` returns."""
        return {"epoch": self._epoch, "position": self._position}

    def set_state(self, state):
        """Restores a ``get_state`` of an iterator with the same arguments (cancels the work
        in flight)."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self._epoch_end or position % self._batch_size:
            raise ValueError(f"invalid state {state}: position must be a multiple of batch_size "
                             f"({self._batch_size}) in [0, {self._epoch_end})")
        self.close()
        self._epoch, self._position = epoch, position

    def close(self):
        """Cancels the batches submitted and not yet yielded."""
        queue = getattr(self, "_queue", None) or ()
        while queue:
            for future in queue.popleft()[2]:
                future.cancel()

    def __del__(self):
        self.close()

    def epoch_order(self, epoch):
        """``[N]`` example indices of ``epoch`` (module docstring)."""
        if epoch not in self._orders:
            if self._shuffle:
                order = np.random.default_rng([self._seed, epoch, 0, _ORDER]).permutation(
                    self._num)
            else:
                order = np.arange(self._num)
            if self._repeats > 1:
                order = np.repeat(order, self._repeats)[:self._num]
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = order
        return self._orders[epoch]

    def _advance(self, epoch, position):
        position += self._batch_size
        return (epoch + 1, 0) if position >= self._epoch_end else (epoch, position)

    def _finished(self, epoch):
        return self._num_epochs is not None and epoch >= self._num_epochs

    # -- the work of one batch (pure functions of their arguments and the iterator's settings)

    def _chunk_images(self, epoch, start, indices):
        """uint8 ``[len(indices), S, S, 3]``: the transformed images at positions ``start``,
        ``start + 1``, ... of ``epoch``."""
        return np.stack([
            self._transform(self._images[i], np.random.default_rng(
                [self._seed, epoch, start + k, _IMAGE]))
            for k, i in enumerate(indices)])

    def _gather(self, epoch, position, indices, chunks):
        """The batch from its chunks (arrays or futures of them)."""
        images = np.concatenate([c if isinstance(c, np.ndarray) else c.result() for c in chunks])
        real = len(indices)
        labels = self._labels[indices]
        batch = {}
        if self._mix is not None:
            images, batch["targets"] = self._mix(
                images, labels, np.random.default_rng([self._seed, epoch, position, _MIX]))
        pad = self._batch_size - real
        if pad:
            images = np.concatenate([images, np.zeros((pad, *images.shape[1:]), np.uint8)])
            labels = np.concatenate([labels, np.zeros(pad, np.int32)])
            if "targets" in batch:
                batch["targets"] = np.concatenate(
                    [batch["targets"], np.zeros((pad, batch["targets"].shape[1]), np.float32)])
        batch["images"], batch["labels"] = images, labels
        batch["mask"] = (np.arange(self._batch_size) < real).astype(np.float32)
        return batch

    def _indices(self, epoch, position):
        end = min(position + self._batch_size, self._epoch_end)
        return self.epoch_order(epoch)[position:end]

    def _submit(self, epoch, position):
        """The futures of one batch's jobs: its chunks', then the gathering one's."""
        indices = self._indices(epoch, position)
        chunks = [self._executor.submit(self._chunk_images, epoch, position + s,
                                        indices[s:s + self._chunk])
                  for s in range(0, len(indices), self._chunk)]
        return chunks + [self._executor.submit(self._gather, epoch, position, indices, chunks)]

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished(self._epoch):
            raise StopIteration
        epoch, position = self._epoch, self._position
        if self._executor is None:
            indices = self._indices(epoch, position)
            batch = self._gather(epoch, position, indices,
                                 [self._chunk_images(epoch, position, indices)])
        else:
            if self._queue:
                epoch_next, position_next = self._advance(*self._queue[-1][:2])
            else:
                epoch_next, position_next = epoch, position
            while len(self._queue) < self._prefetch and not self._finished(epoch_next):
                self._queue.append((epoch_next, position_next,
                                    self._submit(epoch_next, position_next)))
                epoch_next, position_next = self._advance(epoch_next, position_next)
            batch = self._queue.popleft()[2][-1].result()
        self._epoch, self._position = self._advance(epoch, position)
        return batch
