"""The training step is compiled with the XLA options of its mesh's platform (`xla_options`), and an option the
user sets in XLA_FLAGS wins over the project's."""

import os

import helpers
from transformer_jax.runtime import sharding
from transformer_jax.runtime import xla_options
from transformer_jax.training import steps


def test_the_train_step_is_compiled_with_its_platforms_options(monkeypatch, tmp_path):
  monkeypatch.setitem(xla_options._BY_PLATFORM, 'cpu', {'xla_dump_to': str(tmp_path)})
  config = helpers.tiny_config()
  mesh, rules = helpers.one_device_mesh(config)
  model, tx, schedule = steps.training_objects(config, sharding.mesh_platform(mesh))
  state, shardings = steps.create_sharded_state(model, tx, 0, (1, 8), mesh, rules, shard_optimizer=False)
  step = helpers.jitted_train_step(config, model, tx, schedule, shardings, mesh)
  batch = sharding.place_batch(helpers.synthetic_batches(1, 8, 32)[0], mesh)
  with sharding.activate(mesh, rules):
    step.lower(state, batch).compile()
  assert any('train_step' in name for name in os.listdir(tmp_path))  # XLA dumped the step: the option reached it


def test_an_option_set_in_xla_flags_wins_over_the_projects():
  assert xla_options.options('gpu', '--xla_gpu_enable_triton_gemm=true') == {}
  assert xla_options.options('gpu', '--xla_gpu_enable_triton_gemm --xla_gpu_autotune_level=2') == {}
  assert xla_options.options('gpu', '--xla_gpu_autotune_level=2') == {'xla_gpu_enable_triton_gemm': False}
