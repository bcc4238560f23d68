"""Input-pipeline throughput: real (non-padding) tokens per second of the training pipeline.

Trains a tokenizer on the corpus (timed), then for each batching mode consumes batches after a
warm-up and prints one JSON line per measurement and a short table at the end. Corpora:
  synthetic  --num_pairs Zipf-distributed pseudo-word pairs generated in memory
  builtin    the built-in corpus via transformer_jax.data.sources.load_split (train split)
  files      --num_pairs (>= 1M) synthetic pairs written to two text files in a temp dir, read
             back with sources.load_split (source='files')
Example: python -m bench.data_throughput --corpus=synthetic --num_pairs=200000 --seconds=10

The pipeline and tokenizer sections are the config's, their keys changed as train.py's are
(`--config.pipeline.KEY=VALUE`, `--config.tokenizer.KEY=VALUE`), from their defaults (the paper's batch, ~25k tokens a
side); no worker processes unless `--config.pipeline.num_workers` says, both batchings unless
`--config.pipeline.batching` names one. With --workers_for=TOKENS_PER_S (the
source + target tokens/s a chip's training step consumes, e.g. the H100's base step in bench/RESULTS.md) each row
also says how many worker processes at this measured rate per worker would keep that chip fed.

--against_training measures instead, in interleaved rounds of one process, the default config's own pipeline
(built-in corpus, its tokenizer and batch layout) against the real tokens/s its jitted training step consumes,
and reports the ratio (the loader must deliver >= 5x what training consumes).
"""

import math
import os
import tempfile
import time

import numpy as np
from absl import app
from absl import flags
import ml_collections

from bench import common
from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax.config import data as data_section
from transformer_jax.config import pipeline as pipeline_section
from transformer_jax.config import tokenizer as tokenizer_section
from transformer_jax.data import pipeline as pl
from transformer_jax.data import tokenizer as tk


def synthetic_pairs(num_pairs: int, seed: int = 0) -> list[tuple[str, str]]:
  """Pairs of 2..44 (mean 23, as WMT) pseudo-words from a Zipf law over 50k words (vectorized)."""
  rng = np.random.default_rng(seed)
  letters = np.array(list('abcdefghijklmnopqrstuvwxyzäöüéß'))
  vocab = np.array([''.join(rng.choice(letters, n)) for n in rng.integers(2, 10, 50_000)])
  frequency = 1 / np.arange(1, len(vocab) + 1)
  lengths = rng.integers(2, 45, 2 * num_pairs)
  words = vocab[rng.choice(len(vocab), lengths.sum(), p=frequency / frequency.sum())]
  ends = np.cumsum(lengths)
  sentences = [' '.join(words[end - n:end]) for end, n in zip(ends, lengths)]
  return list(zip(sentences[::2], sentences[1::2]))


def file_pairs(num_pairs: int, directory: str):
  """Writes synthetic pairs to train.src / train.tgt and reads them back as a source split."""
  paths = {'source': os.path.join(directory, 'train.src'),
           'target': os.path.join(directory, 'train.tgt')}
  pairs = synthetic_pairs(num_pairs)
  for side, path in enumerate(paths.values()):
    with open(path, 'w', encoding='utf-8') as f:
      f.writelines(pair[side] + '\n' for pair in pairs)
  del pairs
  from transformer_jax.data import sources  # pylint: disable=import-outside-toplevel
  config = data_section.default_config()
  config.source = 'files'
  config.files = {'train': paths}
  return sources.load_split(config, 'train')


def load_corpus(corpus: str, num_pairs: int, directory: str):
  if corpus == 'synthetic':
    return synthetic_pairs(num_pairs)
  if corpus == 'files':
    return file_pairs(max(num_pairs, 1_000_000), directory)
  from transformer_jax.data import sources  # pylint: disable=import-outside-toplevel
  return sources.load_split(data_section.default_config(), 'train')


