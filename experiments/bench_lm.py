r"""Training speed against sequence length, and decoding latency and memory against context,
of the causal LMs (Lightning Attention's "constant speed"; LION paper Figure 5).

    python -m experiments.bench_lm [--out DIR] [--size 410m] [--tokens_per_step 32768]
        [--lengths 1024,2048,4096,8192,16384,32768] [--archs llama,tnl,hgrn2,cosformer2]
        [--contexts 1024,4096,16384,32768] [--decode_archs llama,tnl,hgrn2,cosformer2,lion_s]
        [--recompute_archs llama,lion_s] [--vocab 100280] [--calls 5] [--noremat]

(a) Training: for each architecture and length L, a batch of ``tokens_per_step / L`` rows of
    L tokens (the same tokens per step at every length); one AdamW step (forward, backward,
    update) of :class:`lion_jax.models.lm.CausalLM` at the scaling-laws ``--size``, float32
    parameters, bf16 compute, the mixers at ``impl="auto"`` (the Pallas kernels on a GPU, cuDNN
    flash attention for LLaMA), the training task's sliced loss
    (:func:`lion_jax.models.lm.next_token_losses`) and, with ``--remat`` (default), each block
    recomputed in the backward pass. Reported: training tokens/s and XLA's compiled memory.
(b) Decoding, batch 1: for each context length C, the time of one generated token and the
    compiled memory of that call (its arguments, the decoding state included, plus outputs and
    temporaries), in two modes (``lion_jax.generate``): ``state`` (one token from a state
    holding C tokens: LLaMA's KV cache of capacity C + 1, the linear models' fixed-size
    recurrent state) and, for ``--recompute_archs``, ``recompute`` (the full forward over
    C + 1 tokens, as generation without a state does for every token).

Every side is timed the same way (``bench_value_decay.timed``): the median of 5 samples of
``--calls`` calls back to back with one sync each, after a warm-up call. A side that cannot run
(out of memory) is a cell with the reason. Prints Markdown tables; with ``--out`` writes
``table.md``, ``plot_train.png`` and ``plot_decode.png``. Needs a GPU.
"""

import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from absl import app, flags

from experiments.bench_mlm import compiled_mib
from experiments.bench_value_decay import timed, timing
from experiments.bench_vision import failure, two_panels
from lion_jax.models.lm import ARCHS, CausalLM, lm_size, next_token_losses

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("out", None, "Directory for table.md and plot.png.")
    flags.DEFINE_string("size", "410m", "Scaling-laws size (70m ... 7b).")
    flags.DEFINE_integer("tokens_per_step", 32768, "Training tokens per step.")
    flags.DEFINE_list("lengths", ["1024", "2048", "4096", "8192", "16384", "32768"],
                      "Training sequence lengths.")
    flags.DEFINE_list("archs", ["llama", "tnl", "hgrn2", "cosformer2"], "Trained archs.")
    flags.DEFINE_list("contexts", ["1024", "4096", "16384", "32768"], "Decoding contexts.")
    flags.DEFINE_list("decode_archs", list(ARCHS), "Archs decoded from a state.")
    flags.DEFINE_list("recompute_archs", ["llama", "lion_s"], "Archs also decoded by recompute.")
    flags.DEFINE_integer("vocab", 100_280, "Vocabulary size.")
    flags.DEFINE_integer("calls", 5, "Calls timed back to back.")
    flags.DEFINE_bool("remat", True, "Train with each block recomputed in the backward pass "
                      "(without it a 410M model at 32K tokens per step needs about 80 GB).")


def model(arch, dims, vocab, max_len, impl="auto", remat=False):
    """The bf16-compute :class:`CausalLM` of ``arch`` with ``dims`` (``lm_size``'s keys)."""
    return CausalLM(arch=arch, vocab_size=vocab, max_len=max_len, mixer={"impl": impl},
                    remat=remat, dtype=jnp.bfloat16, **dims)


def init_params(net):
    return nn.meta.unbox(jax.jit(net.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))


def tokens(batch, length, vocab, seed=0):
    return jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 0, vocab, jnp.int32)


def train_step(net, params, batch_tokens, calls):
    """(ms per AdamW step, compiled MiB) of next-token cross-entropy on ``batch_tokens`` (the
    training task's loss: :func:`~lion_jax.models.lm.next_token_losses`)."""
    tx = optax.adamw(3e-4, weight_decay=0.1)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, x):
        def loss(p):
            features = net.apply(p, x[:, :-1], hidden=True)
            return next_token_losses(features, p["params"]["embed"]["embedding"],
                                     x[:, 1:])[0].mean()
        grads = jax.grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    compiled = step.lower(params, opt, batch_tokens).compile()
    return timed(compiled, params, opt, batch_tokens, calls=calls), compiled_mib(compiled)


def decode_step(net, params, context, vocab, calls, mode):
    """(ms per generated token, compiled MiB) with ``context`` tokens before it (batch 1)."""
    prompt = tokens(1, context + 1, vocab, seed=1)
    if mode == "recompute":
        forward = jax.jit(lambda p, x: net.apply(p, x)[:, -1])
        compiled = forward.lower(params, prompt).compile()
        return timed(compiled, params, prompt, calls=calls), compiled_mib(compiled)
    _, state = jax.jit(lambda p, x: net.apply(p, x, return_state=True))(params, prompt[:, :-1])

    def step(p, token, state, offset):
        logits, state = net.apply(p, token, state=state, offset=offset, return_state=True)
        return logits[:, -1], state

    offset = jnp.int32(context)
    compiled = jax.jit(step).lower(params, prompt[:, -1:], state, offset).compile()
    return (timed(compiled, params, prompt[:, -1:], state, offset, calls=calls),
            compiled_mib(compiled))


