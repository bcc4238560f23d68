"""Inference: restore (or average) params onto any mesh, one model or an ensemble, translate with beam search,
greedy or sampling, and continue prompts with a language model.

Used by `eval.py` (through `scoring`), by `train.py`'s final report, by `transformer_jax.translate`,
`transformer_jax.generate` and `transformer_jax.attention_plots`. Never imports the training loop.
(~420 lines: every tool takes a `Restored` from the first half and hands it to the second — restoring and
decoding text are the one job of turning a run directory into outputs; split, every caller would import both.)
"""

import dataclasses
import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from transformer_jax import checkpoint
from transformer_jax import decoding
from transformer_jax import ensemble
from transformer_jax import layer_layout
from transformer_jax import model as model_lib
from transformer_jax import sharding
from transformer_jax.data import pipeline
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.model import LanguageModel, Transformer
from transformer_jax.model_config import ModelConfig
from transformer_jax.tokens import BOS_ID, EOS_ID
from transformer_jax.workdir import Workdir

METHODS = ('beam', 'greedy', 'sample')


def default_config() -> ml_collections.ConfigDict:
  """The `decode` section: the paper's beam search (§6.1); sampling settings of a language model's samples."""
  return ml_collections.ConfigDict({
      'beam_size': 4,
      'alpha': 0.6,  # length penalty ((5 + length) / 6) ** alpha
      'max_len_offset': 50,  # max output length = input length + this (§6.1)
      'batch_size': 64,  # sentences decoded at once (global)
      'max_new_tokens': 40,  # decoder-only: tokens generated after a prompt
      'temperature': 1.0,  # decoder-only sampling; 0 = greedy
      'top_k': 0,  # decoder-only sampling from the k most likely tokens (0 = all)
      'top_p': 1.0,  # decoder-only nucleus sampling (1.0 = off)
  })


def validate(decode: ml_collections.ConfigDict) -> None:
  for key, low in (('beam_size', 1), ('max_len_offset', 0), ('batch_size', 1), ('max_new_tokens', 1),
                   ('temperature', 0), ('top_k', 0)):
    if decode[key] < low:
      raise ValueError(f'decode.{key} must be >= {low}, got {decode[key]}.')
  if decode.alpha < 0:
    raise ValueError(f'decode.alpha must be >= 0 (beam search stops early only then), got {decode.alpha}.')
  if not 0.0 < decode.top_p <= 1.0:
    raise ValueError(f'decode.top_p must be in (0, 1] (1.0 = off), got {decode.top_p}.')


@dataclasses.dataclass
class Restored:
  """What inference needs: one model or an ensemble (members sharded on `mesh`), the tokenizer they share, and
  where each member's params come from."""

  config: ml_collections.ConfigDict  # the first member's run: its decode, eval and data settings serve them all
  members: tuple[ensemble.Member, ...]
  origins: tuple[dict, ...]  # per member {'workdir', 'steps'}: the checkpoint step(s) of its params (averaged)
  tokenizer: tokenizer_lib.Tokenizer
  mesh: jax.sharding.Mesh
  rules: tuple

  def on_mesh(self):
    """Traces and runs under this mesh with the logical-axis rules, as training does."""
    return sharding.activate(self.mesh, self.rules)

  @property
  def is_ensemble(self) -> bool:
    return len(self.members) > 1

  def _single(self) -> int:
    if self.is_ensemble:
      raise ValueError(f'this takes one model, not an ensemble of {len(self.members)}: pass one --workdir and at '
                       'most one --step.')
    return 0

  @property
  def model(self) -> Transformer | LanguageModel:
    return self.members[self._single()].model

  @property
  def params(self) -> dict:
    return self.members[self._single()].params

  @property
  def steps(self) -> list[int]:
    return self.origins[self._single()]['steps']

  @property
  def max_len(self) -> int:
    """The longest sequence every member accepts (`model.max_len`)."""
    return min(m.model.config.max_len for m in self.members)

  @property
  def position_limit(self) -> int | None:
    """The most tokens every member's positions cover (`ModelConfig.position_limit`; None: no limit)."""
    limits = [m.model.config.position_limit for m in self.members if m.model.config.position_limit is not None]
    return min(limits, default=None)

  def decode_length(self, input_length: int, max_len_offset: int) -> int:
    """Output tokens allowed for an input of `input_length` tokens by every member (`ModelConfig.decode_length`)."""
    return min(m.model.config.decode_length(input_length, max_len_offset) for m in self.members)


