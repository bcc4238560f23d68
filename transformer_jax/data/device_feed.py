"""Training batches put on the devices ahead of the step, so the chip does not wait for the host.

A thread takes this host's batches from the pipeline, places them on the mesh (`sharding.place_batch`) and keeps
`depth` of them queued, each with the pipeline's position after it. A checkpoint saves the position after the
last batch the loop took, not after the ones still queued, so a resumed run repeats the uninterrupted one. The
loop's wait for each batch is measured: the share of step time the chip spent waiting for input.
"""

import json
import queue
import threading
import time
from typing import Any, Iterator, NamedTuple

import jax

from transformer_jax.runtime import sharding


class Fed(NamedTuple):
  """One batch as the loop takes it."""

  host: dict  # this host's rows (numpy), for counting tokens
  device: dict  # the global arrays the step takes
  waited: float  # seconds the loop waited for it


class _Position:
  """A pipeline position as grain's checkpoint handler saves it (JSON bytes)."""

  def __init__(self, state: Any):
    self._state = json.dumps(state).encode()

  def get_state(self) -> bytes:
    return self._state


class _Failure(NamedTuple):
  error: BaseException


class DeviceFeed:
  """Batches of `iterator` (a grain iterator, already at its restored position) on `mesh`, `depth` ahead."""

  def __init__(self, iterator: Iterator[dict], mesh: jax.sharding.Mesh, depth: int = 2):
    self._iterator, self._mesh = iterator, mesh
    self._position = iterator.get_state()  # where a run stopped now would resume: before anything queued
    self._queue = queue.Queue(maxsize=depth)
    self._closed = threading.Event()
    self._thread = threading.Thread(target=self._fill, name='device_feed', daemon=True)
    self._thread.start()

  def _fill(self):
    try:
      while not self._closed.is_set():
        host = next(self._iterator)
        self._put((host, sharding.place_batch(host, self._mesh), self._iterator.get_state()))
    except BaseException as error:  # pylint: disable=broad-except  # re-raised in the loop by `next`
      self._put(_Failure(error))

  def _put(self, item):
    """Queues `item` once there is room, unless the feed is closed first."""
    while not self._closed.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return
      except queue.Full:
        continue

  def __next__(self) -> Fed:
    start = time.perf_counter()
    item = self._queue.get()
    waited = time.perf_counter() - start
    if isinstance(item, _Failure):
      raise item.error
    host, device, self._position = item
    return Fed(host, device, waited)

  def position(self) -> _Position:
    """The pipeline's position after the last batch taken, for `checkpoint.save`."""
    return _Position(self._position)

  def close(self):
    """Stops the thread; queued batches are dropped (the position stays that of the last batch taken)."""
    self._closed.set()
    self._thread.join()
