"""The one progress helper of long waits (`runtime.progress`): silent for a short wait; for a long one, lines
at growing intervals with how far it is, its rate and the time left, and a last line with the time it took."""

import re

import pytest

from transformer_jax.runtime import progress


class _Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def _progress(total=None, unit='', memory=False):
  clock, lines = _Clock(), []
  waiting = progress.Progress('translating test', total, unit, memory=memory, clock=clock,
                              log=lambda fmt, *args: lines.append(fmt % args))
  waiting.start()
  return waiting, clock, lines


def test_a_counted_wait_reports_after_ten_seconds_then_at_doubling_intervals_and_when_it_ends():
  waiting, clock, lines = _progress(total=100, unit='sentences')
  clock.now += 9.5
  waiting.advance(30)
  waiting.tick()
  assert not lines  # not 10 s yet
  clock.now += 0.5
  waiting.tick()
  assert lines == ['translating test: 30 of 100 sentences, 3 sentences/s, about 23s left, 10s so far']
  for seconds, expected_lines in ((19, 1), (1, 2), (39, 2), (1, 3), (59, 3), (1, 4), (60, 5)):  # 20 s, 40 s, 60 s
    clock.now += seconds
    waiting.tick()
    assert len(lines) == expected_lines, (seconds, lines)
  waiting.advance(70)
  waiting.finish()
  assert lines[-1] == 'translating test: 100 sentences done in 3m10s'


def test_a_short_wait_says_nothing_and_a_failed_one_no_last_line():
  waiting, clock, lines = _progress(total=5, unit='checkpoints')
  clock.now += 3
  waiting.tick()
  waiting.finish()
  assert not lines
  waiting, clock, lines = _progress(total=5, unit='checkpoints')
  clock.now += 12
  waiting.tick()
  waiting.finish(failed=True)
  assert lines == ['translating test: 0 of 5 checkpoints, 12s so far']


def test_an_opaque_wait_reports_its_time_and_the_peak_memory():
  waiting, clock, lines = _progress(memory=True)
  clock.now += 3725
  waiting.tick()
  assert re.fullmatch(r'translating test: 1h02m so far, peak host memory \d+\.\d GiB', lines[0]), lines
  waiting.finish()
  assert lines[-1] == 'translating test: done in 1h02m'


def test_the_thread_reports_a_wait_as_it_begins_when_told_to_at_once(monkeypatch):
  monkeypatch.setattr(progress, 'AFTER', 0.0)
  lines = []
  with progress.Progress('restoring', total=2, unit='checkpoints', log=lambda fmt, *a: lines.append(fmt % a)) as p:
    p.advance(2)
  assert lines[0].startswith('restoring: ') and lines[-1].startswith('restoring: 2 checkpoints done in ')
  lines.clear()
  with pytest.raises(KeyError):
    with progress.Progress('restoring', log=lambda fmt, *a: lines.append(fmt % a)):
      raise KeyError('a failed wait')
  assert lines and not any('done in' in line for line in lines)


@pytest.mark.parametrize('seconds, said', [(0.4, '0s'), (59.6, '1m00s'), (204.4, '3m24s'), (7322, '2h02m')])
def test_durations(seconds, said):
  assert progress.duration(seconds) == said
