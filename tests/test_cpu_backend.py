"""The CPU seam: its backward passes give autodiff's values, its dropout masks keep at the rate from a quarter of
bernoulli's random words (and off the CPU are nn.Dropout's), it is switched by backend or config, and its
host-memory setting makes large blocks come from the reused heap."""

import functools
import json
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from transformer_jax.compile import topologies
from transformer_jax.config.model import ModelConfig
from transformer_jax.kernels.cpu import projections as cpu_projections
from transformer_jax.model import transformer as model_lib
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime import backends
from transformer_jax.runtime import sharding
from transformer_jax.training import checkpoint, metrics


def _grads(fn, *args):
  return jax.value_and_grad(fn, argnums=tuple(range(len(args))))(*args)


def _assert_close(ours, stock):
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(stock)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize('attention', ['reference', 'chunked'])
def test_a_bf16_train_step_runs_on_a_cpu_and_follows_float32(attention):
  """XLA:CPU cannot run a product of bf16 operands with a float32 result, which attention's scores and the loss's
  gradient products ask for: `ops.einsum_f32` casts the operands for a CPU step, so a bf16 step runs (it
  failed at run time) and its loss and gradient norm are float32's within five of bf16's roundings (2^-8 each)."""
  step_metrics = lambda dtype: helpers.small_step_loss_and_grad_norm(attention=attention, attention_chunk_size=8,
                                                                     attention_dropout=0.1, dtype=dtype)
  np.testing.assert_allclose(step_metrics('bfloat16'), step_metrics('float32'), rtol=5 * 2.0**-8)


@pytest.mark.parametrize('axis,kernel_shape', [(-1, (6, 4, 7)), ((-2, -1), (4, 6, 7))])
def test_dense_general_backward_equals_autodiff(axis, kernel_shape):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 5, 4, 6) if axis != -1 else (3, 5, 6)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=kernel_shape), jnp.float32)
  features = kernel_shape[1:] if axis == -1 else kernel_shape[-1]

  def objective(dot_general, a, w):
    layer = nn.DenseGeneral(features, axis=axis, use_bias=False, dot_general=dot_general)
    return jnp.sum(jnp.sin(layer.apply({'params': {'kernel': w}}, a)))

  ours = _grads(functools.partial(objective, cpu_projections.dot_general), x, kernel)
  stock = _grads(functools.partial(objective, None), x, kernel)
  _assert_close(ours, stock)
  assert float(jnp.max(jnp.abs(stock[1][1]))) > 0.1  # a real gradient, not zeros on both sides


@pytest.mark.parametrize('remat', helpers.fast_tier(['none', 'dots'], fast=['none']))
def test_model_loss_and_gradients_are_the_same_with_and_without_the_cpu_kernels(remat):
  cfg = ModelConfig(vocab_size=40, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                    dropout=0.0, max_len=16, remat=remat)
  tokens = jnp.asarray(np.random.default_rng(3).integers(4, 40, (2, 7)), jnp.int32)
  params = nn.unbox(Transformer(cfg).init(jax.random.key(0), tokens, tokens))['params']

  def loss(setting, p):
    model = Transformer(cfg.replace(cpu_kernels=setting))
    logits = model.apply({'params': p}, tokens, tokens)
    return metrics.token_metrics(logits, tokens, 0.1)['loss']

  ours = jax.jit(jax.value_and_grad(functools.partial(loss, 'on')))(params)
  stock = jax.jit(jax.value_and_grad(functools.partial(loss, 'off')))(params)
  _assert_close(ours, stock)


@pytest.mark.parametrize('setting', ['off', 'on'])
def test_the_model_dropout_is_nn_dropout_off_the_cpu_seam(setting):
  cfg = ModelConfig(vocab_size=40, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                    cpu_kernels=setting)

  class Dropped(nn.Module):  # the two dropouts under the same parent, so they take the same auto-name
    ours: bool

    @nn.compact
    def __call__(self, x):
      return model_lib.Dropout(cfg, 0.3)(x, False) if self.ours else nn.Dropout(0.3)(x, deterministic=False)

  x, rngs = jnp.ones((4, 8, 16)), {'dropout': jax.random.key(3)}
  ours, stock = Dropped(True).apply({}, x, rngs=rngs), Dropped(False).apply({}, x, rngs=rngs)
  np.testing.assert_allclose(np.unique(np.asarray(ours)), [0.0, 1 / 0.7], rtol=1e-6)
  assert np.array_equal(ours, stock) == (setting == 'off')


