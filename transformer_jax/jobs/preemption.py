"""Stop requests: SIGTERM (a scheduler's preemption notice) or SIGINT (Ctrl-C) -> save and stop after a step.

One process: Python signal handlers set a flag that the loop reads after every step (and once before the first),
so a signal during start-up, during the save that a stop triggers, or a second signal, never kills the run
mid-write. train.py installs them before its heavy imports and keeps them until the process exits
(`for_this_process`): a scheduler reads the exit status, and a signal while Python imports JAX or after the last
save must not turn a clean stop into death by signal. During the final report (training is saved by then) a
signal stops the report at once (`StopRequested`).

Several processes: JAX's preemption service (started by `jax.distributed.initialize`) catches SIGTERM, and orbax's
`reached_preemption` makes every host agree on the same step to stop at, without a collective on every step;
Python must not take SIGTERM over from it there (SIGINT keeps its default: one host's Ctrl-C cannot be agreed on
without that collective).
"""

import contextlib
import signal

from absl import logging


def _die_by(signum, frame):  # pylint: disable=unused-argument
  """Ends the process as the signal's default action does (exit status 128 + signum), after a line saying so."""
  logging.warning('received signal %d: stopping', signum)
  signal.signal(signum, signal.SIG_DFL)
  signal.raise_signal(signum)


class StopRequested(BaseException):
  """A signal arrived where no step is running to finish first (the final report): stop now. A BaseException, as
  KeyboardInterrupt is, so that no `except Exception` it passes through (logging's own, while a line is written)
  swallows it."""


class StopRequest:
  """Whether the run should save and stop; a context manager that owns the signal handlers while it is open."""

  def __init__(self, multi_process: bool = False):
    self._multi_process = multi_process
    self._signalled = None
    self._raise = False
    self._manager = None
    self._previous = {}

  @classmethod
  def for_this_process(cls) -> 'StopRequest':
    """One process's request with its handlers installed now and never removed (see `hand_back`)."""
    return cls().install()

  def __enter__(self) -> 'StopRequest':
    return self.install()

  def __exit__(self, *exc):
    self.release()

  def install(self) -> 'StopRequest':
    if not self._multi_process:
      self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    return self

  def release(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}

  def hand_back(self) -> None:
    """Signals go back to their default handling, for a run that several processes stop together (JAX's service
    takes SIGTERM); a signal that came meanwhile is delivered again, as if the handlers had never been there."""
    self.release()
    self._multi_process = True
    if self._signalled is not None:
      signal.raise_signal(self._signalled)

  def end_at_once(self) -> None:
    """For work with no step to stop after (--compile_only): a signal, or one that came meanwhile, ends the process
    now, killed by it as by the default action. A handler of ours stays installed until then because libtpu puts
    its crash handler, which prints a stack trace for a SIGTERM, on a signal left at its default."""
    self.release()
    self._previous = {sig: signal.signal(sig, _die_by) for sig in (signal.SIGTERM, signal.SIGINT)}
    if self._signalled is not None:
      _die_by(self._signalled, None)

  def _handle(self, signum, frame):
    if self._raise:
      self._signalled = signum
      raise StopRequested(f'signal {signum}')
    if self._signalled is None:
      logging.warning('received signal %d: saving and stopping after this step', signum)
    self._signalled = signum

  def watch(self, manager) -> None:
    """The checkpoint manager whose `reached_preemption` decides for several processes."""
    self._manager = manager

  def requested(self, step: int) -> bool:
    if self._multi_process:
      return bool(self._manager is not None and self._manager.reached_preemption(step))
    return self._signalled is not None

  @contextlib.contextmanager
  def raising(self):
    """Inside, a signal (or one that came before) raises `StopRequested` instead of waiting for a step."""
    if self._signalled is not None:
      raise StopRequested(f'signal {self._signalled}')
    self._raise = True
    try:
      yield
    finally:
      self._raise = False
