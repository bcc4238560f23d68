"""Evaluation: restore (or average) params onto any mesh, translate a split with beam search, score BLEU.

Used by `eval.py`, by `train.py` at the end of a run, by `transformer_jax.translate`, and by the sweep runner
(through `results.json`).
"""

import contextlib
import dataclasses
import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from transformer_jax import bleu
from transformer_jax import checkpoint
from transformer_jax import decoding
from transformer_jax import sharding
from transformer_jax import steps
from transformer_jax import trainer
from transformer_jax.data import pipeline
from transformer_jax.data import sources
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.model import Transformer
from transformer_jax.model_config import ModelConfig
from transformer_jax.tokens import EOS_ID


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

  @contextlib.contextmanager
  def on_mesh(self):
    """Traces and runs under this mesh with the logical-axis rules, as training does."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield


def check_same_model(config, saved) -> None:
  """The model section of `config` must be the one the workdir was trained with."""
  given, trained = config.model.to_dict(), saved.model.to_dict()
  differ = sorted(k for k in set(given) | set(trained) if given.get(k) != trained.get(k) and k not in _RUNTIME_KEYS)
  if differ:
    raise ValueError('the workdir was trained with another model config: ' + ', '.join(
        f'model.{k}={trained.get(k)!r} (given {given.get(k)!r})' for k in differ)
        + '; pass the --config it was trained with.')


# Model fields that may differ between training and inference (same parameters, other computation).
_RUNTIME_KEYS = ('attention', 'attention_chunk_size', 'remat', 'dtype', 'dropout', 'attention_dropout',
                 'relu_dropout')


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
  tok = tokenizer_lib.load_tokenizer(workdir)
  tokenizer_lib.check_vocab_size(tok, config.model.vocab_size)
  model = Transformer(ModelConfig.from_dict(config.model))
  mesh = mesh or inference_mesh(config)
  rules = sharding.rules_from_config(config.mesh)
  manager = checkpoint.open_existing(workdir)
  target = abstract_params(model, mesh, rules)
  if average_last:
    chosen = checkpoint.last_steps(manager, average_last)
    params = checkpoint.average_params(manager, chosen, target)
  else:
    chosen = [manager.latest_step() if step is None else step]
    if chosen[0] not in manager.all_steps():
      raise ValueError(f'no checkpoint of step {step} in {checkpoint.checkpoint_dir(workdir)}; '
                       f'available steps: {sorted(manager.all_steps())}.')
    params = checkpoint.restore_params(manager, chosen[0], target)
  manager.close()
  logging.info('restored params of steps %s', chosen)
  return Restored(config, model, params, tok, mesh, rules, chosen)


def save_averaged(restored: Restored, workdir: str) -> str:
  """Writes averaged params as a params-only checkpoint under <workdir>/averaged/<last step>."""
  manager = checkpoint.make_manager(os.path.join(workdir, 'averaged'), async_save=False)
  checkpoint.save(manager, restored.steps[-1], {'params': restored.params}, force=True)
  manager.wait_until_finished()
  manager.close()
  return os.path.join(checkpoint.checkpoint_dir(os.path.join(workdir, 'averaged')), str(restored.steps[-1]))


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
    raise ValueError(f"unknown decoding method {method!r}: use 'beam', 'greedy' or 'sample'.")
  return tokens[:, None], jnp.zeros((batch, 1), jnp.float32)


def translate_batches(restored: Restored, batches, decode_cfg, method: str = 'beam'):
  """Yields (example_index, best token ids) for every real row of `batches` (this process's rows)."""
  batch_sharding = sharding.batch_sharding(restored.mesh)
  for batch in batches:
    inputs = jax.make_array_from_process_local_data(batch_sharding, batch['inputs'])
    tokens, _ = generate(restored.params, inputs, jax.random.key(0), model=restored.model, method=method,
                         beam_size=decode_cfg.beam_size, alpha=decode_cfg.alpha,
                         max_decode_len=batch['inputs'].shape[1] + decode_cfg.max_len_offset)
    tokens = np.asarray(multihost_utils.process_allgather(tokens, tiled=True))[:, 0]
    indices = np.asarray(multihost_utils.process_allgather(batch['example_index'], tiled=True))
    for index, ids in zip(indices, tokens):
      if index >= 0:
        yield int(index), ids


def translate_pairs(restored: Restored, pairs, decode_cfg) -> list[str]:
  """Detokenized translations of every pair's source, in order."""
  batches = pipeline.make_eval_batches(pairs, restored.tokenizer, decode_cfg.batch_size,
                                       process_index=jax.process_index(), process_count=jax.process_count())
  out = [''] * len(pairs)
  with restored.on_mesh():
    for index, ids in translate_batches(restored, batches, decode_cfg):
      out[index] = restored.tokenizer.decode(ids)
  return out


def encode_lines(lines, tokenizer, max_len: int, truncate: bool) -> list[list[int]]:
  """Token ids with EOS for each line; an over-long line is an error naming it, or cut with --truncate."""
  encoded = []
  for number, line in enumerate(lines, 1):
    ids = tokenizer.encode(line) + [EOS_ID]
    if len(ids) > max_len:
      if not truncate:
        raise ValueError(f'input line {number} has {len(ids)} tokens, more than the model\'s max length {max_len}: '
                         'shorten it or pass --truncate.')
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


def teacher_forced_metrics(restored: Restored, pairs) -> dict:
  """Per-token loss (label-smoothed as in training), NLL, perplexity and accuracy over every pair."""
  eval_fn = jax.jit(functools.partial(steps.eval_step, model=restored.model,
                                      smoothing=restored.config.train.label_smoothing))
  with restored.on_mesh():
    return trainer.evaluate(restored.config, restored.params, eval_fn, pairs, restored.tokenizer, restored.mesh)


def results_path(workdir: str, split: str, test_split: str) -> str:
  return os.path.join(workdir, 'results.json' if split == test_split else f'results_{split}.json')


def evaluate_split(restored: Restored, workdir: str, split: str) -> dict:
  """Loss, perplexity, accuracy and BLEU (sacrebleu and the paper's tokenized BLEU) on a split.

  Writes the translations and references under <workdir>/translations and the numbers to results*.json.
  """
  config = restored.config
  pairs = sources.load_split(config.data, split)
  scores = {f'{split}_{k}': v for k, v in teacher_forced_metrics(restored, pairs).items()}
  hypotheses = translate_pairs(restored, pairs, config.decode)
  sources_text = [src for src, _ in pairs]
  references = [tgt for _, tgt in pairs]
  sacre, signature = bleu.sacrebleu_corpus(hypotheses, references)
  tokenized = bleu.tokenized_bleu(hypotheses, references, split_compounds=config.data.target_lang == 'de')
  results = {'step': restored.steps[-1], 'averaged_steps': restored.steps, 'split': split, 'bleu': sacre,
             'bleu_signature': signature, 'tokenized_bleu': tokenized, 'num_sentences': len(pairs),
             'params': int(sum(np.prod(p.shape) for p in jax.tree.leaves(restored.params))),
             'beam_size': config.decode.beam_size, 'alpha': config.decode.alpha, **scores}
  if jax.process_index() == 0:
    paths = bleu.write_translations(workdir, split, sources_text, hypotheses, references)
    results['translations'] = {k: str(v) for k, v in paths.items()}
    with open(results_path(workdir, split, config.eval.test_split), 'w') as f:
      json.dump(results, f, indent=2)
  results['samples'] = list(zip(sources_text, hypotheses, references))
  return results


def describe(results: dict, num_samples: int) -> str:
  """A short human-readable report of `evaluate_split`'s results."""
  split = results['split']
  lines = [f'{split}: BLEU {results["bleu"]:.2f} (sacrebleu {results["bleu_signature"]}), '
           f'tokenized BLEU {results["tokenized_bleu"]:.2f}, loss {results[f"{split}_loss"]:.4f}, '
           f'perplexity {results[f"{split}_perplexity"]:.3f}, accuracy {results[f"{split}_accuracy"]:.3f} '
           f'on {results["num_sentences"]} sentences; params of step(s) {results["averaged_steps"]}']
  for src, hyp, ref in results['samples'][:num_samples]:
    lines += [f'  source:    {src}', f'  output:    {hyp}', f'  reference: {ref}']
  return '\n'.join(lines)


def final_report(config, workdir: str) -> dict:
  """End of training: average the last checkpoints (as many as exist, up to eval.average_last), report test BLEU."""
  manager = checkpoint.open_existing(workdir)
  available = len(manager.all_steps())
  manager.close()
  average = min(config.eval.average_last, available)
  restored = restore(config, workdir, average_last=average if average > 1 else None)
  results = evaluate_split(restored, workdir, config.eval.test_split)
  if jax.process_index() == 0:
    print(describe(results, config.eval.num_samples), flush=True)
  return results