def inference_mesh(config) -> jax.sharding.Mesh:
  """All of this run's devices in one data-parallel axis: any checkpoint restores onto it."""
  mesh_cfg = ml_collections.ConfigDict(config.mesh.to_dict())
  mesh_cfg.shape = {'data': -1, 'fsdp': 1, 'tensor': 1}
  return sharding.make_mesh(mesh_cfg)


def abstract_params(model: Transformer | LanguageModel, mesh, rules):
  """Params' shapes with their NamedShardings on `mesh`, without allocating anything."""
  inputs = model_lib.init_inputs(model.config, (1, 2))
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), **inputs)['params'])
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nn.unbox(boxed), shardings)


def restore(config, workdir: str, *, step: int | None = None, average_last: int | None = None,
            mesh=None) -> Restored:
  """Params of the latest (or given) step, or the average of the last `average_last` checkpoints."""
  return restore_ensemble([(config, workdir, step)], average_last=average_last, mesh=mesh)


def restore_ensemble(runs, *, average_last: int | None = None, mesh=None) -> Restored:
  """An ensemble on one inference mesh (the first run's): for each (config, workdir, step) of `runs` the params of
  that step, of the newest checkpoint that restores (step None) or the average of the newest `average_last`.

  The members may differ in size but not in architecture, and must share the tokenizer (byte-identical
  SentencePiece models, whose size is every member's vocab_size). One run is one model. A checkpoint written with
  the other `model.scan_layers` layout is restored in its own and converted.
  """
  first_config, first_workdir, _ = runs[0]
  tok = tokenizer_lib.load_tokenizer(Workdir(first_workdir).tokenizer_model)
  mesh = mesh or inference_mesh(first_config)
  rules = sharding.rules_from_config(first_config.mesh)
  members, origins = [], []
  for config, workdir, step in runs:
    _check_same_tokenizer(tok, Workdir(workdir).tokenizer_model)
    tokenizer_lib.check_vocab_size(tok, config.model.vocab_size)
    model = model_lib.make_model(ModelConfig.from_dict(config.model))
    if members and model.config.decoder_only != members[0].model.config.decoder_only:
      raise ValueError(f'{workdir} holds a {model.config.architecture} model and {first_workdir} a '
                       f'{members[0].model.config.architecture} one: an ensemble\'s members share the architecture.')
    params, chosen = _restore_params(model, workdir, step, average_last, mesh, rules)
    logging.info('restored params of steps %s of %s', chosen, workdir)
    members.append(ensemble.Member(model, params))
    origins.append({'workdir': workdir, 'steps': chosen})
  return Restored(first_config, tuple(members), tuple(origins), tok, mesh, rules)


def _check_same_tokenizer(tok: tokenizer_lib.Tokenizer, path: str) -> None:
  if tokenizer_lib.load_tokenizer(path).model_proto != tok.model_proto:
    raise ValueError(f'{path} and {tok.path} are different SentencePiece models: ensemble only runs trained with '
                     'the same tokenizer (copy one run\'s tokenizer/spm.model into a new workdir before training it).')


def _restore_params(model, workdir: str, step, average_last, mesh, rules):
  """(params on `mesh` in `model`'s layer layout, the steps they come from) of one run; see `restore_ensemble`."""
  directory = Workdir(workdir).checkpoints
  manager = checkpoint.open_existing(directory)
  target = abstract_params(model, mesh, rules)

  def restore_step(step_: int):
    """A step's params in this model's layer layout, whichever layout (scanned or not) the run saved."""
    saved_scanned = layer_layout.is_scanned(checkpoint.saved_params(manager, step_))
    if saved_scanned == model.config.scan_layers:
      return checkpoint.restore_params(manager, step_, target)
    saved_model = model_lib.make_model(model.config.replace(scan_layers=saved_scanned))
    params = checkpoint.restore_params(manager, step_, abstract_params(saved_model, mesh, rules))
    return layer_layout.convert_onto(params, target, model.config.scan_layers)

  try:
    if average_last:
      return checkpoint.average_params(manager, sorted(manager.all_steps(), reverse=True), restore_step,
                                       count=average_last)
    if step is None:
      latest, params, _ = checkpoint.restore_newest(manager, restore_step)
      return params, [latest]
    if step not in manager.all_steps():
      raise ValueError(f'no checkpoint of step {step} in {directory}; available steps: {sorted(manager.all_steps())}.')
    return restore_step(step), [step]
  finally:
    manager.close()


