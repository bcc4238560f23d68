"""glibc's malloc tuned so that XLA:CPU's per-step temporary buffers reuse the heap (`train.py --host_memory`)."""

import ctypes

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def reuse_host_memory() -> bool:
  """Makes glibc keep freed memory for reuse instead of returning it to the kernel; True if it applied.

  With glibc's defaults a block over 32 MiB is mmap'ed on malloc and unmapped on free, so XLA:CPU's temp buffer
  of a whole jitted step is fresh memory every step: one page fault per 4 KiB page plus the kernel zeroing it
  (bench/RESULTS.md, "Training step on a CPU", has the cost). One arena, no mmap and
  no trimming make later steps reuse the heap; the process keeps its peak heap size. Call it before JAX starts
  its threads (so they share the main arena). False where the C library is not glibc.
  """
  try:
    mallopt = ctypes.CDLL('libc.so.6').mallopt
  except (OSError, AttributeError):
    return False
  never_trim = -1  # read by glibc as SIZE_MAX
  return bool(mallopt(_M_ARENA_MAX, 1) and mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, never_trim))

