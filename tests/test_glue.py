"""GLUE: the metrics (experiments/glue_metrics.py) against independent implementations, the
TSV loader (experiments/data/glue.py) on stand-in files of every task, and the table script
(experiments/glue_table.py) on fake workdirs. No tensorflow, no training."""

import importlib.util
import json
import math
import os
import re

import numpy as np
import pytest
import scipy.stats

from experiments import glue_metrics as gm
from experiments import glue_table as gt
from experiments.data import glue
from experiments.errors import UserError

# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def ref_f1(preds, labels):
    """Binary F1 of class 1 from precision and recall, counted in a Python loop."""
    tp = sum(1 for p, t in zip(preds, labels) if p == 1 and t == 1)
    fp = sum(1 for p, t in zip(preds, labels) if p == 1 and t != 1)
    fn = sum(1 for p, t in zip(preds, labels) if p != 1 and t == 1)
    if tp == 0:
        return 0.0
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return 2 * precision * recall / (precision + recall)


def ref_matthews(preds, labels, num_classes):
    """Matthews as the correlation of one-hot matrices: cov(X, Y) / sqrt(cov(X, X) cov(Y, Y)),
    each cov summed over classes (Gorodkin 2004); 0 when a side is constant."""
    x = np.eye(num_classes)[preds]
    y = np.eye(num_classes)[labels]

    def cov(a, b):
        return sum(np.cov(a[:, k], b[:, k], bias=True)[0, 1] for k in range(num_classes))

    denominator = math.sqrt(cov(x, x) * cov(y, y))
    return 0.0 if denominator == 0 else cov(x, y) / denominator


@pytest.mark.parametrize("num_classes", [2, 3])
def test_classification_metrics_match_independent_ones(rng, num_classes):
    for _ in range(20):
        n = int(rng.integers(1, 300))
        labels = rng.integers(0, num_classes, n)
        # predictions that agree with the labels more often than chance, sometimes constant
        agree = rng.random(n) < rng.random()
        preds = np.where(agree, labels, rng.integers(0, num_classes, n))
        if rng.random() < 0.2:
            preds = np.full(n, rng.integers(0, num_classes))
        assert gm.accuracy(preds, labels) == pytest.approx(
            sum(int(p == t) for p, t in zip(preds, labels)) / n, abs=1e-12)
        assert gm.matthews(preds, labels) == pytest.approx(
            ref_matthews(preds, labels, num_classes), abs=1e-10)
        logits = rng.normal(size=(n, num_classes))
        logits[np.arange(n), preds] += 10.0  # argmax == preds
        assert gm.accuracy(logits, labels) == gm.accuracy(preds, labels)
        assert gm.matthews(logits, labels) == gm.matthews(preds, labels)
        if num_classes == 2:
            assert gm.f1(preds, labels) == pytest.approx(ref_f1(preds, labels), abs=1e-12)
            assert gm.f1(logits, labels) == gm.f1(preds, labels)
            # binary Matthews is Pearson's r of the 0/1 vectors
            if len(set(preds)) > 1 and len(set(labels)) > 1:
                assert gm.matthews(preds, labels) == pytest.approx(
                    scipy.stats.pearsonr(preds, labels)[0], abs=1e-10)



@pytest.mark.parametrize("num_classes", [2, 3])
def test_metrics_match_scikit_learn_on_random_predictions(rng, num_classes):
    """Accuracy, F1 (binary, class 1) and Matthews against sklearn.metrics on random
    predictions, constant predictions included (correlations: test_correlations_match_scipy)."""
    from sklearn import metrics

    for _ in range(20):
        n = int(rng.integers(2, 400))
        labels = rng.integers(0, num_classes, n)
        preds = rng.integers(0, num_classes, n)
        if rng.random() < 0.2:
            preds = np.full(n, rng.integers(0, num_classes))
        assert gm.accuracy(preds, labels) == pytest.approx(
            metrics.accuracy_score(labels, preds), abs=1e-12)
        assert gm.matthews(preds, labels) == pytest.approx(
            metrics.matthews_corrcoef(labels, preds), abs=1e-10)
        if num_classes == 2:
            assert gm.f1(preds, labels) == pytest.approx(
                metrics.f1_score(labels, preds, zero_division=0.0), abs=1e-12)

