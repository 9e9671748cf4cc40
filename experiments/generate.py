r"""Generate text with a trained causal LM (a run of ``configs/lm/*.py``).

    python -m experiments.generate --workdir W --prompt "text" [--max_new_tokens 64] \
        [--mode state|kv_cache|recompute] [--temperature 0] [--top_k 0] [--top_p 1.0] \
        [--seed 0] [--prefill_chunk 0]

Reads ``W/config.json`` and the parameters of the best checkpoint (``W/best``), rebuilds the
run's model and tokenizer (its ``tokenizer_file``, or the byte-level BPE it trained, from the
cache under ``config.data.cache_dir``; trained again, identically, if that cache is gone),
encodes the prompt after the end-of-document token (a document starts after it in training),
runs :func:`lion_jax.generate.generate` and prints the continuation: the decoded new tokens up
to the first end-of-document token (the model ended the document) or ``max_new_tokens``.

``--mode state`` (default) prefills the prompt (in chunks of ``--prefill_chunk`` tokens when
> 0) and decodes one token per step from the mixers' state (LLaMA: its KV cache, whose
capacity is the run's ``max_len``; the linear models: a fixed-size state); ``--mode
kv_cache`` does the same with the linear models keeping a KV cache of capacity ``max_len``
too (attention to every token seen); ``--mode recompute`` reruns the whole sequence for every
token. All three emit the same tokens (greedy: ``--temperature 0``, the default; sampling:
``--temperature > 0`` with ``--top_k``, ``--top_p``, ``--seed``).

Problems (no run there, another task's run, a prompt plus ``max_new_tokens`` longer than
LLaMA's context or, with ``--mode kv_cache``, than ``max_len``, bad sampling settings, a
missing tokenizer) print one ``error:`` line and exit with status 1.
"""

import sys

from absl import app, flags, logging

from experiments.errors import UserError

FLAGS = flags.FLAGS


def define_flags():
    """The command line's flags; defined only when run as a program (see eval_length.py)."""
    flags.DEFINE_string("workdir", None, "Workdir of a causal-LM training run.")
    flags.DEFINE_string("prompt", "", "Text to continue ('' = start a document).")
    flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate at most.")
    flags.DEFINE_string("mode", "state", "state (prefill + one token per step from the state), "
                        "kv_cache (the same from a KV cache of max_len tokens, for the linear "
                        "models too) or recompute (the full forward for every token).")
    flags.DEFINE_float("temperature", 0.0, "0 = greedy; > 0 samples at this temperature.")
    flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens (0 = all).")
    flags.DEFINE_float("top_p", 1.0, "Sample among the most likely tokens of this total "
                       "probability (1 = all).")
    flags.DEFINE_integer("seed", 0, "Seed of the sampling.")
    flags.DEFINE_integer("prefill_chunk", 0, "state and kv_cache modes: prefill the prompt in "
                         "chunks of this many tokens (0 = at once).")


class Generator:
    """A run's model, best parameters and tokenizer, ready to continue prompts.

    Raises UserError (one line) when ``workdir`` is not a causal-LM run with a best checkpoint
    or its tokenizer cannot be loaded.
    """

    def __init__(self, workdir):
        from experiments.checkpointing import load_best_run
        from experiments.data import lm as lm_data
        from experiments.tasks import lm as lm_task

        self.config, self.step, params = load_best_run(workdir, "lm", "experiments.generate")
        try:
            self.tokenizer = lm_data.tokenizer_of(self.config.data)
        except (FileNotFoundError, ValueError) as e:
            raise UserError(f"the run's tokenizer: {e}") from None
        kwargs = lm_task.model_kwargs(self.config.model,
                                      vocab_size=self.tokenizer.vocab_size,
                                      max_len=int(self.config.data.max_len))
        self.model = lm_task.make_model(kwargs)
        rows = params["embed"]["embedding"].shape[0]
        if rows != self.model.vocab_size:
            raise UserError(f"the checkpoint's embedding has {rows} rows but the run's "
                            f"tokenizer ({self.tokenizer.path}) makes a model of "
                            f"{self.model.vocab_size}: the tokenizer is not the one the run "
                            "trained with (its cache under config.data.cache_dir was rebuilt "
                            "from changed data?)")
        self.params = {"params": params}

    def encode(self, prompt):
        """The prompt's ids, after the end-of-document token."""
        return [self.tokenizer.eod_id] + self.tokenizer.encode(prompt)

    def continue_ids(self, prompt, *, max_new_tokens=64, mode="state", temperature=0.0,
                     top_k=0, top_p=1.0, seed=0, prefill_chunk=0):
        """The generated ids (list of int) after ``prompt``, up to the first end-of-document
        token (not included). Raises UserError for a request the model cannot serve."""
        import jax
        import numpy as np

        from lion_jax import generate as gen

        ids = self.encode(prompt)
        settings = dict(mode=mode, temperature=temperature, top_k=top_k, top_p=top_p,
                        prefill_chunk=prefill_chunk)
        try:
            gen.check_request(self.model, len(ids), max_new_tokens, **settings)
        except ValueError as e:
            raise UserError(str(e)) from None
        out = gen.generate(self.model, self.params, np.asarray([ids], np.int32), max_new_tokens,
                           rng=jax.random.PRNGKey(seed), **settings)
        new = [int(t) for t in np.asarray(out)[0, len(ids):]]
        if self.tokenizer.eod_id in new:
            new = new[:new.index(self.tokenizer.eod_id)]
        return new

    def continue_text(self, prompt, **settings):
        """The decoded continuation of ``prompt`` (settings as :meth:`continue_ids`)."""
        new = self.continue_ids(prompt, **settings)
        prompt_ids = self.encode(prompt)[1:]
        # Decode with the prompt so a character split over the boundary comes out whole.
        full, head = self.tokenizer.decode(prompt_ids + new), self.tokenizer.decode(prompt_ids)
        return full[len(head):] if full.startswith(head) else self.tokenizer.decode(new)


def main(argv):
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}", file=sys.stderr)
        sys.exit(1)
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    try:
        if not FLAGS.workdir:
            raise UserError("give --workdir (a causal-LM run) and --prompt")
        text = Generator(FLAGS.workdir).continue_text(
            FLAGS.prompt, max_new_tokens=FLAGS.max_new_tokens, mode=FLAGS.mode,
            temperature=FLAGS.temperature, top_k=FLAGS.top_k, top_p=FLAGS.top_p,
            seed=FLAGS.seed, prefill_chunk=FLAGS.prefill_chunk)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    print(text)


if __name__ == "__main__":
    define_flags()
    app.run(main)
