"""The eight GLUE tasks of the LION paper's Table 3, as text and numpy labels.

Tasks (keys of :data:`TASKS`, in Table 3's column order): ``mnli``, ``rte``, ``qqp``,
``qnli``, ``sst2``, ``stsb``, ``mrpc``, ``cola`` (WNLI is not in the table). Each
:class:`GlueTask` holds the facts a fine-tuning run needs: its sentence keys, the number of
labels (STS-B: 0, a regression on 0..5), the splits, the metrics a run writes and the
number the paper reports (see experiments/glue_metrics.py for why).

Splits. ``"train"``; ``"val"``, the GLUE dev set (tfds ``validation``, ``dev.tsv``); for MNLI
``"val"`` is the *matched* dev set (``validation_matched``, ``dev_matched.tsv``) and
``"val_mismatched"`` the mismatched one (``validation_mismatched``, ``dev_mismatched.tsv``).
GLUE's test labels are hidden (tfds gives -1), so there is no ``"test"`` split here.

Sources (nothing is ever downloaded here):

* ``source="tfds"``: tensorflow-datasets' ``glue/<task>`` (e.g. ``glue/mnli``), already built
  (``tfds build glue/mnli``) under ``data_dir`` (empty: tfds' default directory).
  ``tensorflow_datasets`` is imported only then. Text features are read as UTF-8; labels
  are tfds' ClassLabel ids (the orders in :attr:`GlueTask.label_names`).
* ``source="files"``: the folders made by GLUE's download script (``python
  download_glue_data.py --data_dir glue_data --tasks all``, the gist linked from
  https://github.com/nyu-mll/GLUE-baselines); ``data_dir`` is the folder holding ``MNLI/``,
  ``SST-2/``, ... Files are UTF-8, one example a line, split at tabs only (no quoting, as
  tfds and the GLUE baselines read them). Columns read, by header name where the file has a
  header:

  * MNLI: ``MNLI/train.tsv``, ``dev_matched.tsv`` (val), ``dev_mismatched.tsv``
    (val_mismatched); text ``sentence1``, ``sentence2``; label ``gold_label`` (entailment,
    neutral, contradiction). Train has 12 columns, the dev files 16 (five annotator labels).
  * RTE: ``RTE/train.tsv``, ``dev.tsv``; text ``sentence1``, ``sentence2``; label ``label``
    (entailment, not_entailment).
  * QQP: ``QQP/train.tsv``, ``dev.tsv``; text ``question1``, ``question2``; label
    ``is_duplicate`` (0, 1).
  * QNLI: ``QNLI/train.tsv``, ``dev.tsv``; text ``question``, ``sentence``; label ``label``
    (entailment, not_entailment).
  * SST-2: ``SST-2/train.tsv``, ``dev.tsv``; text ``sentence``; label ``label`` (0, 1).
  * STS-B: ``STS-B/train.tsv``, ``dev.tsv``; text ``sentence1``, ``sentence2``; label
    ``score`` (a float in 0..5).
  * MRPC: ``MRPC/train.tsv``, ``dev.tsv`` (the script writes them with the header
    ``Quality``, ``#1 ID``, ``#2 ID``, ``#1 String``, ``#2 String``); text ``#1 String``,
    ``#2 String``; label ``Quality`` (0, 1).
  * CoLA: ``CoLA/train.tsv``, ``dev.tsv``, **no header**, four columns: source, label (0, 1),
    the author's mark, sentence; text column 3, label column 1.

  Label strings map to the tfds ids (their index in ``label_names``), so both sources give
  the same labels. A line whose number of fields differs from the header's (CoLA: 4), or an
  unknown label, is an error naming the file and line.

What a loader returns: ``dict(text_a=[N] list of str, text_b=[N] list of str or None (single
sentence tasks), labels=int32 [N] (class ids) or float32 [N] (STS-B scores))``, in file
order for ``files`` and tfds' order for ``tfds``. Tokenisation is a callable passed in
(:func:`encode`), so this module does not depend on a tokenizer::

    tokenize(texts_a, texts_b, max_len) -> (ids, type_ids, mask)   # each [N, max_len] ints
                                                                  # texts_b None: singles

:func:`load_glue_encoded` does both and can cache the arrays (npz, keyed by a tokenizer id the
caller names). A missing task raises :class:`GlueDataMissing` (a ``UserError`` and a
``FileNotFoundError``) whose one-line message names GLUE's download script, ``tfds build
glue/<task>`` and the config flags.
"""

