"""ListOps for the Long Range Arena, generated locally with numpy (no TensorFlow).

The task is defined by LRA's generator (`lra_benchmarks/data/listops.py`, Tay et al. 2021,
after Nangia & Bowman 2018). This module reproduces its *distribution* (not its bytes: LRA
uses Python's `random`, we use `numpy.random.Generator`). How we read LRA's generator:

* `generate_tree(depth)` is first called with depth 1. If `depth < max_depth` it draws
  `r ~ U[0, 1)`, else `r = 1`. **`r > VALUE_P` (= 0.25) gives a leaf** digit 0..9, so a node is
  a leaf with probability 0.75, and always at depth `max_depth`. Otherwise it is an operator
  node, one of `[MIN [MAX [MED [SM` (uniform), with `randint(2, max_args)` (both ends
  inclusive) children at `depth + 1`. Operators therefore sit at depths 1..max_depth-1: the
  bracket nesting depth of a sample is at most `max_depth - 1`.
* A tree's length is its number of tokens without parentheses: 1 for a leaf, and
  `2 + sum(children)` for an operator (the operator token and the closing `]`). LRA keeps a
  tree iff `min_length < length < max_length` (**strict**), i.e. 501..1999 tokens by default.
* It collects unique trees (a Python set) until it has `num_train + num_val + num_test`, and
  splits them in that order into train / val / test.
* The label is the value of the expression: MIN, MAX, MED = `int(np.median(args))` (for an
  even count the mean of the two middle values, truncated), SM = `sum(args) % 10`.
* Serialisation. LRA stores the tree as nested *pairs* and `to_string` wraps every pair in
  parentheses, so the TSV `Source` of `[MAX 2 9 ]` is `( ( ( [MAX 2 ) 9 ) ] )`. The parentheses
  carry no information (the bracketed prefix form is unambiguous). The model input is the token
  sequence without parentheses, `[MAX 2 9 ]`: tokens `[MIN [MAX [MED [SM ] 0..9`. This is the
  S4/S5 convention (they strip the parentheses and keep `]`), which is what the SSM-era LRA
  numbers use. (LRA's own input pipeline used tfds' alphanumeric `Tokenizer`, which drops the
  parentheses *and* the `[`/`]` characters, so its models saw `MAX 2 9` with no closing
  brackets; we keep `]`, without which the expression is ambiguous.)

Deliberate differences from LRA, none of which changes the distribution of a split:
* Trees are drawn level by level for a batch of roots at once (vectorised). Every node's draws
  are independent and depend only on its depth, exactly as in LRA's depth-first recursion.
* Split order is generation order (first unique trees go to train); LRA used the iteration
  order of a Python set, which is also unrelated to the labels.

Token ids (`TOKENS[i]` is the string of id `i`): 0 = padding, 1..10 = digits 0..9,
11..14 = `[MIN [MAX [MED [SM`, 15 = `]`, 16 = EOS. An EOS token is appended to every sample
(as S4/S5 do), so a causal model has one fixed position that has read the whole expression and
a classifier may pool there; bidirectional models may ignore it and mean-pool. Since LRA's
expressions are strictly shorter than `max_length`, expression + EOS always fits in
`max_length` columns, and `lengths` counts the EOS.

Data is cached: `load_listops` generates all three splits once per configuration and stores
them in `<cache_dir>/listops_<hash>.npz` (the hash covers every generation parameter and the
generator version).

LRA's official files: `load_listops_tsv` reads `basic_{train,val,test}.tsv` of LRA's release
(same token ids, EOS and padding as the generated data; parsed on every call, no cache).

CLI: `python -m experiments.data.listops --cache_dir DIR [--num_train N ...]`.
"""

import argparse
import hashlib
import json
import os
import time

import numpy as np

from experiments.data import common

