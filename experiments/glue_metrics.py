"""GLUE metrics in numpy, and the number per task that the LION paper's Table 3 reports.

Conventions: ``preds`` are class ids ``[N]`` (ints) or scores ``[N, C]`` (logits or
probabilities; the argmax is taken), or for STS-B real numbers ``[N]`` (or ``[N, 1]``);
``labels`` are class ids ``[N]`` or, STS-B, real numbers ``[N]``. Every metric is a Python
float, a fraction (accuracy 0.85, not 85); tables multiply by 100. Metrics are computed over a
whole split at once (F1, Matthews and the correlations are not means of per-example values).
Undefined cases give 0.0, never NaN: F1 with no positive prediction or label, Matthews
when predictions or labels are all one class, a correlation when either side is constant.
Empty inputs are a ValueError.

Which number per task (``task_score``), and why. Table 3 comes from the LION repository's
fine-tuning script (``Masked_Language_Modeling/glue.py`` with ``src/glue/finetuning_jobs.py``,
a fork of M2-BERT's, which the paper says it follows): per task it takes **the mean of every
metric of every evaluator of that task**, x100, and the GLUE average is the mean over tasks.
The evaluators and metrics there are:

* MNLI: accuracy on matched and on mismatched dev -> **the mean of the two accuracies**
  (not matched alone, as BERT's paper prints "MNLI-m").
* QQP: accuracy and binary F1 -> **the mean of accuracy and F1** (neither alone; consistent
  with the paper's QQP, e.g. 89.90 for BERT-LARGE, lying between BERT's usual dev accuracy
  (~91) and F1 (~88)).
* MRPC: binary F1 only (accuracy is commented out there) -> **F1**.
* STS-B: Spearman only -> **Spearman** (Pearson is also written by runs, for reference).
* CoLA: Matthews only -> **Matthews correlation**.
* RTE, QNLI, SST-2: accuracy.

The facts live in ``experiments.data.glue.TASKS`` (``metrics``: the keys a run writes per eval
split; ``score``: the (split, key) pairs averaged); :func:`score_from_metrics` applies them to
the records of a run, :func:`task_score` to predictions. Binary F1 takes class 1 as positive
(QQP "duplicate", MRPC "equivalent"). Matthews is the multi-class R_K of Gorodkin (2004),
which for two classes is the usual phi coefficient (CoLA is binary). Spearman is Pearson's r
of the ranks, ties given the average of their ranks (as scipy.stats.spearmanr).
A fine-tuning run computes them from every prediction of the split, gathered on the host
(experiments/tasks/glue.py, the trainer's ``split_metrics`` hook).
"""

import numpy as np

from experiments.data import glue


def _vector(x, name):
    x = np.asarray(x)
    if x.ndim == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim != 1:
        raise ValueError(f"{name} must be [N] (or [N, 1]), got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{name} is empty")
    return x


def _pair(preds, labels, classes):
    """(preds, labels) as 1-d arrays of one length; class predictions as argmax of scores."""
    preds = np.asarray(preds)
    if classes and preds.ndim == 2 and preds.shape[1] > 1:
        preds = np.argmax(preds, axis=-1)
    preds, labels = _vector(preds, "preds"), _vector(labels, "labels")
    if preds.shape != labels.shape:
        raise ValueError(f"preds {preds.shape} and labels {labels.shape} differ in length")
    return preds, labels


def _ratio(numerator, denominator):
    return float(numerator / denominator) if denominator > 0 else 0.0


def accuracy(preds, labels):
    """Fraction of ``preds`` (ids [N] or scores [N, C]) equal to ``labels`` [N]."""
    preds, labels = _pair(preds, labels, True)
    return float(np.mean(preds == labels))


def confusion_matrix(preds, labels, num_classes=None):
    """int64 [C, C]: entry [i, j] counts examples of label i predicted as j.

    ``num_classes`` defaults to 1 + the largest id seen (at least 2)."""
    preds, labels = _pair(preds, labels, True)
    preds, labels = preds.astype(np.int64), labels.astype(np.int64)
    if min(preds.min(), labels.min()) < 0:
        raise ValueError("class ids must be >= 0")
    c = max(int(preds.max()), int(labels.max()), 1) + 1 if num_classes is None else num_classes
    return np.bincount(labels * c + preds, minlength=c * c).reshape(c, c)


def f1_from_counts(tp, fp, fn):
    """F1 = 2 tp / (2 tp + fp + fn); 0.0 when that is 0 / 0. Any common scale works."""
    return _ratio(2.0 * tp, 2.0 * tp + fp + fn)