import dataclasses
import os

import numpy as np

from experiments.data import common
from experiments.errors import UserError

SPLITS = ("train", "val", "val_mismatched")
SOURCES = common.SOURCES  # ("tfds", "files")
GLUE_SCRIPT = ("GLUE's download script (python download_glue_data.py --data_dir glue_data "
               "--tasks {script_task}; https://gist.github.com/W4ngatang/"
               "60c2bdb54d156a41194446737ce03e2e, linked from "
               "https://github.com/nyu-mll/GLUE-baselines)")

_VERSION = 1  # bump whenever the cached arrays change, so old cache files are not reused


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """Facts of one GLUE task.

    Attributes:
      name: our key ("mnli"), also tfds' config name (``glue/<name>``).
      title: the column of the LION paper's Table 3 ("MNLI", "SST2", "COLA", ...).
      folder: the folder of the GLUE download ("MNLI", "SST-2", "CoLA", ...).
      script_task: the download script's ``--tasks`` name ("MNLI", "SST", "STS", ...).
      text_keys: tfds feature names of the one or two sentences.
      tsv_text: the TSV columns of those sentences (header names; CoLA: indices).
      tsv_label: the TSV label column (header name; CoLA: index).
      num_labels: number of classes; 0 for a regression (STS-B).
      label_names: tfds' ClassLabel names in id order; the TSV label strings of the tasks that
        use strings are these names. Empty for STS-B.
      tsv_files: split -> file name inside ``folder``.
      tfds_splits: split -> tfds split name.
      metrics: the metric keys a run writes for each eval split (experiments/glue_metrics.py).
      score: the (split, metric) pairs whose mean is the number the paper reports.
    """

    name: str
    title: str
    folder: str
    script_task: str
    text_keys: tuple
    tsv_text: tuple
    tsv_label: object
    num_labels: int
    label_names: tuple
    tsv_files: dict
    tfds_splits: dict
    metrics: tuple
    score: tuple

    @property
    def splits(self):
        """The splits of this task: ("train", "val") or, MNLI, also "val_mismatched"."""
        return tuple(self.tsv_files)

    @property
    def eval_splits(self):
        """The labelled dev splits: ("val",) or, MNLI, ("val", "val_mismatched")."""
        return tuple(s for s in self.tsv_files if s != "train")

    @property
    def is_regression(self):
        return self.num_labels == 0


_DEV = dict(train="train.tsv", val="dev.tsv")
_TFDS = dict(train="train", val="validation")
_NLI = ("entailment", "not_entailment")

