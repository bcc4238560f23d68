"""Host-memory reuse across training steps (glibc malloc settings), set once by the process that trains.

With glibc's defaults a block over 32 MiB is mmap'ed on malloc and unmapped on free (and a thread's non-main
arena maps any block too big for its heap), so a buffer allocated anew every step — XLA:CPU's temp buffer of
a whole jitted train step (2.3 GB for the base model at 32×64 tokens) — is fresh memory every step: one page
fault per 4 KiB page plus the kernel zeroing it, ~580k faults and 3.2 s of system time per base-model step on a
2-core CPU (a quarter of the step's CPU time). One arena, no mmap and no trimming make the second and later steps
reuse the heap; the process then keeps its peak heap size. See bench/RESULTS.md.
"""

import ctypes

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def reuse_freed_memory() -> bool:
  """Makes glibc keep freed memory for reuse instead of returning it to the kernel.

  Call early, before the JAX backend starts its threads (so they share the main arena). Returns whether the
  settings applied: False where the C library is not glibc (the defaults then stay).
  """
  try:
    mallopt = ctypes.CDLL('libc.so.6').mallopt
  except (OSError, AttributeError):
    return False
  never_trim = -1  # read by glibc as SIZE_MAX
  return bool(mallopt(_M_ARENA_MAX, 1) and mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, never_trim))