def test_correlations_match_scipy(rng):
    for trial in range(20):
        n = int(rng.integers(2, 400))
        labels = rng.uniform(0, 5, n)
        preds = labels + rng.normal(scale=rng.uniform(0.1, 3), size=n)
        if trial % 2:  # many ties, as STS-B's labels (steps of 0.2) and rounded predictions
            labels, preds = np.round(labels * 5) / 5, np.round(preds)
        if len(set(labels)) < 2 or len(set(preds)) < 2:
            continue
        assert gm.pearson(preds, labels) == pytest.approx(
            scipy.stats.pearsonr(preds, labels)[0], abs=1e-10)
        assert gm.spearman(preds, labels) == pytest.approx(
            scipy.stats.spearmanr(preds, labels)[0], abs=1e-10)
        np.testing.assert_array_equal(gm.rankdata(preds), scipy.stats.rankdata(preds))
        assert gm.pearson(preds[:, None], labels) == gm.pearson(preds, labels)  # [N, 1]


def test_hand_checked_cases():
    assert gm.accuracy([0, 1, 1, 0], [0, 1, 0, 0]) == 0.75
    # tp 1, fp 1, fn 1: precision = recall = 1/2
    assert gm.f1([1, 1, 0, 0], [1, 0, 1, 0]) == 0.5
    # all predicted positive, one positive label: precision 1/4, recall 1 -> 0.4
    assert gm.f1([1, 1, 1, 1], [1, 0, 0, 0]) == pytest.approx(0.4)
    # tp 2, fp 1, fn 0, tn 1: (2 * 1 - 1 * 0) / sqrt(3 * 2 * 2 * 1)
    assert gm.matthews([1, 1, 1, 0], [1, 1, 0, 0]) == pytest.approx(2 / math.sqrt(12))
    assert gm.matthews([0, 1, 0, 1], [0, 1, 0, 1]) == 1.0
    assert gm.matthews([1, 0, 1, 0], [0, 1, 0, 1]) == -1.0
    assert gm.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert gm.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # no ties: 1 - 6 sum d^2 / (n (n^2 - 1)) = 1 - 6 * 2 / 60
    assert gm.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    np.testing.assert_array_equal(gm.rankdata([10, 20, 20, 30, 20]), [1, 3, 3, 5, 3])
    np.testing.assert_array_equal(gm.rankdata([2.0, 1.0]), [2, 1])


def test_undefined_cases_are_zero_not_nan():
    labels = np.array([0, 1, 1, 0, 1])
    assert gm.matthews(np.ones(5, int), labels) == 0.0  # constant predictions
    assert gm.matthews(labels, np.zeros(5, int)) == 0.0  # constant labels
    assert gm.matthews([1], [1]) == 0.0
    assert gm.f1(np.zeros(5, int), np.zeros(5, int)) == 0.0  # no positive anywhere
    assert gm.f1(np.zeros(5, int), labels) == 0.0
    assert gm.pearson(np.full(5, 2.5), labels) == 0.0
    assert gm.spearman(labels, np.full(5, 3.0)) == 0.0
    assert gm.spearman([1.0], [2.0]) == 0.0
    assert gm.accuracy([1], [1]) == 1.0


@pytest.mark.parametrize("call", [
    lambda: gm.accuracy([], []),
    lambda: gm.f1([0, 1], [0, 1, 1]),
    lambda: gm.spearman(np.zeros((2, 2)), [0.0, 1.0]),
    lambda: gm.matthews([-1, 0], [0, 0]),
])
def test_bad_inputs_are_value_errors(call):
    with pytest.raises(ValueError):
        call()


def test_counts_forms_match_and_are_scale_free(rng):
    preds, labels = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    cm = gm.confusion_matrix(preds, labels)
    assert cm.sum() == 200 and cm[1, 0] == np.sum((labels == 1) & (preds == 0))
    tp, fp, fn = cm[1, 1], cm[0, 1], cm[1, 0]
    assert gm.f1_from_counts(tp, fp, fn) == pytest.approx(gm.f1(preds, labels), abs=1e-12)
    assert gm.f1_from_counts(tp / 200, fp / 200, fn / 200) == pytest.approx(
        gm.f1(preds, labels), abs=1e-12)
    assert gm.matthews_from_confusion(cm / 200) == pytest.approx(
        gm.matthews(preds, labels), abs=1e-12)
    assert gm.confusion_matrix([0, 0], [0, 0], num_classes=3).shape == (3, 3)


