"""Test setup: 8 simulated CPU devices for mesh tests, fast compiles, a persistent compilation cache, and the one
trained language model that several test modules share.

XLA's backend optimisation level 0 compiles ~40% faster; the tests compare implementations and runs with each
other under the same setting, so it changes no assertion's meaning.
"""

import os
import tempfile

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(tempfile.gettempdir(), 'transformer_jax_jit_cache'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5')

import pytest  # noqa: E402  (after the environment above)


@pytest.fixture(scope='session')
def trained_lm(tmp_path_factory):
  """A tiny decoder-only model trained for 30 steps on an 8-device FSDP mesh, checkpoints every 10 steps (shared
  by the language model's evaluation, generation and layout tests)."""
  import helpers  # pylint: disable=import-outside-toplevel
  from transformer_jax import trainer  # pylint: disable=import-outside-toplevel
  config = helpers.tiny_config(**helpers.LM, train__num_steps=30, train__checkpoint_every=10,
                               train__keep_checkpoints=5, mesh__shape={'data': 1, 'fsdp': 8, 'tensor': 1})
  workdir = str(tmp_path_factory.mktemp('trained_lm'))
  trainer.train_and_evaluate(config, workdir)
  return config, workdir
