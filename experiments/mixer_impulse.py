r"""How far a config's token mixer reaches at initialisation, and how loud it is.

    python -m experiments.mixer_impulse --config configs/lra/pathfinder.py[:variant] \
        [--config.model.mixer.key=value ...] [--length 1024] [--token 512] [--seeds 3]

Builds one mixer as the config's model builds each of its layers (``model.mixer_kind``,
``model.mixer``, ``model.d_model``, ``model.num_heads``), in float32, initialises it, feeds it
``x ~ N(0, 1)`` of shape ``[1, length, d_model]`` (what a normalised residual stream looks like)
and prints, for each lag ``d``, the impulse response ``||d y_t / d x_{t+d}||`` (the Frobenius
norm of the Jacobian block, by one VJP per seed with a random unit cotangent at token ``t``)
relative to its largest value over all lags, and the output's RMS. Each number is the mean over
``--seeds`` initialisations and inputs.

A mixer whose response has fallen by orders of magnitude at the lags a task needs (32 tokens
between vertical neighbours of a 32x32 image, hundreds along a Pathfinder path), or whose
output is small beside the residual stream (RMS 1), starts far from using that context.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from ml_collections import config_flags

from experiments.errors import UserError, run_program
from lion_jax.layers.block import make_mixer, model_mixer_kwargs

FLAGS = flags.FLAGS


def define_flags():
    """The command line's flags; defined only when run as a program, so that importing this
    module (tests, notebooks) does not clash with other programs' flags of the same name."""
    config_flags.DEFINE_config_file("config", None, "Config file, path.py[:variant].",
                                    lock_config=True)
    flags.DEFINE_integer("length", 1024, "Sequence length of the input.")
    flags.DEFINE_integer("token", None, "The output token t whose Jacobian is taken "
                         "(default: the middle one).")
    flags.DEFINE_string("lags", "-512,-256,-64,-32,-8,-1,0,1,8,32,64,256,511",
                        "Comma-separated lags d (the input token is t + d).")
    flags.DEFINE_integer("seeds", 3, "Initialisations and inputs averaged.")


def mixer_of(model_config):
    """``(mixer module, d_model)`` for one layer of ``model_config`` (a config's ``model``),
    its dtypes float32."""
    d_model = model_config.get("d_model") or 0
    if d_model <= 0 or (model_config.get("num_heads") or 0) <= 0:
        raise ValueError(
            f"d_model and num_heads must be set in the config (got {d_model} and "
            f"{model_config.get('num_heads')}); configs that size their model from "
            "model.size when it is built (MLM, LM) are not read here")
    kind = model_config.get("mixer_kind", "lion")
    kwargs = model_mixer_kwargs("mixer_impulse", kind, dict(model_config.mixer), d_model=d_model,
                                num_heads=model_config.num_heads,
                                head_dim=model_config.get("head_dim"))
    return make_mixer(kind, parent=None, **dict(kwargs, dtype=jnp.float32)), d_model


def impulse(mixer, d_model, length, token, lags, seed):
    """``(response [len(lags)], output RMS)`` of one initialisation (module docstring)."""
    keys = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(keys[0], (1, length, d_model))
    params = mixer.init(keys[1], x)
    y, vjp = jax.vjp(lambda x: mixer.apply(params, x), x)
    direction = jax.random.normal(keys[2], (d_model,))
    cotangent = jnp.zeros_like(y).at[0, token].set(direction / jnp.linalg.norm(direction))
    norms = np.linalg.norm(np.asarray(vjp(cotangent)[0][0], np.float64), axis=-1)
    norms /= norms.max()
    return norms[token + np.asarray(lags)], float(jnp.sqrt(jnp.mean(y ** 2)))


def run():
    """Parses the flags, measures, prints (module docstring)."""
    if FLAGS.config is None:
        raise UserError("--config is required, e.g. --config configs/lra/pathfinder.py:s5")
    length = FLAGS.length
    token = length // 2 if FLAGS.token is None else FLAGS.token
    try:
        lags = [int(s) for s in FLAGS.lags.split(",")]
    except ValueError:
        raise UserError(f"--lags must be comma-separated integers; got {FLAGS.lags!r}") from None
    if not 0 <= token < length or not all(0 <= token + d < length for d in lags):
        raise UserError(f"--token {token} with --lags {FLAGS.lags} reaches outside the "
                        f"{length} tokens; choose lags within [-{token}, {length - 1 - token}]")
    try:
        mixer, d_model = mixer_of(FLAGS.config.model)
    except ValueError as e:
        raise UserError(f"config.model: {e}") from None
    runs = [impulse(mixer, d_model, length, token, lags, seed) for seed in range(FLAGS.seeds)]
    response = np.mean([r for r, _ in runs], axis=0)
    rms = float(np.mean([s for _, s in runs]))
    label = FLAGS.config.get("label", "") or FLAGS.config.model.get("mixer_kind", "lion")
    print(f"{label}: {type(mixer).__name__}, d_model {d_model}, {length} tokens, output token "
          f"{token}, mean of {FLAGS.seeds} initialisations")
    print("lag       " + "".join(f"{d:>9d}" for d in lags))
    print("response  " + "".join(f"{r:9.2e}" for r in response))
    print(f"output RMS {rms:.3g} (input RMS 1)")


if __name__ == "__main__":
    run_program(define_flags, run)