def test_task_score_is_the_papers_number(rng):
    preds, labels = rng.integers(0, 2, 100), rng.integers(0, 2, 100)
    acc, f1 = gm.accuracy(preds, labels), gm.f1(preds, labels)
    assert gm.task_score("qqp", preds, labels) == pytest.approx((acc + f1) / 2)
    assert gm.task_score("MRPC", preds, labels) == f1
    assert gm.task_score("CoLA", preds, labels) == gm.matthews(preds, labels)
    for task in ("rte", "qnli", "SST-2"):
        assert gm.task_score(task, preds, labels) == acc
    x, y = rng.normal(size=50), rng.normal(size=50)
    assert gm.task_score("STS-B", x, y) == gm.spearman(x, y)
    assert gm.task_metrics("stsb", x, y) == {"pearson": gm.pearson(x, y),
                                             "spearman": gm.spearman(x, y)}
    assert set(gm.task_metrics("cola", preds, labels)) == {"matthews", "accuracy"}
    # MNLI: the mean of matched and mismatched accuracy; both splits are needed
    m = ([0, 1, 2, 2], [0, 1, 2, 0])  # 3/4
    mm = ([2, 2, 1, 0, 0], [2, 1, 1, 0, 1])  # 3/5
    assert gm.task_score("mnli", {"val": m[0], "val_mismatched": mm[0]},
                         {"val": m[1], "val_mismatched": mm[1]}) == pytest.approx(0.675)
    with pytest.raises(ValueError, match="val_mismatched"):
        gm.task_score("mnli", m[0], m[1])
    with pytest.raises(KeyError, match="QQP needs val/f1"):
        gm.score_from_metrics("qqp", {"val": {"accuracy": 0.9}})


# --------------------------------------------------------------------------------------------
# Data: the files source on stand-in TSVs
# --------------------------------------------------------------------------------------------

MNLI_TRAIN_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\t"
                     "sentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\t"
                     "sentence2\tlabel1\tgold_label")
MNLI_DEV_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\t"
                   "sentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\t"
                   "sentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")


def mnli_line(i, a, b, gold, dev):
    labels = [gold] * (5 if dev else 1)
    return "\t".join([str(i), "1", f"{i}e", "fiction", "( x )", "( y )", "(ROOT x)",
                      "(ROOT y)", a, b, *labels, gold])


# task -> {file: text}, and the examples each split must give: (text_a, text_b, labels)
STAND_INS = {
    "MNLI": {
        "train.tsv": "\n".join([MNLI_TRAIN_HEADER,
                                mnli_line(0, "A man \"sleeps\".", "Nobody sleeps.",
                                          "contradiction", False),
                                mnli_line(1, "Café au lait.", "A drink.", "entailment", False),
                                mnli_line(2, "It rains.", "It is wet.", "neutral", False)]),
        "dev_matched.tsv": "\n".join([MNLI_DEV_HEADER,
                                      mnli_line(0, "m premise", "m hypothesis", "neutral",
                                                True)]),
        "dev_mismatched.tsv": "\n".join([MNLI_DEV_HEADER,
                                         mnli_line(0, "mm one", "mm two", "entailment", True),
                                         mnli_line(1, "mm three", "mm four", "contradiction",
                                                   True)]),
    },
    "RTE": {
        "train.tsv": "index\tsentence1\tsentence2\tlabel\n0\tP one.\tH one.\tentailment\n"
                     "1\tP two.\tH two.\tnot_entailment\n",
        "dev.tsv": "index\tsentence1\tsentence2\tlabel\n0\tdev p\tdev h\tnot_entailment\n",
    },
    "QQP": {
        "train.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\r\n"
                     "7\t1\t2\tHow do I cook?\tHow to cook?\t1\r\n"
                     "8\t3\t4\tWhy \"sky\" blue?\tWhat is 2+2?\t0\r\n",
        "dev.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                   "9\t5\t6\tdev q1\tdev q2\t0\n",
    },
    "QNLI": {
        "train.tsv": "index\tquestion\tsentence\tlabel\n0\tWho?\tHim.\tentailment\n",
        "dev.tsv": "index\tquestion\tsentence\tlabel\n0\tWhere?\tNowhere.\tnot_entailment\n"
                   "1\tWhen?\tNow.\tentailment\n",
    },
    "SST-2": {
        "train.tsv": "sentence\tlabel\nit 's a charming journey \t1\nflat , dull \t0\n",
        "dev.tsv": "sentence\tlabel\nunflinchingly bleak \t0\n",
    },
    "STS-B": {
        "train.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                     "sentence2\tscore\n"
                     "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane takes off."
                     "\tAn air plane is taking off.\t5.000\n"
                     "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man plays."
                     "\tA woman cooks.\t0.500\n",
        "dev.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                   "sentence2\tscore\n"
                   "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tdev one\tdev two"
                   "\t3.8\n",
    },
    "MRPC": {
        "train.tsv": "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                     "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him .\n"
                     "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought it .\n",
        "dev.tsv": "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                   "1\t1355540\t1355592\tdev s1 .\tdev s2 .\n",
    },
    "CoLA": {
        "train.tsv": "gj04\t1\t\tOur friends won't buy this analysis.\n"
                     "gj04\t0\t*\tThey drank the pub.\n",
        "dev.tsv": "gj04\t0\t*\tThe more we study verbs, the crazier.\n",
    },
}
EXPECTED = {
    ("mnli", "train"): (["A man \"sleeps\".", "Café au lait.", "It rains."],
                        ["Nobody sleeps.", "A drink.", "It is wet."], [2, 0, 1]),
    ("mnli", "val"): (["m premise"], ["m hypothesis"], [1]),
    ("mnli", "val_mismatched"): (["mm one", "mm three"], ["mm two", "mm four"], [0, 2]),
    ("rte", "train"): (["P one.", "P two."], ["H one.", "H two."], [0, 1]),
    ("rte", "val"): (["dev p"], ["dev h"], [1]),
    ("qqp", "train"): (["How do I cook?", "Why \"sky\" blue?"],
                       ["How to cook?", "What is 2+2?"], [1, 0]),
    ("qqp", "val"): (["dev q1"], ["dev q2"], [0]),
    ("qnli", "train"): (["Who?"], ["Him."], [0]),
    ("qnli", "val"): (["Where?", "When?"], ["Nowhere.", "Now."], [1, 0]),
    ("sst2", "train"): (["it 's a charming journey ", "flat , dull "], None, [1, 0]),
    ("sst2", "val"): (["unflinchingly bleak "], None, [0]),
    ("stsb", "train"): (["A plane takes off.", "A man plays."],
                        ["An air plane is taking off.", "A woman cooks."], [5.0, 0.5]),
    ("stsb", "val"): (["dev one"], ["dev two"], [3.8]),
    ("mrpc", "train"): (["Amrozi accused his brother .", "Yucaipa owned Dominick 's ."],
                        ["Referring to him .", "Yucaipa bought it ."], [1, 0]),
    ("mrpc", "val"): (["dev s1 ."], ["dev s2 ."], [1]),
    ("cola", "train"): (["Our friends won't buy this analysis.", "They drank the pub."],
                        None, [1, 0]),
    ("cola", "val"): (["The more we study verbs, the crazier."], None, [0]),
}


