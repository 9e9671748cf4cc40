"""The causal-LM task (experiments/tasks/lm.py), its data (experiments/data/lm.py), its configs
(configs/lm/) and experiments.generate."""

import json
import os
import re
import subprocess
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.lm import common as lm_configs
from experiments.data import lm as lm_data
from experiments.data import mlm_corpus
from experiments.errors import UserError
from experiments.generate import Generator
from experiments.tasks import TASKS, get_task
from experiments.trainer import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EOD = 0


def tiny_config(arch, cache_dir):
    config = lm_configs.make_config(arch, "tiny")
    config.data.cache_dir = str(cache_dir)
    return config


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("lm_cache")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir):
    """``runs(arch)``: the tiny run of ``arch`` (4 steps, evaluations at 2 and 4), made once."""
    done = {}

    def get(arch):
        if arch not in done:
            workdir = str(tmp_path_factory.mktemp(f"lm_{arch}") / "w")
            done[arch] = workdir, train_and_evaluate(tiny_config(arch, cache_dir), workdir)
        return done[arch]

    return get


def _one_error_line(result):
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def test_packing_shifts_targets_and_separates_documents(rng):
    lengths = rng.integers(0, 30, size=25)
    lengths[[3, 7]] = 0  # empty documents are skipped
    flat = rng.integers(1, 500, size=int(lengths.sum()))
    max_len = int(rng.integers(3, 20))
    rows, dropped = lm_data.pack_documents(flat, lengths, max_len, eod_id=EOD)
    again, _ = lm_data.pack_documents(flat, lengths, max_len, eod_id=EOD)
    np.testing.assert_array_equal(rows, again)  # deterministic
    docs = np.split(flat, np.cumsum(lengths)[:-1])
    stream = np.concatenate([[EOD]] + [np.append(d, EOD) for d in docs if d.size])
    N = rows.shape[0]
    assert rows.shape == (N, max_len + 1) and rows.dtype == np.int32
    assert N == (stream.size - 1) // max_len and dropped == stream.size - 1 - N * max_len
    tokens, targets = rows[:, :-1], rows[:, 1:]
    np.testing.assert_array_equal(targets[:, :-1], tokens[:, 1:])  # shifted by one
    np.testing.assert_array_equal(tokens[1:, 0], targets[:-1, -1])  # rows overlap by one
    # Every stream token after the first is a target exactly once, in order.
    np.testing.assert_array_equal(targets.ravel(), stream[1:1 + N * max_len])
    # The documents, in order, each between end-of-document tokens.
    joined = np.concatenate([tokens[0, :1], targets.ravel()])
    assert joined[0] == EOD
    pieces = np.split(joined, np.flatnonzero(joined == EOD))[1:]
    full = [p[1:] for p in pieces[:-1]]  # the last piece may be cut by the end of the rows
    nonempty = [d for d in docs if d.size]
    for got, want in zip(full, nonempty):
        np.testing.assert_array_equal(got, want)
    # Too little for one row: no rows, everything dropped.
    rows, dropped = lm_data.pack_documents([5, 6], [2], 8, eod_id=EOD, dtype=np.uint16)
    assert rows.shape == (0, 9) and rows.dtype == np.uint16 and dropped == 4


def test_load_lm_embedded_round_trip_and_cache(tmp_path, capsys):
    kwargs = dict(num_train=10, num_val=3, num_test=2, max_len=48, vocab_size=400,
                  tokenizer_documents=10, min_chars=300, max_chars=500,
                  cache_dir=str(tmp_path))
    splits, info = lm_data.load_lm(**kwargs)
    assert "Training a byte-level BPE" in capsys.readouterr().out
    assert sorted(splits) == ["test", "train", "val"]
    assert info["vocab_size"] == 400 and info["eod_id"] == EOD
    for split, arrays in splits.items():
        tokens, targets = arrays["tokens"], arrays["targets"]
        assert tokens.shape == targets.shape == (info["num_rows"][split], 48)
        assert tokens.dtype == np.uint16
        np.testing.assert_array_equal(targets[:, :-1], tokens[:, 1:])
    # The train stream starts with the first train document (index num_test + num_val).
    tok = lm_data.BpeTokenizer(info["tokenizer_file"])
    train = splits["train"]
    stream = np.concatenate([train["tokens"][0, :1], train["targets"].ravel()])
    first = stream[1:np.flatnonzero(stream == EOD)[1]]
    docs = list(mlm_corpus.iter_documents(15, min_chars=300, max_chars=500))
    assert tok.decode(first) == docs[5]
    # Byte-level: any text comes back exactly.
    for text in docs + ["naïve café — 東京 <|endoftext|> \t\n  end"]:
        ids = tok.encode(text)
        assert EOD not in ids and tok.decode(ids) == text
    # Cached: the second load trains and tokenises nothing and gives the same rows.
    splits2, info2 = lm_data.load_lm(**kwargs)
    out = capsys.readouterr().out
    assert "Training" not in out and "Building" not in out
    np.testing.assert_array_equal(splits2["val"]["tokens"], splits["val"]["tokens"])
    # Another row length re-packs the cached tokens.
    splits3, _ = lm_data.load_lm(**dict(kwargs, max_len=20))
    assert "Building" not in capsys.readouterr().out
    assert splits3["val"]["tokens"].shape[1] == 20
    # A given tokenizer file is used as is.
    _, info4 = lm_data.load_lm(**dict(kwargs, tokenizer_file=info["tokenizer_file"]))
    assert info4["tokenizer_file"] == info["tokenizer_file"]


