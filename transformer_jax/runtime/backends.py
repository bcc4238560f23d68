"""Which of JAX's backends a tool starts: decided before any starts, from JAX_PLATFORMS or the machine's device
files, so that an installed accelerator plugin without its hardware stays quiet."""

import glob
import os

import jax

_ACCELERATOR_DEVICES = ('/dev/nvidia[0-9]*', '/dev/kfd', '/dev/accel[0-9]*', '/dev/vfio/[0-9]*')  # GPUs, TPUs


def will_run_on_cpu(platforms: str | None = None) -> bool:
  """Whether JAX will compute on the CPU, decided before any backend starts (JAX_PLATFORMS, else whether the
  machine has GPU or TPU device files; an installed plugin without its hardware falls back to the CPU):
  `train.py --host_memory=auto` reuses host memory only then."""
  if platforms is None:
    platforms = os.environ.get('JAX_PLATFORMS') or jax.config.jax_platforms or ''
  if platforms:
    return platforms.split(',')[0].strip() == 'cpu'
  return not any(glob.glob(pattern) for pattern in _ACCELERATOR_DEVICES)


def skip_absent_accelerators() -> None:
  """Where JAX would fall back to the CPU anyway (no JAX_PLATFORMS, no GPU or TPU device files), starts only its
  CPU backend: an installed libtpu or CUDA plugin then does not log its failed start-up on every run."""
  if not os.environ.get('JAX_PLATFORMS') and not jax.config.jax_platforms and will_run_on_cpu():
    jax.config.update('jax_platforms', 'cpu')