def write_glue(root, stand_ins=STAND_INS):
    for folder, files in stand_ins.items():
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        for name, text in files.items():
            with open(os.path.join(root, folder, name), "w", encoding="utf-8",
                      newline="") as f:
                f.write(text)
    return str(root)


@pytest.fixture
def glue_dir(tmp_path):
    return write_glue(tmp_path / "glue_data")


def test_task_table():
    assert glue.TASK_NAMES == ("mnli", "rte", "qqp", "qnli", "sst2", "stsb", "mrpc", "cola")
    assert [glue.TASKS[t].title for t in glue.TASK_NAMES] == [
        "MNLI", "RTE", "QQP", "QNLI", "SST2", "STSB", "MRPC", "COLA"]
    assert glue.TASKS["mnli"].eval_splits == ("val", "val_mismatched")
    assert glue.TASKS["mnli"].num_labels == 3 and glue.TASKS["stsb"].is_regression
    assert all(glue.TASKS[t].eval_splits == ("val",) for t in glue.TASK_NAMES if t != "mnli")
    for spelling, key in [("SST-2", "sst2"), ("STS-B", "stsb"), ("CoLA", "cola"),
                          ("sts_b", "stsb"), ("MNLI", "mnli")]:
        assert glue.task_key(spelling) == key
    with pytest.raises(ValueError, match="unknown GLUE task 'wnli'"):
        glue.task_key("wnli")


def test_files_source_reads_every_task(glue_dir):
    assert {task for task, _ in EXPECTED} == set(glue.TASK_NAMES)
    for (task, split), (text_a, text_b, labels) in EXPECTED.items():
        d = glue.load_glue(task, split, source="files", data_dir=glue_dir)
        assert d["text_a"] == text_a, (task, split)
        assert d["text_b"] == text_b, (task, split)
        if task == "stsb":
            assert d["labels"].dtype == np.float32
            np.testing.assert_allclose(d["labels"], labels, rtol=1e-6)
        else:
            assert d["labels"].dtype == np.int32
            np.testing.assert_array_equal(d["labels"], labels)


def test_mnli_has_matched_and_mismatched_val_only_mnli(glue_dir):
    matched = glue.load_glue("mnli", "val", source="files", data_dir=glue_dir)
    mismatched = glue.load_glue("MNLI", "val_mismatched", source="files", data_dir=glue_dir)
    assert matched["text_a"] == ["m premise"] and mismatched["text_a"][0] == "mm one"
    with pytest.raises(ValueError, match="splits"):
        glue.load_glue("rte", "val_mismatched", source="files", data_dir=glue_dir)
    with pytest.raises(ValueError, match="splits"):
        glue.load_glue("rte", "test", source="files", data_dir=glue_dir)


