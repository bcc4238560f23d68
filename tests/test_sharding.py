"""Parallelism is a config change that does not change the math: on 8 simulated CPU devices, data parallel,
FSDP, data × tensor and FSDP × tensor parallel train step for step like one device (dropout on), for the
translator and for the language model (with its layers scanned: stacked parameters shard like the others);
FSDP stores 1/8 of the parameters per device, data parallel 1/8 of the optimizer state; meshes and batches that
do not fit are clear errors."""

import flax.linen as nn
import jax
import numpy as np
import pytest

import helpers
from transformer_jax import config as config_lib
from transformer_jax.runtime import sharding
from transformer_jax.training import steps

NUM_STEPS = 3
ROWS, LENGTH = helpers.STEP_ROWS, helpers.STEP_LENGTH

MESHES = {
    'dp': {'data': 8, 'fsdp': 1, 'tensor': 1},
    'fsdp': {'data': 1, 'fsdp': 8, 'tensor': 1},
    'dp_tp': {'data': 4, 'fsdp': 1, 'tensor': 2},
    'fsdp_tp': {'data': 1, 'fsdp': 4, 'tensor': 2},
}


MODELS = {'translator': ({}, ('inputs', 'targets')),
          'lm_scanned': ({**helpers.LM, 'model__scan_layers': True}, ('targets',))}


@pytest.fixture(scope='module')
def setup(request):
  """The model named by the test's `setup` parameter, its optimizer, schedule and batches."""
  # Dropout on (0.1): step s uses fold_in(rng, s) on the global arrays, so the masks do not depend on the
  # sharding either. The paper schedule with a short warmup makes the updates large enough to matter.
  overrides, sides = MODELS[request.param]
  config = helpers.tiny_config(**helpers.DROPOUT_STEP, **overrides)
  model, tx, schedule = helpers.train_objects(config)
  batches = helpers.synthetic_batches(NUM_STEPS, ROWS, LENGTH, seed=1, sides=sides)
  return config, model, tx, schedule, batches


def _mesh(config, shape, devices):
  config = config.copy_and_resolve_references()
  config.mesh.shape = shape
  return sharding.mesh_and_rules(config.mesh, devices)


def _train(setup, mesh, rules, state, shardings):
  config, model, tx, schedule, batches = setup
  step_fn = helpers.jitted_train_step(config, model, tx, schedule, shardings, mesh)
  losses, grad_norms = [], []
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for batch in batches:
      state, metrics = step_fn(state, sharding.place_batch(batch, mesh))
      losses.append(float(metrics['loss']) / float(metrics['tokens']))
      grad_norms.append(float(metrics['grad_norm']))
  return np.array(losses), np.array(grad_norms), jax.device_get(state.params)


@pytest.fixture(scope='module')
def one_device(setup):
  config, model, tx, _, _ = setup
  mesh, rules = helpers.one_device_mesh(config)
  state, shardings = steps.create_sharded_state(model, tx, config.train.seed, (ROWS, 8), mesh, rules,
                                                shard_optimizer=True)
  initial = jax.device_get(state.as_dict())
  return initial, _train(setup, mesh, rules, state, shardings)


@pytest.mark.parametrize('setup,donate_params', helpers.fast_tier(
    [(model, donate) for model in MODELS for donate in (True, False)], fast=[('lm_scanned', True)]), indirect=['setup'])
def test_the_train_step_donates_its_state_and_the_parameters_if_asked(setup, donate_params):
  """The rest of the state is always donated; the parameters unless `donate_params` is off (`steps.donates_params`:
  on a TPU with ZeRO-1). The step computes the same either way."""
  config, model, tx, schedule, batches = setup
  mesh, rules = _mesh(config, MESHES['dp'], jax.devices())

  def step(jitted):
    state, shardings = steps.create_sharded_state(model, tx, config.train.seed, (ROWS, 8), mesh, rules,
                                                  shard_optimizer=True)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return state, jitted(shardings)(state, sharding.place_batch(batches[0], mesh))

  state, (new, metrics) = step(lambda shardings: steps.jit_train_step(
      model, tx, schedule, config.train, shardings, mesh, donate_params=donate_params))
  assert all(x.is_deleted() for x in jax.tree.leaves((state.step, state.opt_state, state.rng)))
  assert [x.is_deleted() for x in jax.tree.leaves(state.params)] == [donate_params] * len(jax.tree.leaves(new.params))
  _, (expected, expected_metrics) = step(
      lambda shardings: helpers.jitted_train_step(config, model, tx, schedule, shardings, mesh))
  jax.tree.map(_equal_up_to_float32_sums, jax.device_get((new.as_dict(), metrics)),
               jax.device_get((expected.as_dict(), expected_metrics)))