PAD_ID = 0
OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
TOKENS = ("<pad>", *"0123456789", *OPERATORS, "]", "<eos>")
DIGIT_OFFSET = 1  # id of digit d is d + DIGIT_OFFSET
FIRST_OP_ID = TOKENS.index("[MIN")  # id of operator k (in OPERATORS order) is FIRST_OP_ID + k
CLOSE_ID = TOKENS.index("]")
EOS_ID = TOKENS.index("<eos>")
_TOKEN_IDS = {t: i for i, t in enumerate(TOKENS)}
_NO_PARENTHESES = str.maketrans("()", "  ")  # for `tokenize`
VOCAB_SIZE = len(TOKENS)  # 17
NUM_CLASSES = 10
MAX_LENGTH = 2000  # padded width of the LRA configuration (expression < 2000 tokens, + EOS)

VALUE_P = 0.25  # LRA: a node with r > VALUE_P is a leaf
SPLITS = ("train", "val", "test")
LRA_CONFIG = dict(num_train=96000, num_val=2000, num_test=2000, seed=0, min_length=500,
                  max_length=2000, max_depth=10, max_args=10)  # generation parameters of LRA

_GENERATOR_VERSION = 1  # bump whenever generation changes, so old cache files are not reused
_TREES_PER_BATCH = 16384  # fixed (the data depends on it through the order of random draws)


# --------------------------------------------------------------------------------------------
# Generation (vectorised over a batch of trees, level by level)
# --------------------------------------------------------------------------------------------


def _group_starts(counts):
    """Start index of each contiguous group of sizes `counts` [G] -> [G]."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def _draw_levels(rng, num_trees, max_depth, max_args):
    """Draws `num_trees` independent LRA trees, one level (= LRA depth) at a time.

    Returns a list of levels; level i holds the nodes at LRA depth i + 1 as a dict of arrays
    over those n_i nodes:
      parent [n_i]   index of the parent in level i - 1 (level 0: the tree index),
      token  [n_i]   token id of the node (digit, or operator),
      op_idx [m_i]   indices of the operator nodes, ascending,
      nchild [m_i]   number of children of each operator node.
    The children of level i's operators are level i + 1's nodes, grouped by parent in
    `op_idx` order.
    """
    levels = []
    parent = np.arange(num_trees)
    for depth in range(1, max_depth + 1):
        n = parent.size
        is_op = rng.random(n) <= VALUE_P if depth < max_depth else np.zeros(n, bool)
        op_idx = np.flatnonzero(is_op)
        nchild = rng.integers(2, max_args, size=op_idx.size, endpoint=True)
        token = rng.integers(0, 10, size=n) + DIGIT_OFFSET
        token[op_idx] = FIRST_OP_ID + rng.integers(0, len(OPERATORS), size=op_idx.size)
        levels.append(dict(parent=parent, token=token, op_idx=op_idx, nchild=nchild))
        if op_idx.size == 0:
            break
        parent = np.repeat(op_idx, nchild)
    return levels


def _sizes_and_values(levels):
    """Bottom-up token counts and values of every node: two lists of [n_i] int64 arrays."""
    sizes, values = [None] * len(levels), [None] * len(levels)
    for i in reversed(range(len(levels))):
        lvl = levels[i]
        size = np.ones(lvl["parent"].size, np.int64)
        value = lvl["token"] - DIGIT_OFFSET  # correct for leaves; operators overwritten below
        if lvl["op_idx"].size:
            nchild, starts = lvl["nchild"], _group_starts(lvl["nchild"])
            child_size, child_value = sizes[i + 1], values[i + 1]
            size[lvl["op_idx"]] = 2 + np.add.reduceat(child_size, starts)
            # Children values sorted within each group (values are 0..9, groups ascending).
            group = np.repeat(np.arange(nchild.size), nchild)
            ordered = np.sort(group * 10 + child_value) - group * 10
            low, high = ordered[starts + (nchild - 1) // 2], ordered[starts + nchild // 2]
            results = np.stack([
                np.minimum.reduceat(child_value, starts),  # [MIN
                np.maximum.reduceat(child_value, starts),  # [MAX
                (low + high) // 2,  # [MED: int(np.median(args)) for args >= 0
                np.add.reduceat(child_value, starts) % 10,  # [SM
            ])
            op = lvl["token"][lvl["op_idx"]] - FIRST_OP_ID
            value[lvl["op_idx"]] = results[op, np.arange(op.size)]
        sizes[i], values[i] = size, value
    return sizes, values


def _serialize(levels, sizes, keep, width):
    """Writes the kept trees as padded token rows.

    Args:
      levels, sizes: from `_draw_levels` / `_sizes_and_values`.
      keep: [K] indices of the trees to write, in output order.
      width: row width; every kept tree must have size < width (room for EOS).

    Returns:
      uint8 [K, width]: prefix-order tokens, then EOS, then PAD_ID.
    """
    out = np.full((keep.size, width), PAD_ID, np.uint8)
    row_of_tree = np.full(levels[0]["parent"].size, -1, np.int64)
    row_of_tree[keep] = np.arange(keep.size)
    row, pos = row_of_tree, np.zeros(row_of_tree.size, np.int64)  # of level-0 nodes
    for i, lvl in enumerate(levels):
        sel = row >= 0
        out[row[sel], pos[sel]] = lvl["token"][sel]
        ops = lvl["op_idx"][sel[lvl["op_idx"]]]
        out[row[ops], pos[ops] + sizes[i][ops] - 1] = CLOSE_ID
        if i + 1 == len(levels):
            break
        # A child starts after its parent's operator token and its earlier siblings.
        nchild, child_size = lvl["nchild"], sizes[i + 1]
        before = np.cumsum(child_size) - child_size
        sibling_offset = before - np.repeat(before[_group_starts(nchild)], nchild)
        parent_node = levels[i + 1]["parent"]
        row, pos = row[parent_node], pos[parent_node] + 1 + sibling_offset
    out[np.arange(keep.size), sizes[0][keep]] = EOS_ID
    return out


def _max_tree_length(max_depth, max_args):
    """Length of the largest tree LRA's generator can produce (exact integer)."""
    length = 1  # at depth max_depth
    for _ in range(max_depth - 1):
        length = 2 + max_args * length
    return length


