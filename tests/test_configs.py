"""Config files: every variant builds, keeps the trainer's keys, and makes a valid model."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import pytest

from configs import common
from configs.lra import listops

CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs")


def _config_modules():
    """(relative path, module) of every config file (a module with get_config)."""
    found = []
    for root, _, files in os.walk(CONFIGS_DIR):
        for name in sorted(files):
            if name.endswith(".py") and not name.startswith("_"):
                path = os.path.join(root, name)
                spec = importlib.util.spec_from_file_location(name[:-3], path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                if hasattr(module, "get_config"):
                    found.append((os.path.relpath(path, CONFIGS_DIR), module))
    return found


# configs/recorded.py has no default: it is built from its EXAMPLE run
CASES = [(rel, module, variant) for rel, module in _config_modules()
         for variant in (getattr(module, "EXAMPLE", None), *module.VARIANTS)]


@pytest.mark.parametrize("rel, module, variant", CASES,
                         ids=[f"{rel}:{variant or 'default'}" for rel, module, variant in CASES])
def test_variant_builds_with_trainer_keys(rel, module, variant):
    config = module.get_config(variant)
    base = common.base_config()
    assert set(base.keys()) <= set(config.keys()), rel
    assert set(base.optim.keys()) == set(config.optim.keys())
    assert set(base.mesh.keys()) == set(config.mesh.keys())
    assert module.__doc__.strip(), "the first docstring line describes the default"
    assert all(isinstance(d, str) and d for d in module.VARIANTS.values())


def test_recorded_config_is_the_run_s_own(tmp_path):
    """configs/recorded.py gives back every key of a config as the config file wrote it
    (sequences as tuples), from a workdir, a record folder or a config.json."""
    import json

    from configs import recorded

    for variant in (None, "quick", "s5_complex_sigmoid"):
        config = listops.get_config(variant)
        for arg in (recorded.EXAMPLE, f"{recorded.EXAMPLE}/config.json"):
            assert recorded.get_config(arg).to_json_best_effort()  # loads
        path = tmp_path / f"recorded_{variant}.json"
        with open(path, "w") as f:
            f.write(config.to_json_best_effort())
        assert recorded.get_config(path).to_dict() == config.to_dict()
        assert json.loads(recorded.get_config(path).to_json_best_effort()) == json.loads(
            config.to_json_best_effort())
    with pytest.raises(ValueError, match="takes a run"):
        recorded.get_config(None)


RECORDS = sorted(os.path.join("docs", "lra_runs", name) for name in os.listdir(os.path.join(
    os.path.dirname(CONFIGS_DIR), "docs", "lra_runs")))


@pytest.mark.parametrize("record", RECORDS)
def test_recorded_runs_build_their_models(record):
    """Every run record of docs/lra_runs gives, through configs/recorded.py, the trainer's keys
    and a model that builds (keys added since the run take their defaults)."""
    from configs import recorded
    from lion_jax.models import SequenceClassifier

    config = recorded.get_config(os.path.join(os.path.dirname(CONFIGS_DIR), record))
    assert set(common.base_config().keys()) <= set(config.keys())
    kwargs = config.model.to_dict()
    kwargs.update(dtype=jnp.dtype(kwargs["dtype"]), param_dtype=jnp.dtype(kwargs["param_dtype"]))
    model = SequenceClassifier(vocab_size=20, num_classes=10, pad_id=0, **kwargs)
    tokens = jnp.ones((2, 64), jnp.int32)
    variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, train=False))
    logits = jax.eval_shape(lambda v: model.apply(v, tokens, train=False), variables)
    assert logits.shape == (2, 10)


@pytest.mark.parametrize("variant", [None, *listops.VARIANTS])
def test_listops_model_config_is_valid(variant):
    """The model keys are SequenceClassifier's: it builds and runs (shapes only)."""
    from experiments.data.listops import NUM_CLASSES, VOCAB_SIZE
    from lion_jax.models import SequenceClassifier

    kwargs = listops.get_config(variant).model.to_dict()
    kwargs.update(dtype=jnp.dtype(kwargs["dtype"]), param_dtype=jnp.dtype(kwargs["param_dtype"]))
    model = SequenceClassifier(vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES, **kwargs)
    tokens = jnp.ones((2, 64), jnp.int32)
    variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, train=False))
    logits = jax.eval_shape(lambda v: model.apply(v, tokens, train=False), variables)
    assert logits.shape == (2, NUM_CLASSES)


