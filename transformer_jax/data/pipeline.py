"""Grain input pipelines: sentence pairs or documents -> encoded, filtered, shuffled, batched numpy batches.

An example is a (source, target) pair of a translation, or a document (str) of a language model, which has
only the 'targets' side: its batches hold only the 'targets' keys (packed documents never see each other).

Training batches come in one of two layouts (`pipeline.batching`):
- 'packed': several examples per row of `packed_length` tokens (grain's first-fit packing); an
  example's source goes into 'inputs' and its target into 'targets' of the same row, both with
  the same segment id. Rows per batch are fixed, so every batch has the same shape.
- 'token_budget': examples bucketed by length as in the paper (§5.1): each batch holds examples
  of one length bucket, padded to the bucket length, with rows*length <= `tokens_per_batch`.

Every batch is a dict of int32 arrays with the keys `BATCH_KEYS` (of its sides): 'inputs', 'targets' [B, L]
(0 = padding), '*_segment_ids' (1, 2, ... per example in a row, 0 for padding) and
'*_positions' (0-based, restarting at each segment): grain's packing names, which are also the model's
argument names, so a batch goes to the model as it is and the model has one code path.

Host sharding (process_count > 1):
- packed: examples are sharded by index (`pairs[process_index::process_count]`) before the
  per-host shuffle; every host packs its own shard into batches of batch_size/process_count rows.
- token_budget: every host runs the same global pipeline (same shuffle, same buckets) and keeps
  its contiguous slice of the rows of each global batch, since batch shapes depend on the data.
Either way the hosts together see every example once per epoch and all hosts yield batches of
the same shapes in the same order, as `jax.make_array_from_process_local_data` requires.

Iterator state (`it.get_state()` / `it.set_state(...)`, JSON-serializable, saved in orbax with
`grain.checkpoint.CheckpointHandler`) restores the exact batch sequence.

Parallelism: `read_threads` threads encode examples; `num_workers` > 0 runs the whole pipeline
in that many grain worker processes (`mp_prefetch`), the way to scale on hosts with many cores
(the batch sequence then depends on num_workers: a run keeps the number it started with, see
`config/pipeline.py`'s `worker_count` for what -1, the default, chooses).
"""

import bisect
import functools
import itertools
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import grain
import jax
import ml_collections
import numpy as np
from absl import flags, logging

from transformer_jax.config import pipeline as pipeline_section
from transformer_jax.core.tokens import EOS_ID
from transformer_jax.data.tokenizer import Tokenizer

BATCH_KEYS = ('inputs', 'targets', 'inputs_segment_ids', 'targets_segment_ids',
              'inputs_positions', 'targets_positions')
SIDES = ('inputs', 'targets')
Example = dict[str, Any]  # 'inputs' (pairs only), 'targets': int32 token ids incl. EOS; 'index' (train only)


class FilterStats:
  """Counts the training examples examined and dropped (too long, or empty after encoding).

  Counted each time an example is encoded (thread-safe), by every iterator of the dataset,
  prefetched and restored examples included; not part of the iterator state. One absl log line
  once an epoch's worth of examples is examined (every epoch filters the same examples: later ones
  would repeat it). With pipeline.num_workers > 0 the counting happens in
  the worker processes, on their copies: only their log lines report it (the trainer then logs no
  `dropped_examples` metric rather than this object's 0).
  """

  def __init__(self):
    self.examined = 0
    self.too_long = 0
    self.empty = 0
    self._lock = threading.Lock()

  def __getstate__(self) -> dict[str, int]:  # picklable for grain's worker processes
    return {key: value for key, value in vars(self).items() if key != '_lock'}

  def __setstate__(self, state: dict[str, int]):
    vars(self).update(state, _lock=threading.Lock())

  @property
  def dropped(self) -> int:
    return self.too_long + self.empty

  def __str__(self) -> str:
    return (f'dropped {self.dropped} of {self.examined} examples examined'
            f' ({self.too_long} longer than max_length, {self.empty} empty after encoding)')

  def record(self, reason: str | None, epoch_size: int, max_length: int):
    """Counts one example (`reason` is None, 'too_long' or 'empty'); logs after the first epoch's worth."""
    with self._lock:
      self.examined += 1
      if reason is not None:
        setattr(self, reason, getattr(self, reason) + 1)
      if self.examined != epoch_size:
        return
      logging.info('Training data filter: %s.', str(self))  # its counts now, not when the line is read
      if self.dropped == self.examined:
        raise ValueError(f'The training filter {self}; raise pipeline.max_length={max_length} or'
                         ' check the data.')