def _validate(num_train, num_val, num_test, seed, min_length, max_length, max_depth, max_args):
    args = dict(num_train=num_train, num_val=num_val, num_test=num_test, seed=seed,
                min_length=min_length, max_length=max_length, max_depth=max_depth,
                max_args=max_args)
    for name, value in args.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise ValueError(f"{name} must be an int, got {value!r}")
    for name in ("num_train", "num_val", "num_test"):
        if args[name] < 1:
            raise ValueError(f"{name} must be positive, got {args[name]}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    if min_length < 0:
        raise ValueError(f"min_length must be non-negative, got {min_length}")
    if max_length < min_length + 2:
        raise ValueError(f"max_length ({max_length}) must be >= min_length ({min_length}) + 2: "
                         "lengths are kept iff min_length < length < max_length (as LRA)")
    if max_depth < 2:
        raise ValueError(f"max_depth must be >= 2 (the root is at depth 1), got {max_depth}")
    if max_args < 2:
        raise ValueError(f"max_args must be >= 2, got {max_args}")
    if min_length + 1 > _max_tree_length(max_depth, max_args):
        raise ValueError(f"min_length ({min_length}) is unreachable: trees with max_depth="
                         f"{max_depth}, max_args={max_args} have at most "
                         f"{_max_tree_length(max_depth, max_args)} tokens")


def generate_listops(*, num_train=96000, num_val=2000, num_test=2000, seed=0, min_length=500,
                     max_length=2000, max_depth=10, max_args=10):
    """Generates the three ListOps splits (no caching; see `load_listops`).

    Returns:
      {split: dict(tokens=uint8 [N, max_length], lengths=int32 [N], labels=int32 [N])} for
      split in SPLITS; tokens are ids (module docstring), lengths include the EOS token.

    Raises:
      ValueError: bad arguments.
      RuntimeError: the configuration cannot produce enough unique samples (e.g. a very narrow
        length range), detected after drawing 1000 trees per requested sample.
    """
    _validate(num_train, num_val, num_test, seed, min_length, max_length, max_depth, max_args)
    rng = np.random.default_rng(seed)
    num_samples = num_train + num_val + num_test
    max_trees = 1000 * num_samples + 10 * _TREES_PER_BATCH
    seen, chunks, count, drawn = set(), [], 0, 0
    while count < num_samples:
        if drawn >= max_trees:
            raise RuntimeError(
                f"only {count} unique ListOps samples of {num_samples} after drawing {drawn} "
                f"trees: widen (min_length, max_length) = ({min_length}, {max_length}) or ask "
                "for fewer samples")
        levels = _draw_levels(rng, _TREES_PER_BATCH, max_depth, max_args)
        drawn += _TREES_PER_BATCH
        sizes, values = _sizes_and_values(levels)
        candidates = np.flatnonzero((sizes[0] > min_length) & (sizes[0] < max_length))
        rows = _serialize(levels, sizes, candidates, max_length)
        unique = []
        for j, r in enumerate(rows):
            key = hashlib.blake2b(r.tobytes(), digest_size=16).digest()
            if key not in seen and count + len(unique) < num_samples:
                seen.add(key)
                unique.append(j)
        unique = np.asarray(unique, np.int64)
        chunks.append((rows[unique], sizes[0][candidates[unique]] + 1,
                       values[0][candidates[unique]]))
        count += unique.size
    tokens, lengths, labels = (np.concatenate(parts) for parts in zip(*chunks))
    bounds = np.cumsum([0, num_train, num_val, num_test])
    return {split: dict(tokens=tokens[lo:hi], lengths=lengths[lo:hi].astype(np.int32),
                        labels=labels[lo:hi].astype(np.int32))
            for split, lo, hi in zip(SPLITS, bounds[:-1], bounds[1:])}


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------


def cache_path(cache_dir, **params):
    """Path of the cache file of a configuration (`generate_listops` arguments; LRA defaults)."""
    unknown = set(params) - set(LRA_CONFIG)
    if unknown:
        raise TypeError(f"unknown ListOps parameters {sorted(unknown)}")
    key = json.dumps(dict(LRA_CONFIG, **params, version=_GENERATOR_VERSION), sort_keys=True)
    return os.path.join(cache_dir, f"listops_{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz")


def _write_cache(path, data, params):
    """Stores tokens without padding (flat uint8 per split) and the parameters (as JSON, for
    inspection); writes a temp file in the same directory and renames it (atomic)."""
    arrays = {"params": np.asarray(json.dumps(params, sort_keys=True))}
    for split, d in data.items():
        valid = np.arange(d["tokens"].shape[1]) < d["lengths"][:, None]
        arrays[f"{split}_flat_tokens"] = d["tokens"][valid]
        arrays[f"{split}_lengths"] = d["lengths"]
        arrays[f"{split}_labels"] = d["labels"]
    common.write_npz(path, arrays)


def _pad(flat, lengths, max_length):
    """Concatenated sequences `flat` with `lengths` [N] -> int32 [N, max_length], PAD_ID after."""
    tokens = np.full((lengths.size, max_length), PAD_ID, np.int32)
    tokens[np.arange(max_length) < lengths[:, None]] = flat
    return tokens


def _read_cache(path, split, max_length):
    """Reads one split back as int32 padded arrays (dict of `load_listops`)."""
    with np.load(path) as f:
        flat, lengths, labels = (f[f"{split}_{k}"] for k in ("flat_tokens", "lengths", "labels"))
    return dict(tokens=_pad(flat, lengths, max_length), lengths=lengths.astype(np.int32),
                labels=labels.astype(np.int32))


def load_listops(split, *, cache_dir, num_train=96000, num_val=2000, num_test=2000, seed=0,
                 min_length=500, max_length=2000, max_depth=10, max_args=10):
    """One ListOps split, generated on first use and cached under `cache_dir`.

    Defaults are LRA's. Expressions have min_length < length < max_length tokens (strict, as
    LRA); an EOS token follows each.

    Args:
      split: "train", "val" or "test".
      cache_dir: directory of the cache files (created if missing).
      num_train, num_val, num_test: split sizes.
      seed: seed of the numpy Generator; the data is a deterministic function of all arguments.
      min_length, max_length: length bounds, exclusive; max_length is also the padded width.
      max_depth: maximum tree depth (root at depth 1, so at most max_depth - 1 nested operators).
      max_args: maximum number of arguments of an operator (minimum is 2).

    Returns:
      dict(tokens=int32 [N, max_length] padded with PAD_ID, lengths=int32 [N] (with EOS),
      labels=int32 [N] in 0..9).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    params = dict(num_train=num_train, num_val=num_val, num_test=num_test, seed=seed,
                  min_length=min_length, max_length=max_length, max_depth=max_depth,
                  max_args=max_args)
    _validate(**params)
    params = {k: int(v) for k, v in params.items()}  # numpy ints are not JSON-serialisable
    path = cache_path(cache_dir, **params)
    if not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        print(f"Generating ListOps (train {num_train} / val {num_val} / test {num_test}, "
              f"seed {seed}, lengths ({min_length}, {max_length})) into {path} ...", flush=True)
        start = time.perf_counter()
        _write_cache(path, generate_listops(**params), params)
        print(f"Generated ListOps in {time.perf_counter() - start:.1f} s", flush=True)
    return _read_cache(path, split, max_length)


# --------------------------------------------------------------------------------------------
# LRA's official files
# --------------------------------------------------------------------------------------------

TSV_HELP = (
    "get LRA's official ListOps from the archive lra_release.gz linked in the Long Range Arena "
    "README (https://github.com/google-research/long-range-arena; "
    "https://storage.googleapis.com/long-range-arena/lra_release.gz), extract it "
    "(tar xzf lra_release.gz) and pass --config.data.source=tsv "
    "--config.data.data_dir=<dir containing basic_train.tsv> (lra_release/listops-1000 in the "
    "archive); or use the default --config.data.source=generate to generate ListOps locally")


def load_listops_tsv(split, *, data_dir, max_length=MAX_LENGTH):
    """One split of LRA's official ListOps: `<data_dir>/basic_<split>.tsv`, parsed (no cache).

    The file has a header row `Source<TAB>Target`, then one sample per line: LRA's
    parenthesised expression (module docstring) and its label 0..9.

    Args:
      split: "train", "val" or "test".
      data_dir: directory holding `basic_{train,val,test}.tsv` (`lra_release/listops-1000`).
      max_length: padded width; every expression + EOS must fit (LRA's are < 2000 + EOS).

    Returns:
      dict(tokens=int32 [N, max_length] padded with PAD_ID, lengths=int32 [N] (with EOS),
      labels=int32 [N] in 0..9), as `load_listops`.

    Raises:
      FileNotFoundError: no data_dir or no such file; the message says how to get the data.
      ValueError: bad split, a malformed line, or a sequence longer than max_length.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = os.path.join(data_dir, f"basic_{split}.tsv")
    if not data_dir or not os.path.isfile(path):
        where = f"{path} not found" if data_dir else "no ListOps data_dir given"
        raise FileNotFoundError(f"{where}: {TSV_HELP}")
    sequences, labels = [], []
    with open(path) as f:
        if f.readline().split() != ["Source", "Target"]:
            raise ValueError(f"{path}: the first line is not the header 'Source<TAB>Target'")
        for line_number, line in enumerate(f, start=2):
            try:
                source, target = line.split("\t")
                sequences.append(np.array(tokenize(source) + [EOS_ID], np.int32))
                labels.append(int(target))
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}:{line_number}: not a ListOps sample ({e!r})") from e
    lengths = np.array([len(s) for s in sequences], np.int32)
    labels = np.array(labels, np.int32)
    if lengths.size == 0:
        raise ValueError(f"{path} has no samples")
    if lengths.max() > max_length:
        raise ValueError(f"{path} has sequences of up to {lengths.max()} tokens (with EOS), "
                         f"more than max_length={max_length}")
    if not np.all((labels >= 0) & (labels < NUM_CLASSES)):
        raise ValueError(f"{path} has labels outside 0..{NUM_CLASSES - 1}")
    return dict(tokens=_pad(np.concatenate(sequences), lengths, max_length), lengths=lengths,
                labels=labels)


# --------------------------------------------------------------------------------------------
# Tokens, evaluation, statistics
# --------------------------------------------------------------------------------------------


def tokenize(source):
    """LRA TSV `Source` string (with or without parentheses) -> list of token ids (no EOS).

    Parentheses are dropped; any other unknown token raises KeyError.
    """
    return list(map(_TOKEN_IDS.__getitem__, source.translate(_NO_PARENTHESES).split()))


def detokenize(tokens):
    """Token ids -> space-separated string, stopping at padding."""
    out = []
    for t in np.asarray(tokens).tolist():
        if t == PAD_ID:
            break
        out.append(TOKENS[t])
    return " ".join(out)


def evaluate(tokens):
    """Value of a token sequence, with an explicit stack (independent of the generator's code).

    Args:
      tokens: 1-D ids of one expression; stops at EOS or padding.

    Returns:
      The int value 0..9 (MED as LRA: int(np.median(args))).
    """
    stack = [[]]  # argument lists; stack[0] collects the top-level value
    ops = []
    for t in np.asarray(tokens).tolist():
        if t in (PAD_ID, EOS_ID):
            break
        if DIGIT_OFFSET <= t < DIGIT_OFFSET + 10:
            stack[-1].append(t - DIGIT_OFFSET)
        elif FIRST_OP_ID <= t < FIRST_OP_ID + len(OPERATORS):
            ops.append(OPERATORS[t - FIRST_OP_ID])
            stack.append([])
        elif t == CLOSE_ID and ops:
            op, args = ops.pop(), stack.pop()
            if op == "[MIN":
                stack[-1].append(min(args))
            elif op == "[MAX":
                stack[-1].append(max(args))
            elif op == "[MED":
                stack[-1].append(int(np.median(args)))
            else:
                stack[-1].append(sum(args) % 10)
        else:
            raise ValueError(f"unexpected token id {t}")
    if ops or len(stack[0]) != 1:
        raise ValueError("malformed expression")
    return stack[0][0]


def majority_class_rate(labels):
    """Fraction of the most common label (the constant-prediction baseline accuracy)."""
    labels = np.asarray(labels)
    if labels.size == 0:
        raise ValueError("labels is empty")
    return np.bincount(labels.ravel()).max() / labels.size


def main(argv=None):
    parser = argparse.ArgumentParser(description="Generate (and cache) LRA ListOps.")
    parser.add_argument("--cache_dir", required=True)
    for name, default in LRA_CONFIG.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    args = vars(parser.parse_args(argv))
    cache_dir = args.pop("cache_dir")
    for split in SPLITS:
        d = load_listops(split, cache_dir=cache_dir, **args)
        lengths, labels = d["lengths"], d["labels"]
        hist = np.bincount(labels, minlength=NUM_CLASSES)
        print(f"{split}: {labels.size} samples; lengths (with EOS) min {lengths.min()} "
              f"mean {lengths.mean():.1f} median {np.median(lengths):.0f} max {lengths.max()}; "
              f"majority class rate {majority_class_rate(labels):.4f}")
        print(f"  label histogram {dict(enumerate(hist.tolist()))}")
    print(f"example (test[0], label {labels[0]}): {detokenize(d['tokens'][0])[:200]} ...")


if __name__ == "__main__":
    main()
