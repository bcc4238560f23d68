"""The targets a run compiles for without their chips (`topologies`): their names, the GPU target config, and a
missing or unstarted compiler's one-line error."""

import importlib.util

import jax
import pytest

from transformer_jax import cli
from transformer_jax.compile import topologies


def test_topology_names():
  names = ('v4-8', 'v4-32', 'v5e-8', 'v5p-8', 'v6e-8', 'tpu7x-8', 'h100-1', 'h200-8', 'a100-4')
  assert [topologies.get_topology(n).num_chips for n in names] == [4, 16, 8, 4, 8, 4, 1, 8, 4]
  # a TPU7x chip is two devices (TensorCores), each with half its HBM
  assert [topologies.get_topology(n).num_devices for n in names] == [4, 16, 8, 4, 8, 8, 1, 8, 4]
  assert [topologies.get_topology(n).chip.platform for n in names] == ['tpu'] * 6 + ['gpu'] * 3
  assert topologies.get_topology('v4-32').libtpu_name == 'v4:2x2x4'
  assert topologies.get_topology('tpu7x-16').libtpu_name == 'tpu7x:2x2x2'
  with pytest.raises(ValueError, match=r"unknown topology 'v4-7': use one of v4-8, .*, h100-8, "):
    topologies.get_topology('v4-7')


@pytest.mark.parametrize('name, packages, install', [
    ('v6e-4', ('libtpu',), rf'pip install "jax\[tpu\]=={jax.__version__}"'),
    ('h100-8', ('jax_cuda12_plugin', 'jax_cuda13_plugin'), rf'pip install "jax-cuda12-plugin=={jax.__version__}"')])
def test_a_missing_compiler_says_how_to_install_it_in_one_line(monkeypatch, name, packages, install):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec', lambda n, *a: None if n in packages else real(n, *a))
  with pytest.raises(cli.USER_ERRORS, match=install):
    topologies.topology_devices(name)


@pytest.mark.parametrize('installed, cuda', [
    (('jax_cuda12_plugin',), 'major: 12 minor: 9'), (('jax_cuda13_plugin',), 'major: 13 minor: 0'),
    (('jax_cuda12_plugin', 'jax_cuda13_plugin'), 'major: 12 minor: 9')])
def test_a_gpu_program_is_compiled_for_the_installed_plugins_cuda(monkeypatch, installed, cuda):
  """jax 0.11 (Python 3.12+) compiles for a GPU with its CUDA 13 plugin as well as the CUDA 12 one."""
  plugins = ('jax_cuda12_plugin', 'jax_cuda13_plugin')
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec',
                      lambda n, *a: (None if n not in installed else real('jax')) if n in plugins else real(n, *a))
  config = topologies.gpu_target_config(topologies.get_topology('h100-1').chip)
  assert f'runtime_version {{ {cuda} }}' in config


def test_a_cuda_plugin_that_did_not_start_says_what_to_do(monkeypatch):
  """The plugin registers no GPU topologies where it checked for a GPU's CUDA and found none (JAX_PLATFORMS
  naming cuda on a machine without one)."""
  from jax.experimental import topologies as jax_topologies  # pylint: disable=import-outside-toplevel

  def unregistered(*args, **kwargs):
    raise NotImplementedError('topology not implemented for cuda')

  monkeypatch.setattr(jax_topologies, 'get_topology_desc', unregistered)
  with pytest.raises(cli.USER_ERRORS, match='the CUDA plugin did not start, .* run with JAX_PLATFORMS=cpu'):
    topologies.topology_devices.__wrapped__('h200-2')  # not the cached devices of an earlier call
