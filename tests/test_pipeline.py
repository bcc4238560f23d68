"""Tests of the grain pipelines on a small corpus whose sentences name their pair ('x12' / 'y12'):
packing and token-budget layouts lose nothing, hosts get disjoint complete shards, iterators
resume exactly (also across epochs and through grain's orbax checkpoint handler), the length
filter is counted, and eval batches cover every example once, in order."""

import collections
import json
import logging

import grain
import numpy as np
import pytest
from etils import epath

import helpers
from transformer_jax.config import pipeline as pipeline_section
from transformer_jax.config import tokenizer as tokenizer_section
from transformer_jax.core.tokens import EOS_ID, PAD_ID
from transformer_jax.data import pipeline as pl
from transformer_jax.data import tokenizer as tk

WORDS = 'the a cat dog house tree red blue small big runs sees and of in on with green'.split()
NUM_PAIRS = 400
TOO_LONG = (7, 99)  # pairs longer than MAX_LENGTH tokens
EMPTY = (5, 250)  # pairs with a side that encodes to nothing
MAX_LENGTH = 24


def _make_pairs():
  rng = np.random.default_rng(0)
  def sentence(tag, i, max_words):
    return ' '.join([f'{tag}{i}', *rng.choice(WORDS, rng.integers(0, max_words))])
  pairs = [(sentence('x', i, 14), sentence('y', i, 14)) for i in range(NUM_PAIRS)]
  for i in TOO_LONG:
    pairs[i] = (sentence('x', i, 1), ' '.join([f'y{i}'] + ['house'] * 40))
  pairs[EMPTY[0]] = ('', pairs[EMPTY[0]][1])
  pairs[EMPTY[1]] = (pairs[EMPTY[1]][0], '   ')
  return pairs


PAIRS = _make_pairs()
KEPT = set(range(NUM_PAIRS)) - set(TOO_LONG) - set(EMPTY)


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
  config = tokenizer_section.default_config()
  config.vocab_size = 200
  return tk.load_or_train_tokenizer(config, str(tmp_path_factory.mktemp('run') / 'spm.model'), PAIRS)


def _config(batching, **fields):
  config = pipeline_section.default_config()
  config.update({'batching': batching, 'max_length': MAX_LENGTH, 'packed_length': 32,
                 'batch_size': 8, 'tokens_per_batch': 256, 'bucket_boundaries': (8, 16, 24),
                 'batch_multiple': 4, **fields})
  return config


def _examples(batch):
  """(inputs, targets) token tuples of every example in a batch, unpacked by segment id."""
  examples = []
  for row in range(len(batch['inputs'])):
    segments = {key: batch[f'{key}_segment_ids'][row] for key in ('inputs', 'targets')}
    segment_ids = set(segments['inputs']) - {0}
    assert segment_ids == set(segments['targets']) - {0}  # a source and its target share one id
    for segment in sorted(segment_ids):
      example = []
      for key in ('inputs', 'targets'):
        where = np.flatnonzero(segments[key] == segment)
        assert np.array_equal(where, np.arange(where[0], where[0] + len(where)))  # contiguous
        assert np.array_equal(batch[f'{key}_positions'][row, where], np.arange(len(where)))
        example.append(tuple(batch[key][row, where]))
      examples.append(tuple(example))
    for key in ('inputs', 'targets'):
      padding = segments[key] == 0
      assert np.all(batch[key][row, padding] == PAD_ID)
      assert np.all(batch[key][row, ~padding] != PAD_ID)
      assert np.all(batch[f'{key}_positions'][row, padding] == 0)
  return examples


def _identity(tokenizer, example):
  """The pair index an example was made from; its source and target must agree."""
  source, target = (tokenizer.decode(tokens) for tokens in example)
  assert source.split()[0][1:] == target.split()[0][1:], (source, target)
  return int(source.split()[0][1:])


