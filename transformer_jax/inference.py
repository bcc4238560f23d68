"""Inference: restore (or average) params onto any mesh, one model or an ensemble, and translate with beam search,
greedy or sampling.

Used by `eval.py` (through `scoring`), by `train.py`'s final report, by `transformer_jax.translate` and by
`transformer_jax.attention_plots`. Never imports the training loop.
"""

import dataclasses
import functools

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
from transformer_jax import sharding
from transformer_jax.data import pipeline
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.model import Transformer
from transformer_jax.model_config import ModelConfig
from transformer_jax.tokens import EOS_ID
from transformer_jax.workdir import Workdir

METHODS = ('beam', 'greedy', 'sample')


def default_config() -> ml_collections.ConfigDict:
  """The `decode` section: the paper's beam search (§6.1)."""
  return ml_collections.ConfigDict({
      'beam_size': 4,
      'alpha': 0.6,  # length penalty ((5 + length) / 6) ** alpha
      'max_len_offset': 50,  # max output length = input length + this (§6.1)
      'batch_size': 64,  # sentences decoded at once (global)
  })


def validate(decode: ml_collections.ConfigDict) -> None:
  for key, low in (('beam_size', 1), ('max_len_offset', 0), ('batch_size', 1)):
    if decode[key] < low:
      raise ValueError(f'decode.{key} must be >= {low}, got {decode[key]}.')
  if decode.alpha < 0:
    raise ValueError(f'decode.alpha must be >= 0 (beam search stops early only then), got {decode.alpha}.')


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
  def model(self) -> Transformer:
    return self.members[self._single()].model

  @property
  def params(self) -> dict:
    return self.members[self._single()].params

  @property
  def steps(self) -> list[int]:
    return self.origins[self._single()]['steps']

  @property
  def max_len(self) -> int:
    """The longest input every member accepts (`model.max_len`)."""
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


def abstract_params(model: Transformer, mesh, rules):
  """Params' shapes with their NamedShardings on `mesh`, without allocating anything."""
  tokens = jnp.ones((1, 2), jnp.int32)
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens, tokens)['params'])
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nn.unbox(boxed), shardings)


def restore(config, workdir: str, *, step: int | None = None, average_last: int | None = None,
            mesh=None) -> Restored:
  """Params of the latest (or given) step, or the average of the last `average_last` checkpoints."""
  return restore_ensemble([(config, workdir, step)], average_last=average_last, mesh=mesh)


def restore_ensemble(runs, *, average_last: int | None = None, mesh=None) -> Restored:
  """An ensemble on one inference mesh (the first run's): for each (config, workdir, step) of `runs` the params of
  that step, of the newest checkpoint that restores (step None) or the average of the newest `average_last`.

  The members may differ in size but must share the tokenizer (byte-identical SentencePiece models, whose size is
  every member's vocab_size). One run is one model.
  """
  first_config, first_workdir, _ = runs[0]
  tok = tokenizer_lib.load_tokenizer(Workdir(first_workdir).tokenizer_model)
  mesh = mesh or inference_mesh(first_config)
  rules = sharding.rules_from_config(first_config.mesh)
  members, origins = [], []
  for config, workdir, step in runs:
    _check_same_tokenizer(tok, Workdir(workdir).tokenizer_model)
    tokenizer_lib.check_vocab_size(tok, config.model.vocab_size)
    model = Transformer(ModelConfig.from_dict(config.model))
    params, chosen = _restore_params(model, workdir, step, average_last, mesh, rules)
    logging.info('restored params of steps %s of %s', chosen, workdir)
    members.append(ensemble.Member(model, params))
    origins.append({'workdir': workdir, 'steps': chosen})
  return Restored(first_config, tuple(members), tuple(origins), tok, mesh, rules)


def _check_same_tokenizer(tok: tokenizer_lib.Tokenizer, path: str) -> None:
  if tokenizer_lib.load_tokenizer(path).model_proto != tok.model_proto:
    raise ValueError(f'{path} and {tok.path} are different SentencePiece models: ensemble only runs trained with '
                     'the same tokenizer (copy one run\'s tokenizer/spm.model into a new workdir before training it).')


def _restore_params(model: Transformer, workdir: str, step, average_last, mesh, rules):
  """(params on `mesh`, the steps they come from) of one run; see `restore_ensemble`."""
  directory = Workdir(workdir).checkpoints
  manager = checkpoint.open_existing(directory)
  target = abstract_params(model, mesh, rules)
  try:
    if average_last:
      return checkpoint.average_params(manager, sorted(manager.all_steps(), reverse=True), target,
                                       count=average_last)
    if step is None:
      latest, params, _ = checkpoint.restore_newest(manager, lambda s: checkpoint.restore_params(manager, s, target))
      return params, [latest]
    if step not in manager.all_steps():
      raise ValueError(f'no checkpoint of step {step} in {directory}; available steps: {sorted(manager.all_steps())}.')
    return checkpoint.restore_params(manager, step, target), [step]
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