@pytest.mark.parametrize("folder, name, text, message", [
    ("RTE", "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tp\th\tentailment\n1\tp\th\n",
     r"RTE/dev\.tsv line 3 has 3 tab-separated fields, expected 4"),
    ("RTE", "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tp\th\tmaybe\n",
     r"RTE/dev\.tsv line 2: label 'maybe' is not entailment, not_entailment, 0, 1"),
    ("SST-2", "dev.tsv", "sentence\tlabel\nfine\t2\n", r"line 2: label '2' is not"),
    ("STS-B", "dev.tsv", "sentence1\tsentence2\tscore\na\tb\thigh\n", "is not a number"),
    ("CoLA", "dev.tsv", "gj04\t1\tOnly three fields.\n", r"line 1 has 3 tab-separated"),
    ("QQP", "dev.tsv", "id\tquestion1\tquestion2\n1\ta\tb\n", "no column 'is_duplicate'"),
])
def test_malformed_files_name_file_and_line(tmp_path, folder, name, text, message):
    root = write_glue(tmp_path / "glue_data", {folder: {name: text}})
    with pytest.raises(ValueError, match=message):
        glue.load_glue(folder, "val", source="files", data_dir=root)


@pytest.mark.parametrize("task", glue.TASK_NAMES)
def test_missing_task_is_one_error_line(tmp_path, task):
    t = glue.TASKS[task]
    with pytest.raises(glue.GlueDataMissing) as info:
        glue.load_glue(task, "train", source="files", data_dir=str(tmp_path))
    error = info.value
    assert isinstance(error, UserError) and isinstance(error, FileNotFoundError)
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"GLUE {t.title} file {tmp_path}/{t.folder}/train.tsv not found")
    for needed in ("download_glue_data.py", f"--tasks {t.script_task}",
                   f"tfds build glue/{task}", "--config.data.source=files",
                   "--config.data.data_dir=", "--config.data.source=tfds"):
        assert needed in message
    with pytest.raises(glue.GlueDataMissing, match="no GLUE data_dir given"):
        glue.load_glue(task, "val", source="files", data_dir="")


def test_tfds_source_without_tensorflow_datasets_is_one_error_line():
    if importlib.util.find_spec("tensorflow_datasets") is not None:
        pytest.skip("tensorflow-datasets is installed")
    with pytest.raises(glue.GlueDataMissing) as info:
        glue.load_glue("cola", "train", source="tfds")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("GLUE COLA: tensorflow-datasets is not installed: ")
    assert "tfds build glue/cola" in message


def test_tfds_source_names_and_decoding(monkeypatch):
    """The tfds path on a stand-in reader: dataset and split names, feature keys, decoding."""
    asked = []

    def fake_tfds_split(name, split, data_dir, help_text):
        asked.append((name, split, data_dir))
        task = glue.TASKS[name.split("/")[1]]
        d = {key: np.array([f"{key} é".encode(), b"x"], object) for key in task.text_keys}
        d["label"] = np.array([1.5, 4.0], np.float32) if task.is_regression else np.array(
            [task.num_labels - 1, 0])
        d["idx"] = np.arange(2)
        return d

    monkeypatch.setattr(glue.common, "tfds_split", fake_tfds_split)
    mnli = glue.load_glue("mnli", "val_mismatched", data_dir="/data/tfds")
    assert asked[-1] == ("glue/mnli", "validation_mismatched", "/data/tfds")
    assert mnli["text_a"] == ["premise é", "x"] and mnli["text_b"] == ["hypothesis é", "x"]
    np.testing.assert_array_equal(mnli["labels"], [2, 0])
    assert mnli["labels"].dtype == np.int32
    assert glue.load_glue("mnli", "val")["text_a"] and asked[-1][1] == "validation_matched"
    sst2 = glue.load_glue("SST-2", "train")
    assert asked[-1][:2] == ("glue/sst2", "train") and sst2["text_b"] is None
    stsb = glue.load_glue("stsb", "val")
    assert asked[-1][:2] == ("glue/stsb", "validation") and stsb["labels"].dtype == np.float32
    np.testing.assert_array_equal(stsb["labels"], [1.5, 4.0])


def fake_tokenize(calls):
    """A tokenizer stand-in: word ids by hash, [CLS] a [SEP] b [SEP], padded with 0."""
    def tokenize(texts_a, texts_b, max_len):
        calls.append(len(texts_a))
        n = len(texts_a)
        ids, types, mask = (np.zeros((n, max_len), np.int64) for _ in range(3))
        for i in range(n):
            a = [2, *(hash(w) % 97 + 5 for w in texts_a[i].split()), 3]
            b = [] if texts_b is None else [*(hash(w) % 97 + 5 for w in texts_b[i].split()), 3]
            row = (a + b)[:max_len]
            ids[i, :len(row)] = row
            types[i, len(a):len(row)] = 1
            mask[i, :len(row)] = 1
        return ids, types, mask.astype(bool)
    return tokenize