def test_auto_follows_the_devices_the_step_is_compiled_for_not_the_host():
  assert jax.default_backend() == 'cpu'  # the tests run on CPU devices
  kernels = lambda devices, setting: ModelConfig(cpu_kernels=setting,
                                                 platform=sharding.devices_platform(devices)).kernels
  cpu, tpu = jax.devices(), topologies.topology_devices('v4-8')  # compiling for a TPU on this CPU host
  assert kernels(cpu, 'auto').cpu_projections and kernels(cpu, 'on').cpu_projections
  assert not kernels(cpu, 'off').cpu_projections
  assert not kernels(tpu, 'auto').cpu_projections and kernels(tpu, 'on').cpu_projections
  assert [kernels(d, 'auto').dropout_masks for d in (cpu, tpu)] == ['sixteen_bit', 'bernoulli']
  with pytest.raises(ValueError, match=r"model.cpu_kernels='fast' is not one of \('auto', 'on', 'off'\)"):
    ModelConfig(cpu_kernels='fast')


_PROBE = """
import ctypes, json, sys
from transformer_jax.runtime import host_memory
applied = sys.argv[1] == 'reuse' and host_memory.reuse_host_memory()

class MallInfo2(ctypes.Structure):
  _fields_ = [(name, ctypes.c_size_t) for name in
              ('arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks', 'fordblks',
               'keepcost')]

libc = ctypes.CDLL('libc.so.6')
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
before = libc.mallinfo2()
block = libc.malloc(1 << 26)  # 64 MiB: above glibc's mmap threshold
during = libc.mallinfo2()
libc.free(ctypes.c_void_p(block))
after = libc.mallinfo2()
print(json.dumps({'applied': applied, 'mmapped_during': during.hblks - before.hblks, 'heap_during': during.arena,
                  'heap_after': after.arena}))
"""


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['reuse', 'system'])
def test_reused_host_memory_serves_large_blocks_from_the_heap_and_keeps_it(mode):
  """With reuse a 64 MiB block comes from the heap (no mmap) and stays there after free, ready for the next
  step; with glibc's defaults it is mmap'ed and the heap never holds it."""
  result = subprocess.run([sys.executable, '-c', _PROBE, mode], cwd=helpers.REPO, env=helpers.subprocess_env(),
                          capture_output=True, text=True, timeout=60, check=True)
  probe = json.loads(result.stdout.strip().splitlines()[-1])
  if mode == 'reuse':
    assert probe['applied'] and probe['mmapped_during'] == 0
    assert probe['heap_during'] >= 1 << 26 and probe['heap_after'] >= 1 << 26
  else:
    assert probe['mmapped_during'] == 1 and probe['heap_during'] < 1 << 26


def test_host_memory_auto_follows_jax_platforms_then_the_devices(monkeypatch):
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  assert backends.will_run_on_cpu()
  monkeypatch.setenv('JAX_PLATFORMS', 'cuda,cpu')
  assert not backends.will_run_on_cpu()
  monkeypatch.setattr(backends.glob, 'glob', lambda pattern: ['/dev/nvidia0'] if 'nvidia' in pattern else [])
  assert not backends.will_run_on_cpu(platforms='')  # JAX_PLATFORMS unset on a GPU machine
  monkeypatch.setattr(backends.glob, 'glob', lambda pattern: [])
  assert backends.will_run_on_cpu(platforms='')  # no accelerator, whatever plugins are installed


@pytest.mark.parametrize('replica_parallel', [True, False])
def test_saves_with_or_without_replica_parallel_writes_restore_the_same_values(tmp_path, replica_parallel):
  """orbax's array handler (a replicated array's save split over its replicas) and the CPU's (one copy per array,
  `checkpoint.replica_parallel_saves()`) both save params, replicated over 8 devices or sharded, that restore."""
  mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
  shardings = {'replicated': jax.NamedSharding(mesh, jax.P()), 'sharded': jax.NamedSharding(mesh, jax.P('data'))}
  values = {'replicated': np.arange(48, dtype=np.float32).reshape(8, 6) / 7,
            'sharded': np.linspace(-1, 1, 64, dtype=np.float32)}
  params = {name: jax.device_put(values[name], sharding) for name, sharding in shardings.items()}
  manager = checkpoint.make_manager(str(tmp_path), replica_parallel=replica_parallel)
  checkpoint.save(manager, 1, {'params': params}, force=True)
  manager.wait_until_finished()
  restored = checkpoint.restore_params(manager, 1, jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params))
  manager.close()
  for name, value in values.items():
    assert restored[name].sharding == shardings[name]
    np.testing.assert_array_equal(np.asarray(restored[name]), value)
