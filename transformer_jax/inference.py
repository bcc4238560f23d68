"""Inference: restore (or average) params onto any mesh, and translate with beam search, greedy or sampling.

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
  """What inference needs: the model, its params (sharded on `mesh`), the tokenizer, and their provenance."""

  config: ml_collections.ConfigDict
  model: Transformer
  params: dict
  tokenizer: tokenizer_lib.Tokenizer
  mesh: jax.sharding.Mesh
  rules: tuple
  steps: list[int]  # the checkpoint step(s) the params come from (several when averaged)

  def on_mesh(self):
    """Traces and runs under this mesh with the logical-axis rules, as training does."""
    return sharding.activate(self.mesh, self.rules)


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
  run_dir = Workdir(workdir)
  tok = tokenizer_lib.load_tokenizer(run_dir.tokenizer_model)
  tokenizer_lib.check_vocab_size(tok, config.model.vocab_size)
  model = Transformer(ModelConfig.from_dict(config.model))
  mesh = mesh or inference_mesh(config)
  rules = sharding.rules_from_config(config.mesh)
  manager = checkpoint.open_existing(run_dir.checkpoints)
  target = abstract_params(model, mesh, rules)
  try:
    if average_last:
      params, chosen = checkpoint.average_params(manager, sorted(manager.all_steps(), reverse=True), target,
                                                 count=average_last)
    elif step is None:
      latest, params, _ = checkpoint.restore_newest(manager, lambda s: checkpoint.restore_params(manager, s, target))
      chosen = [latest]
    else:
      if step not in manager.all_steps():
        raise ValueError(f'no checkpoint of step {step} in {run_dir.checkpoints}; '
                         f'available steps: {sorted(manager.all_steps())}.')
      params, chosen = checkpoint.restore_params(manager, step, target), [step]
  finally:
    manager.close()
  logging.info('restored params of steps %s', chosen)
  return Restored(config, model, params, tok, mesh, rules, chosen)


def save_averaged(restored: Restored, workdir: str) -> str:
  """Writes averaged params as a params-only checkpoint in the workdir's `averaged` checkpoints (at the last
  averaged step); returns its directory."""
  directory = Workdir(workdir).averaged.checkpoints
  manager = checkpoint.make_manager(directory, async_save=False)
  checkpoint.save(manager, restored.steps[-1], {'params': restored.params}, force=True)
  manager.wait_until_finished()
  manager.close()
  return f'{directory}/{restored.steps[-1]}'


def _cached_logits_fn(model: Transformer, params, encoded, inputs, max_decode_len):
  """Next-token logits from the model's key/value cache: one decoder position per step.

  The source tokens ride in the cache, so beam search reorders them with the beams.
  """
  _, variables = model.apply({'params': params}, encoded, inputs, max_decode_len, method=Transformer.init_cache,
                             mutable=['cache'])

  def logits_fn(tokens, cache):
    logits, new_vars = model.apply({'params': params, 'cache': cache['model']}, None, cache['inputs'], tokens,
                                   decode=True, method=Transformer.decode, mutable=['cache'])
    return logits[:, 0], {'model': new_vars['cache'], 'inputs': cache['inputs']}

  return logits_fn, {'model': variables['cache'], 'inputs': inputs}


def _uncached_logits_fn(model: Transformer, params, encoded, inputs, max_decode_len):
  """Next-token logits recomputed from the whole prefix every step (the reference the cache must match)."""

  def logits_fn(tokens, cache):
    index = cache['index']
    prefix = jax.lax.dynamic_update_slice_in_dim(cache['prefix'], tokens, index, axis=1)
    logits = model.apply({'params': params}, cache['encoded'], cache['inputs'], prefix, method=Transformer.decode)
    step_logits = jax.lax.dynamic_index_in_dim(logits, index, axis=1, keepdims=False)
    return step_logits, dict(cache, prefix=prefix, index=index + 1)

  prefix = jnp.zeros((inputs.shape[0], max_decode_len), jnp.int32)
  return logits_fn, {'prefix': prefix, 'index': jnp.zeros((), jnp.int32), 'encoded': encoded, 'inputs': inputs}


@functools.partial(jax.jit, static_argnames=('model', 'method', 'beam_size', 'alpha', 'max_decode_len', 'n_best',
                                             'temperature', 'top_k', 'top_p', 'use_cache'))
def generate(params, inputs, rng, *, model: Transformer, method: str = 'beam', beam_size: int = 4,
             alpha: float = 0.6, max_decode_len: int = 64, n_best: int = 1, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, use_cache: bool = True):
  """Token ids [batch, n_best, max_decode_len] (PAD after EOS) and scores, by beam search, greedy or sampling.

  use_cache=False recomputes the decoder over the whole prefix at every step (for tests and benchmarks).
  """
  encoded = model.apply({'params': params}, inputs, method=Transformer.encode)
  make_fn = _cached_logits_fn if use_cache else _uncached_logits_fn
  logits_fn, cache = make_fn(model, params, encoded, inputs, max_decode_len)
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
    tokens, _ = generate(restored.params, inputs, jax.random.key(0), model=restored.model, method=method,
                         beam_size=decode_cfg.beam_size, alpha=decode_cfg.alpha,
                         max_decode_len=restored.model.config.decode_length(batch['inputs'].shape[1],
                                                                            decode_cfg.max_len_offset))
    tokens = np.asarray(multihost_utils.process_allgather(tokens, tiled=True))[:, 0]
    indices = np.asarray(multihost_utils.process_allgather(batch['example_index'], tiled=True))
    for index, ids in zip(indices, tokens):
      if index >= 0:
        yield int(index), ids


def translate_pairs(restored: Restored, pairs, decode_cfg) -> list[str]:
  """Detokenized translations of every pair's source, in order."""
  batches = pipeline.make_eval_batches(pairs, restored.tokenizer, decode_cfg.batch_size,
                                       max_length=restored.model.config.position_limit,
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


def translate_lines(restored: Restored, lines: list[str], *, method='beam', beam_size=None,
                    batch_size=32, truncate=False) -> list[str]:
  """Translations of `lines` in order; empty (or blank) lines give empty outputs."""
  config = restored.config
  keep = [i for i, line in enumerate(lines) if line.strip()]
  encoded = encode_lines([lines[i] for i in keep], restored.tokenizer, config.model.max_len, truncate)
  decode_cfg = config.decode.copy_and_resolve_references()
  decode_cfg.beam_size = beam_size or decode_cfg.beam_size
  rows = -(-batch_size // sharding.data_parallel_size(restored.mesh)) * sharding.data_parallel_size(restored.mesh)
  examples = ({'inputs': np.asarray(ids, np.int32), 'targets': np.asarray([EOS_ID], np.int32)} for ids in encoded)
  batches = pipeline.batch_examples(examples, rows, process_index=jax.process_index(),
                                    process_count=jax.process_count())
  out = [''] * len(lines)
  with restored.on_mesh():
    for i, ids in translate_batches(restored, batches, decode_cfg, method):
      out[keep[i]] = restored.tokenizer.decode(ids)
  return out