def test_encode_and_cache(glue_dir, tmp_path):
    calls = []
    d = glue.load_glue_encoded("mnli", "train", fake_tokenize(calls), 6, source="files",
                               data_dir=glue_dir)
    assert {k: (v.shape, v.dtype) for k, v in d.items()} == {
        "tokens": ((3, 6), np.int32), "type_ids": ((3, 6), np.int32),
        "attention_mask": ((3, 6), np.int32), "labels": ((3,), np.int32)}
    np.testing.assert_array_equal(d["labels"], [2, 0, 1])
    assert d["tokens"][0, 0] == 2 and d["type_ids"][0, 0] == 0 and d["type_ids"][0, -1] == 1
    single = glue.load_glue_encoded("cola", "val", fake_tokenize(calls), 16, source="files",
                                    data_dir=glue_dir)
    # 7 words, [CLS] and [SEP]; no second segment
    assert single["type_ids"].sum() == 0 and single["attention_mask"][0].sum() == 9
    cache = str(tmp_path / "cache")
    calls.clear()
    kwargs = dict(source="files", data_dir=glue_dir, tokenizer_id="fake v1", cache_dir=cache)
    first = glue.load_glue_encoded("stsb", "train", fake_tokenize(calls), 8, **kwargs)
    second = glue.load_glue_encoded("stsb", "train", fake_tokenize(calls), 8, **kwargs)
    assert calls == [2]  # the second call read the cache
    assert len(os.listdir(cache)) == 1
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])
    assert second["labels"].dtype == np.float32


@pytest.mark.parametrize("bad, message", [
    (lambda a, b, n: (np.zeros((len(a), n + 1), int),) * 3, "shape"),
    (lambda a, b, n: (np.zeros((len(a), n)),) * 3, "dtype"),
    (lambda a, b, n: (np.full((len(a), n), 2),) * 3, "mask"),
    (lambda a, b, n: np.zeros((len(a), n), int), "return"),
])
def test_encode_checks_the_tokenizer(glue_dir, bad, message):
    examples = glue.load_glue("rte", "train", source="files", data_dir=glue_dir)
    with pytest.raises(ValueError, match=message):
        glue.encode(examples, bad, 4)


# --------------------------------------------------------------------------------------------
# glue_table on fake workdirs
# --------------------------------------------------------------------------------------------

H100 = "NVIDIA H100 80GB HBM3"


def run_record(step, time):
    return {"step": step, "split": "run", "metrics": {}, "time": time,
            "info": {"device": H100, "platform": "gpu", "num_devices": 1, "jax": "0.11.2",
                     "config": "configs/glue/glue.py"}}


def eval_records(step, time, **splits):
    return [{"step": step, "split": split, "metrics": {"loss": 0.5, **metrics}, "time": time}
            for split, metrics in splits.items()]


def write_run(name, task, evals, steps=300, label="LION-S LARGE", mlm=False):
    """``runs/name`` (relative to the current directory): config.json + metrics.jsonl with a
    run record at time 0, then ``evals`` = [(step, {split: metrics})] at time 10 * step."""
    path = os.path.join("runs", name)
    os.makedirs(path)
    config = {"task": "mlm" if mlm else "glue", "label": label, "num_train_steps": steps,
              "data": {"name": "c4"} if mlm else {"name": "glue", "task": task},
              "model": {"mixer": {"variant": "s"}}}
    records = [run_record(0, 0.0)]
    for step, splits in evals:
        records += [{"step": step, "split": "train", "metrics": {"loss": 1.0},
                     "time": 10.0 * step}, *eval_records(step, 10.0 * step, **splits)]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