def test_listops_default_is_the_paper_setting():
    """LION App. D.2 (AdamW, lr 5e-4, cosine) with S5's ListOps sizes; full LRA data."""
    c = listops.get_config()
    assert (c.optim.learning_rate, c.optim.schedule, c.optim.weight_decay) == (5e-4, "cosine", 0.04)
    assert (c.model.d_model, c.model.num_layers, c.model.mixer.variant) == (128, 8, "s")
    assert c.model.mixer.init_std == 0.1
    assert (c.batch_size, c.num_train_steps, c.optim.warmup_steps) == (50, 76800, 1920)
    assert (c.data.num_train, c.data.num_val, c.data.num_test) == (96000, 2000, 2000)
    assert (c.data.min_length, c.data.max_length, c.data.max_depth, c.data.max_args) == (
        500, 2000, 10, 10)
    assert c.model.dtype == "bfloat16" and c.model.param_dtype == "float32"


@pytest.mark.parametrize("task, layer", [("listops", "half_glu2"), ("text", "half_glu2"),
                                         ("retrieval", "half_glu"), ("image", "half_glu"),
                                         ("pathfinder", "half_glu"), ("pathx", "half_glu")])
def test_s5_variants_take_s5s_layer_of_the_task(task, layer):
    """``s5_block``, ``s5_complex``, ``s5_complex_sigmoid`` and ``s5`` take S5's activation of
    the task's script (lindermanlab/S5 bin/run_experiments: half_glu2 for ListOps and IMDb, the
    default half_glu1 elsewhere); ``s5_complex`` differs from ``s5_block`` in the decay init
    alone, ``s5_complex_sigmoid`` from ``s5_complex`` in the features, SCALE and the gate's
    biases alone."""
    module = importlib.import_module(f"configs.lra.{task}")
    for variant in ("s5_block", "s5_complex", "s5_complex_sigmoid", "s5"):
        c = module.get_config(variant)
        assert (c.model.channel_mixer, c.model.norm) == (layer, "batchnorm"), (task, variant)
    assert module.get_config().model.channel_mixer == "mlp"
    block, complex_ = (module.get_config(v).to_dict() for v in ("s5_block", "s5_complex"))
    assert complex_["model"]["mixer"].pop("decay_init") == "hippo_complex"
    assert block["model"]["mixer"].pop("decay_init") == "hippo"
    assert {**block, "label": ""} == {**complex_, "label": ""}
    sigmoid = module.get_config("s5_complex_sigmoid").to_dict()
    changed = {key: sigmoid["model"]["mixer"].pop(key)
               for key in ("feature_map", "normalize", "decay_init_exponents")}
    assert changed == dict(feature_map="sigmoid", normalize=False,
                           decay_init_exponents=(10.0, 16.0))
    complex_ = module.get_config("s5_complex").to_dict()
    for key in changed:
        complex_["model"]["mixer"].pop(key)
    assert {**sigmoid, "label": ""} == {**complex_, "label": ""}


def test_parse_variant():
    variants = {"quick": "q", "tiny": "t"}
    assert common.parse_variant(None, variants) is None
    assert common.parse_variant("", variants) is None
    assert common.parse_variant("tiny", variants) == "tiny"
    with pytest.raises(ValueError, match=r"unknown config variant 'big' \(known variants: "
                                         r"quick, tiny\)"):
        common.parse_variant("big", variants)


@pytest.mark.parametrize("task, side", [("image", 32), ("pathfinder", 32), ("pathx", 128)])
def test_image_tasks_know_their_image(task, side):
    """The image tasks give the classifier the image's shape (raster order by default) and a
    ``v2`` variant walking the row- and column-snake orders (LION-S v2); a model of that variant
    builds and runs on the task's sequence length (shapes only)."""
    from lion_jax.models import SequenceClassifier

    module = importlib.import_module(f"configs.lra.{task}")
    c = module.get_config()
    assert (tuple(c.model.orders), tuple(c.model.image_shape)) == (("raster",), (side, side))
    c = module.get_config("v2")
    assert tuple(c.model.orders) == ("row_snake", "col_snake") and c.label == "LION-S (v2)"
    kwargs = c.model.to_dict() | dict(d_model=16, num_heads=2, num_layers=1, mlp_dim=16,
                                      dtype=jnp.float32, param_dtype=jnp.float32)
    model = SequenceClassifier(vocab_size=256, num_classes=2, pad_id=None, **kwargs)
    pixels = jnp.ones((2, side * side), jnp.uint8)
    variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), pixels, train=False))
    assert jax.eval_shape(lambda v: model.apply(v, pixels, train=False),
                          variables).shape == (2, 2)
    assert "v2" not in listops.VARIANTS  # a sequence of tokens has no image to walk