def test_tokenizer_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="--config.data.tokenizer_file") as e:
        lm_data.load_tokenizer(tokenizer_file=str(tmp_path / "nope.json"))
    assert len(str(e.value).splitlines()) == 1 and "nope.json not found" in str(e.value)
    (tmp_path / "bad.json").write_text("not json")
    with pytest.raises(ValueError, match="bad.json is not a tokenizers JSON file") as e:
        lm_data.BpeTokenizer(str(tmp_path / "bad.json"))
    assert len(str(e.value).splitlines()) == 1
    path = str(tmp_path / "t.json")
    lm_data.train_tokenizer(["a small text", "another small text"], path, vocab_size=270,
                            eod_token="</s>")
    with pytest.raises(ValueError, match=r"no end-of-document token '<\|endoftext\|>'.*"
                                         r"--config.data.eod_token"):
        lm_data.BpeTokenizer(path)
    assert lm_data.BpeTokenizer(path, eod_token="</s>").eod_id == 0


class _FakeTfds(types.ModuleType):
    """Stands in for `tensorflow_datasets` (builder, is_prepared, as_dataset with split
    slicing "test[2:4]", as_numpy)."""

    def __init__(self, datasets, prepared=True):
        super().__init__("tensorflow_datasets")
        self.datasets, self.prepared, self.calls = datasets, prepared, []

    def builder(self, name, *, data_dir=None):
        def as_dataset(*, split, shuffle_files):
            self.calls.append((name, split))
            m = re.fullmatch(r"(\w+)\[(\d*):(\d*)\]", split)
            texts = self.datasets[name][m[1]][int(m[2] or 0):int(m[3]) if m[3] else None]
            return iter([{"text": t.encode()} for t in texts])

        return types.SimpleNamespace(is_prepared=lambda: self.prepared, as_dataset=as_dataset,
                                     data_dir=os.path.join(data_dir or "~", name))

    @staticmethod
    def as_numpy(dataset):
        return dataset


def test_tfds_splits_and_missing_data(monkeypatch, tmp_path):
    texts = {s: [f"{s} {i}" for i in range(10)] for s in ("train", "validation", "test")}
    fake = _FakeTfds({"lm1b": texts, "wiki40b/en": texts, "c4/en": texts})
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    kwargs = dict(source="tfds", num_train=4, num_val=2, num_test=3)
    expected = {"lm1b": ["train[:4]", "test[:2]", "test[2:5]"],
                "wiki40b/en": ["train[:4]", "validation[:2]", "test[0:3]"],
                "c4/en": ["train[:4]", "validation[:2]", "validation[2:5]"]}
    for name, specs in expected.items():
        fake.calls.clear()
        for split in ("train", "val", "test"):
            list(lm_data.iter_documents(split, tfds_name=name, **kwargs))
        assert [c[1] for c in fake.calls] == specs
    assert list(lm_data.iter_documents("val", tfds_name="lm1b", **kwargs)) == ["test 0",
                                                                                "test 1"]
    with pytest.raises(ValueError, match="tfds_name must be lm1b"):
        list(lm_data.iter_documents("val", tfds_name="imdb_reviews", **kwargs))
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", _FakeTfds({}, prepared=False))
    with pytest.raises(FileNotFoundError) as e:
        lm_data.load_lm(source="tfds", tfds_name="wiki40b/en", data_dir=str(tmp_path),
                        cache_dir=str(tmp_path / "cache"))
    message = str(e.value)
    assert len(message.splitlines()) == 1 and "no prepared wiki40b/en" in message
    assert "tfds build wiki40b/en" in message and "--config.data.data_dir" in message
    assert "c4/en --data_dir" not in message  # this module's advice, not mlm.py's