def _item_sides(item: tuple[str, str] | str) -> tuple[str, ...]:
  """The sides an item fills: a pair both, a document (str) only 'targets'."""
  return ('targets',) if isinstance(item, str) else SIDES


def encode_pair(tokenizer: Tokenizer, pair: tuple[str, str] | str) -> Example:
  """Source and target token ids, each followed by EOS; a document (str) is a 'targets' side alone."""
  if isinstance(pair, str):
    return {'targets': np.array(tokenizer.encode(pair) + [EOS_ID], np.int32)}
  source, target = pair
  return {'inputs': np.array(tokenizer.encode(source) + [EOS_ID], np.int32),
          'targets': np.array(tokenizer.encode_target(target) + [EOS_ID], np.int32)}


def _sides(example: Example) -> list[str]:
  return [key for key in SIDES if key in example]


def _encode_and_filter(index: int, pair: tuple[str, str] | str, *, tokenizer: Tokenizer,
                       max_length: int, stats: FilterStats, epoch_size: int) -> Example | None:
  """The encoded example with its dataset index, or None if it is too long or empty."""
  example = encode_pair(tokenizer, pair)
  lengths = [len(example[key]) for key in _sides(example)]
  reason = 'empty' if min(lengths) == 1 else 'too_long' if max(lengths) > max_length else None
  stats.record(reason, epoch_size, max_length)
  if reason is not None:
    return None
  example['index'] = index
  return example


def pad_batch(examples: Sequence[Example], rows: int, length: int) -> dict[str, np.ndarray]:
  """One example per row, padded to [rows, length]; rows past the examples are all padding."""
  sides = _sides(examples[0])
  batch = {key: np.zeros((rows, length), np.int32) for key in BATCH_KEYS if key.startswith(tuple(sides))}
  for row, example in enumerate(examples):
    for key in sides:
      tokens = example[key]
      batch[key][row, :len(tokens)] = tokens
      batch[f'{key}_segment_ids'][row, :len(tokens)] = 1
      batch[f'{key}_positions'][row, :len(tokens)] = np.arange(len(tokens))
  return batch


