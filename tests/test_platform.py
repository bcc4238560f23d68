"""The platform is chosen once: the run builder chooses the model's kernels from the devices it builds for
(`ModelConfig.platform`, `config/platform.py`), and a model traces to the same program inside the run's mesh as
outside any mesh: nothing below the builder asks the ambient mesh which platform it is on."""

import jax
import jax.numpy as jnp
import pytest

import helpers
from transformer_jax.compile import topologies
from transformer_jax.config import platform as platform_lib
from transformer_jax.config.model import ModelConfig
from transformer_jax.training import run_builder

_WRAPPERS = ('pjit', 'shard_map')  # a mesh runs the Pallas kernels in a shard_map; jit nests the same ops


def _program(jaxpr) -> list[tuple]:
  """Every equation's primitive and output types, inner jaxprs flattened into their wrappers' places; the sharding
  constraints, reshards and wrappers a mesh adds left out (on a one-device mesh they change no value)."""
  ops = []
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name in ('sharding_constraint', 'reshard'):
      continue
    if name not in _WRAPPERS:
      ops.append((name, tuple(str(v.aval) for v in eqn.outvars)))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      ops.extend(_program(sub))
  return ops


@pytest.mark.parametrize('topology, platform', [(None, 'cpu'), ('h100-1', 'gpu'), ('v4-8', 'tpu')])
def test_a_model_traces_the_same_program_inside_the_runs_mesh_as_outside_any(topology, platform):
  config = helpers.tiny_config(model__attention_dropout=0.1, model__relu_dropout=0.1, model__d_model=32,
                               model__num_heads=2)
  devices = jax.devices()[:1] if topology is None else topologies.topology_devices(topology)[:1]
  run = run_builder.build(config, devices)
  assert run.model.config.platform == platform  # chosen from the devices, not this CPU host
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), run.abstract_state.params)
  tokens = jax.ShapeDtypeStruct((2, 16), jnp.int32)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  train = lambda p, inputs, targets, key: run.model.apply({'params': p}, inputs, targets, deterministic=False,
                                                          rngs={'dropout': key})
  outside = jax.make_jaxpr(train)(params, tokens, tokens, key)
  with run.activate():
    inside = jax.make_jaxpr(train)(params, tokens, tokens, key)
  assert _program(inside.jaxpr) == _program(outside.jaxpr)
  kernels = [eqn.params['name'] for eqn in helpers.equations(outside.jaxpr) if eqn.primitive.name == 'pallas_call']
  expected = {'cpu': [], 'gpu': ['attention_gpu_fwd', 'residual_norm_fwd'], 'tpu': ['attention_dropout_fwd']}
  assert sorted(set(kernels)) == expected[platform]  # each platform's own kernels, traced on this CPU


def test_the_kernels_follow_the_platform_and_the_model_settings():
  cpu, gpu, tpu = (ModelConfig(platform=p).kernels for p in ('cpu', 'gpu', 'tpu'))
  assert (cpu.attention, gpu.attention, tpu.attention) == ('reference', 'flash_gpu', 'flash_tpu')
  assert (cpu.dropout_masks, gpu.dropout_masks, tpu.dropout_masks) == ('sixteen_bit', 'hashed', 'bernoulli')
  assert [k.fused_projections for k in (cpu, gpu, tpu)] == [False, True, False]
  assert [k.float32_products for k in (cpu, gpu, tpu)] == [True, False, False]
  assert gpu.cudnn_attention and not ModelConfig(platform='gpu', attention='flash_gpu').kernels.cudnn_attention
  assert not ModelConfig(platform='gpu', residual_norm_kernel=False).kernels.residual_norm_kernel
  without = ModelConfig(platform='gpu', loss_kernel=False).kernels  # XLA's passes over the logits, the GPU's loss
  assert (without.gpu_loss, without.loss_kernel, gpu.loss_kernel, cpu.loss_kernel) == (True, False, True, False)
  assert ModelConfig(platform='tpu', cpu_kernels='on').kernels.dropout_masks == 'sixteen_bit'
  # The settings the config holds are unchanged by the platform: it is not a config key.
  assert 'platform' not in ModelConfig(platform='gpu').section()
  with pytest.raises(ValueError, match=r"unknown model config keys \['platform'\]"):
    ModelConfig.from_dict({'platform': 'gpu'})
  with pytest.raises(ValueError, match=r"model.platform='ipu' is not one of \('cpu', 'gpu', 'tpu'\)"):
    ModelConfig(platform='ipu')
  assert platform_lib.choose('gpu', attention='auto', cpu_kernels='auto', residual_norm_kernel=True,
                             loss_kernel=True) == gpu


def test_the_kernels_line_names_what_runs():
  line = ModelConfig(platform='gpu').kernels.describe()
  assert line == ('GPU kernels: attention flash_gpu (cuDNN where it serves), hashed dropout masks, fused projections, '
                  'residual-block kernel, loss kernel')