# --------------------------------------------------------------------------------------------
# Command-line errors
# --------------------------------------------------------------------------------------------


def test_cli_errors_are_one_line(tmp_path):
    base = ["experiments.train", "--config", "configs/lm/llama.py:tiny",
            "--workdir", str(tmp_path / "w"), f"--config.data.cache_dir={tmp_path / 'c'}"]
    line = _one_error_line(_cli(*base, f"--config.data.tokenizer_file={tmp_path / 'no.json'}"))
    assert "no.json not found" in line and "--config.data.tokenizer_file" in line
    line = _one_error_line(_cli(*base, "--config.data.source=tfds",
                                f"--config.data.data_dir={tmp_path / 'tfds'}"))
    assert "lm1b" in line and "tfds build lm1b" in line and "--config.data.data_dir" in line
    line = _one_error_line(_cli("experiments.train", "--config", "configs/lm/tnl.py:tnl_358m"))
    assert "unknown config variant 'tnl_358m'" in line and "tnl_385m" in line


# --------------------------------------------------------------------------------------------
# Task and training
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "tnl"])
def test_tiny_run_trains_with_falling_loss(runs, arch):
    workdir, summary = runs(arch)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    val = {r["step"]: r["metrics"] for r in records if r["split"] == "val"}
    assert sorted(val) == [2, 4]
    assert val[4]["loss"] < val[2]["loss"]
    for m in val.values():
        assert m["perplexity"] == pytest.approx(np.exp(m["loss"]), rel=1e-4)
        assert m["log_likelihood"] == pytest.approx(-m["loss"], rel=1e-5)
        assert 0 <= m["accuracy"] <= 1
    assert summary["best"]["step"] == 4 and "val/perplexity" in summary["final"]
    assert summary["val unigram perplexity"] > 1
    train = [r["metrics"] for r in records if r["split"] == "train"]
    assert train and "log_likelihood" not in train[0]


def test_loss_is_the_mean_next_token_cross_entropy(cache_dir):
    task = get_task(tiny_config("tnl", cache_dir))
    assert TASKS["lm"] == "experiments.tasks.lm:LMTask"
    assert task.model.vocab_size == task.info["vocab_size"] == 300
    batch = next(task.eval_batches("val", 2))
    assert batch["tokens"].dtype == batch["targets"].dtype == np.int32
    assert batch["tokens"].shape == (2, 32)
    params = nn.meta.unbox(task.init(jax.random.PRNGKey(np.random.randint(2**31))))["params"]
    loss, metrics = task.loss(params, batch, None, train=False)
    logits = task.model.apply({"params": params}, batch["tokens"])  # the full [B, L, V] logits
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
    np.testing.assert_allclose(loss, nll.mean(-1), rtol=1e-5)
    np.testing.assert_allclose(metrics["log_likelihood"], -loss)
    hits = jnp.argmax(logits, -1) == batch["targets"]
    np.testing.assert_allclose(metrics["accuracy"], hits.mean(-1))
    _, train_metrics = task.loss(params, batch, None, train=True)
    assert set(train_metrics) == {"accuracy"}
    # The split metrics: perplexity = exp(mean row loss).
    out = task.split_metrics("val", {"log_likelihood": np.array([-1.0, -2.0])})
    assert out == {"log_likelihood": -1.5, "perplexity": pytest.approx(np.exp(1.5))}


def test_bad_model_settings_are_one_line(cache_dir):
    cases = [("bogus", 1, "bad config.model: unknown key 'bogus'"),
             ("size", "160M", "bad config.model.size: unknown LM size '160M'"),
             ("arch", "gpt", "bad config.model.arch: 'gpt' is not one of"),
             ("vocab_size", 100, "config.model.vocab_size=100 is smaller than the tokenizer's"),
             ("dtype", "float17", "bad config.model.dtype"),
             ("num_heads", 3, "bad config.model: d_model=32 is not divisible by num_heads=3")]
    for key, value, message in cases:
        config = tiny_config("tnl", cache_dir)
        with config.model.unlocked():
            config.model[key] = value
        with pytest.raises(UserError, match=re.escape(message)) as e:
            get_task(config)
        assert len(str(e.value).splitlines()) == 1
    config = tiny_config("tnl", cache_dir)
    with config.model.mixer.unlocked():
        config.model.mixer.gate = "sigmoid_of_nothing"
    with pytest.raises(UserError, match="bad config.model.mixer .*gate 'sigmoid_of_nothing'"):
        get_task(config)


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