def _packed_batch(packed: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
  """grain's packed rows as int32 `BATCH_KEYS`; pads the last batch of a finite pipeline."""
  missing = rows - len(packed['targets'])
  return {key: np.pad(packed[key], ((0, missing), (0, 0))).astype(np.int32) for key in BATCH_KEYS if key in packed}


def _host_rows(batch: dict[str, np.ndarray], *, process_index: int,
               process_count: int) -> dict[str, np.ndarray]:
  """This host's contiguous slice of the rows of a global batch."""
  rows = len(next(iter(batch.values()))) // process_count
  return {key: value[process_index * rows:(process_index + 1) * rows]
          for key, value in batch.items()}


class _BucketBatchIterator(grain.DatasetIterator):
  """Buffers examples per length bucket and emits a bucket's batch once it is full.

  The state is the parent's position plus the dataset indices of the buffered examples, which
  are re-read by index on restore, so a restored iterator continues exactly.
  """

  def __init__(self, parent: grain.DatasetIterator, examples: grain.MapDataset,
               boundaries: Sequence[int], batch_sizes: Sequence[int]):
    super().__init__(parent)
    self._examples = examples
    self._boundaries = boundaries
    self._batch_sizes = batch_sizes
    self._buffers = [[] for _ in boundaries]

  def __next__(self) -> dict[str, np.ndarray]:
    for example in self._parent:
      length = max(len(example[key]) for key in _sides(example))
      bucket = bisect.bisect_left(self._boundaries, length)
      self._buffers[bucket].append(example)
      if len(self._buffers[bucket]) == self._batch_sizes[bucket]:
        return self._emit(bucket)
    for bucket, buffer in enumerate(self._buffers):  # a finite parent ended: flush, padded
      if buffer:
        return self._emit(bucket)
    raise StopIteration

  def _emit(self, bucket: int) -> dict[str, np.ndarray]:
    examples, self._buffers[bucket] = self._buffers[bucket], []
    return pad_batch(examples, self._batch_sizes[bucket], self._boundaries[bucket])

  def get_state(self) -> dict[str, Any]:
    return {'parent': self._parent.get_state(),
            'buffered': [[int(example['index']) for example in buffer]
                         for buffer in self._buffers]}

  def set_state(self, state: dict[str, Any]):
    self._parent.set_state(state['parent'])
    self._buffers = [[self._examples[index] for index in indices]
                     for indices in state['buffered']]


class _BucketBatchIterDataset(grain.IterDataset):
  """Token-budget batches from a MapDataset of encoded examples (None = filtered out)."""

  def __init__(self, examples: grain.MapDataset, read_options: grain.ReadOptions,
               boundaries: Sequence[int], batch_sizes: Sequence[int]):
    super().__init__(examples.to_iter_dataset(read_options))
    self._examples = examples
    self._boundaries = boundaries
    self._batch_sizes = batch_sizes

  def __iter__(self) -> _BucketBatchIterator:
    return _BucketBatchIterator(self._parent.__iter__(), self._examples, self._boundaries,
                                self._batch_sizes)


def batch_shapes(config: ml_collections.ConfigDict, sides=SIDES,
                 process_count: int = 1) -> list[dict[str, tuple[int, int]]]:
  """The global shape of every field of every training batch the `pipeline` section yields on `process_count`
  hosts: one batch shape when packed, one per length bucket with token budgets. `sides`: ('targets',) for a
  language model."""
  if config.batching == 'packed':
    row_lengths = [(config.batch_size, config.packed_length)]
  else:
    row_lengths = list(zip(pipeline_section.bucket_batch_sizes(config, process_count), config.bucket_boundaries))
  keys = [key for key in BATCH_KEYS if key.startswith(tuple(sides))]
  return [{key: shape for key in keys} for shape in row_lengths]


def _check_hosts(process_index: int, process_count: int):
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} is not in [0, process_count={process_count});'
                     ' pass jax.process_index() and jax.process_count().')


def _packed_batches(examples: grain.IterDataset, config: ml_collections.ConfigDict, process_count: int,
                    sides: Sequence[str]) -> grain.IterDataset:
  """First-fit packs examples (the sides in `sides`) into rows, one packing group of `rows` rows per host batch."""
  rows = pipeline_section.packed_rows(config, process_count)
  length = {key: config.packed_length for key in sides}
  packed = grain.experimental.FirstFitPackIterDataset(
      examples, length_struct=length, num_packing_bins=rows, shuffle_bins=False)
  return packed.batch(rows).map(functools.partial(_packed_batch, rows=rows))


def num_workers(config: ml_collections.ConfigDict) -> int:
  """The worker processes this host runs the `pipeline` section with (`config/pipeline.py`'s `worker_count` for this
  host's devices and cores)."""
  return pipeline_section.worker_count(config.num_workers, jax.local_devices()[0].platform, os.cpu_count() or 1)


