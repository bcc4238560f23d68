"""This host's memory and cores as concurrent work sees them: the memory it can still take (Linux's MemAvailable,
capped by a container's cgroup v2 memory limit), this process's resident set now and at its peak, and the cores it
may run on; and handing freed memory back to the OS. `concurrent_compiles` sizes the compiles it runs at once by
them."""

import ctypes
import functools
import os
import resource
import sys

_CGROUP = '/sys/fs/cgroup'  # cgroup v2's unified hierarchy


def _read(path: str) -> str | None:
  try:
    with open(path, encoding='ascii') as f:
      return f.read()
  except OSError:
    return None


def available_bytes() -> int | None:
  """Memory this process can still take without swapping; None where the OS does not say (not Linux)."""
  meminfo = _read('/proc/meminfo')
  if meminfo is None:
    return None
  fields = dict(line.split(':', 1) for line in meminfo.splitlines() if ':' in line)
  available = int(fields['MemAvailable'].split()[0]) * 1024
  limit, used = _read(f'{_CGROUP}/memory.max'), _read(f'{_CGROUP}/memory.current')
  if limit and used and limit.strip() != 'max':
    available = min(available, int(limit) - int(used))
  return max(available, 0)


def resident_bytes() -> int:
  """This process's resident set now."""
  statm = _read('/proc/self/statm')
  if statm is None:  # no procfs: the peak is what there is
    return peak_resident_bytes()
  return int(statm.split()[1]) * os.sysconf('SC_PAGE_SIZE')


def peak_resident_bytes() -> int:
  """The largest resident set this process has had since `reset_peak` (Linux's VmHWM, or the resident set of this
  moment where that is larger: the kernel updates the mark lazily; getrusage's figure, elsewhere, may lag it and is
  never reset)."""
  status = _read('/proc/self/status') or ''
  fields = {line.split(':')[0]: int(line.split()[1]) * 1024 for line in status.splitlines()
            if line.startswith(('VmHWM:', 'VmRSS:'))}
  if 'VmHWM' in fields:
    return max(fields.values())
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak if sys.platform == 'darwin' else peak * 1024  # macOS gives bytes, the others KiB


def reset_peak() -> None:
  """Starts the peak (`peak_resident_bytes`) again from this moment's resident set, where Linux lets a process do
  so (its clear_refs); elsewhere the peak stays the process's own, which only overstates a later task's."""
  try:
    with open('/proc/self/clear_refs', 'w', encoding='ascii') as f:
      f.write('5')
  except OSError:
    pass


@functools.cache
def _malloc_trim():
  try:
    return ctypes.CDLL('libc.so.6').malloc_trim
  except (OSError, AttributeError):  # not glibc
    return None


def release_freed_memory() -> None:
  """Hands the memory this process has freed back to the OS where the C library can (glibc's malloc_trim). A TPU
  compile frees gigabytes inside glibc's per-thread arenas, which keep it: without this, every compile of a run
  would raise the resident set for good."""
  trim = _malloc_trim()
  if trim is not None:
    trim(0)


def usable_cores() -> int:
  """The cores this process may run on (its affinity where the OS has one)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