def save_averaged(restored: Restored, workdir: str) -> str:
  """Writes averaged params as a params-only checkpoint in the workdir's `averaged` checkpoints (at the last
  averaged step); returns its directory."""
  directory = Workdir(workdir).averaged.checkpoints
  manager = checkpoint.make_manager(directory, async_save=False)
  checkpoint.save(manager, restored.steps[-1], {'params': restored.params}, force=True)
  manager.wait_until_finished()
  manager.close()
  return f'{directory}/{restored.steps[-1]}'


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


@functools.partial(jax.jit, static_argnames=('method', 'beam_size', 'alpha', 'max_decode_len', 'n_best',
                                             'temperature', 'top_k', 'top_p', 'use_cache'))
def generate(members: tuple[ensemble.Member, ...], inputs, rng, *, method: str = 'beam', beam_size: int = 4,
             alpha: float = 0.6, max_decode_len: int = 64, n_best: int = 1, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, use_cache: bool = True):
  """Token ids [batch, n_best, max_decode_len] (PAD after EOS) and scores, by beam search, greedy or sampling
  with one model (one member) or an ensemble: each member with its own encoder output (or prompt prefill) and
  key/value cache, their log-probabilities combined per step by `ensemble.logits_fn`, all in one jitted program.

  inputs [batch, length] (right-padded with 0): the source sentences of a translation, or the prompts a language
  model continues (a document's first tokens, without EOS; an empty row starts a document). use_cache=False
  recomputes the decoder over the whole prefix at every step (for tests and benchmarks).
  """
  starts = [_start(m.model, m.params, inputs) for m in members]
  make_fn = _cached_logits_fn if use_cache else _uncached_logits_fn
  member_fns, caches = zip(*(make_fn(m.model, m.params, start, max_decode_len) for m, start in zip(members, starts)))
  logits_fn, cache = ensemble.logits_fn(member_fns), tuple(caches)
  batch, first = inputs.shape[0], starts[0].first_tokens  # the same for every member: it comes from the inputs
  if method == 'beam':
    return decoding.beam_search(logits_fn, cache, batch, beam_size=beam_size, alpha=alpha,
                                max_decode_len=max_decode_len, n_best=n_best, first_tokens=first)
  if method == 'greedy':
    tokens = decoding.greedy_search(logits_fn, cache, batch, max_decode_len=max_decode_len, first_tokens=first)
  elif method == 'sample':
    tokens = decoding.sample(logits_fn, cache, batch, rng, max_decode_len=max_decode_len, temperature=temperature,
                             top_k=top_k, top_p=top_p, first_tokens=first)
  else:
    raise ValueError(f'unknown decoding method {method!r}: use one of {METHODS}.')
  return tokens[:, None], jnp.zeros((batch, 1), jnp.float32)


def generate_batches(restored: Restored, batches, max_decode_len, rng=None, **generate_kwargs):
  """Yields (example_index, best token ids) for every real row of `batches` (this process's rows) by `generate`.

  max_decode_len(width): the output length for a batch of inputs `width` tokens wide; batch i samples with
  fold_in(rng, i).
  """
  batch_sharding = sharding.batch_sharding(restored.mesh)
  rng = jax.random.key(0) if rng is None else rng
  for number, batch in enumerate(batches):
    inputs = jax.make_array_from_process_local_data(batch_sharding, batch['inputs'])
    tokens, _ = generate(restored.members, inputs, jax.random.fold_in(rng, number),
                         max_decode_len=max_decode_len(batch['inputs'].shape[1]), **generate_kwargs)
    tokens = np.asarray(multihost_utils.process_allgather(tokens, tiled=True))[:, 0]
    indices = np.asarray(multihost_utils.process_allgather(batch['example_index'], tiled=True))
    for index, ids in zip(indices, tokens):
      if index >= 0:
        yield int(index), ids


def translate_batches(restored: Restored, batches, decode_cfg, method: str = 'beam'):
  """Yields (example_index, best token ids) for every real row of `batches` (this process's rows)."""
  return generate_batches(restored, batches,
                          lambda width: restored.decode_length(width, decode_cfg.max_len_offset),
                          method=method, beam_size=decode_cfg.beam_size, alpha=decode_cfg.alpha)


def translate_pairs(restored: Restored, pairs, decode_cfg) -> list[str]:
  """Detokenized translations of every pair's source, in order."""
  batches = pipeline.make_eval_batches(pairs, restored.tokenizer, decode_cfg.batch_size,
                                       max_length=restored.position_limit,
                                       process_index=jax.process_index(), process_count=jax.process_count())
  out = [''] * len(pairs)
  with restored.on_mesh():
    for index, ids in translate_batches(restored, batches, decode_cfg):
      out[index] = restored.tokenizer.decode(ids)
  return out


