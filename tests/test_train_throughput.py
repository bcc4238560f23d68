"""bench.train_throughput's timing: each step waited for on its own, or (`--pipelined`) a round's steps dispatched
back to back and waited for once, as the trainer keeps steps in flight; the overrides' parsing; `ours_variant`."""

import argparse

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


@pytest.mark.slow
def test_the_variant_is_ours_with_its_model_changes_and_compiler_options():
  """`ours_variant`: an A/B timed in the same rounds as `ours` (e.g. with a logits bias, or an XLA option off)."""
  args = argparse.Namespace(
      rows=2, source_len=8, target_len=8, threads=1,
      override='d_model=32,d_ff=64,num_heads=2,num_encoder_layers=1,num_decoder_layers=1,vocab_size=64',
      variant_override='logits_bias=True', variant_xla_options='xla_llvm_disable_expensive_passes=True')
  cfg, rows, source_len, target_len = train_throughput.model_dims('base', args)
  batch = train_throughput.random_batch(rows, source_len, target_len, cfg.vocab_size)
  ours, variant = train_throughput.make_runners(['ours', 'ours_variant'], cfg, batch, args, 'cpu')
  assert variant.name == 'ours_variant'
  assert variant.xla_options == {**ours.xla_options, 'xla_llvm_disable_expensive_passes': True}
  assert 'logits_bias' in variant.state.params['decoder'] and 'logits_bias' not in ours.state.params['decoder']
  assert float(variant.step()) == float(ours.step())  # the bias starts at zero
  with pytest.raises(Exception, match="No such compile option: 'xla_no_such_option'"):  # the options reach XLA
    train_throughput.Ours(cfg, batch, compiler_options={'xla_no_such_option': 1})


def test_variant_options_without_the_variant_runner_are_refused():
  with pytest.raises(SystemExit, match='change ours_variant only: add it to --impls'):
    train_throughput.main(['--impls=ours', '--variant_xla_options=xla_gpu_dot_merger_threshold_mb=0',
                           '--malloc=system'])
