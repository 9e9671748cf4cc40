"""A deterministic, resumable batch iterator over in-memory numpy arrays.

Epoch `e` visits the examples in the order `np.random.default_rng([seed, e]).permutation(N)`
(or `arange(N)` without shuffling), in consecutive batches that never cross an epoch boundary.
The whole position is `{"epoch": int, "position": int}` (`get_state` / `set_state`), so an
iterator restored from a saved state yields exactly the batches the uninterrupted one would.

Every batch has exactly `batch_size` rows (fixed shapes, one jit compilation) and a `mask`
key, float32 [batch_size]: 1 for real examples, 0 for padding rows. With
`drop_remainder=False` the last batch of an epoch is padded with zero rows; exact metrics are
`sum(mask * metric) / sum(mask)`. With `drop_remainder=True` the mask is all ones and the last
`N % batch_size` examples of each epoch's order are skipped.

:class:`LengthBucketIterator` batches examples of similar lengths and cuts the token arrays to
each batch's longest example (a few shapes, one compilation each).

Batches are numpy; the trainer places them on devices (and shards them).
"""

import numpy as np


class BatchIterator:
    """Iterator of batches {key: [batch_size, ...] array} plus "mask" float32 [batch_size].

    Args:
      arrays: {name: np.ndarray [N, ...]}, equal leading dimension N >= 1; no key "mask".
      batch_size: rows per batch.
      shuffle: a fresh permutation per epoch (else the stored order).
      seed: seed of the per-epoch permutations.
      drop_remainder: skip the last partial batch of each epoch (else pad it and mask it).
      num_epochs: stop (StopIteration) after this many epochs; None = forever.
    """

    def __init__(self, arrays, batch_size, *, shuffle, seed, drop_remainder, num_epochs=None):
        if not arrays:
            raise ValueError("arrays is empty")
        if "mask" in arrays:
            raise ValueError("arrays must not contain the key 'mask' (added by the iterator)")
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        sizes = {k: v.shape[0] if v.ndim else None for k, v in arrays.items()}
        if None in sizes.values() or len(set(sizes.values())) != 1:
            raise ValueError(f"arrays must share one leading dimension, got {sizes}")
        num_examples = next(iter(sizes.values()))
        if num_examples < 1:
            raise ValueError("arrays have no examples")
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if drop_remainder and batch_size > num_examples:
            raise ValueError(f"batch_size ({batch_size}) > number of examples ({num_examples}) "
                             "with drop_remainder=True would yield no batches")
        if num_epochs is not None and (not isinstance(num_epochs, (int, np.integer))
                                       or num_epochs < 1):
            raise ValueError(f"num_epochs must be a positive int or None, got {num_epochs!r}")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self._arrays = arrays
        self._num_examples = num_examples
        self._batch_size = int(batch_size)
        self._shuffle = shuffle
        self._seed = seed
        self._num_epochs = num_epochs
        full = num_examples // batch_size * batch_size
        self._epoch_end = full if drop_remainder else num_examples  # first position not visited
        self._epoch, self._position = 0, 0
        self._order_epoch, self._order = None, None

    @property
    def num_examples(self):
        return self._num_examples

    @property
    def steps_per_epoch(self):
        """Number of batches per epoch."""
        return -(-self._epoch_end // self._batch_size)

    def get_state(self):
        """{"epoch": int, "position": int}: the next batch starts at `position` of `epoch`."""
        return {"epoch": self._epoch, "position": self._position}

    def set_state(self, state):
        """Restores a state from `get_state` of an iterator with the same arguments."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self._epoch_end or position % self._batch_size:
            raise ValueError(f"invalid state {state}: position must be a multiple of batch_size "
                             f"({self._batch_size}) in [0, {self._epoch_end})")
        self._epoch, self._position = epoch, position

    def _epoch_order(self):
        """[N] example indices of the current epoch, computed once per epoch."""
        if self._order_epoch != self._epoch:
            if self._shuffle:
                rng = np.random.default_rng([self._seed, self._epoch])
                self._order = self._arrange(rng.permutation(self._num_examples))
            else:
                self._order = np.arange(self._num_examples)
            self._order_epoch = self._epoch
        return self._order

    def _arrange(self, order):
        """The epoch's visiting order from its permutation ``order`` (a subclass hook)."""
        return order

    def _finish(self, batch, idx):
        """The batch of examples ``idx`` as yielded (a subclass hook)."""
        return batch

    def __iter__(self):
        return self

    def __next__(self):
        if self._num_epochs is not None and self._epoch >= self._num_epochs:
            raise StopIteration
        end = min(self._position + self._batch_size, self._epoch_end)
        idx = self._epoch_order()[self._position:end]
        real = idx.size
        batch = {}
        for k, v in self._arrays.items():
            rows = v[idx]
            if real < self._batch_size:
                pad = np.zeros((self._batch_size - real, *v.shape[1:]), v.dtype)
                rows = np.concatenate([rows, pad])
            batch[k] = rows
        batch["mask"] = (np.arange(self._batch_size) < real).astype(np.float32)
        self._position = end
        if self._position >= self._epoch_end:
            self._epoch, self._position = self._epoch + 1, 0
        return self._finish(batch, idx)


class LengthBucketIterator(BatchIterator):
    """Training batches of similar lengths, cut to their longest example: padding that every
    batch of one fixed length would compute on is not computed.

    Each epoch's permutation (as :class:`BatchIterator`'s, shuffled, full batches only) is cut
    into pools of ``pool`` batches; each pool is sorted by length and its batches are visited in
    a random order (seeded by the seed and the epoch). The arrays named in ``crop`` (``[N, L,
    ...]``, padded at the end of axis 1) are cut to the batch's longest example rounded up to a
    multiple of ``multiple`` (at most L): at most ``ceil(L / multiple)`` shapes, so as many
    compilations of a jitted step. Positions and ``get_state`` are :class:`BatchIterator`'s, so a
    restored iterator yields the same batches.

    Args:
      arrays, batch_size, seed, num_epochs: as for :class:`BatchIterator`.
      lengths: ``[N]`` ints, each example's length (its real tokens) along axis 1 of ``crop``.
      multiple: positive int, the cut lengths' granularity.
      crop: names of arrays to cut (same L).
      pool: batches per sorted pool (more: closer lengths within a batch, less mixing).
    """

    def __init__(self, arrays, batch_size, *, lengths, multiple, crop, seed, pool=100,
                 num_epochs=None):
        super().__init__(arrays, batch_size, shuffle=True, seed=seed, drop_remainder=True,
                         num_epochs=num_epochs)
        lengths = np.asarray(lengths)
        if lengths.shape != (self._num_examples,) or not np.issubdtype(lengths.dtype,
                                                                        np.integer):
            raise ValueError(f"lengths must be [{self._num_examples}] ints, got {lengths.dtype} "
                             f"{lengths.shape}")
        for name, value in (("multiple", multiple), ("pool", pool)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        widths = {k: self._arrays[k].shape[1] if self._arrays[k].ndim > 1 else None
                  for k in crop}
        if not crop or None in widths.values() or len(set(widths.values())) != 1:
            raise ValueError(f"crop must name arrays of one length L on axis 1, got {widths}")
        self._lengths, self._multiple, self._crop, self._pool = lengths, int(multiple), crop, pool
        self._width = next(iter(widths.values()))

    def _arrange(self, order):
        """Pools of ``pool`` batches from the permutation, each sorted by length, its batches
        in a random order; the examples past the last full batch stay last (never visited)."""
        rng = np.random.default_rng([self._seed, self._epoch, 1])
        span, end = self._batch_size * self._pool, self._epoch_end
        pieces = []
        for start in range(0, end, span):
            idx = order[start:min(start + span, end)]
            batches = idx[np.argsort(self._lengths[idx], kind="stable")].reshape(
                -1, self._batch_size)
            pieces.append(batches[rng.permutation(len(batches))].reshape(-1))
        return np.concatenate(pieces + [order[end:]])

    def _finish(self, batch, idx):
        """Cuts the ``crop`` arrays to the longest of ``idx``, rounded up to ``multiple``."""
        longest = max(int(self._lengths[idx].max()), 1)
        width = min(self._width, -(-longest // self._multiple) * self._multiple)
        for k in self._crop:
            batch[k] = batch[k][:, :width]
        return batch