def encode_lines(lines, tokenizer, max_len: int, truncate: bool,
                 what: str = 'input line {number}', fix: str = 'shorten it or pass --truncate') -> list[list[int]]:
  """Token ids with EOS for each line; an over-long line is an error naming it (`what`, `fix`), or cut."""
  encoded = []
  for number, line in enumerate(lines, 1):
    ids = tokenizer.encode(line) + [EOS_ID]
    if len(ids) > max_len:
      if not truncate:
        raise ValueError(f'{what.format(number=number)} has {len(ids)} tokens, more than the model\'s max length '
                         f'{max_len}: {fix}.')
      ids = ids[:max_len - 1] + [EOS_ID]
    encoded.append(ids)
  return encoded


def translate_nonblank(lines: list[str], translate) -> list[str]:
  """`translate(lines)` of the non-blank lines, put back in order; empty (or blank) lines give empty outputs (as in
  every translation engine)."""
  keep = [i for i, line in enumerate(lines) if line.strip()]
  out = [''] * len(lines)
  for i, text in zip(keep, translate([lines[i] for i in keep]), strict=True):
    out[i] = text
  return out


def translate_lines(restored: Restored, lines: list[str], *, method='beam', beam_size=None,
                    batch_size=32, truncate=False) -> list[str]:
  """Translations of `lines` in order; empty (or blank) lines give empty outputs."""
  decode_cfg = restored.config.decode.copy_and_resolve_references()
  decode_cfg.beam_size = beam_size or decode_cfg.beam_size
  rows = -(-batch_size // sharding.data_parallel_size(restored.mesh)) * sharding.data_parallel_size(restored.mesh)

  def translate(kept: list[str]) -> list[str]:
    encoded = encode_lines(kept, restored.tokenizer, restored.max_len, truncate)
    examples = ({'inputs': np.asarray(ids, np.int32), 'targets': np.asarray([EOS_ID], np.int32)} for ids in encoded)
    batches = pipeline.batch_examples(examples, rows, process_index=jax.process_index(),
                                      process_count=jax.process_count())
    out = [''] * len(kept)
    with restored.on_mesh():
      for i, ids in translate_batches(restored, batches, decode_cfg, method):
        out[i] = restored.tokenizer.decode(ids)
    return out

  return translate_nonblank(lines, translate)


def continue_prompts(restored: Restored, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0,
                     top_k: int = 0, top_p: float = 1.0, seed: int = 0, num_samples: int = 1, batch_size: int = 32,
                     fit: bool = False) -> list[list[str]]:
  """`num_samples` texts per prompt: the prompt continued by a language model for up to `max_new_tokens` tokens
  (or to the end of its document), sampled (temperature 0: greedy), batched and jitted once per shape.

  A prompt too long for `max_new_tokens` more tokens within the model's max length is an error, or with `fit`
  all prompts get as many new tokens as the longest leaves room for.
  """
  max_len = restored.max_len
  encoded = [restored.tokenizer.encode(prompt) for prompt in prompts]
  if fit:
    max_new_tokens = max(min(max_new_tokens, max_len - max(map(len, encoded), default=0)), 1)
  for number, ids in enumerate(encoded, 1):
    if len(ids) + max_new_tokens > max_len:
      raise ValueError(f'prompt {number} has {len(ids)} tokens, which with max_new_tokens={max_new_tokens} is more '
                       f'than the model\'s max length {max_len}: shorten the prompt or generate fewer tokens.')
  rows = [ids for ids in encoded for _ in range(num_samples)]
  data_parallel = sharding.data_parallel_size(restored.mesh)
  examples = ({'inputs': np.asarray(ids, np.int32)} for ids in rows)
  batches = pipeline.batch_examples(examples, -(-batch_size // data_parallel) * data_parallel, max_length=max_len,
                                    process_index=jax.process_index(), process_count=jax.process_count())
  sampling = {'method': 'greedy'} if temperature == 0 else {
      'method': 'sample', 'temperature': temperature, 'top_k': top_k, 'top_p': top_p}
  texts = [''] * len(rows)
  with restored.on_mesh():
    for index, ids in generate_batches(restored, batches, lambda width: max_new_tokens, jax.random.key(seed),
                                       **sampling):
      texts[index] = restored.tokenizer.decode(rows[index] + [int(i) for i in ids])
  return [texts[i * num_samples:(i + 1) * num_samples] for i in range(len(prompts))]
