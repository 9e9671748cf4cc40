r"""Train and evaluate a config.

    python -m experiments.train --config configs/lra/listops.py[:variant] \
        [--workdir DIR] [--config.key=value ...]
    python -m experiments.train --config configs/recorded.py:RUN ...   # a run's own config
    python -m experiments.train --list        # config files, their variants, descriptions

``--workdir`` defaults to ``workdir/<config path under configs/, '/' -> '_'>[_<variant>]``
(e.g. ``workdir/lra_listops_quick``), relative to the current directory. Running again with
the same workdir resumes from its latest checkpoint.

Problems the user can fix (unknown config key, config file or variant, batch size that does
not split over the devices, missing data, NaN loss, ...) are reported as one ``error:`` line
on stderr with exit code 1.
"""

import importlib.util
import os
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from experiments.errors import UserError

CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "Config file, path/to/config.py[:variant] (see --list).", lock_config=True)
flags.DEFINE_string("workdir", None, "Output directory; default workdir/<config>_<variant>.")
flags.DEFINE_bool("list", False, "List the config files and their variants, then exit.")
flags.DEFINE_alias("list_configs", "list")


def _load_config_module(path):
    spec = importlib.util.spec_from_file_location(f"_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def list_configs():
    """Text listing every config file under configs/ with its description and variants."""
    lines = []
    for root, dirs, files in sorted(os.walk(CONFIGS_DIR)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if not name.endswith(".py") or name.startswith("_"):
                continue
            module = _load_config_module(path)
            if not hasattr(module, "get_config"):
                continue
            rel = os.path.relpath(path, os.path.dirname(CONFIGS_DIR))
            doc = (module.__doc__ or "").strip().splitlines()
            lines.append(f"{rel}  {doc[0] if doc else ''}")
            for variant, description in getattr(module, "VARIANTS", {}).items():
                lines.append(f"    {rel}:{variant}  {description}")
    return "\n".join(lines)


def default_workdir(config_arg):
    """``workdir/lra_listops_quick`` for ``configs/lra/listops.py:quick``;
    ``workdir/recorded_<run>`` for ``configs/recorded.py:.../<run>[/config.json]``."""
    path, _, variant = config_arg.partition(":")
    if "/" in variant or variant.endswith(".json"):  # a run's folder or config.json
        folder = os.path.dirname(variant) if variant.endswith(".json") else variant
        variant = os.path.basename(os.path.normpath(folder))
    stem = os.path.splitext(os.path.abspath(path))[0]
    rel = os.path.relpath(stem, CONFIGS_DIR)
    name = os.path.basename(stem) if rel.startswith("..") else rel.replace(os.sep, "_")
    return os.path.join("workdir", name + (f"_{variant}" if variant else ""))


def _config_arg(argv):
    """The value of --config in argv, or None."""
    for i, arg in enumerate(argv):
        match = re.fullmatch(r"--?config(=(.*))?", arg)
        if match:
            return match.group(2) if match.group(1) else (argv[i + 1] if i + 1 < len(argv) else "")
    return None


def _root_cause(error):
    """The innermost exception of a chain (absl wraps config errors with tracebacks)."""
    while error.__cause__ or error.__context__:
        error = error.__cause__ or error.__context__
    return error


def _fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def parse_flags(argv):
    """absl flag parsing with one-line errors."""
    config_arg = _config_arg(argv)
    if config_arg is not None:
        path = config_arg.partition(":")[0]
        if not os.path.isfile(path):
            _fail(f"config file {path!r} not found (see python -m experiments.train --list)")
    try:
        return FLAGS(argv)
    except (AttributeError, KeyError) as e:  # an override of a key the config does not have
        missing = str(e).strip("\"'").split("'")[0]
        keys = [m.group(1) for m in map(re.compile(r"--?config\.([^=]+)").match, argv) if m]
        key = next((k for k in keys if missing in k.split(".")), missing)
        _fail(f"unknown config key {key!r} (not in {config_arg})")
    except (flags.Error, TypeError, ValueError) as e:
        first = str(e).splitlines()[0]  # e.g. "flag --config.batch_size=abc: invalid literal"
        cause = str(_root_cause(e)).strip().splitlines()[-1]
        _fail(first if first.startswith("flag --config.") else cause)


def out_of_memory_line(error, workdir):
    """The one-line message for a device's out-of-memory error, or None for another error."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text:
        return None
    detail = text.split("RESOURCE_EXHAUSTED:", 1)[1].strip().splitlines()[0]
    return (f"the device ran out of memory ({detail}); lower --config.batch_size (with "
            f"--config.grad_accum_steps to keep the batch) or --config.eval_batch_size; "
            f"{workdir} keeps its last checkpoint")


def main(argv):
    if len(argv) > 1:
        _fail(f"unexpected arguments {argv[1:]}")
    if FLAGS.list:
        print(list_configs())
        return
    config_arg = _config_arg(sys.argv)
    if config_arg is None:
        _fail("--config is required, e.g. --config configs/lra/listops.py:quick (see --list)")
    logging.set_verbosity(logging.WARNING)
    from jax.errors import JaxRuntimeError  # imported here so --list and flag errors stay fast

    from experiments import trainer

    workdir = FLAGS.workdir or default_workdir(config_arg)
    try:
        trainer.train_and_evaluate(FLAGS.config, workdir, config_name=config_arg)
    except UserError as e:
        _fail(str(e))
    except JaxRuntimeError as e:
        if (line := out_of_memory_line(e, workdir)) is None:
            raise
        _fail(line)
    except KeyboardInterrupt:
        _fail(f"interrupted; run the same command again to resume {workdir} from its last "
              "checkpoint")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
