"""Where a long job may stop: `here()`, called between the batches of an evaluation and before its files are
written, raises what the stop in force raises (`jobs.preemption`: a signal during train.py's final evaluation) and
otherwise does nothing; so a stop never interrupts a library mid-call (a restore's threads, a compile, a device
computation in flight, half a results file), and the job ends where it has nothing running. Code that may block on
the outside world for good and leaves nothing running if an exception ends it (reading a user's file: a pipe with no
writer, a hung mount) is `interruptible()`: there a stop need not wait for the next safe point (`at_once`)."""

import contextlib
import threading
from typing import Callable

_CHECKS: list[Callable[[], None]] = []
_INTERRUPTIBLE = threading.local()  # per thread: a signal handler asks about the main thread, which it runs in


def here() -> None:
  """A point where the running job may stop: the checks in force run, and one may raise."""
  for check in tuple(_CHECKS):
    check()


@contextlib.contextmanager
def in_force(check: Callable[[], None]):
  """Inside, every `here()` calls `check` (which raises to stop the job)."""
  _CHECKS.append(check)
  try:
    yield
  finally:
    _CHECKS.remove(check)


@contextlib.contextmanager
def interruptible():
  """Inside, this thread runs code that an exception may end at any moment (see the module's docstring); its start
  is a safe point (`here`), so that a stop that came just before it does not wait there."""
  here()
  _INTERRUPTIBLE.depth = at_once() + 1
  try:
    yield
  finally:
    _INTERRUPTIBLE.depth -= 1


def at_once() -> int:
  """Whether this thread is `interruptible()` now (its depth of such regions)."""
  return getattr(_INTERRUPTIBLE, 'depth', 0)
