"""Dropout's keep masks: the CPU's 16-bit threefry draws, the GPU's hash, and which one a step compiled for each
platform draws."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from transformer_jax.compile import hlo_costs
from transformer_jax.compile import topologies
from transformer_jax.config.model import ModelConfig
from transformer_jax.kernels import dropout_masks
from transformer_jax.runtime import sharding

MASKS = {'cpu': dropout_masks.sixteen_bit_keep, 'gpu': dropout_masks.hashed_keep}


@pytest.mark.parametrize('platform', sorted(MASKS))
def test_keep_masks_keep_at_the_rate_independently_and_reproducibly(platform):
  keep_mask, keep, shape = MASKS[platform], 0.9, (1000, 1001)  # the CPU's: a row's last evaluation uses 1 of 4 draws
  mask = np.asarray(keep_mask(jax.random.key(5), keep, shape))
  assert mask.shape == shape and mask.dtype == bool
  n, flat = mask.size, mask.reshape(-1).astype(np.float64)
  assert abs(flat.mean() - keep) < 5 * np.sqrt(keep * (1 - keep) / n)  # five standard deviations
  for lag in (1, 2, shape[1]):  # neighbours on a row (one word's draws, adjacent words); the next row
    assert abs(np.corrcoef(flat[:-lag], flat[lag:])[0, 1]) < 5 / np.sqrt(n - lag)
  np.testing.assert_array_equal(mask, keep_mask(jax.random.key(5), keep, shape))
  assert (mask != np.asarray(keep_mask(jax.random.key(6), keep, shape))).mean() > 0.1
  assert keep_mask(jax.random.key(5), keep, (7, 3, 5)).shape == (7, 3, 5)


def test_cpu_keep_masks_take_one_threefry_evaluation_per_four_elements():
  def random_work(keep_mask):
    return _random_work(jax.make_jaxpr(lambda key: keep_mask(key, 0.9, (64, 100)))(jax.random.key(0)).jaxpr)

  assert random_work(jax.random.bernoulli) == (64 * 100, 0)  # a word per element
  # a threefry key, then an evaluation per four elements
  assert random_work(dropout_masks.sixteen_bit_keep) == (2, 64 * 100 // 4)
  assert random_work(dropout_masks.hashed_keep) == (2, 0)  # the hash's two words, then no random bits at all


@pytest.mark.parametrize('platform', sorted(MASKS))
def test_keep_masks_are_drawn_shard_by_shard(platform):
  mesh = helpers.data_mesh(jax.devices()[:4])
  x = jax.device_put(jnp.ones((8, 6, 10)), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data')))
  dropped = jax.jit(lambda key, x: jnp.where(MASKS[platform](key, 0.9, x.shape), x / 0.9, 0))
  hlo = dropped.lower(jax.random.key(1), x).compile().as_text()
  assert not [op for op in hlo_costs.COLLECTIVES if op in hlo]
  np.testing.assert_array_equal(dropped(jax.random.key(1), x), dropped(jax.random.key(1), np.ones((8, 6, 10))))
  with pytest.raises(ValueError, match='split the batch'):
    jax.eval_shape(lambda key: MASKS[platform](key, 0.9, (1 << 16, 1 << 16, 8)), jax.random.key(0))


def _random_work(jaxpr):
  """(32-bit words drawn from the key, one threefry2x32 evaluation each; threefry2x32 evaluations of its own)"""
  eqns = list(helpers.equations(jaxpr))
  return (sum(math.prod(eqn.params['shape']) for eqn in eqns if eqn.primitive.name == 'random_bits'),
          sum(eqn.invars[2].aval.size for eqn in eqns if eqn.primitive.name == 'threefry2x32'))


@pytest.mark.parametrize('topology, work', [('h100-1', (2, 0)), ('v4-8', (6 * 40, 0)), (None, (2, 6 * 40 // 4))])
def test_a_step_draws_the_masks_of_the_platform_it_is_compiled_for(topology, work):
  """The kernels of a GPU's, a TPU's or this CPU's devices (`model.cpu_kernels='auto'`) draw the hash,
  bernoulli's word per element, or the CPU's threefry evaluation per four elements."""
  devices = jax.devices()[:1] if topology is None else topologies.topology_devices(topology)[:1]
  kernels = ModelConfig(platform=sharding.devices_platform(devices)).kernels
  key = jax.random.key(2)
  traced = jax.jit(lambda key: dropout_masks.keep_mask(key, 0.8, (6, 40), kernels)).trace(key).jaxpr
  assert _random_work(traced.jaxpr) == work
  mask = {None: dropout_masks.sixteen_bit_keep, 'h100-1': dropout_masks.hashed_keep,
          'v4-8': lambda *a: jax.random.bernoulli(*a)}[topology](key, 0.8, (6, 40))
  np.testing.assert_array_equal(jax.core.eval_jaxpr(traced.jaxpr, traced.consts, key)[0], mask)