def measure(pairs, tokenizer, config, seconds: float, warmup_batches: int) -> dict:
  """Consumes batches for `seconds` after `warmup_batches`; counts real tokens and examples."""
  iterator = iter(pl.make_train_dataset(pairs, tokenizer, config))
  start = time.perf_counter()
  next(iterator)
  first_batch_seconds = time.perf_counter() - start
  for _ in range(warmup_batches):
    next(iterator)
  counts = dict(batches=0, examples=0, source_tokens=0, target_tokens=0, target_slots=0)
  start, start_cpu = time.perf_counter(), time.process_time()
  while time.perf_counter() - start < seconds:
    batch = next(iterator)
    counts['batches'] += 1
    counts['examples'] += int(batch['targets_segment_ids'].max(axis=1).sum())
    counts['source_tokens'] += int((batch['inputs'] != 0).sum())
    counts['target_tokens'] += int((batch['targets'] != 0).sum())
    counts['target_slots'] += batch['targets'].size
  elapsed = time.perf_counter() - start
  cpu = time.process_time() - start_cpu  # this process only (not grain worker processes)
  iterator.close()
  return {
      'batching': config.batching,
      'batches_per_s': counts['batches'] / elapsed,
      'examples_per_s': counts['examples'] / elapsed,
      'target_tokens_per_s': counts['target_tokens'] / elapsed,
      'source_target_tokens_per_s': (counts['source_tokens'] + counts['target_tokens']) / elapsed,
      'target_tokens_per_process_cpu_s': counts['target_tokens'] / cpu,
      'target_fill': counts['target_tokens'] / counts['target_slots'],
      'batch_shape_last': list(batch['targets'].shape),
      'seconds': elapsed,
      'first_batch_seconds': first_batch_seconds,
  }


def default_config_training_ratio(seconds: float, rounds: int) -> list[dict]:
  """Pipeline tokens/s vs train-step tokens/s of configs/default.py, alternating the two in each round."""
  import jax  # pylint: disable=import-outside-toplevel
  from transformer_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from transformer_jax.training import run_builder  # pylint: disable=import-outside-toplevel
  from transformer_jax.runtime import sharding  # pylint: disable=import-outside-toplevel
  from transformer_jax.data import sources  # pylint: disable=import-outside-toplevel
  config = config_lib.load('configs/default.py')
  pairs = sources.load_split(config.data, 'train')
  with tempfile.TemporaryDirectory() as directory:
    tokenizer = tk.load_or_train_tokenizer(config.tokenizer, os.path.join(directory, 'spm.model'), pairs)
  run = run_builder.build(config)
  mesh, state, step_fn = run.mesh, run.initial_state(), run.train_step
  batches = iter(pl.make_train_dataset(pairs, tokenizer, config.pipeline))
  state, metrics = step_fn(state, sharding.place_batch(next(batches), mesh))  # compile
  jax.block_until_ready(metrics)
  results = []
  for round_index in range(rounds):
    loader = measure(pairs, tokenizer, config.pipeline, seconds, warmup_batches=5)
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
      batch = next(batches)
      state, metrics = step_fn(state, sharding.place_batch(batch, mesh))
      tokens += int((batch['inputs'] != 0).sum() + (batch['targets'] != 0).sum())
    jax.block_until_ready(metrics)
    train_tokens_per_s = tokens / (time.perf_counter() - start)
    result = {'round': round_index, 'loader_source_target_tokens_per_s': loader['source_target_tokens_per_s'],
              'train_step_source_target_tokens_per_s': train_tokens_per_s,
              'ratio': loader['source_target_tokens_per_s'] / train_tokens_per_s}
    common.emit(result)
    results.append(result)
  return results


def sections() -> ml_collections.ConfigDict:
  """What --config.KEY=VALUE changes: the pipeline and tokenizer sections, without worker processes by default."""
  config = ml_collections.ConfigDict({'pipeline': pipeline_section.default_config(),
                                      'tokenizer': tokenizer_section.default_config()})
  config.pipeline.num_workers = 0
  return config


