"""Which of JAX's backends a tool starts: decided before any starts, from JAX_PLATFORMS or the machine's device
files, so that an installed accelerator plugin without its hardware stays quiet; and libtpu's start-up lines on a
machine without TPUs (it loads to compile for a slice), kept off the output."""

import contextlib
import glob
import os
import sys
import tempfile

import jax

_GPU_DEVICES = ('/dev/nvidia[0-9]*', '/dev/kfd')
_TPU_DEVICES = ('/dev/accel[0-9]*', '/dev/vfio/[0-9]*')
# What libtpu writes to stderr as it loads on a machine without TPUs (it looks for the host's own TPU type and
# workers): lines with these words. Any other line it writes stays.
_LIBTPU_WITHOUT_TPUS = ('could not determine TPU', 'Logging before InitGoogle()', '=== Source Location Trace: ===',
                        'libtpu_init_utils.cc')


def will_run_on_cpu(platforms: str | None = None) -> bool:
  """Whether JAX will compute on the CPU, decided before any backend starts (JAX_PLATFORMS, else whether the
  machine has GPU or TPU device files; an installed plugin without its hardware falls back to the CPU):
  `train.py --host_memory=auto` reuses host memory only then."""
  if platforms is None:
    platforms = os.environ.get('JAX_PLATFORMS') or jax.config.jax_platforms or ''
  if platforms:
    return platforms.split(',')[0].strip() == 'cpu'
  return not _has_devices(_GPU_DEVICES + _TPU_DEVICES)


def _has_devices(patterns) -> bool:
  return any(glob.glob(pattern) for pattern in patterns)


def skip_absent_accelerators() -> None:
  """Where JAX would fall back to the CPU anyway (no JAX_PLATFORMS, no GPU or TPU device files), starts only its
  CPU backend: an installed libtpu or CUDA plugin then does not log its failed start-up on every run. Every tool
  (`cli.run`), the bench scripts and `configs.table3` call it before JAX starts a backend."""
  if not os.environ.get('JAX_PLATFORMS') and not jax.config.jax_platforms and will_run_on_cpu():
    jax.config.update('jax_platforms', 'cpu')


@contextlib.contextmanager
def libtpu_loading():
  """Around the first use of libtpu on a machine without TPUs (compiling for a slice): what it writes to stderr
  meanwhile is held back, and written after it but for its start-up lines about the TPU it looks for
  (`_LIBTPU_WITHOUT_TPUS`). On a machine with TPUs (device files) nothing is held back."""
  if _has_devices(_TPU_DEVICES):
    yield
    return
  sys.stderr.flush()
  kept = os.dup(2)
  with tempfile.TemporaryFile() as held:
    os.dup2(held.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(kept, 2)
      os.close(kept)
      held.seek(0)
      lines = held.read().decode(errors='replace').splitlines(keepends=True)
      sys.stderr.write(''.join(line for line in lines if not any(words in line for words in _LIBTPU_WITHOUT_TPUS)))
      sys.stderr.flush()