def _equal_up_to_float32_sums(actual, expected):
  """Equal but for float32 rounding: aliased buffers may let XLA:CPU order a sum differently (its loop emitters do,
  in a few entries), so each array's error is taken against its largest entry."""
  np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())


@pytest.mark.parametrize('setup,name', helpers.fast_tier(
    [(model, mesh) for model in MODELS for mesh in MESHES],
    fast=[('translator', 'fsdp_tp')]), indirect=['setup'])
def test_meshes_train_like_one_device(setup, one_device, name):
  config, model, tx, _, _ = setup
  assert jax.device_count() == 8
  initial, (ref_losses, ref_norms, _) = one_device
  mesh, rules = _mesh(config, MESHES[name], jax.devices())
  if name == 'fsdp':  # created directly in its sharded layout
    state, shardings = steps.create_sharded_state(model, tx, config.train.seed, (ROWS, 8), mesh, rules,
                                                  shard_optimizer=True)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.as_dict()), initial)
  else:  # the same initial state, placed on this mesh (saves compiling the initialisation once more)
    _, shardings = steps.abstract_state_and_shardings(model, tx, config.train.seed, (ROWS, 8), mesh, rules,
                                                      shard_optimizer=True)
    state = steps.TrainState.from_dict(jax.device_put(initial, shardings.as_dict()))
  losses, norms, _ = _train(setup, mesh, rules, state, shardings)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
  np.testing.assert_allclose(norms, ref_norms, rtol=1e-4)
  assert len(set(np.round(losses, 4))) == NUM_STEPS  # the steps really trained (losses change)


def _bytes_per_device(tree) -> dict:
  """Bytes of a tree's arrays held by each device."""
  totals = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
  return totals


@pytest.mark.parametrize('setup', list(MODELS), indirect=True)
def test_fsdp_stores_an_eighth_of_the_params_per_device(setup):
  config, model, tx, _, _ = setup
  mesh, rules = _mesh(config, MESHES['fsdp'], jax.devices())
  state, _ = steps.create_sharded_state(model, tx, config.train.seed, (ROWS, 8), mesh, rules, shard_optimizer=True)
  total = sum(x.nbytes for x in jax.tree.leaves(state.params))
  per_device = _bytes_per_device(state.params)
  assert len(per_device) == 8
  # Everything with an embed (d_model) axis is split 8 ways; only small per-head biases stay replicated.
  assert max(per_device.values()) <= total / 8 * 1.1, (max(per_device.values()), total)
  assert sum(per_device.values()) <= total * 1.5
  # The optimizer state (Adam's moments) follows the params.
  opt_per_device = _bytes_per_device(state.opt_state)
  opt_total = sum(x.nbytes for x in jax.tree.leaves(state.opt_state))
  assert max(opt_per_device.values()) <= opt_total / 8 * 1.1
  # Data parallel, for contrast, keeps a full copy on every device.
  mesh, rules = _mesh(config, MESHES['dp'], jax.devices())
  abstract, shardings = steps.abstract_state_and_shardings(model, tx, config.train.seed, (ROWS, 8), mesh, rules,
                                                           shard_optimizer=True)
  replicated = _bytes_per_device(jax.device_put(jax.device_get(state.params), shardings.params))
  assert min(replicated.values()) == total


@pytest.mark.parametrize('setup', list(MODELS), indirect=True)
def test_data_parallel_splits_the_optimizer_state_and_keeps_whole_params(setup):
  """mesh.shard_optimizer (ZeRO-1): on the data mesh every device holds all params but 1/8 of Adam's moments
  (test_meshes_train_like_one_device trains with it); off, every device holds all of both."""
  config, model, tx, _, _ = setup
  mesh, rules = _mesh(config, MESHES['dp'], jax.devices())
  per_device = {}
  for shard_optimizer in (True, False):
    state, _ = steps.create_sharded_state(model, tx, config.train.seed, (ROWS, 8), mesh, rules,
                                          shard_optimizer=shard_optimizer)
    params, opt = _bytes_per_device(state.params), _bytes_per_device(state.opt_state)
    assert min(params.values()) == sum(x.nbytes for x in jax.tree.leaves(state.params))
    per_device[shard_optimizer] = max(opt.values())
  assert per_device[False] == sum(x.nbytes for x in jax.tree.leaves(state.opt_state))
  # Everything with an embed axis is split 8 ways; only small per-head biases stay whole.
  assert per_device[True] <= per_device[False] / 8 * 1.1