TASKS = {t.name: t for t in (
    GlueTask("mnli", "MNLI", "MNLI", "MNLI", ("premise", "hypothesis"),
             ("sentence1", "sentence2"), "gold_label", 3,
             ("entailment", "neutral", "contradiction"),
             dict(train="train.tsv", val="dev_matched.tsv",
                  val_mismatched="dev_mismatched.tsv"),
             dict(train="train", val="validation_matched",
                  val_mismatched="validation_mismatched"),
             ("accuracy",), (("val", "accuracy"), ("val_mismatched", "accuracy"))),
    GlueTask("rte", "RTE", "RTE", "RTE", ("sentence1", "sentence2"),
             ("sentence1", "sentence2"), "label", 2, _NLI, _DEV, _TFDS,
             ("accuracy",), (("val", "accuracy"),)),
    GlueTask("qqp", "QQP", "QQP", "QQP", ("question1", "question2"),
             ("question1", "question2"), "is_duplicate", 2, ("not_duplicate", "duplicate"),
             _DEV, _TFDS, ("accuracy", "f1"), (("val", "accuracy"), ("val", "f1"))),
    GlueTask("qnli", "QNLI", "QNLI", "QNLI", ("question", "sentence"),
             ("question", "sentence"), "label", 2, _NLI, _DEV, _TFDS,
             ("accuracy",), (("val", "accuracy"),)),
    GlueTask("sst2", "SST2", "SST-2", "SST", ("sentence",), ("sentence",), "label", 2,
             ("negative", "positive"), _DEV, _TFDS, ("accuracy",), (("val", "accuracy"),)),
    GlueTask("stsb", "STSB", "STS-B", "STS", ("sentence1", "sentence2"),
             ("sentence1", "sentence2"), "score", 0, (), _DEV, _TFDS,
             ("pearson", "spearman"), (("val", "spearman"),)),
    GlueTask("mrpc", "MRPC", "MRPC", "MRPC", ("sentence1", "sentence2"),
             ("#1 String", "#2 String"), "Quality", 2, ("not_equivalent", "equivalent"),
             _DEV, _TFDS, ("accuracy", "f1"), (("val", "f1"),)),
    GlueTask("cola", "COLA", "CoLA", "CoLA", ("sentence",), (3,), 1, 2,
             ("unacceptable", "acceptable"), _DEV, _TFDS, ("matthews", "accuracy"),
             (("val", "matthews"),)),
)}
TASK_NAMES = tuple(TASKS)  # Table 3's column order
CSV_COLUMNS = {"cola": 4}  # headerless files: their number of fields

# Accepted spellings of a task name -> key: "SST-2", "sst_2", "STS-B", "CoLA", ...
_ALIASES = {**{k: k for k in TASKS}, **{t.folder.lower().replace("-", ""): k
                                         for k, t in TASKS.items()}}


class GlueDataMissing(UserError, FileNotFoundError):
    """A GLUE task's data is not where the config points; the one-line message says how to
    get it. Both a UserError (the CLI prints ``error: <message>``) and a FileNotFoundError
    (what the data loaders of experiments/data raise)."""


def task_key(name):
    """Our key of a task name ("MNLI", "SST-2", "sts_b", "CoLA" ...); ValueError if unknown."""
    key = str(name).lower().replace("-", "").replace("_", "")
    if key not in _ALIASES:
        raise ValueError(f"unknown GLUE task {name!r} (known: {', '.join(TASK_NAMES)})")
    return _ALIASES[key]


def get_task(name):
    """The :class:`GlueTask` of a task name (any spelling :func:`task_key` accepts)."""
    return TASKS[task_key(name)]


def help_text(task):
    """How to get ``task``'s data (one line, no trailing period)."""
    t = get_task(task)
    return (f"get it with {GLUE_SCRIPT.format(script_task=t.script_task)} and pass "
            f"--config.data.source=files --config.data.data_dir=/path/to/glue_data (the folder "
            f"holding {t.folder}/), or pip install -e '.[data]', run `tfds build glue/{t.name}` "
            f"(it downloads; add --data_dir=DIR for a non-default tfds directory) and pass "
            f"--config.data.source=tfds [--config.data.data_dir=DIR]")


def check_split(task, split):
    """ValueError unless ``split`` is one of ``task``'s splits."""
    t = get_task(task)
    if split not in t.splits:
        raise ValueError(f"GLUE {t.title} has splits {t.splits}, got {split!r}")


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


