"""Generating: token ids by beam search, greedy search or sampling with one model or an ensemble, all in one jitted
program, and the jobs built on it: translating pairs or lines of text, and continuing a language model's prompts.
Takes a `restoring.Restored`."""

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from transformer_jax.core import stops
from transformer_jax.core.tokens import BOS_ID, EOS_ID
from transformer_jax.data import pipeline
from transformer_jax.data import text_input
from transformer_jax.inference import decoding
from transformer_jax.inference.restoring import Restored
from transformer_jax.model import ensemble
from transformer_jax.model import transformer as model_lib
from transformer_jax.model.transformer import LanguageModel, Transformer
from transformer_jax.runtime import progress
from transformer_jax.runtime import sharding

METHODS = ('beam', 'greedy', 'sample')


class _Start(NamedTuple):
  """Where decoding starts, for either architecture (per-row arrays: beam search reorders them)."""

  context: dict  # the decoder's encoder-side arguments: encoded source and its ids; none for a language model
  prefix: jax.Array  # [batch, P] decoder inputs before the first step: a prompt as the model reads it; P = 0
  first_tokens: jax.Array  # [batch] the first step's input: BOS, or a prompt's last token
  positions: jax.Array  # [batch] the first step's position in each row's decoder input


def _start(model, params, inputs) -> _Start:
  """Translation starts from BOS at position 0 after the encoded source. A language model reads a prompt of L
  tokens as BOS, p_1..p_L: the prefix BOS, p_1..p_{L-1} (right-padded, `shift_right` of the prompt) goes
  through the cache at once, and the first step feeds p_L (BOS for an empty prompt) at position L."""
  batch = inputs.shape[0]
  if not model.config.decoder_only:
    encoded = model.apply({'params': params}, inputs, method=Transformer.encode)
    return _Start({'encoded': encoded, 'inputs': inputs}, jnp.zeros((batch, 0), jnp.int32),
                  jnp.full((batch,), BOS_ID, jnp.int32), jnp.zeros((batch,), jnp.int32))
  lengths = jnp.sum(inputs > 0, axis=1, dtype=jnp.int32)
  last = jnp.take_along_axis(inputs, jnp.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]
  return _Start({}, model_lib.shift_right(inputs), jnp.where(lengths > 0, last, BOS_ID), lengths)


def _decoder_args(cache: dict) -> dict:
  """The decoder's encoder-side keyword arguments as the cache carries them (none for a language model)."""
  return {key: cache[key] for key in ('encoded', 'inputs') if key in cache}


def _cached_logits_fn(model, params, start: _Start, max_decode_len: int):
  """Next-token logits from the model's key/value cache: one decoder position per step, after the prefix (a
  prompt) went through in one call. Each row's position is its own (prompts differ in length); the source
  tokens of a translation ride in the cache, so beam search reorders them with the beams."""
  batch, prefix_len = start.prefix.shape
  cache_len = prefix_len + max_decode_len
  if model.config.decoder_only:
    _, variables = model.apply({'params': params}, batch, cache_len, method=LanguageModel.init_cache,
                               mutable=['cache'])
  else:
    _, variables = model.apply({'params': params}, start.context['encoded'], start.context['inputs'], cache_len,
                               method=Transformer.init_cache, mutable=['cache'])
  context = {'encoded': None, 'inputs': start.context['inputs']} if start.context else {}
  if prefix_len:  # the prefill: every prompt position into the cache (padding marked invalid there)
    _, variables = model.apply({'params': params, 'cache': variables['cache']}, decoder_inputs=start.prefix,
                               decode=True, method='decode', mutable=['cache'], **context)

  def logits_fn(tokens, cache):
    logits, new_vars = model.apply({'params': params, 'cache': cache['model']}, decoder_inputs=tokens,
                                   targets_positions=cache['positions'][:, None], decode=True, method='decode',
                                   mutable=['cache'], **_decoder_args(cache))
    return logits[:, 0], dict(cache, model=new_vars['cache'], positions=cache['positions'] + 1)

  return logits_fn, {'model': variables['cache'], 'positions': start.positions, **context}


def _uncached_logits_fn(model, params, start: _Start, max_decode_len: int):
  """Next-token logits recomputed from each row's whole decoder input every step (the reference the cache must
  match)."""

  def logits_fn(tokens, cache):
    index, rows = cache['positions'], jnp.arange(tokens.shape[0])  # rows: batch × beams in beam search
    prefix = cache['prefix'].at[rows, index].set(tokens[:, 0])
    logits = model.apply({'params': params}, decoder_inputs=prefix, method='decode', **_decoder_args(cache))
    return logits[rows, index], dict(cache, prefix=prefix, positions=index + 1)

  prefix = jnp.pad(start.prefix, ((0, 0), (0, max_decode_len)))
  return logits_fn, {'prefix': prefix, 'positions': start.positions, **start.context}


