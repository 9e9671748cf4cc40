r"""Inference speed and memory of BERT against LION-S on masked-LM (paper Figure 3 right).

    python -m experiments.bench_mlm [--out DIR] [--lengths 512,2048,4096,8192,14336]
        [--batch 4] [--calls 5] [--size base] [--vocab 30522] [--train]

For each sequence length, batch ``--batch``, bf16 compute with the parameters cast to bf16,
no gradient (``train=False``): milliseconds per batch and XLA's compiled memory (arguments +
outputs + temporaries of the whole jitted forward, from ``memory_analysis()``) of

* BERT (``mixer_kind="softmax"``, learned positions with ``max_len`` = the longest of
  ``--lengths``) with cuDNN's flash attention and with plain XLA softmax attention, and
* LION-S (``pos_emb="none"``) with ``impl`` = pallas, chunk and recurrent (on a GPU, without
  a gradient, ``recurrent`` is the forward-only Pallas token walk ``pallas_kernels.lion_walk``).

What is measured is the encoder plus the MLM head on the masked positions only: 15 % of the
tokens of each row (fixed random positions, ``BertForMaskedLM(..., positions=...)``), as in
training, not the head over every token (at 14,336 tokens x batch 4 the float32 logits over
the 30,522-token vocabulary alone would be 7 GB). The paper does not say which it measured.
Token ids are random and there is no padding (``pad_id=None``).

``--train`` adds one forward + backward step per side and length (no optimizer update):
float32 parameters, bf16 compute, dropout on, the cross-entropy on the masked positions;
its ms per step and compiled memory (the gradients are its output) form a second table.

A side that does not compile or run (out of memory, a refused shape) is a row cell with the
reason. Every side is timed the same way (:func:`experiments.bench_value_decay.timed`): the
median of 5 samples of ``--calls`` calls back to back with one sync each, after a warm-up call.
Prints the tables; with ``--out`` writes ``table.md`` and ``plot.png`` (time and memory against
length, log scales; inference only). Needs a GPU.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

from experiments.bench_value_decay import timed, timing
from experiments.bench_vision import failure, two_panels
from lion_jax.models import BertForMaskedLM
from lion_jax.models.bert import bert_size

FLAGS = flags.FLAGS
MASK_RATE = 0.15
LION_IMPLS = ("pallas", "chunk", "recurrent")
SOFTMAX_IMPLS = ("cudnn", "xla")
SOFTMAX_NAMES = {"cudnn": "BERT, cuDNN flash", "xla": "BERT, XLA softmax"}


def define_flags():
    flags.DEFINE_string("out", None, "Directory for table.md and plot.png.")
    flags.DEFINE_list("lengths", ["512", "2048", "4096", "8192", "14336"],
                      "Sequence lengths (tokens).")
    flags.DEFINE_integer("batch", 4, "Sequences per batch.")
    flags.DEFINE_integer("calls", 5, "Calls timed back to back.")
    flags.DEFINE_string("size", "base", "BERT size: tiny, base or large.")
    flags.DEFINE_integer("vocab", 30522, "Vocabulary size.")
    flags.DEFINE_bool("train", False, "Also time one forward + backward step.")


def model(size, kind, impl, max_len, vocab):
    """A BertForMaskedLM of ``size``: ``kind`` "softmax" (BERT, learned positions up to
    ``max_len``) or "lion" (LION-S, no positions), the mixer on ``impl``; bf16 compute."""
    softmax = kind == "softmax"
    return BertForMaskedLM(encoder=dict(
        **bert_size(size), vocab_size=vocab, mixer_kind=kind,
        mixer=dict(impl=impl) if softmax else dict(variant="s", impl=impl),
        pos_emb="learned" if softmax else "none", max_len=max_len if softmax else None,
        pad_id=None, dtype=jnp.bfloat16))


def sides(size, max_len, vocab, softmax_impls=SOFTMAX_IMPLS, lion_impls=LION_IMPLS):
    """``[(name, net)]``: BERT on each of ``softmax_impls``, LION-S on each of ``lion_impls``."""
    out = [(SOFTMAX_NAMES[i], model(size, "softmax", i, max_len, vocab)) for i in softmax_impls]
    return out + [(f"LION-S, {i}", model(size, "lion", i, max_len, vocab)) for i in lion_impls]


def init_params(net):
    """float32 parameters of ``net``, initialised on XLA forms (the same for every impl of a
    kind, so both BERT sides get the same weights; the parameters do not depend on impl)."""
    enc = dict(net.encoder)
    enc["mixer"] = dict(enc["mixer"], impl="xla" if enc["mixer_kind"] == "softmax" else "chunk")
    tokens = jnp.ones((1, 8), jnp.int32)
    return net.clone(encoder=enc).init(jax.random.key(0), tokens, train=False,
                                       positions=jnp.zeros((1, 1), jnp.int32))["params"]


def inputs(batch, length, vocab, seed=0):
    """Random token ids ``[B, L]`` and ``round(MASK_RATE * L)`` (at least 1) distinct sorted
    positions per row ``[B, P]``."""
    r = np.random.default_rng(seed)
    tokens = r.integers(0, vocab, (batch, length))
    count = max(1, round(MASK_RATE * length))
    positions = np.stack([np.sort(r.choice(length, count, replace=False)) for _ in range(batch)])
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32)


def compiled_mib(compiled):
    """Arguments + outputs + temporaries of a compiled executable, in MiB."""
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes) / 2 ** 20


def inference(net, params, tokens, positions, calls):
    """(ms per batch, compiled MiB) of the jitted forward (encoder + head at ``positions``)."""
    forward = jax.jit(lambda p, t, pos: net.apply({"params": p}, t, train=False, positions=pos))
    compiled = forward.lower(params, tokens, positions).compile()
    mib = compiled_mib(compiled)
    return timed(compiled, params, tokens, positions, calls=calls), mib


def train_step(net, params, tokens, positions, calls):
    """(ms per step, compiled MiB) of one forward + backward: the gradient of the mean
    cross-entropy at ``positions`` (labels: the tokens there) w.r.t. float32 ``params``."""
    labels = jnp.take_along_axis(tokens, positions, axis=1)

    @jax.jit
    def step(p, t, pos, labels, key):
        def loss(p):
            logits = net.apply({"params": p}, t, train=True, positions=pos,
                               rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return jax.value_and_grad(loss)(p)

    key = jax.random.key(1)
    compiled = step.lower(params, tokens, positions, labels, key).compile()
    mib = compiled_mib(compiled)
    return timed(compiled, params, tokens, positions, labels, key, calls=calls), mib


def run_sides(named_nets, batch, lengths, vocab, calls, train=False):
    """Every side at every length: ``(names, results, train_results)``, each results dict
    ``{(name, length): (ms, MiB) or reason}``; ``train_results`` is None without ``train``."""
    results, train_results = {}, ({} if train else None)
    for name, net in named_nets:
        params32 = init_params(net)
        params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params32)
        for length in lengths:
            tokens, positions = inputs(batch, length, vocab)
            try:
                results[name, length] = inference(net, params, tokens, positions, calls)
            except Exception as e:  # noqa: BLE001  OOM / refused: reported, not fatal
                results[name, length] = failure(e)
            print(f"  {name} at {length} tokens: {results[name, length]}", flush=True)
            if train:
                try:
                    train_results[name, length] = train_step(net, params32, tokens, positions,
                                                             calls)
                except Exception as e:  # noqa: BLE001
                    train_results[name, length] = failure(e)
                print(f"  {name} at {length} tokens, train step: {train_results[name, length]}",
                      flush=True)
        del params, params32
    return [name for name, _ in named_nets], results, train_results


def _table(title, names, results, lengths):
    lines = [title, "", "| model | " + " | ".join(f"{n:,}" for n in lengths) + " |",
             "| --- |" + " --- |" * len(lengths)]
    for name in names:
        cells = []
        for n in lengths:
            x = results[name, n]
            cells.append(x if isinstance(x, str) else f"{x[0]:.1f} ({x[1]:,.0f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def markdown(device, size, batch, calls, names, results, lengths, train_results=None):
    """The Markdown report: a header line and one table per measurement (rows: sides,
    columns: lengths, cells ``ms (MiB)`` or the reason a side did not run)."""
    lines = [f"{device}, jax {jax.__version__}, BERT-{size} MLM, batch {batch}, bf16; encoder + "
             f"head on {MASK_RATE:.0%} of the tokens (masked positions); "
             f"{timing(calls)}", ""]
    lines += _table("Inference (no gradient), bf16 parameters: ms / batch (compiled memory, "
                    "MiB) at each sequence length", names, results, lengths)
    if train_results is not None:
        lines += [""] + _table("Forward + backward (float32 parameters, bf16 compute, dropout): "
                               "ms / step (compiled memory, MiB)", names, train_results, lengths)
    return "\n".join(lines) + "\n"


def plot(path, names, results, lengths):
    """Two panels, ms per batch and compiled MiB against length (log scales)."""
    two_panels(path, names, results, lengths, xlabel="sequence length (tokens)",
               speed_label="ms / batch", xscale="log")


def main(argv):
    del argv
    if jax.default_backend() != "gpu":
        sys.exit("error: bench_mlm needs a GPU")
    try:
        bert_size(FLAGS.size)
        lengths = [int(n) for n in FLAGS.lengths]
    except ValueError as e:
        sys.exit(f"error: {e}")
    if not lengths or min(lengths) < 1:
        sys.exit(f"error: --lengths must be positive; got {FLAGS.lengths}")
    for name in ("batch", "calls"):
        if getattr(FLAGS, name) < 1:
            sys.exit(f"error: --{name} must be >= 1; got {getattr(FLAGS, name)}")
    if FLAGS.vocab < 1:
        sys.exit(f"error: --vocab must be >= 1; got {FLAGS.vocab}")
    device = jax.devices()[0].device_kind
    named = sides(FLAGS.size, max(lengths), FLAGS.vocab)
    names, results, train_results = run_sides(named, FLAGS.batch, lengths, FLAGS.vocab,
                                              FLAGS.calls, train=FLAGS.train)
    table = markdown(device, FLAGS.size, FLAGS.batch, FLAGS.calls, names, results, lengths,
                     train_results)
    print(table)
    if FLAGS.out:
        os.makedirs(FLAGS.out, exist_ok=True)
        with open(os.path.join(FLAGS.out, "table.md"), "w") as f:
            f.write(table)
        plot(os.path.join(FLAGS.out, "plot.png"), names, results, lengths)


if __name__ == "__main__":
    define_flags()
    app.run(main)