def _cached_logits_fn(model: Transformer, params, inputs, max_decode_len):
  """Next-token logits from the model's key/value cache: one decoder position per step.

  The source tokens ride in the cache, so beam search reorders them with the beams.
  """
  encoded = model.apply({'params': params}, inputs, method=Transformer.encode)
  _, variables = model.apply({'params': params}, encoded, inputs, max_decode_len, method=Transformer.init_cache,
                             mutable=['cache'])

  def logits_fn(tokens, cache):
    logits, new_vars = model.apply({'params': params, 'cache': cache['model']}, None, cache['inputs'], tokens,
                                   decode=True, method=Transformer.decode, mutable=['cache'])
    return logits[:, 0], {'model': new_vars['cache'], 'inputs': cache['inputs']}

  return logits_fn, {'model': variables['cache'], 'inputs': inputs}


def _uncached_logits_fn(model: Transformer, params, inputs, max_decode_len):
  """Next-token logits recomputed from the whole prefix every step (the reference the cache must match)."""

  def logits_fn(tokens, cache):
    index = cache['index']
    prefix = jax.lax.dynamic_update_slice_in_dim(cache['prefix'], tokens, index, axis=1)
    logits = model.apply({'params': params}, cache['encoded'], cache['inputs'], prefix, method=Transformer.decode)
    step_logits = jax.lax.dynamic_index_in_dim(logits, index, axis=1, keepdims=False)
    return step_logits, dict(cache, prefix=prefix, index=index + 1)

  encoded = model.apply({'params': params}, inputs, method=Transformer.encode)
  prefix = jnp.zeros((inputs.shape[0], max_decode_len), jnp.int32)
  return logits_fn, {'prefix': prefix, 'index': jnp.zeros((), jnp.int32), 'encoded': encoded, 'inputs': inputs}


@functools.partial(jax.jit, static_argnames=('method', 'beam_size', 'alpha', 'max_decode_len', 'n_best',
                                             'temperature', 'top_k', 'top_p', 'use_cache'))
def generate(members: tuple[ensemble.Member, ...], inputs, rng, *, method: str = 'beam', beam_size: int = 4,
             alpha: float = 0.6, max_decode_len: int = 64, n_best: int = 1, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, use_cache: bool = True):
  """Token ids [batch, n_best, max_decode_len] (PAD after EOS) and scores, by beam search, greedy or sampling
  with one model (one member) or an ensemble: each member with its own encoder output and key/value cache, their
  log-probabilities combined per step by `ensemble.logits_fn`, all in one jitted program.

  use_cache=False recomputes the decoder over the whole prefix at every step (for tests and benchmarks).
  """
  make_fn = _cached_logits_fn if use_cache else _uncached_logits_fn
  member_fns, caches = zip(*(make_fn(m.model, m.params, inputs, max_decode_len) for m in members))
  logits_fn, cache = ensemble.logits_fn(member_fns), tuple(caches)
  batch = inputs.shape[0]
  if method == 'beam':
    return decoding.beam_search(logits_fn, cache, batch, beam_size=beam_size, alpha=alpha,
                                max_decode_len=max_decode_len, n_best=n_best)
  if method == 'greedy':
    tokens = decoding.greedy_search(logits_fn, cache, batch, max_decode_len=max_decode_len)
  elif method == 'sample':
    tokens = decoding.sample(logits_fn, cache, batch, rng, max_decode_len=max_decode_len, temperature=temperature,
                             top_k=top_k, top_p=top_p)
  else:
    raise ValueError(f'unknown decoding method {method!r}: use one of {METHODS}.')
  return tokens[:, None], jnp.zeros((batch, 1), jnp.float32)


def translate_batches(restored: Restored, batches, decode_cfg, method: str = 'beam'):
  """Yields (example_index, best token ids) for every real row of `batches` (this process's rows)."""
  batch_sharding = sharding.batch_sharding(restored.mesh)
  for batch in batches:
    inputs = jax.make_array_from_process_local_data(batch_sharding, batch['inputs'])
    tokens, _ = generate(restored.members, inputs, jax.random.key(0), method=method,
                         beam_size=decode_cfg.beam_size, alpha=decode_cfg.alpha,
                         max_decode_len=restored.decode_length(batch['inputs'].shape[1], decode_cfg.max_len_offset))
    tokens = np.asarray(multihost_utils.process_allgather(tokens, tiled=True))[:, 0]
    indices = np.asarray(multihost_utils.process_allgather(batch['example_index'], tiled=True))
    for index, ids in zip(indices, tokens):
      if index >= 0:
        yield int(index), ids


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
