"""bench.train_throughput's timing: each step waited for on its own, or (`--pipelined`) a round's steps dispatched
back to back and waited for once, as the trainer keeps steps in flight."""

import pytest

from bench import train_throughput


class _Runner:
  """Records each step's dispatch and each wait for a step's result."""

  name = 'fake'

  def __init__(self):
    self.events = []

  def reset_peak(self):
    pass

  def memory(self) -> dict:
    return {}

  def step(self):
    self.events.append('dispatch')
    events = self.events

    class Result:
      def __float__(self):
        events.append('wait')
        return 0.0

    return Result()


@pytest.mark.parametrize('pipelined', [False, True])
def test_steps_are_waited_for_one_by_one_or_once_per_round(pipelined):
  runner = _Runner()
  times, cpu_times, _ = train_throughput.measure([runner], rounds=2, steps=3, warmup=1, pipelined=pipelined)
  timed = runner.events[2:]  # after the warm-up step's dispatch and wait
  if pipelined:
    assert timed == (['dispatch'] * 3 + ['wait']) * 2
    assert len(times['fake']) == len(cpu_times['fake']) == 2  # one sample per round: its mean step
  else:
    assert timed == ['dispatch', 'wait'] * 6
    assert len(times['fake']) == len(cpu_times['fake']) == 6


def test_overrides_parse_numbers_and_booleans():
  assert train_throughput.parse_overrides('attention=flash_gpu, d_model=256,relu_dropout=0.1,logits_bias=True') == {
      'attention': 'flash_gpu', 'd_model': 256, 'relu_dropout': 0.1, 'logits_bias': True}
  assert train_throughput.parse_overrides('logits_bias=False') == {'logits_bias': False}