def _epoch(tokenizer, config, **hosts):
  """All batches of one epoch; asserts the batch layout and one batch shape per bucket."""
  batches = list(pl.make_train_dataset(PAIRS, tokenizer, config, num_epochs=1, **hosts))
  process_count = hosts.get('process_count', 1)
  for batch in batches:
    assert set(batch) == set(pl.BATCH_KEYS)
    assert all(value.dtype == np.int32 and value.shape == batch['inputs'].shape
               for value in batch.values())
    rows, length = batch['inputs'].shape
    if config.batching == 'packed':
      assert (rows, length) == (config.batch_size // process_count, config.packed_length)
    else:
      assert length in config.bucket_boundaries
      assert rows * process_count == pipeline_section.bucket_batch_sizes(config, process_count)[
          config.bucket_boundaries.index(length)]
  return batches


def _expected_examples(tokenizer, indices):
  return collections.Counter(
      (tuple(e['inputs']), tuple(e['targets']))
      for e in (pl.encode_pair(tokenizer, PAIRS[i]) for i in indices))


@pytest.mark.parametrize('batching', pipeline_section.BATCHINGS)
def test_one_epoch_gives_back_exactly_the_encoded_examples(tokenizer, batching):
  batches = _epoch(tokenizer, _config(batching))
  examples = [example for batch in batches for example in _examples(batch)]
  assert collections.Counter(examples) == _expected_examples(tokenizer, KEPT)
  assert all(e[0][-1] == EOS_ID and e[1][-1] == EOS_ID for e in examples)
  if batching == 'packed':  # several examples per row, and rows well filled
    assert len(examples) > 2 * sum(len(batch['inputs']) for batch in batches)
    fill = np.mean([np.mean(batch['targets'] != PAD_ID) for batch in batches[:-1]])
    assert fill > 0.6


def test_token_budget_batches_are_bucketed_within_budget(tokenizer):
  config = _config('token_budget')
  assert pipeline_section.bucket_batch_sizes(config) == [32, 16, 8]  # 256 // length, multiple of 4
  for batch in _epoch(tokenizer, config):
    rows, length = batch['inputs'].shape
    assert rows * length <= config.tokens_per_batch and rows % config.batch_multiple == 0
    shorter = max([b for b in config.bucket_boundaries if b < length], default=0)
    for example in _examples(batch):
      assert shorter < max(map(len, example)) <= length


@pytest.mark.parametrize('batching', pipeline_section.BATCHINGS)
@pytest.mark.parametrize('process_count', [2, 4])
def test_hosts_get_disjoint_complete_shards_and_equal_shapes(tokenizer, batching, process_count):
  config = _config(batching)
  seen = []
  for process_index in range(process_count):
    hosts = {'process_index': process_index, 'process_count': process_count}
    for batch in _epoch(tokenizer, config, **hosts):
      seen += [_identity(tokenizer, example) for example in _examples(batch)]
  assert sorted(seen) == sorted(KEPT)
  # Infinite training streams: the i-th batches of all hosts have the same shapes.
  iterators = [iter(pl.make_train_dataset(PAIRS, tokenizer, config, process_index=i,
                                          process_count=process_count))
               for i in range(process_count)]
  for _ in range(12):
    shapes = {next(it)['inputs'].shape for it in iterators}
    assert len(shapes) == 1


def _assert_same_batches(expected, actual):
  assert len(expected) == len(actual)
  for a, b in zip(expected, actual):
    assert a.keys() == b.keys() and all(np.array_equal(a[key], b[key]) for key in a)


@pytest.mark.parametrize('batching', pipeline_section.BATCHINGS)
def test_encoding_threads_give_the_inline_batches(tokenizer, batching):
  _assert_same_batches(_epoch(tokenizer, _config(batching)), _epoch(tokenizer, _config(batching, read_threads=2)))


@pytest.mark.parametrize('read_threads', [0, 2])
@pytest.mark.parametrize('batching', pipeline_section.BATCHINGS)
def test_restored_iterator_continues_exactly_across_epochs(tokenizer, batching, read_threads):
  config = _config(batching, read_threads=read_threads)
  epoch_batches = len(_epoch(tokenizer, config))
  dataset = pl.make_train_dataset(PAIRS, tokenizer, config)
  iterator = iter(dataset)
  first_epoch = [next(iterator) for _ in range(epoch_batches - 3)]
  state = json.loads(json.dumps(iterator.get_state()))  # as grain's checkpoint handler stores it
  expected = [next(iterator) for _ in range(epoch_batches)]  # into the second epoch
  restored = iter(dataset)
  restored.set_state(state)
  _assert_same_batches(expected, [next(restored) for _ in range(epoch_batches)])
  # The same seed gives the same stream; the second epoch is shuffled differently.
  fresh = iter(dataset)
  _assert_same_batches(first_epoch[:5], [next(fresh) for _ in range(5)])
  identities = [[_identity(tokenizer, e) for b in batches for e in _examples(b)][:50]
                for batches in (first_epoch, expected[3:])]
  assert identities[0] != identities[1]


def test_other_shuffle_seed_gives_other_order(tokenizer):
  first = [next(iter(pl.make_train_dataset(PAIRS, tokenizer, _config('packed', shuffle_seed=s))))
           for s in (0, 1)]
  assert not np.array_equal(first[0]['inputs'], first[1]['inputs'])


def test_grain_checkpoint_handler_round_trip(tokenizer, tmp_path):
  dataset = pl.make_train_dataset(PAIRS, tokenizer, _config('token_budget'))
  iterator = iter(dataset)
  for _ in range(5):
    next(iterator)
  grain.checkpoint.CheckpointHandler().save(epath.Path(tmp_path), item=iterator)
  expected = [next(iterator) for _ in range(5)]
  restored = grain.checkpoint.CheckpointHandler().restore(epath.Path(tmp_path), item=iter(dataset))
  _assert_same_batches(expected, [next(restored) for _ in range(5)])


@pytest.mark.slow
def test_worker_processes_resume_exactly(tokenizer):
  with helpers.absl_flags_parsed(True):
    dataset = pl.make_train_dataset(PAIRS, tokenizer, _config('token_budget', num_workers=2))
    iterator = iter(dataset)
    for _ in range(20):
      next(iterator)
    state = json.loads(json.dumps(iterator.get_state()))
    assert all(any(worker['buffered']) for worker in state['iterators_in_use_states'])
    expected = [next(iterator) for _ in range(6)]
    iterator.close()
    restored = iter(dataset)
    restored.set_state(state)
    _assert_same_batches(expected, [next(restored) for _ in range(6)])
    restored.close()


def test_workers_need_parsed_flags(tokenizer):
  with helpers.absl_flags_parsed(False), pytest.raises(ValueError, match='mark_as_parsed'):
    pl.make_train_dataset(PAIRS, tokenizer, _config('packed', num_workers=2))


def test_filter_counts_dropped_examples_and_logs_them_once(tokenizer, caplog):
  """Every epoch filters the same examples: the line after the first says it all, and is not repeated."""
  stats = pl.FilterStats()
  with caplog.at_level(logging.INFO, logger='absl'):
    list(pl.make_train_dataset(PAIRS, tokenizer, _config('packed'), num_epochs=3,
                               filter_stats=stats))
  assert (stats.examined, stats.too_long, stats.empty) == (3 * NUM_PAIRS, 3 * len(TOO_LONG), 3 * len(EMPTY))
  assert stats.dropped == 3 * (len(TOO_LONG) + len(EMPTY))
  said = [message for message in caplog.messages if message.startswith('Training data filter: ')]
  assert said == [f'Training data filter: dropped 4 of {NUM_PAIRS} examples examined ({len(TOO_LONG)} longer than '
                  f'max_length, {len(EMPTY)} empty after encoding).']


def test_filter_that_drops_everything_is_an_error(tokenizer):
  dataset = pl.make_train_dataset(PAIRS[:20], tokenizer, _config('packed', max_length=2))
  with pytest.raises(ValueError, match=r'dropped 20 of 20 .*raise pipeline.max_length=2'):
    next(iter(dataset))


@pytest.mark.parametrize('process_count', [1, 2])
def test_eval_batches_cover_every_example_once_in_order(tokenizer, process_count):
  hosts = [list(pl.make_eval_batches(PAIRS, tokenizer, 16, process_index=i,
                                     process_count=process_count))
           for i in range(process_count)]
  assert len({len(batches) for batches in hosts}) == 1 and len(hosts[0]) == -(-NUM_PAIRS // 16)
  order = []
  for host_batches in zip(*hosts):
    assert len({batch['inputs'].shape for batch in host_batches}) == 1
    for batch in host_batches:
      assert batch['inputs'].shape[1] % 16 == 0
      for row, index in enumerate(batch['example_index']):
        order.append(int(index))
        if index < 0:
          assert not batch['inputs'][row].any() and not batch['targets_segment_ids'][row].any()
          continue
        expected = pl.encode_pair(tokenizer, PAIRS[index])
        for key in ('inputs', 'targets'):
          length = len(expected[key])
          assert np.array_equal(batch[key][row, :length], expected[key])
          assert not batch[key][row, length:].any()
  assert order == list(range(NUM_PAIRS)) + [-1] * (-NUM_PAIRS % 16)


@pytest.mark.parametrize('fields, hosts, message', [
    ({'batching': 'sorted'}, {}, 'pipeline.batching'),
    ({'batch_size': 6}, {}, 'pipeline.batch_size=6 must be a positive multiple of 4'),
    ({'batch_size': 8}, {'process_count': 3, 'process_index': 0}, 'multiple of 12'),
    ({'packed_length': 16}, {}, 'set packed_length >= max_length'),
    ({'batching': 'token_budget', 'bucket_boundaries': (8, 16)}, {}, 'add a bucket >= max_length'),
    ({'batching': 'token_budget', 'bucket_boundaries': (16, 8, 24)}, {}, 'increasing'),
    ({'batching': 'token_budget', 'tokens_per_batch': 50}, {}, 'set it to >= 96'),
    ({}, {'process_index': 2, 'process_count': 2}, 'process_index=2'),
])
def test_bad_configs_are_one_line_errors(tokenizer, fields, hosts, message):
  config = _config(fields.pop('batching', 'packed'), **fields)
  with pytest.raises(ValueError, match=message) as error:
    pl.make_train_dataset(PAIRS, tokenizer, config, **hosts)
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('setting,platform,cores,count', [
    (pipeline_section.AUTO_WORKERS, 'cpu', 64, 0),  # the training step needs the cores
    (pipeline_section.AUTO_WORKERS, 'gpu', 16, 14),  # every core but the training process and its dispatch
    (pipeline_section.AUTO_WORKERS, 'tpu', 2, 1),
    (0, 'gpu', 16, 0), (3, 'cpu', 2, 3),  # a number is taken as it is
])
def test_worker_count(setting, platform, cores, count):
  assert pipeline_section.worker_count(setting, platform, cores) == count


def test_a_negative_worker_count_other_than_auto_is_refused():
  config = _config('packed', num_workers=-2)
  with pytest.raises(ValueError, match=r'pipeline\.num_workers=-2; set it to a number of worker processes'):
    pipeline_section.validate(config)