def val(**metrics):
    return {"val": metrics}


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return [
        # MNLI: step 100 has no mismatched record (skipped although its matched is best);
        # best of the complete ones: step 200, (0.80 + 0.84) / 2
        write_run("mnli", "mnli", [
            (100, val(accuracy=0.95)),
            (200, {"val": {"accuracy": 0.80}, "val_mismatched": {"accuracy": 0.84}}),
            (300, {"val": {"accuracy": 0.79}, "val_mismatched": {"accuracy": 0.80}})]),
        # two RTE seeds: best 0.60 (step 100; earliest of equal) and 0.70 -> mean 0.65
        write_run("rte_seed0", "rte", [(100, val(accuracy=0.60)), (200, val(accuracy=0.60)),
                                       (300, val(accuracy=0.55))]),
        write_run("rte_seed1", "RTE", [(300, val(accuracy=0.70))]),
        write_run("qqp", "qqp", [(300, val(accuracy=0.90, f1=0.86))]),  # 0.88
        write_run("qnli", "qnli", [(300, val(accuracy=0.91))]),
        write_run("sst2", "SST-2", [(300, val(accuracy=0.93))]),
        write_run("stsb", "STS-B", [(300, val(pearson=0.90, spearman=0.89))]),
        write_run("mrpc", "mrpc", [(300, val(accuracy=0.85, f1=0.89))]),
        # CoLA unfinished (step 200 of 300)
        write_run("cola", "CoLA", [(200, val(matthews=0.55, accuracy=0.80))]),
        write_run("mlm", None, [(300, val(accuracy=0.69))], mlm=True),
        write_run("bert_rte", "rte", [(300, val(accuracy=0.66))], label="BERT LARGE"),
        write_run("bert_noeval", "sst2", [], label="BERT LARGE"),
    ]


def table_lines(report, first_cell):
    return [line for line in report.splitlines() if line.startswith(f"| {first_cell}")]


def test_collect_picks_the_best_complete_eval(runs):
    rows = {os.path.basename(r["workdir"]): r for r in gt.collect(runs)}
    assert (rows["mnli"]["step"], rows["mnli"]["score"]) == (200, pytest.approx(0.82))
    assert rows["mnli"]["metrics"] == ("val accuracy 80.00, val_mismatched accuracy 84.00")
    assert (rows["rte_seed0"]["step"], rows["rte_seed0"]["score"]) == (100, 0.60)
    assert rows["qqp"]["score"] == pytest.approx(0.88)
    assert rows["qqp"]["metrics"] == "accuracy 90.00, f1 86.00"
    assert rows["mrpc"]["score"] == 0.89 and rows["stsb"]["score"] == 0.89
    assert rows["cola"]["score"] == 0.55 and rows["cola"]["status"] == "running"
    assert (rows["mlm"]["task"], rows["mlm"]["score"]) == ("mlm", 0.69)
    assert rows["bert_noeval"]["step"] is None and rows["bert_noeval"]["score"] is None
    assert rows["mnli"]["wall_time_s"] == 3000.0
    assert rows["mnli"]["devices"] == [f"1x {H100}"]
    assert [r["model"] for r in rows.values()].count("LION-S LARGE") == 10


def test_pick_last(runs):
    rows = {os.path.basename(r["workdir"]): r for r in gt.collect(runs, pick="last")}
    assert (rows["mnli"]["step"], rows["mnli"]["score"]) == (300, pytest.approx(0.795))
    assert (rows["rte_seed0"]["step"], rows["rte_seed0"]["score"]) == (300, 0.55)
    with pytest.raises(UserError, match="pick must be one of best, last"):
        gt.collect(runs, pick="first")


def test_summary_table(runs):
    report = gt.render(gt.collect(runs))
    assert table_lines(report, "model") == [
        "| model | MLM Acc. | MNLI | RTE | QQP | QNLI | SST2 | STSB | MRPC | COLA | Avg |"]
    # (82 + 65 + 88 + 91 + 93 + 89 + 89 + 55) / 8 = 81.5, CoLA unfinished
    assert table_lines(report, "ours") == [
        "| ours: LION-S LARGE | 69.00 | 82.00 | 65.00 (n=2) | 88.00 | 91.00 | 93.00 | 89.00 "
        "| 89.00 | 55.00* | 81.50* |",
        "| ours: BERT LARGE |  |  | 66.00 |  |  |  |  |  |  |  |"]
    assert table_lines(report, "LION paper") == [
        "| LION paper: BERT LARGE | 69.88 | 85.68 | 67.44 | 89.90 | 91.89 | 93.04 | 88.63 "
        "| 90.89 | 56.14 | 82.95 |",
        "| LION paper: LION-LIT LARGE | 67.11 | 83.73 | 57.18 | 89.85 | 89.93 | 91.86 | 88.02 "
        "| 90.18 | 55.36 | 80.76 |",
        "| LION paper: LION-RETNET LARGE | 68.64 | 83.82 | 60.72 | 89.72 | 89.79 | 92.93 "
        "| 87.29 | 89.66 | 56.83 | 81.34 |",
        "| LION paper: LION-S LARGE | 69.16 | 84.38 | 57.69 | 89.57 | 90.30 | 92.93 | 87.68 "
        "| 90.57 | 59.54 | 81.58 |",
        "| LION paper: BERT BASE | 67.70 | 84.63 | 64.33 | 89.99 | 89.80 | 92.51 | 86.69 "
        "| 89.62 | 60.42 | 82.25 |",
        "| LION paper: LION-LIT BASE | 65.47 | 82.50 | 63.47 | 89.72 | 89.27 | 91.74 | 87.18 "
        "| 89.37 | 49.22 | 80.31 |",
        "| LION paper: LION-RETNET BASE | 66.62 | 82.85 | 52.49 | 89.63 | 88.43 | 91.86 "
        "| 85.96 | 83.94 | 53.58 | 78.59 |",
        "| LION paper: LION-S BASE | 67.05 | 83.17 | 53.50 | 89.35 | 88.89 | 93.00 | 37.73 "
        "| 77.87 | 53.18 | 72.09 |"]
    assert "arXiv 2502.16249" in report and "Table 3" in report and "Table 10" in report