def train_rows(archs, dims, vocab, tokens_per_step, lengths, calls, remat=True):
    """``{(arch, L): (tokens/s, MiB) or reason}``; ``dims(arch)`` gives the model's sizes."""
    results = {}
    for arch in archs:
        for length in lengths:
            batch = max(1, tokens_per_step // length)
            try:
                net = model(arch, dims(arch), vocab, length, remat=remat)
                params = init_params(net)
                ms, mib = train_step(net, params, tokens(batch, length + 1, vocab), calls)
                results[arch, length] = (batch * length / ms * 1e3, mib)
            except Exception as e:  # noqa: BLE001  OOM / refused: reported, not fatal
                results[arch, length] = failure(e)
            print(f"  train {arch} at {length} tokens x {batch}: {results[arch, length]}",
                  flush=True)
    return results


def decode_rows(decode_archs, recompute_archs, dims, vocab, contexts, calls):
    """``(names, {(name, C): (ms per token, MiB) or reason})``, names "<arch>, <mode>"."""
    sides = [(a, "state") for a in decode_archs] + [(a, "recompute") for a in recompute_archs]
    results = {}
    for arch, mode in sides:
        for context in contexts:
            name = f"{arch}, {mode}"
            try:
                net = model(arch, dims(arch), vocab, context + 1)
                params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), init_params(net))
                results[name, context] = decode_step(net, params, context, vocab, calls, mode)
            except Exception as e:  # noqa: BLE001
                results[name, context] = failure(e)
            print(f"  decode {name} at {context}: {results[name, context]}", flush=True)
    return [f"{a}, {m}" for a, m in sides], results


def _table(title, names, results, columns, fmt):
    lines = [title, "", "| model | " + " | ".join(f"{c:,}" for c in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for name in names:
        cells = [results[name, c] if isinstance(results[name, c], str) else fmt(results[name, c])
                 for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def markdown(device, size, tokens_per_step, calls, archs, train, lengths, names, decode,
             contexts, remat=True):
    lines = [f"{device}, jax {jax.__version__}, scaling-laws {size} models, bf16 compute"
             f"{', blocks rematerialized in training' if remat else ''}; "
             f"{timing(calls)}", ""]
    if train:
        lines += _table(f"Training tokens/s at {tokens_per_step:,} tokens per step (compiled "
                        "memory, MiB), by sequence length", archs, train, lengths,
                        lambda r: f"{r[0]:,.0f} ({r[1]:,.0f})") + [""]
    if decode:
        lines += _table("Decoding, batch 1: ms per generated token (compiled memory, MiB), by "
                        "context length", names, decode, contexts,
                        lambda r: f"{r[0]:.2f} ({r[1]:,.0f})")
    return "\n".join(lines) + "\n"


def plot(path, archs, train, lengths, names, decode, contexts):
    """Training tokens/s against length (left pair of panels), decoding ms/token against
    context (right pair)."""
    base, ext = os.path.splitext(path)
    if train:
        two_panels(f"{base}_train{ext}", archs, train, lengths, xlabel="sequence length",
                   speed_label="training tokens / s", xscale="log")
    if decode:
        two_panels(f"{base}_decode{ext}", names, decode, contexts, xlabel="context length",
                   speed_label="ms / token", xscale="log")


def main(argv):
    del argv
    try:
        lm_size(FLAGS.size, "llama")
        lengths = [int(n) for n in FLAGS.lengths]
        contexts = [int(n) for n in FLAGS.contexts]
    except ValueError as e:
        sys.exit(f"error: {e}")
    unknown = set(FLAGS.archs + FLAGS.decode_archs + FLAGS.recompute_archs) - set(ARCHS)
    if unknown:
        sys.exit(f"error: unknown archs {sorted(unknown)}; valid: {list(ARCHS)}")
    if jax.default_backend() != "gpu":
        sys.exit("error: bench_lm needs a GPU")
    device = jax.devices()[0].device_kind
    def dims(arch):
        return lm_size(FLAGS.size, arch)

    train = train_rows(FLAGS.archs, dims, FLAGS.vocab, FLAGS.tokens_per_step, lengths,
                       FLAGS.calls, FLAGS.remat) if FLAGS.archs else {}
    names, decode = decode_rows(FLAGS.decode_archs, FLAGS.recompute_archs, dims, FLAGS.vocab,
                                contexts, FLAGS.calls)
    table = markdown(device, FLAGS.size, FLAGS.tokens_per_step, FLAGS.calls, FLAGS.archs,
                     train, lengths, names, decode, contexts, FLAGS.remat)
    print(table)
    if FLAGS.out:
        os.makedirs(FLAGS.out, exist_ok=True)
        with open(os.path.join(FLAGS.out, "table.md"), "w") as f:
            f.write(table)
        plot(os.path.join(FLAGS.out, "plot.png"), FLAGS.archs, train, lengths, names, decode,
             contexts)


if __name__ == "__main__":
    define_flags()
    app.run(main)
