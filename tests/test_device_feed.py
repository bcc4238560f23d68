"""The device feed: batches placed on the mesh ahead of the step, in order, with the position a checkpoint saves
being that after the last batch the loop took (not after the queued ones)."""

import json

import grain
import jax
import numpy as np
import pytest

import helpers
from transformer_jax.data import device_feed
from transformer_jax.runtime import sharding

ROWS = 8  # one row per CPU device of the tests' mesh


def _batches():
  """A grain pipeline of numbered [ROWS, 4] batches: batch i holds i everywhere."""
  return grain.MapDataset.range(1000).map(lambda i: {'targets': np.full((ROWS, 4), i, np.int32)}).to_iter_dataset()


def _mesh():
  config = helpers.tiny_config()
  config.mesh.shape = {'data': -1, 'fsdp': 1, 'tensor': 1}
  return sharding.mesh_and_rules(config.mesh, jax.devices())[0]


def test_batches_come_in_order_on_the_mesh_and_the_position_is_the_last_taken():
  iterator = iter(_batches())
  feed = device_feed.DeviceFeed(iterator, _mesh(), depth=2)
  try:
    taken = [next(feed) for _ in range(3)]
    assert [int(batch.host['targets'][0, 0]) for batch in taken] == [0, 1, 2]
    for batch in taken:
      np.testing.assert_array_equal(np.asarray(batch.device['targets']), batch.host['targets'])
      assert len(batch.device['targets'].sharding.device_set) == len(jax.devices())
      assert batch.waited >= 0
    saved = json.loads(feed.position().get_state())
  finally:
    feed.close()
  resumed = iter(_batches())
  resumed.set_state(saved)
  assert int(next(resumed)['targets'][0, 0]) == 3  # the queued batches are not skipped on resume


def test_the_position_before_any_batch_is_the_iterators_own():
  iterator = iter(_batches())
  next(iterator)  # as a restored iterator: somewhere past the start
  start = iterator.get_state()
  feed = device_feed.DeviceFeed(iterator, _mesh(), depth=2)
  try:
    assert json.loads(feed.position().get_state()) == start
  finally:
    feed.close()


def test_a_pipeline_error_reaches_the_loop():
  def fail_at_two(i):
    if i == 2:
      raise ValueError('broken example 2')
    return {'targets': np.full((ROWS, 4), i, np.int32)}

  feed = device_feed.DeviceFeed(iter(grain.MapDataset.range(10).map(fail_at_two).to_iter_dataset()), _mesh())
  try:
    next(feed), next(feed)
    with pytest.raises(ValueError, match='broken example 2'):
      next(feed)
  finally:
    feed.close()
