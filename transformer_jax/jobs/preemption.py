"""Stop requests: SIGTERM (a scheduler's preemption notice) or SIGINT (Ctrl-C) -> save and stop after a step.

One process: Python signal handlers set a flag that the loop reads after every step (and once before the first),
so a signal during start-up, during the save that a stop triggers, or a second signal, never kills the run
mid-write. train.py installs them before its heavy imports and keeps them until the process exits
(`for_this_process`): a scheduler reads the exit status, and a signal while Python imports JAX or after the last
save must not turn a clean stop into death by signal. The interpreter's finalization runs no Python handler and
gives each signal that has one back its default action (death) before the process is gone; so from the last exit
hook on, the signals are ignored instead (`_ignore_from_exit`). During the final report (training is saved by
then) a signal stops the report at its next safe point (`StopRequest.at_safe_points`, `core.stops.here`).

Several processes: JAX's preemption service (started by `jax.distributed.initialize`) catches SIGTERM, and orbax's
`reached_preemption` makes every host agree on the same step to stop at, without a collective on every step;
Python must not take SIGTERM over from it there (SIGINT keeps its default: one host's Ctrl-C cannot be agreed on
without that collective).
"""

import atexit
import contextlib
import signal

from absl import logging

from transformer_jax.core import stops


_AT_SAFE_POINTS = 'stopping the final evaluation at its next safe point'  # what a signal does in the final report


def _die_by(signum, frame):  # pylint: disable=unused-argument
  """Ends the process as the signal's default action does (exit status 128 + signum), after a line saying so."""
  logging.warning('received signal %d: stopping', signum)
  signal.signal(signum, signal.SIG_DFL)
  signal.raise_signal(signum)


class StopRequested(BaseException):
  """A signal arrived where no step is running to finish first (the final report): the job stops at its next safe
  point (`core.stops.here`). A BaseException, as KeyboardInterrupt is, so that no `except Exception` it passes
  through swallows it."""


class StopRequest:
  """Whether the run should save and stop; a context manager that owns the signal handlers while it is open."""

  def __init__(self, multi_process: bool = False):
    self._multi_process = multi_process
    self._signalled = None
    self._stopping = 'saving and stopping after this step'  # what a first signal does, as the log says
    self._manager = None
    self._previous = {}

  @classmethod
  def for_this_process(cls) -> 'StopRequest':
    """One process's request with its handlers installed now and never removed (see `hand_back`): from the last
    exit hook on (this one is registered first, so it runs last), SIGTERM and SIGINT are ignored where they still
    have ours."""
    request = cls().install()
    atexit.register(request._ignore_from_exit)
    return request

  def _ignore_from_exit(self) -> None:
    """The run's work is over: a signal has nothing left to stop. Ignored, it cannot kill the process while the
    interpreter finalizes, which restores the default action of every signal a Python handler held."""
    for sig in (signal.SIGTERM, signal.SIGINT):
      if signal.getsignal(sig) == self._handle:  # not --compile_only's `_die_by`, nor JAX's after `hand_back`
        signal.signal(sig, signal.SIG_IGN)

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
    if self._signalled is None:
      logging.warning('received signal %d: %s', signum, self._stopping)
    self._signalled = signum
    if self._stopping == _AT_SAFE_POINTS and stops.at_once():  # e.g. blocked reading the test split from a pipe
      raise StopRequested(f'signal {signum}')

  def watch(self, manager) -> None:
    """The checkpoint manager whose `reached_preemption` decides for several processes."""
    self._manager = manager

  def requested(self, step: int) -> bool:
    if self._multi_process:
      return bool(self._manager is not None and self._manager.reached_preemption(step))
    return self._signalled is not None

  def check(self) -> None:
    """Raises `StopRequested` if a signal came."""
    if self._signalled is not None:
      raise StopRequested(f'signal {self._signalled}')

  @contextlib.contextmanager
  def at_safe_points(self):
    """Inside (the final report: training is saved), a signal, or one that came before, stops the job with
    `StopRequested` at its next safe point (`core.stops.here`: between batches, before files are written) rather
    than after a step, or at once where the job is `stops.interruptible` (blocked reading a file). Elsewhere the
    handler never raises: an exception thrown into whatever the main thread runs (an orbax restore waiting on its
    threads, a compile, a device computation in flight, a half-written file) would leave their work going as the
    process exits, or be swallowed by a library's `except BaseException`."""
    self.check()
    self._stopping = _AT_SAFE_POINTS
    with stops.in_force(self.check):
      yield
