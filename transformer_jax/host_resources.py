"""This host's memory and cores as concurrent work sees them: the memory it can still take (Linux's MemAvailable,
capped by a container's cgroup v2 memory limit), this process's resident set now and at its peak, and the cores it
may run on. `aot.compile_run` sizes its concurrent compiles by them."""

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
  """The largest resident set this process has had (Linux's VmHWM, which counts the resident set of this moment;
  getrusage's figure, elsewhere, may lag it)."""
  status = _read('/proc/self/status') or ''
  high_water = [int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith('VmHWM:')]
  if high_water:
    return high_water[0]
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak if sys.platform == 'darwin' else peak * 1024  # macOS gives bytes, the others KiB


def usable_cores() -> int:
  """The cores this process may run on (its affinity where the OS has one)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