def test_the_optimizer_state_is_split_by_default_on_accelerators_only():
  config = helpers.tiny_config()
  mesh, _ = sharding.mesh_and_rules(config.mesh)  # this machine's CPU devices
  assert not sharding.shards_optimizer(config.mesh.shard_optimizer, mesh)  # 'auto' on CPUs
  assert sharding.shards_optimizer('on', mesh) and not sharding.shards_optimizer('off', mesh)
  # On a TPU slice 'auto' splits it: tests/test_aot.py compiles the data mesh's gathers. A bad value is refused.
  config.mesh.shard_optimizer = 'yes'
  with pytest.raises(ValueError, match=r"mesh.shard_optimizer='yes': use one of \('auto', 'on', 'off'\)"):
    config_lib.validate(config)


def test_an_optimizer_dimension_that_does_not_divide_keeps_the_params_sharding():
  mesh = jax.make_mesh((2, 4, 1), ('data', 'fsdp', 'tensor'), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  rules = (('embed', 'fsdp'), ('mlp', None))
  boxed = {'even': nn.LogicallyPartitioned(jax.ShapeDtypeStruct((16, 3), np.float32), ('embed', 'mlp')),
           'odd': nn.LogicallyPartitioned(jax.ShapeDtypeStruct((12, 3), np.float32), ('embed', 'mlp'))}
  shardings = sharding.optimizer_shardings(boxed, mesh, rules)
  assert shardings['even'].spec == jax.sharding.PartitionSpec(('fsdp', 'data'), None)  # 16 over 8 devices
  assert shardings['odd'].spec == jax.sharding.PartitionSpec('fsdp', None)  # 12 over 4, not over 8


def test_mesh_must_match_the_device_count():
  config = helpers.tiny_config()
  config.mesh.shape = {'data': 3, 'fsdp': 1, 'tensor': 1}
  with pytest.raises(ValueError, match=r'uses 3 devices but 8 are available'):
    sharding.make_mesh(config.mesh)
  config.mesh.shape = {'data': -1, 'fsdp': 3, 'tensor': 1}
  with pytest.raises(ValueError, match=r'cannot fill 8 devices'):
    sharding.make_mesh(config.mesh)
  config.mesh.shape = {'data': 8, 'model': 1}
  with pytest.raises(ValueError, match=r'unknown mesh axes'):
    sharding.make_mesh(config.mesh)


def test_batch_must_divide_over_the_data_axes():
  config = helpers.tiny_config()
  config.mesh.shape = {'data': 2, 'fsdp': 2, 'tensor': 2}
  mesh = sharding.make_mesh(config.mesh)
  sharding.check_batch_divisible(8, mesh, 'pipeline.batch_size')
  with pytest.raises(ValueError, match=r'pipeline.batch_size: a global batch of 6 rows .* 4 data-parallel'):
    sharding.check_batch_divisible(6, mesh, 'pipeline.batch_size')


def test_per_device_runs_a_function_on_each_devices_block_of_the_mesh():
  """Outside a mesh the function sees the whole arrays; under one, each device's block as the specs split them,
  with the logical rules deciding which mesh axes shard a logical axis (here 'batch' over data × fsdp)."""
  from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)

  def local(x, w):
    return x * w + x.shape[0]  # the rows this call sees, in every row of its block

  def specs(mesh):
    rows = sharding.mesh_axes(mesh, 'batch', x.shape[0])
    return (P(rows, None), P()), P(rows, None)

  w = np.float32(2.0)
  np.testing.assert_array_equal(sharding.per_device(local, x, w, specs=specs), x * 2 + 8)
  mesh_config = config_lib.load('configs/default.py').mesh
  mesh_config.shape = {'data': 2, 'fsdp': 2, 'tensor': 2}
  mesh, rules = sharding.mesh_and_rules(mesh_config, jax.devices()[:8])
  with sharding.activate(mesh, rules):
    assert sharding.mesh_axes(mesh, 'batch', 8) == ('data', 'fsdp')
    assert sharding.mesh_axes(mesh, 'batch', 6) is None  # 6 rows do not split over 4 devices: replicated
    out = jax.jit(lambda x: sharding.per_device(local, x, w, specs=specs))(x)
  np.testing.assert_array_equal(out, x * 2 + 2)  # 8 rows over data × fsdp: 2 a device
