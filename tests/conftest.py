"""Test setup: 8 simulated CPU devices for mesh tests, fast compiles, and a persistent compilation cache.

XLA's backend optimisation level 0 compiles ~40% faster; the tests compare implementations and runs with each
other under the same setting, so it changes no assertion's meaning.
"""

import os
import tempfile

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(tempfile.gettempdir(), 'transformer_jax_jit_cache'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5')
