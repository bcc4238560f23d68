"""Input-pipeline throughput: real (non-padding) tokens per second of the training pipeline.

Trains a tokenizer on the corpus (timed), then for each batching mode consumes batches after a
warm-up and prints one JSON line per measurement and a short table at the end. Corpora:
  synthetic  --num_pairs Zipf-distributed pseudo-word pairs generated in memory
  builtin    the built-in corpus via transformer_jax.data.sources.load_split (train split)
  files      --num_pairs (>= 1M) synthetic pairs written to two text files in a temp dir, read
             back with sources.load_split (source='files') or, without sources.py, line by line
Example: python -m bench.data_throughput --corpus=synthetic --num_pairs=200000 --seconds=10

The pipeline section's defaults are the paper's batch (~25k tokens a side). With --workers_for=TOKENS_PER_S (the
source + target tokens/s a chip's training step consumes, e.g. the H100's base step in bench/RESULTS.md) each row
also says how many worker processes at this measured rate per worker would keep that chip fed.

--against_training measures instead, in interleaved rounds of one process, the default config's own pipeline
(built-in corpus, its tokenizer and batch layout) against the real tokens/s its jitted training step consumes,
and reports the ratio (the loader must deliver >= 5x what training consumes).
"""

import argparse
import math
import os
import tempfile
import time

import numpy as np
from absl import flags

from bench import common
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
  try:
    from transformer_jax.data import sources  # pylint: disable=import-outside-toplevel
  except ImportError:
    lines = []
    for path in paths.values():
      with open(path, encoding='utf-8') as f:
        lines.append([line.rstrip('\n') for line in f])
    return list(zip(*lines))
  config = data_section.default_config()
  config.source = 'files'
  config.files = {'train': paths}
  return sources.load_split(config, 'train')


def load_corpus(args, directory: str):
  if args.corpus == 'synthetic':
    return synthetic_pairs(args.num_pairs)
  if args.corpus == 'files':
    return file_pairs(max(args.num_pairs, 1_000_000), directory)
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


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--corpus', choices=('synthetic', 'builtin', 'files'), default='synthetic')
  parser.add_argument('--num_pairs', type=int, default=200_000)
  parser.add_argument('--batching', choices=(*pipeline_section.BATCHINGS, 'both'), default='both')
  parser.add_argument('--vocab_size', type=int, default=8000)
  parser.add_argument('--read_threads', type=int, default=pipeline_section.default_config().read_threads)
  parser.add_argument('--num_workers', type=int, default=0)
  parser.add_argument('--seconds', type=float, default=10.0)
  parser.add_argument('--warmup_batches', type=int, default=20)
  parser.add_argument('--workers_for', type=float, default=None,
                      help='source + target tokens/s a chip consumes: report the workers it needs')
  parser.add_argument('--against_training', action='store_true')
  parser.add_argument('--rounds', type=int, default=3)
  args = parser.parse_args()
  flags.FLAGS.mark_as_parsed()  # grain's worker processes read absl flags
  if args.against_training:
    results = default_config_training_ratio(args.seconds, args.rounds)
    columns = ('round', 'loader_source_target_tokens_per_s', 'train_step_source_target_tokens_per_s', 'ratio')
    print('\n' + common.markdown_table(list(columns), [[r[c] for c in columns] for r in results]))
    return

  with tempfile.TemporaryDirectory() as directory:
    start = time.perf_counter()
    pairs = load_corpus(args, directory)
    common.emit({'corpus': args.corpus, 'pairs': len(pairs),
                 'load_seconds': time.perf_counter() - start, **common.machine(),
                 'load_average_1min': os.getloadavg()[0]})
    tokenizer_config = tokenizer_section.default_config()
    tokenizer_config.vocab_size = args.vocab_size
    start = time.perf_counter()
    tokenizer = tk.load_or_train_tokenizer(tokenizer_config, os.path.join(directory, 'spm.model'), pairs)
    common.emit({'tokenizer_train_seconds': time.perf_counter() - start,
                 'sample_sentences': min(tokenizer_config.sample_size, 2 * len(pairs)),
                 'vocab_size': tokenizer.vocab_size})
    results = []
    for batching in (pipeline_section.BATCHINGS if args.batching == 'both' else (args.batching,)):
      config = pipeline_section.default_config()
      config.batching = batching
      config.read_threads = args.read_threads
      config.num_workers = args.num_workers
      result = {'corpus': args.corpus, 'pairs': len(pairs), 'read_threads': args.read_threads,
                'num_workers': args.num_workers,
                **measure(pairs, tokenizer, config, args.seconds, args.warmup_batches)}
      result['source_target_tokens_per_s_per_worker'] = result['source_target_tokens_per_s'] / max(args.num_workers, 1)
      if args.workers_for:
        result['workers_needed'] = math.ceil(args.workers_for / result['source_target_tokens_per_s_per_worker'])
      common.emit(result)
      results.append(result)

  columns = ('batching', 'num_workers', 'target_tokens_per_s', 'source_target_tokens_per_s',
             'source_target_tokens_per_s_per_worker', 'examples_per_s', 'batches_per_s', 'target_fill',
             'target_tokens_per_process_cpu_s') + (('workers_needed',) if args.workers_for else ())
  print('\n' + common.markdown_table(list(columns), [[r[c] for c in columns] for r in results]))

if __name__ == '__main__':
  main()
