"""Progress through a long wait, in the log: what is being waited for, how far it is (k of n, the rate, the time
left), how long it has taken and, for compiles, the host's peak memory. One helper for every wait (compiles,
restores and averaging, teacher-forced scoring, decoding; tfds' download retries say how long they go on in its
`duration`): a wait shorter than `AFTER` seconds says
nothing, a longer one a line every so often (`AFTER`, then twice as long each time up to `EVERY_AT_MOST`) from a
thread of its own, so that one long call (a compile) is reported too, and a last line when it ends. The lines go to
the log (stderr), terminal or not: a batch job's log shows where its time went."""

import threading
import time

from absl import logging

from transformer_jax.runtime import host_resources

AFTER = 10.0  # seconds before a wait's first line
EVERY_AT_MOST = 60.0  # seconds between its lines at the most


def duration(seconds: float) -> str:
  """'45s', '3m24s', '1h02m': a wait's length as a line reports it."""
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds}s'
  if seconds < 3600:
    return f'{seconds // 60}m{seconds % 60:02d}s'
  return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'


class Progress:
  """`with Progress('translating test', total=1000, unit='sentences') as progress: ... progress.advance(rows)`.

  total: how many units the wait has (None: an opaque wait, a compile); memory: report the process's peak resident
  memory (`host_resources.peak_resident_bytes`: compiles). `clock` and `log` are the thread's time and output.
  """

  def __init__(self, what: str, total: int | None = None, unit: str = '', *, memory: bool = False,
               clock=time.monotonic, log=logging.info):
    self.what, self.total, self.unit, self.done = what, total, unit, 0
    self._memory, self._clock, self._log = memory, clock, log
    self._start = self._next = self._interval = None
    self._reported = False
    self._stopped = threading.Event()
    self._thread = None

  def __enter__(self) -> 'Progress':
    self.start()
    self._thread = threading.Thread(target=self._watch, name=f'progress: {self.what}', daemon=True)
    self._thread.start()
    return self

  def __exit__(self, error_type, *unused):
    self._stopped.set()
    if self._thread is not None:
      self._thread.join()
    self.finish(failed=error_type is not None)

  def start(self) -> None:
    """The wait begins (`__enter__` calls it)."""
    self._start = self._clock()
    self._interval = AFTER
    self._next = self._start + AFTER

  def advance(self, count: int = 1) -> None:
    """`count` more units are done."""
    self.done += count

  def tick(self) -> None:
    """A line if one is due (the thread calls it as the wait begins, then every second)."""
    now = self._clock()
    if now < self._next:
      return
    self._log('%s', self.line(now))
    self._reported = True
    self._interval = min(self._interval * 2, EVERY_AT_MOST)
    self._next = now + self._interval

  def finish(self, failed: bool = False) -> None:
    """The wait's last line, if it said anything before: how long it took in all."""
    if self._reported and not failed:
      counted = f'{self.done} {self.unit} ' if self.total is not None else ''
      self._log('%s: %sdone in %s', self.what, counted, duration(self._clock() - self._start))

  def line(self, now: float) -> str:
    """'what: k of n unit, r unit/s, t left (elapsed so far)', or for an opaque wait 'what: elapsed so far'."""
    elapsed = now - self._start
    parts = []
    if self.total is not None:
      parts.append(f'{self.done} of {self.total} {self.unit}')
      if self.done:
        rate = self.done / max(elapsed, 1e-9)
        parts.append(f'{rate:.3g} {self.unit}/s, about {duration((self.total - self.done) / rate)} left')
    parts.append(f'{duration(elapsed)} so far')
    if self._memory:
      parts.append(f'peak host memory {host_resources.peak_resident_bytes() / 2**30:.1f} GiB')
    return f'{self.what}: {", ".join(parts)}'

  def _watch(self) -> None:
    while True:
      self.tick()
      if self._stopped.wait(1.0):
        return
