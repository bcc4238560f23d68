"""Stop requests: SIGTERM (a scheduler's preemption notice) or SIGINT (Ctrl-C) -> save and stop after a step.

One process: Python signal handlers set a flag. Several processes: JAX's preemption service (started by
`jax.distributed.initialize`) catches SIGTERM, and orbax's `reached_preemption` makes every host agree on the
same step to stop at, without a collective on every step; Python must not take SIGTERM over from it there
(and SIGINT keeps its default there: one host's Ctrl-C cannot be agreed on without that collective).
"""

import signal

import jax
from absl import logging


class StopRequest:
  """`requested(step)`: whether the run should save and stop after `step`. `close()` restores the handlers."""

  def __init__(self, manager):
    self._manager = manager
    self._signalled = False
    self._multi_process = jax.process_count() > 1
    signals = () if self._multi_process else (signal.SIGTERM, signal.SIGINT)
    self._previous = {sig: signal.signal(sig, self._handle) for sig in signals}

  def _handle(self, signum, frame):
    logging.warning('received signal %d: saving and stopping after this step', signum)
    self._signalled = True

  def requested(self, step: int) -> bool:
    if self._multi_process:
      return bool(self._manager.reached_preemption(step))
    return self._signalled

  def close(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