def test_paper_averages_are_the_mean_of_the_eight_columns():
    for label, _, scores, average in gt.PAPER_ROWS:
        assert len(scores) == 8
        assert abs(sum(scores) / 8 - average) <= 0.0051, label


def test_markdown_shape_and_details(runs):
    report = gt.render(gt.collect(runs))
    blocks = [block.splitlines() for block in report.split("\n\n")]
    tables = [block for block in blocks if block[0].startswith("|")]
    assert len(tables) == 2
    summary, details = tables
    assert len(summary) == 2 + 2 + 8  # header, rule, 2 of ours, 8 of the paper
    assert len(details) == 2 + len(runs)
    for table, width in ((summary, len(gt.COLUMNS)), (details, len(gt.DETAIL_COLUMNS))):
        assert all(line.startswith("| ") and line.endswith(" |") for line in table)
        assert all(line.count(" | ") == width - 1 for line in table)
        assert table[1] == "| " + " | ".join(["---"] * width) + " |"
    assert table_lines(report, "workdir") == [
        "| workdir | task | model | step picked | score | metrics there | steps | status "
        "| wall time (h:mm) | device | config |"]
    lines = table_lines(report, "runs/")
    assert len(lines) == len(runs)
    assert lines[0] == (f"| runs/mnli | MNLI | LION-S LARGE | 200 | 82.00 | val accuracy "
                        f"80.00, val_mismatched accuracy 84.00 | 300/300 | done | 0:50 "
                        f"| 1x {H100} | configs/glue/glue.py |")
    assert lines[-1] == ("| runs/bert_noeval | SST2 | BERT LARGE | - | - | - | 0/300 "
                         f"| running | 0:00 | 1x {H100} | configs/glue/glue.py |")
    assert "| runs/mlm | MLM | LION-S LARGE | 300 | 69.00 | accuracy 69.00 |" in report


def test_cli_writes_the_report(runs, capsys):
    gt.main([*runs, "--pick", "last", "--output", "glue.md"])
    printed = capsys.readouterr().out
    with open("glue.md") as f:
        assert f.read() == printed
    assert re.match(r"GLUE table generated \d{4}-\d\d-\d\d \d\d:\d\d UTC by "
                    r"`python -m experiments\.glue_table` from `runs/mnli`, ", printed)
    assert "`--pick last`" in printed


@pytest.mark.parametrize("config, message", [
    ({"data": {"name": "cifar"}, "num_train_steps": 1},
     "error: run/config.json: data.name='cifar' is not a GLUE run"),
    ({"data": {"name": "glue", "task": "wnli"}, "num_train_steps": 1},
     "error: run/config.json: data.task: unknown GLUE task 'wnli'"),
    ({"data": {"name": "glue", "task": "rte"}},
     "error: run/config.json: no key 'num_train_steps'"),
])
def test_bad_workdirs_are_one_error_line(tmp_path, monkeypatch, capsys, config, message):
    monkeypatch.chdir(tmp_path)
    os.mkdir("run")
    with open(os.path.join("run", "config.json"), "w") as f:
        json.dump(config, f)
    open(os.path.join("run", "metrics.jsonl"), "w").close()
    with pytest.raises(SystemExit) as info:
        gt.main(["run"])
    assert info.value.code == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(message) and err.count("\n") == 1


@pytest.mark.parametrize("variant, mixer_kind, name", [
    ("s", None, "LION-S"), ("lit", "lion", "LION-LIT"), ("d", None, "LION-RETNET"),
    ("retnet", None, "LION-RETNET"), ("s", "softmax", "BERT")])
def test_model_names(variant, mixer_kind, name):
    model = {"mixer": {"variant": variant}}
    if mixer_kind:
        model["mixer_kind"] = mixer_kind
    assert gt.model_name({"label": "", "model": model}) == name
    assert gt.model_name({"label": "mine", "model": model}) == "mine"
