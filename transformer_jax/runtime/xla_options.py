"""XLA options the training step is compiled with, chosen from the platform of the run's mesh (never the host's),
each measured on the platform it serves.

GPU: XLA's Triton GEMM fusions off, so every matrix product runs in cuBLAS (faster training steps at the paper's
batch: bench/RESULTS.md, "Training step on a GPU"). An option the user sets in XLA_FLAGS wins over the project's.
"""

import os
import re

import jax

from transformer_jax.runtime import sharding

_BY_PLATFORM = {
    'gpu': {'xla_gpu_enable_triton_gemm': False},
}


def options(platform: str, xla_flags: str) -> dict:
  """The options for steps compiled for `platform` ('cpu', 'gpu', 'tpu'), less any that `xla_flags` (the
  XLA_FLAGS variable's value) sets."""
  return {name: value for name, value in _BY_PLATFORM.get(platform, {}).items()
          if not re.search(rf'--{name}(=|\s|$)', xla_flags)}


def for_mesh(mesh: jax.sharding.Mesh) -> dict:
  """The options for a step compiled for `mesh`'s devices, with this process's XLA_FLAGS."""
  return options(sharding.mesh_platform(mesh), os.environ.get('XLA_FLAGS', ''))