def ensemble_logits_fn(member_fns: Sequence[decoding.LogitsFn]) -> decoding.LogitsFn:
  """A `decoding.LogitsFn` of an ensemble (`ensemble.mean_log_softmax` of its members'), over a tuple of the
  members' caches (each its own encoder output and KV cache)."""

  def combined(tokens, caches):
    outputs = [fn(tokens, cache) for fn, cache in zip(member_fns, caches)]
    return ensemble.mean_log_softmax([logits for logits, _ in outputs]), tuple(cache for _, cache in outputs)

  return combined


@functools.partial(jax.jit, static_argnames=('method', 'beam_size', 'alpha', 'max_decode_len', 'n_best',
                                             'temperature', 'top_k', 'top_p', 'use_cache'))
def generate(members: tuple[ensemble.Member, ...], inputs, rng, *, method: str = 'beam', beam_size: int = 4,
             alpha: float = 0.6, max_decode_len: int = 64, n_best: int = 1, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, use_cache: bool = True, row_limits=None):
  """Token ids [batch, n_best, max_decode_len] (PAD after EOS) and scores, by beam search, greedy or sampling
  with one model (one member) or an ensemble: each member with its own encoder output (or prompt prefill) and
  key/value cache, their log-probabilities combined per step by `ensemble_logits_fn`, all in one jitted program.

  inputs [batch, length] (right-padded with 0): the source sentences of a translation, or the prompts a language
  model continues (a document's first tokens, without EOS; an empty row starts a document). row_limits [batch]: a
  translation's most tokens per row (default max_decode_len); a language model's row ends where its prompt and
  continuation fill the model's max length. use_cache=False recomputes the decoder over the whole prefix at every
  step (for tests and benchmarks).
  """
  starts = [_start(m.model, m.params, inputs) for m in members]
  make_fn = _cached_logits_fn if use_cache else _uncached_logits_fn
  member_fns, caches = zip(*(make_fn(m.model, m.params, start, max_decode_len) for m, start in zip(members, starts)))
  logits_fn, cache = ensemble_logits_fn(member_fns), tuple(caches)
  batch, first = inputs.shape[0], starts[0].first_tokens  # the same for every member: it comes from the inputs
  limits = (min(m.model.config.max_len for m in members) - starts[0].positions
            if members[0].model.config.decoder_only else row_limits)
  if method == 'beam':
    return decoding.beam_search(logits_fn, cache, batch, beam_size=beam_size, alpha=alpha,
                                max_decode_len=max_decode_len, n_best=n_best, first_tokens=first, row_limits=limits)
  if method == 'greedy':
    tokens = decoding.greedy_search(logits_fn, cache, batch, max_decode_len=max_decode_len, first_tokens=first,
                                    row_limits=limits)
  elif method == 'sample':
    tokens = decoding.sample(logits_fn, cache, batch, rng, max_decode_len=max_decode_len, temperature=temperature,
                             top_k=top_k, top_p=top_p, first_tokens=first, row_limits=limits)
  else:
    raise ValueError(f'unknown decoding method {method!r}: use one of {METHODS}.')
  return tokens[:, None], jnp.zeros((batch, 1), jnp.float32)


def generate_batches(restored: Restored, batches, max_decode_len, rng=None, per_row: bool = False,
                     **generate_kwargs):
  """Yields (example_index, best token ids) for every real row of `batches` (this process's rows) by `generate`.

  max_decode_len(length): the output length for a batch of inputs `length` tokens wide or, `per_row`, for each
  row's own input of `length` tokens (a translation's); batch i samples with fold_in(rng, i).
  """
  batch_sharding = sharding.batch_sharding(restored.mesh)
  rng = jax.random.key(0) if rng is None else rng
  for number, batch in enumerate(batches):
    stops.here()
    inputs = jax.make_array_from_process_local_data(batch_sharding, batch['inputs'])
    if per_row:
      lengths = np.sum(batch['inputs'] > 0, axis=1)
      limits = np.asarray([max_decode_len(int(length)) for length in lengths], np.int32)
      generate_kwargs['row_limits'] = jax.make_array_from_process_local_data(batch_sharding, limits)
    tokens, _ = generate(restored.members, inputs, jax.random.fold_in(rng, number),
                         max_decode_len=max_decode_len(batch['inputs'].shape[1]), **generate_kwargs)
    tokens = np.asarray(multihost_utils.process_allgather(tokens, tiled=True))[:, 0]
    indices = np.asarray(multihost_utils.process_allgather(batch['example_index'], tiled=True))
    for index, ids in zip(indices, tokens):
      if index >= 0:
        yield int(index), ids


def translate_batches(restored: Restored, batches, decode_cfg, method: str = 'beam'):
  """Yields (example_index, best token ids) for every real row of `batches` (this process's rows), each at most
  its input's length (tokens, EOS included) + `decode.max_len_offset` tokens long (`Restored.decode_length`)."""
  return generate_batches(restored, batches,
                          lambda length: restored.decode_length(length, decode_cfg.max_len_offset), per_row=True,
                          method=method, beam_size=decode_cfg.beam_size, alpha=decode_cfg.alpha)


