"""Token generation for :class:`lion_jax.models.lm.CausalLM`, in three modes that emit the same
tokens (the LION paper's Figure 5 decodes a linear model these three ways):

* ``mode="recompute"``: every new token runs the full forward over the whole sequence so far
  (a fixed ``[B, P + N]`` buffer, zeros past the current token: causality makes them
  invisible). Time per token grows with the context; no state.
* ``mode="state"``: a prefill returns each mixer's decoding state (the KV cache for LLaMA, the
  recurrent state ``S`` for the linear models), then one token per call continues from it.
  The linear models' state has a fixed size, so memory and time per token stay flat in the
  context; LLaMA's cache grows to ``max_len``. ``prefill_chunk > 0`` runs the prompt in chunks
  of that many tokens, each continuing from the previous chunk's state (the exact state: the
  same tokens as one prefill).
* ``mode="kv_cache"``: as ``"state"`` (``prefill_chunk`` too), but the linear models keep a KV
  cache of capacity ``max_len`` (``CausalLM(kv_cache=True)``, :class:`lion_jax.ops.KVCache`)
  instead of ``S`` and attend to every token seen, as LLaMA does: memory and time per token
  scale with ``max_len``. For LLaMA it is ``"state"``. A prompt + generation longer than
  ``max_len`` is refused.

Sampling: greedy (``temperature=0``), else softmax at ``temperature`` after keeping the
``top_k`` most likely tokens (0: all) and the smallest set whose probability reaches ``top_p``
(1.0: all). Shapes: ``prompt [B, P]`` int -> ``[B, P + max_new_tokens]`` int32.
"""

import functools

import jax
import jax.numpy as jnp

MODES = ("recompute", "state", "kv_cache")


def sample(logits, rng, *, temperature=0.0, top_k=0, top_p=1.0):
    """Next tokens ``[B]`` int32 from ``logits [B, V]`` (module docstring)."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / temperature
    if top_k:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more likely tokens
        sorted_logits = jnp.where(before < top_p, sorted_logits, -jnp.inf)
        logits = jnp.full_like(logits, -jnp.inf).at[
            jnp.arange(logits.shape[0])[:, None], order].set(sorted_logits)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def check_request(model, prompt_len, max_new_tokens, *, mode="state", temperature=0.0,
                  top_k=0, top_p=1.0, prefill_chunk=0):
    """Raises ``ValueError`` (one line) for a request :func:`generate` cannot serve."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid: {list(MODES)}")
    if prompt_len < 1 or max_new_tokens < 1:
        raise ValueError(f"need a prompt of at least 1 token and max_new_tokens >= 1; got "
                         f"{prompt_len} and {max_new_tokens}")
    if (model.arch == "llama" or mode == "kv_cache") \
            and prompt_len + max_new_tokens > model.max_len:
        whose = "LLaMA's context" if model.arch == "llama" else "the KV cache's capacity"
        fix = "" if model.arch == "llama" else ", or use mode='state'"
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) "
                         f"pass {whose} max_len={model.max_len}; shorten the prompt or "
                         f"generate fewer tokens{fix}")
    if temperature < 0 or top_k < 0 or not 0.0 < top_p <= 1.0 or prefill_chunk < 0:
        raise ValueError(f"need temperature >= 0, top_k >= 0, 0 < top_p <= 1 and "
                         f"prefill_chunk >= 0; got {temperature}, {top_k}, {top_p}, "
                         f"{prefill_chunk}")


def prefill(model, params, prompt, *, chunk=0):
    """``(logits of the last prompt token [B, V], state)``: the prompt in one call, or in
    chunks of ``chunk`` tokens each continuing from the state of the one before."""
    P = prompt.shape[1]
    size = chunk or P
    state, logits = None, None
    for start in range(0, P, size):
        logits, state = model.apply(params, prompt[:, start:start + size], state=state,
                                    offset=start, return_state=True)
    return logits[:, -1], state


def generate(model, params, prompt, max_new_tokens, *, mode="state", rng=None,
             temperature=0.0, top_k=0, top_p=1.0, prefill_chunk=0):
    """``prompt [B, P]`` followed by ``max_new_tokens`` generated tokens (module docstring).

    Raises:
      ValueError: an unknown mode, bad sampling settings, or (LLaMA, or mode="kv_cache") a
        prompt and generation longer than the model's ``max_len``.
    """
    prompt = jnp.asarray(prompt, jnp.int32)
    B, P = prompt.shape
    check_request(model, P, max_new_tokens, mode=mode, temperature=temperature, top_k=top_k,
                  top_p=top_p, prefill_chunk=prefill_chunk)
    rng = jax.random.PRNGKey(0) if rng is None else rng
    pick = functools.partial(sample, temperature=temperature, top_k=top_k, top_p=top_p)
    keys = jax.random.split(rng, max_new_tokens)
    if mode == "recompute":
        return jax.jit(functools.partial(_recompute, model, pick))(params, prompt, keys)
    if mode == "kv_cache":
        model = model.clone(kv_cache=True)
    last, state = jax.jit(functools.partial(prefill, model, chunk=prefill_chunk))(params,
                                                                                  prompt)
    return jax.jit(functools.partial(_decode, model, pick))(params, prompt, last, state, keys)


def _recompute(model, pick, params, prompt, keys):
    B, P = prompt.shape
    tokens = jnp.zeros((B, P + keys.shape[0]), jnp.int32).at[:, :P].set(prompt)

    def body(i, tokens):
        logits = model.apply(params, tokens)
        t = P + i
        nxt = pick(jax.lax.dynamic_index_in_dim(logits, t - 1, axis=1, keepdims=False),
                   keys[i])
        return tokens.at[:, t].set(nxt)

    return jax.lax.fori_loop(0, keys.shape[0], body, tokens)


def _decode(model, pick, params, prompt, last, state, keys):
    P = prompt.shape[1]
    first = pick(last, keys[0])

    def body(carry, key_and_offset):
        token, state = carry
        key, offset = key_and_offset
        logits, state = model.apply(params, token[:, None], state=state, offset=offset,
                                    return_state=True)
        return (pick(logits[:, -1], key), state), carry[0]

    offsets = P + jnp.arange(keys.shape[0] - 1, dtype=jnp.int32)  # of the token fed
    (final, _), tokens = jax.lax.scan(body, (first, state), (keys[1:], offsets))
    return jnp.concatenate([prompt, tokens.T, final[:, None]], axis=1)
