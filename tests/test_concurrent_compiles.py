"""Several programs compiled at once (`concurrent_compiles`): the first alone with the others lowered beside it,
then as many at once as the memory it took allows; and the host's readings (`host_resources`) that size them."""

import collections
import threading

import numpy as np
import pytest

from transformer_jax.runtime import concurrent_compiles
from transformer_jax.runtime import host_resources

GiB = 1 << 30


def _host(monkeypatch, compile_gib: int, available_gib: int):
  """A host with `available_gib` free where each compile takes `compile_gib` and cores are plenty."""
  monkeypatch.setattr(host_resources, 'resident_bytes', lambda: 1 * GiB)
  monkeypatch.setattr(host_resources, 'peak_resident_bytes', lambda: (1 + compile_gib) * GiB)
  monkeypatch.setattr(host_resources, 'available_bytes', lambda: available_gib * GiB)
  monkeypatch.setattr(host_resources, 'usable_cores', lambda: 16)


def test_the_first_compiles_alone_while_the_others_are_lowered(monkeypatch):
  _host(monkeypatch, compile_gib=1, available_gib=100)
  events, second_lowered = [], threading.Event()

  def lower(item):
    events.append(('lowered', item))
    if item == 'b':
      second_lowered.set()
    return item * 2

  def compile_lowered(item, lowered):
    events.append(('started', item))
    if item == 'a':  # a first compile that held up the lowering of the others would wait here in vain
      assert second_lowered.wait(timeout=120)
    events.append(('finished', item))
    return lowered.upper()

  assert dict(concurrent_compiles.compile_all(['a', 'b', 'c'], lower, compile_lowered)) == {
      'a': 'AA', 'b': 'BB', 'c': 'CC'}
  assert events.index(('lowered', 'b')) < events.index(('finished', 'a'))
  assert events.index(('finished', 'a')) < min(events.index(('started', 'b')), events.index(('started', 'c')))


def test_the_others_compile_as_many_at_once_as_memory_allows(monkeypatch):
  """9 GiB free for 4 GiB compiles: the two programs after the first compile side by side (each waits for the
  other to start; one by one, the barrier breaks and the test fails)."""
  _host(monkeypatch, compile_gib=4, available_gib=9)
  side_by_side = threading.Barrier(2, timeout=120)
  threads = set()

  def compile_lowered(item, lowered):
    if item != 'first':
      threads.add(threading.current_thread().name)
      side_by_side.wait()
    return item

  given = [item for item, _ in concurrent_compiles.compile_all(['first', 'b', 'c'], str, compile_lowered)]
  assert given[0] == 'first' and sorted(given[1:]) == ['b', 'c'] and len(threads) == 2


def test_each_compile_hands_the_memory_it_freed_back(monkeypatch):
  """Every compile is followed, in its own thread, by the release (compiles in other threads may interleave)."""
  events = collections.defaultdict(list)  # compile thread -> what happened in it, in order
  record = lambda what: events[threading.current_thread().name].append(what)
  monkeypatch.setattr(host_resources, 'release_freed_memory', lambda: record('released'))
  list(concurrent_compiles.compile_all(['a', 'b', 'c'], str, lambda item, lowered: record(item)))
  in_threads = [what for thread in events.values() for what in thread]
  assert sorted(in_threads) == ['a', 'b', 'c', 'released', 'released', 'released']
  for thread in events.values():
    assert thread[1::2] == ['released'] * (len(thread) // 2) and 'released' not in thread[::2]


@pytest.mark.parametrize('failing', ['a', 'b'])
def test_a_failed_compile_is_raised(failing):
  """The first compile's error comes before any other compile starts; a later one's when it is given."""
  started = []

  def compile_lowered(item, lowered):
    started.append(item)
    if item == failing:
      raise ValueError(f'{item} does not compile')
    return item

  with pytest.raises(ValueError, match=f'{failing} does not compile'):
    list(concurrent_compiles.compile_all(['a', 'b', 'c'], str, compile_lowered))
  if failing == 'a':
    assert started == ['a']


@pytest.mark.parametrize('peak, available, cores, programs, expected', [
    (4, 9, 16, 10, 2),  # memory: two 4 GiB compiles fit in 9 GiB
    (4, 100, 2, 10, 2),  # cores
    (4, 100, 16, 3, 3),  # programs
    (4, 3, 16, 10, 1),  # less memory than one compile: one at a time
    (4, None, 16, 10, 1),  # the OS does not say
])
def test_how_many_is_bounded_by_memory_cores_and_programs(peak, available, cores, programs, expected):
  available = None if available is None else available * GiB
  assert concurrent_compiles.how_many(peak * GiB, available, cores, programs) == expected


def test_the_host_reports_its_memory_and_a_process_that_touches_memory_grows():
  before = host_resources.resident_bytes()
  touched = np.ones(64 << 20, np.uint8)  # 64 MiB, every page written
  assert host_resources.resident_bytes() - before >= 48 << 20
  now = host_resources.resident_bytes()
  assert host_resources.peak_resident_bytes() >= now
  assert 0 < host_resources.available_bytes() and 1 <= host_resources.usable_cores()
  del touched


def test_the_peak_starts_again_from_the_resident_set_once_reset():
  """What a compile took is its peak against the resident set before it, not an earlier, higher peak."""
  touched = np.ones(64 << 20, np.uint8)
  high = host_resources.peak_resident_bytes()
  del touched  # an allocation this large is handed back to the OS
  host_resources.reset_peak()
  assert host_resources.peak_resident_bytes() <= high - (48 << 20)


def test_memory_freed_inside_a_threads_arena_goes_back_to_the_os():
  """glibc keeps what a thread frees in that thread's arena (a compile's gigabytes); released, the resident set falls."""
  def allocate_and_free(kept):
    held = [bytes(1000) + bytes([i % 256]) for i in range(200_000)]  # ~200 MiB in malloc's arena, not Python's pool
    kept.append(bytes(1000) + b'top')  # allocated after them: the arena's top stays in use, so glibc cannot trim it
    del held

  kept = []
  worker = threading.Thread(target=allocate_and_free, args=(kept,))
  worker.start()
  worker.join()
  before = host_resources.resident_bytes()
  host_resources.release_freed_memory()
  assert before - host_resources.resident_bytes() >= 100 << 20