def translate_pairs(restored: Restored, pairs, decode_cfg, what: str = 'translating') -> list[str]:
  """Detokenized translations of every pair's source, in order; a long pass reports its progress as `what`."""
  batches = pipeline.make_eval_batches(pairs, restored.tokenizer, decode_cfg.batch_size,
                                       max_length=restored.position_limit,
                                       process_index=jax.process_index(), process_count=jax.process_count())
  out = [''] * len(pairs)
  with restored.on_mesh(), progress.Progress(what, total=len(pairs), unit='sentences') as translated:
    for index, ids in translate_batches(restored, batches, decode_cfg):
      out[index] = restored.tokenizer.decode(ids)
      translated.advance()
  return out


def check_translation_model(model_config, workdir: str) -> None:
  """Refuses, in one line, a language model where a tool translates (or plots a translation's attention)."""
  if model_config.decoder_only:
    raise ValueError(f"{workdir} holds a language model (model.architecture='decoder_only'), which continues "
                     'text rather than translating it: use python -m transformer_jax.generate.')


def translate_lines(restored: Restored, lines: list[str], *, method='beam', beam_size=None,
                    batch_size=32, truncate=False) -> list[str]:
  """Translations of `lines` in order; empty (or blank) lines give empty outputs."""
  decode_cfg = restored.config.decode.copy_and_resolve_references()
  decode_cfg.beam_size = beam_size or decode_cfg.beam_size
  rows = -(-batch_size // sharding.data_parallel_size(restored.mesh)) * sharding.data_parallel_size(restored.mesh)

  def translate(kept: list[str], numbers: list[int]) -> list[str]:
    encoded = text_input.encode_lines(kept, restored.tokenizer, restored.max_len, truncate, numbers=numbers)
    examples = ({'inputs': np.asarray(ids, np.int32), 'targets': np.asarray([EOS_ID], np.int32)} for ids in encoded)
    batches = pipeline.batch_examples(examples, rows, process_index=jax.process_index(),
                                      process_count=jax.process_count())
    out = [''] * len(kept)
    with restored.on_mesh(), progress.Progress('translating', total=len(kept), unit='sentences') as translated:
      for i, ids in translate_batches(restored, batches, decode_cfg, method):
        out[i] = restored.tokenizer.decode(ids)
        translated.advance()
    return out

  return text_input.translate_nonblank(lines, translate)


def continue_prompts(restored: Restored, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0,
                     top_k: int = 0, top_p: float = 1.0, seed: int = 0, num_samples: int = 1, batch_size: int = 32,
                     fit: bool = False) -> list[list[str]]:
  """`num_samples` texts per prompt: the prompt continued by a language model for up to `max_new_tokens` tokens
  (or to the end of its document), sampled (temperature 0: greedy), batched and jitted once per shape.

  A prompt too long for `max_new_tokens` more tokens within the model's max length is an error, or with `fit`
  each prompt gets as many of them as that length leaves it room for (an error only for a prompt that fills it).
  """
  max_len = restored.max_len
  encoded = [restored.tokenizer.encode(prompt) for prompt in prompts]
  for number, ids in enumerate(encoded, 1):
    if fit and len(ids) >= max_len:
      raise ValueError(f'prompt {number} has {len(ids)} tokens, which leaves no room for more within the model\'s '
                       f'max length {max_len}: shorten the prompt.')
    if not fit and len(ids) + max_new_tokens > max_len:
      raise ValueError(f'prompt {number} has {len(ids)} tokens, which with max_new_tokens={max_new_tokens} is more '
                       f'than the model\'s max length {max_len}: shorten the prompt or generate fewer tokens.')
  if fit:  # each row stops at its own room (`generate`)
    max_new_tokens = min(max_new_tokens, max_len - min(map(len, encoded), default=0))
  rows = [ids for ids in encoded for _ in range(num_samples)]
  data_parallel = sharding.data_parallel_size(restored.mesh)
  examples = ({'inputs': np.asarray(ids, np.int32)} for ids in rows)
  batches = pipeline.batch_examples(examples, -(-batch_size // data_parallel) * data_parallel, max_length=max_len,
                                    process_index=jax.process_index(), process_count=jax.process_count())
  sampling = {'method': 'greedy'} if temperature == 0 else {
      'method': 'sample', 'temperature': temperature, 'top_k': top_k, 'top_p': top_p}
  texts = [''] * len(rows)
  with restored.on_mesh(), progress.Progress('generating', total=len(rows), unit='texts') as generated:
    for index, ids in generate_batches(restored, batches, lambda width: max_new_tokens, jax.random.key(seed),
                                       **sampling):
      texts[index] = restored.tokenizer.decode(rows[index] + [int(i) for i in ids])
      generated.advance()
  return [texts[i * num_samples:(i + 1) * num_samples] for i in range(len(prompts))]