def _parse_label(t, value, where):
    """A TSV label field -> class id (int) or score (float); ValueError naming ``where``."""
    value = value.strip()
    try:
        if t.is_regression:
            return float(value)
        if value in t.label_names:
            return t.label_names.index(value)
        label = int(value)
        if 0 <= label < t.num_labels:
            return label
    except ValueError:
        pass
    known = "a number" if t.is_regression else ", ".join(
        [*t.label_names, *map(str, range(t.num_labels))])
    raise ValueError(f"{where}: label {value!r} is not {known}")


def read_tsv(task, path):
    """``(texts_a, texts_b or None, labels)`` of one GLUE TSV file of ``task`` (columns in the
    module docstring): lists of str, and int32 / float32 [N] labels.

    Raises:
      GlueDataMissing: no such file.
      ValueError: a line with the wrong number of fields, a missing column or a bad label
        (the message names the file and line).
    """
    t = get_task(task)
    if not os.path.isfile(path):
        raise GlueDataMissing(f"GLUE {t.title} file {path} not found: {help_text(t.name)}")
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    if t.name in CSV_COLUMNS:
        width, text_cols, label_col, first = CSV_COLUMNS[t.name], t.tsv_text, t.tsv_label, 1
    else:
        header = lines[0].split("\t") if lines else []
        missing = [c for c in (*t.tsv_text, t.tsv_label) if c not in header]
        if missing:
            raise ValueError(f"{path}: the header has no column {missing[0]!r} (it has "
                             f"{', '.join(header) or 'nothing'}); is this GLUE's "
                             f"{t.folder}/{os.path.basename(path)}?")
        width, first = len(header), 2
        text_cols = tuple(header.index(c) for c in t.tsv_text)
        label_col = header.index(t.tsv_label)
        lines = lines[1:]
    texts = [[] for _ in text_cols]
    labels = []
    for number, line in enumerate(lines, start=first):
        fields = line.split("\t")
        where = f"{path} line {number}"
        if len(fields) != width:
            raise ValueError(f"{where} has {len(fields)} tab-separated fields, expected {width}")
        for column, out in zip(text_cols, texts):
            out.append(fields[column])
        labels.append(_parse_label(t, fields[label_col], where))
    return (texts[0], texts[1] if len(texts) > 1 else None,
            np.asarray(labels, np.float32 if t.is_regression else np.int32))


def _decode(values):
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


def _from_tfds(t, split, data_dir):
    try:
        d = common.tfds_split(f"glue/{t.name}", t.tfds_splits[split], data_dir,
                              help_text(t.name))
    except GlueDataMissing:
        raise
    except FileNotFoundError as e:
        raise GlueDataMissing(f"GLUE {t.title}: {e}") from None
    texts = [_decode(d[key]) for key in t.text_keys]
    if t.is_regression:
        labels = np.asarray(d["label"], np.float32)
    else:
        labels = common.check_labels(d["label"], t.num_labels, f"glue/{t.name} {split}")
    return texts[0], texts[1] if len(texts) > 1 else None, labels


def load_glue(task, split, *, source="tfds", data_dir=""):
    """One split of one GLUE task as text and labels (conventions in the module docstring).

    Args:
      task: a task name ("mnli", "SST-2", ...; see :func:`task_key`).
      split: "train", "val" (MNLI: matched) or, MNLI only, "val_mismatched".
      source: "tfds" (``glue/<task>`` built under ``data_dir``) or "files" (GLUE's TSV folders
        under ``data_dir``).
      data_dir: tfds' data directory ("" = its default), or the folder holding ``MNLI/``,
        ``SST-2/``, ... (``~`` expanded).

    Returns:
      dict(text_a=list of N str, text_b=list of N str or None (SST-2, CoLA),
           labels=int32 [N] class ids, or float32 [N] similarity scores in [0, 5] for STS-B).

    Raises:
      GlueDataMissing: the task's data is not there; one line saying how to get it.
      ValueError: a bad argument or a malformed file.
    """
    t = get_task(task)
    check_split(t.name, split)
    common.check_source(source)
    if source == "files":
        if not data_dir:
            raise GlueDataMissing(f"no GLUE data_dir given for {t.title}: {help_text(t.name)}")
        path = os.path.join(os.path.expanduser(data_dir), t.folder, t.tsv_files[split])
        text_a, text_b, labels = read_tsv(t.name, path)
    else:
        text_a, text_b, labels = _from_tfds(t, split, data_dir)
    return dict(text_a=text_a, text_b=text_b, labels=labels)