def test_generation_modes_agree_tnl(runs, tmp_path):
    """TNL's recurrent state, the prompt prefilled in chunks (test_generate_cli: LLaMA's KV
    cache through the command line)."""
    generator = Generator(runs("tnl")[0])
    prompt = "The harbor of Brisford"
    ref = generator.continue_ids(prompt, max_new_tokens=8, mode="recompute")
    assert generator.continue_ids(prompt, max_new_tokens=8, mode="state",
                                  prefill_chunk=3) == ref
    assert generator.continue_ids(prompt, max_new_tokens=8, mode="kv_cache") == ref
    text = generator.continue_text(prompt, max_new_tokens=8, mode="recompute")
    assert text == generator.tokenizer.decode(ref)
    with pytest.raises(UserError, match="config.json not found"):
        Generator(str(tmp_path / "none"))
    with pytest.raises(UserError, match="unknown mode 'fast'"):
        generator.continue_ids(prompt, mode="fast")


def test_generate_cli(runs):
    workdir = runs("llama")[0]
    args = ["experiments.generate", "--workdir", workdir, "--prompt", "The harbor of",
            "--max_new_tokens", "10"]
    outputs = []
    for mode in ("recompute", "state"):
        result = _cli(*args, "--mode", mode)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] and outputs[0].endswith("\n") and outputs[0].strip()
    # LLaMA's context is the run's rows (32 tokens): a longer request is one error line.
    line = _one_error_line(_cli(*args[:-1], "40"))
    assert "pass LLaMA's context max_len=32" in line


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def test_configs_are_the_papers():
    from lion_jax.models.lm import ARCHS, SIZES

    assert lm_configs.SIZES == tuple(SIZES) and set(lm_configs.ARCH_LABELS) == set(ARCHS)
    for arch in ARCHS:
        default, size = lm_configs.make_config(arch), lm_configs.make_config(arch, "160m")
        assert default.to_dict() == dict(size.to_dict(), label=default.label)
        o = default.optim
        assert (o.learning_rate, o.weight_decay, o.schedule) == (3e-4, 0.1, "constant")
        assert (default.batch_size, default.data.max_len, default.num_train_steps) == (
            480, 8192, 76_294)
        assert default.model.size == "160m" and default.data.source == "embedded"
        assert lm_configs.make_config(arch, "7b").mesh.fsdp == -1
        small = lm_configs.make_config(arch, "small")
        assert small.model.mixer.impl == "auto" and small.model.vocab_size == 0
    tnl = lm_configs.make_config("tnl", "tnl_385m")
    assert (tnl.model.num_layers, tnl.model.d_model, tnl.model.num_heads, tnl.model.mlp_dim,
            tnl.model.vocab_size, tnl.model.mixer.gate) == (24, 1024, 8, 2816, 64_000, "linear")
    assert lm_configs.make_config("tnl", "tnl_1b").model.d_model == 2048
    assert "tnl_385m" not in lm_configs.variants("llama")
    with pytest.raises(ValueError, match="unknown config variant 'tnl_1b'"):
        lm_configs.make_config("llama", "tnl_1b")


def test_lightnet_paper_models_have_table_10_sizes():
    """Total parameters of the LightNet paper's LLMs (Table 10: 0.15, 0.385, 1.0, 2.9B; heads
    and GLU width are our reading, configs/lm/common.py): within 3%."""
    from lion_jax.models.lm import CausalLM

    printed = {"lightnet_150m": 0.15e9, "lightnet_385m": 0.385e9, "lightnet_1b": 1.0e9,
               "lightnet_3b": 2.9e9}
    for variant, want in printed.items():
        m = lm_configs.make_config("lightnet", variant).model
        net = CausalLM(arch="lightnet", vocab_size=m.vocab_size, d_model=m.d_model,
                       num_layers=m.num_layers, num_heads=m.num_heads, mlp_dim=m.mlp_dim)
        shapes = jax.eval_shape(net.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
        got = sum(np.prod(x.shape) for x in jax.tree.leaves(shapes))
        assert abs(got / want - 1) < 0.03, (variant, got)
