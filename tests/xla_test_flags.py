"""The tests' XLA:CPU flags, in one place for the test process (conftest.py) and the train.py runs it starts.

Fast compiles: backend optimisation level 0, and, where XLA still has them (jaxlib before 0.11: the Python 3.11
line), XLA:CPU's older loop emitters in place of its fusion emitters; each compiles these tiny programs markedly
faster (bench/RESULTS.md, "CI time"). The newer line's XLA has only the fusion emitters, and stops at an unknown flag.
Tests compare implementations and runs with each other under the same setting, so neither changes an assertion's
meaning; where two programs may now round a sum differently, the test says so (test_sharding's donation test).
"""

import importlib.metadata

_JAXLIB = tuple(int(n) for n in importlib.metadata.version('jaxlib').split('.')[:2])
_LOOP_EMITTERS = ('--xla_cpu_use_fusion_emitters=false',) if _JAXLIB < (0, 11) else ()
FAST_COMPILE = ('--xla_backend_optimization_level=0', *_LOOP_EMITTERS)


def xla_flags(device_count: int, fast_compile: bool = True) -> str:
  """XLA_FLAGS for `device_count` simulated CPU devices; `fast_compile=False` keeps XLA's defaults otherwise."""
  return ' '.join((f'--xla_force_host_platform_device_count={device_count}',) + (FAST_COMPILE if fast_compile else ()))