def main():
  """The command: its flags are defined here, when it runs (not when a test imports the module)."""
  config_flag = cli.define_config_overrides_flag(
      sections(), 'The pipeline and tokenizer sections, changed as train.py takes them: --config.pipeline.KEY=VALUE, '
      '--config.tokenizer.KEY=VALUE.')
  corpus = flags.DEFINE_enum('corpus', 'synthetic', ['synthetic', 'builtin', 'files'], 'The pairs to read.')
  num_pairs = flags.DEFINE_integer('num_pairs', 200_000, 'Synthetic pairs (files: at least 1M).', lower_bound=1)
  seconds = flags.DEFINE_float('seconds', 10.0, 'Seconds of batches per measurement.', lower_bound=0.1)
  warmup_batches = flags.DEFINE_integer('warmup_batches', 20, 'Batches read before each measurement.', lower_bound=0)
  workers_for = flags.DEFINE_float('workers_for', None, 'Source + target tokens/s a chip consumes: report the '
                                   'worker processes it needs.', lower_bound=1.0)
  against_training = flags.DEFINE_bool('against_training', False, "The default config's own pipeline against its "
                                       'training step, in interleaved rounds (takes no --config.* changes).')
  rounds = flags.DEFINE_integer('rounds', 3, '--against_training rounds.', lower_bound=1)

  def run(argv):
    if len(argv) > 1:
      raise app.UsageError(f'unexpected arguments {argv[1:]}; settings go in --config.KEY=VALUE.')
    overrides = cli.overrides()
    if against_training.value:
      if overrides:
        raise ValueError(f'--against_training measures configs/default.py as it is: drop {sorted(overrides)}.')
      results = default_config_training_ratio(seconds.value, rounds.value)
      columns = ('round', 'loader_source_target_tokens_per_s', 'train_step_source_target_tokens_per_s', 'ratio')
      print('\n' + common.markdown_table(list(columns), [[r[c] for c in columns] for r in results]))
      return
    config = config_flag.value
    tokenizer_section.validate(config.tokenizer)
    batchings = (config.pipeline.batching,) if 'pipeline.batching' in overrides else pipeline_section.BATCHINGS
    if len(batchings) == 1:
      config_lib.check_overrides(config, overrides)
    for batching in batchings:  # before the corpus and the tokenizer: a bad setting fails at once
      pipeline_section.validate(with_batching(config.pipeline, batching))
    measure_batchings(config, batchings, corpus.value, num_pairs.value, seconds.value, warmup_batches.value,
                      workers_for.value)

  cli.run(run)


def with_batching(pipeline: ml_collections.ConfigDict, batching: str) -> ml_collections.ConfigDict:
  pipeline = pipeline.copy_and_resolve_references()
  pipeline.batching = batching
  return pipeline


def measure_batchings(config, batchings, corpus: str, num_pairs: int, seconds: float, warmup_batches: int,
                      workers_for: float | None):
  """The corpus's tokenizer trained (timed), then each batching's pipeline measured: a JSON line each, a table."""
  num_workers = pl.num_workers(config.pipeline)  # what the pipeline runs: -1 resolved for this host
  with tempfile.TemporaryDirectory() as directory:
    start = time.perf_counter()
    pairs = load_corpus(corpus, num_pairs, directory)
    common.emit({'corpus': corpus, 'pairs': len(pairs),
                 'load_seconds': time.perf_counter() - start, **common.machine(),
                 'load_average_1min': os.getloadavg()[0]})
    start = time.perf_counter()
    tokenizer = tk.load_or_train_tokenizer(config.tokenizer, os.path.join(directory, 'spm.model'), pairs)
    common.emit({'tokenizer_train_seconds': time.perf_counter() - start,
                 'sample_sentences': min(config.tokenizer.sample_size, 2 * len(pairs)),
                 'vocab_size': tokenizer.vocab_size})
    results = []
    for batching in batchings:
      pipeline = with_batching(config.pipeline, batching)
      result = {'corpus': corpus, 'pairs': len(pairs), 'read_threads': pipeline.read_threads,
                'num_workers': num_workers,
                **measure(pairs, tokenizer, pipeline, seconds, warmup_batches)}
      result['source_target_tokens_per_s_per_worker'] = result['source_target_tokens_per_s'] / max(num_workers, 1)
      if workers_for:
        result['workers_needed'] = math.ceil(workers_for / result['source_target_tokens_per_s_per_worker'])
      common.emit(result)
      results.append(result)

  columns = ('batching', 'num_workers', 'target_tokens_per_s', 'source_target_tokens_per_s',
             'source_target_tokens_per_s_per_worker', 'examples_per_s', 'batches_per_s', 'target_fill',
             'target_tokens_per_process_cpu_s') + (('workers_needed',) if workers_for else ())
  print('\n' + common.markdown_table(list(columns), [[r[c] for c in columns] for r in results]))


if __name__ == '__main__':
  main()