# --------------------------------------------------------------------------------------------
# Tokenisation
# --------------------------------------------------------------------------------------------


def encode(examples, tokenize, max_len):
    """Token arrays of :func:`load_glue`'s examples through a tokenizer callable.

    Args:
      examples: dict(text_a, text_b, labels) as :func:`load_glue` returns.
      tokenize: ``tokenize(texts_a, texts_b, max_len) -> (ids, type_ids, mask)``: lists of N
        str (``texts_b`` None for single-sentence tasks) -> three integer or bool arrays
        ``[N, max_len]``: token ids (padded), segment ids (0 for sentence a, 1 for b), 1 on
        real tokens and 0 on padding. Truncation and special tokens are its business.
      max_len: the padded length.

    Returns:
      dict(tokens=int32 [N, max_len], type_ids=int32 [N, max_len],
           attention_mask=int32 [N, max_len] in {0, 1}, labels=as given [N]).
      (``attention_mask``, not ``mask``: the trainer's batches use ``mask [batch]`` for the
      real-example mask.)

    Raises:
      ValueError: the tokenizer returned arrays of another shape, non-integers, or a mask with
        values other than 0 and 1.
    """
    n = len(examples["text_a"])
    out = tokenize(examples["text_a"], examples["text_b"], max_len)
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise ValueError("tokenize must return (ids, type_ids, mask)")
    arrays = {}
    for name, value in zip(("tokens", "type_ids", "attention_mask"), out):
        value = np.asarray(value)
        if value.shape != (n, max_len):
            raise ValueError(f"tokenize returned {name} of shape {value.shape}, expected "
                             f"{(n, max_len)}")
        if not (np.issubdtype(value.dtype, np.integer) or value.dtype == bool):
            raise ValueError(f"tokenize returned {name} of dtype {value.dtype}, expected ints")
        arrays[name] = value.astype(np.int32)
    if not np.isin(arrays["attention_mask"], (0, 1)).all():
        raise ValueError("tokenize returned a mask with values other than 0 and 1")
    return dict(arrays, labels=np.asarray(examples["labels"]))


def load_glue_encoded(task, split, tokenize, max_len, *, source="tfds", data_dir="",
                      tokenizer_id=None, cache_dir="~/.cache/lion_jax/glue"):
    """:func:`load_glue` then :func:`encode`; with ``tokenizer_id`` the arrays are cached.

    Args:
      task, split, source, data_dir: as :func:`load_glue`.
      tokenize, max_len: as :func:`encode`.
      tokenizer_id: a string that changes whenever ``tokenize`` would give other ids (e.g.
        "bert-base-uncased vocab sha256:..."); None: no cache.
      cache_dir: folder of ``glue_<task>_<split>_<hash>.npz`` (the hash covers task, split,
        source, absolute data_dir, max_len, tokenizer_id and the module's version).

    Returns:
      :func:`encode`'s dict.
    """
    t = get_task(task)

    def build():
        return encode(load_glue(t.name, split, source=source, data_dir=data_dir), tokenize,
                      max_len)

    if tokenizer_id is None:
        return build()
    check_split(t.name, split)
    common.check_source(source)
    key = dict(task=t.name, split=split, source=source, data_dir=common.abs_dir(data_dir),
               max_len=int(max_len), tokenizer=str(tokenizer_id), version=_VERSION)
    return common.cached(cache_dir, f"glue_{t.name}_{split}", key, build)