def f1(preds, labels):
    """Binary F1 of class 1 (positive) on ids [N] or scores [N, 2]; 0.0 when no example is
    predicted or labelled positive."""
    preds, labels = _pair(preds, labels, True)
    p, t = preds == 1, labels == 1
    return f1_from_counts(np.sum(p & t), np.sum(p & ~t), np.sum(~p & t))


def matthews_from_confusion(cm):
    """Matthews correlation (Gorodkin's R_K) of a confusion matrix [C, C] (rows: labels);
    0.0 when all predictions or all labels are one class. Any common scale works."""
    cm = np.asarray(cm, np.float64)
    s, c = cm.sum(), np.trace(cm)
    p, t = cm.sum(axis=0), cm.sum(axis=1)  # predicted and true counts per class
    cov_pt = c * s - p @ t
    cov_pp, cov_tt = s * s - p @ p, s * s - t @ t
    return float(np.clip(_ratio(cov_pt, np.sqrt(cov_pp * cov_tt)), -1.0, 1.0))


def matthews(preds, labels):
    """Matthews correlation coefficient of class ids [N] (or scores [N, C]) and labels [N];
    in [-1, 1], 0.0 when predictions or labels are constant."""
    return matthews_from_confusion(confusion_matrix(preds, labels))


def pearson(x, y):
    """Pearson's r of two real vectors [N] (float64 inside); 0.0 when either is constant."""
    x, y = _pair(x, y, False)
    x = x.astype(np.float64) - np.mean(x, dtype=np.float64)
    y = y.astype(np.float64) - np.mean(y, dtype=np.float64)
    return float(np.clip(_ratio(x @ y, np.sqrt((x @ x) * (y @ y))), -1.0, 1.0))


def rankdata(x):
    """1-based ranks of a vector [N] (float64), tied values given the mean of their ranks."""
    x = _vector(x, "x")
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]  # each run of equal values is [start, end)
    mean_rank = (starts + ends + 1) / 2.0  # mean of start + 1 ... end
    ranks = np.empty(x.size, np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def spearman(x, y):
    """Spearman's rho (average ranks for ties) of two vectors [N]; 0.0 when either is
    constant."""
    x, y = _pair(x, y, False)
    return pearson(rankdata(x), rankdata(y))


METRICS = {"accuracy": accuracy, "f1": f1, "matthews": matthews, "pearson": pearson,
           "spearman": spearman}


def task_metrics(task, preds, labels):
    """``{key: value}`` of the metrics a GLUE run writes for one eval split of ``task``
    (``glue.TASKS[task].metrics``: accuracy; QQP and MRPC also f1; CoLA matthews and
    accuracy; STS-B pearson and spearman)."""
    t = glue.get_task(task)
    return {key: METRICS[key](preds, labels) for key in t.metrics}


def score_from_metrics(task, metrics):
    """The paper's number for ``task`` (a fraction) from per-split metric dicts.

    Args:
      task: a GLUE task name.
      metrics: ``{split: {key: value}}`` holding at least the pairs of
        ``glue.TASKS[task].score`` (MNLI: "val" and "val_mismatched" accuracy).

    Raises:
      KeyError: a needed split or metric is missing (the message names it).
    """
    t = glue.get_task(task)
    values = []
    for split, key in t.score:
        if split not in metrics or key not in metrics[split]:
            raise KeyError(f"{t.title} needs {split}/{key}")
        values.append(float(metrics[split][key]))
    return float(np.mean(values))


def task_score(task, preds, labels):
    """The number Table 3 reports for ``task``, as a fraction (see the module docstring).

    Args:
      task: a GLUE task name.
      preds, labels: arrays of the "val" split, or mappings ``{split: array}``; MNLI needs
        mappings with both "val" (matched) and "val_mismatched".

    Returns:
      MNLI: mean of matched and mismatched accuracy; QQP: mean of accuracy and F1; MRPC: F1;
      STS-B: Spearman; CoLA: Matthews; RTE, QNLI, SST-2: accuracy.

    Raises:
      ValueError: a split the score needs is not given, or bad arrays.
    """
    t = glue.get_task(task)
    if not isinstance(preds, dict):
        preds, labels = {"val": preds}, {"val": labels}
    needed = dict.fromkeys(split for split, _ in t.score)
    missing = [s for s in needed if s not in preds or s not in labels]
    if missing:
        raise ValueError(f"{t.title}'s score needs predictions and labels of the splits "
                         f"{', '.join(needed)}; missing {', '.join(missing)}")
    return score_from_metrics(t.name, {s: task_metrics(t.name, preds[s], labels[s])
                                       for s in needed})