def make_train_dataset(pairs: Sequence[tuple[str, str]] | Sequence[str], tokenizer: Tokenizer,
                       config: ml_collections.ConfigDict, *, process_index: int = 0,
                       process_count: int = 1, num_epochs: int | None = None,
                       filter_stats: FilterStats | None = None) -> grain.IterDataset:
  """This host's training batches of pairs or documents: shuffled each epoch (seeded), encoded with EOS, filtered.

  Repeats forever unless `num_epochs` is set (finite runs pad their last batches with padding
  rows). Drop counts go to `filter_stats` if given. See the module docstring for layouts.
  """
  _check_hosts(process_index, process_count)
  pipeline_section.validate(config, process_count)
  packed = config.batching == 'packed'
  source = grain.MapDataset.source(pairs)
  if packed:
    source = source[process_index::process_count]
  if len(source) == 0:
    raise ValueError(f'No training pairs for host {process_index} of {process_count}'
                     f' ({len(pairs)} pairs in all); check the data config.')
  encode = functools.partial(_encode_and_filter, tokenizer=tokenizer,
                             max_length=config.max_length, stats=filter_stats or FilterStats(),
                             epoch_size=len(source))
  examples = (source.shuffle(seed=config.shuffle_seed).repeat(num_epochs)
              .map_with_index(encode))
  read_options = grain.ReadOptions(num_threads=config.read_threads)
  if packed:
    batches = _packed_batches(examples.to_iter_dataset(read_options), config, process_count, _item_sides(pairs[0]))
  else:
    batches = _BucketBatchIterDataset(
        examples, read_options, tuple(config.bucket_boundaries),
        pipeline_section.bucket_batch_sizes(config, process_count)).map(
            functools.partial(_host_rows, process_index=process_index,
                              process_count=process_count))
  workers = num_workers(config)
  if workers:
    if not flags.FLAGS.is_parsed():
      raise ValueError(f'pipeline.num_workers={workers} needs parsed absl flags (grain'
                       ' reads them): run under absl.app.run or call flags.FLAGS.mark_as_parsed().')
    batches = batches.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
  return batches


def make_eval_batches(pairs: Sequence[tuple[str, str]] | Sequence[str], tokenizer: Tokenizer, batch_size: int, *,
                      process_index: int = 0, process_count: int = 1, length_multiple: int = 16,
                      max_length: int | None = None) -> Iterator[dict[str, np.ndarray]]:
  """This host's rows of one in-order pass over `pairs` (or documents): nothing dropped, nothing repeated.

  `batch_size` is global. Each batch is padded to its longest sentence rounded up to
  `length_multiple` (few distinct shapes to compile); the last one is filled with padding rows.
  'example_index' [B] is each row's index in `pairs`, -1 for padding rows. `max_length`: a side
  longer than this is cut to it, EOS kept (`ModelConfig.position_limit`; `count_over` counts them).
  """
  encoded = (_cut(encode_pair(tokenizer, pairs[i]), max_length) for i in range(len(pairs)))
  return batch_examples(encoded, batch_size, process_index=process_index, process_count=process_count,
                        length_multiple=length_multiple, max_length=max_length)


def _cut(example: Example, max_length: int | None) -> Example:
  if max_length is None:
    return example
  return {key: ids if len(ids) <= max_length else np.append(ids[:max_length - 1], np.int32(EOS_ID))
          for key, ids in example.items()}


def count_over(pairs: Sequence[tuple[str, str]] | Sequence[str], tokenizer: Tokenizer,
               max_length: int | None) -> int:
  """How many pairs (documents) have a side longer than `max_length` tokens with EOS (what `make_eval_batches`
  cuts)."""
  if max_length is None:
    return 0
  return sum(max(len(ids) for ids in encode_pair(tokenizer, pairs[i]).values()) > max_length
             for i in range(len(pairs)))


def padded_length(longest: int, length_multiple: int = 16) -> int:
  """The width `batch_examples` pads a batch to whose longest example has `longest` tokens."""
  return -(-longest // length_multiple) * length_multiple


def batch_examples(examples: Iterable[Example], batch_size: int, *, process_index: int = 0,
                   process_count: int = 1, length_multiple: int = 16,
                   max_length: int | None = None) -> Iterator[dict[str, np.ndarray]]:
  """In-order batches of already encoded examples, laid out as `make_eval_batches` describes; a batch is at most
  `max_length` wide when given (its examples must fit) and at least 1."""
  _check_hosts(process_index, process_count)
  if batch_size < 1 or batch_size % process_count:
    raise ValueError(f'Eval batch_size={batch_size} must be a positive multiple of the'
                     f' {process_count} hosts; change the eval batch size.')
  iterator, start = iter(examples), 0
  while chunk := list(itertools.islice(iterator, batch_size)):
    longest = max(len(e[key]) for e in chunk for key in _sides(e))
    width = padded_length(longest, length_multiple)
    batch = pad_batch(chunk, batch_size, max(1, min(width, max_length or width)))
    batch['example_index'] = np.full(batch_size, -1, np.int32)
    batch['example_index'][:len(chunk)] = np.arange(start, start + len(chunk))
    start += len(chunk)
    yield _host_rows(batch, process_index=process_index, process_count=process_count)
