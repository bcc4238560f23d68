"""host_memory.reuse_freed_memory: a jitted step's large buffers stop costing fresh pages every call.

Each setting runs in its own process (malloc settings are process-wide): a jitted function whose 64 MiB output
is freed after every call is called 24 times; we count the minor page faults of each call. With reuse the heap
grows for the first few calls (until its free space fits the buffer: more calls when the machine is loaded and
frees land later), then calls stop faulting; so the claim is on the median of the last 8 calls.
"""

import json
import resource
import subprocess
import sys

import numpy as np

import helpers

_CALLS = 24
_LAST = 8
_BUFFER_BYTES = 1 << 26

_PROBE = f"""
import json, resource, sys
from transformer_jax import host_memory
applied = sys.argv[1] == 'reuse' and host_memory.reuse_freed_memory()
import jax, jax.numpy as jnp
step = jax.jit(lambda x: jnp.sin(x) * 2)
x = jnp.ones(({_BUFFER_BYTES} // 4,), jnp.float32)
faults = []
for _ in range({_CALLS}):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  step(x).block_until_ready().delete()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({{'applied': applied, 'faults': faults}}))
"""


def _last_calls_faults(setting: str) -> tuple[bool, float]:
  """(whether the settings applied, median page faults of the last calls)."""
  proc = subprocess.run([sys.executable, '-c', _PROBE, setting], env=helpers.subprocess_env(device_count=1),
                        capture_output=True, text=True, timeout=300, check=True)
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  return result['applied'], float(np.median(result['faults'][-_LAST:]))


def test_reused_memory_is_not_faulted_in_again():
  applied, reuse_faults = _last_calls_faults('reuse')
  _, system_faults = _last_calls_faults('system')
  assert applied  # this machine's C library is glibc
  pages = _BUFFER_BYTES // resource.getpagesize()
  assert reuse_faults < 0.05 * pages, (reuse_faults, pages)
  # glibc's defaults map and unmap the buffer on every call: fresh pages each time (fewer, larger ones where
  # transparent huge pages are always on).
  assert system_faults > 10 * reuse_faults + 3, (system_faults, reuse_faults)
