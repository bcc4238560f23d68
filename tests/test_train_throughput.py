"""bench.train_throughput's timing: each step waited for on its own, or (`--pipelined`) a round's steps dispatched
back to back and waited for once, as the trainer keeps steps in flight; its model changes, `--config.model.KEY=VALUE`
as train.py takes them (and `--variant.model.KEY=VALUE` for `ours_variant`); XLA options' parsing; `ours_variant`."""

import json
import types

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


def test_xla_options_parse_numbers_and_booleans():
  assert train_throughput.parse_xla_options(
      'xla_gpu_dot_merger_threshold_mb=0, xla_llvm_disable_expensive_passes=True,xla_gpu_memory_limit_slop_factor=0.5,'
      'xla_dump_to=/tmp/x') == {'xla_gpu_dot_merger_threshold_mb': 0, 'xla_llvm_disable_expensive_passes': True,
                                'xla_gpu_memory_limit_slop_factor': 0.5, 'xla_dump_to': '/tmp/x'}
  assert train_throughput.parse_xla_options('') == {}


def _settings(**changes):
  """A run's settings as `main` makes them from its flags: a tiny model's changes on top of `base`."""
  settings = dict(
      models=['base'], impls=['ours'], rows=2, source_len=8, target_len=8, threads=1, variant_changes={},
      variant_xla_options={}, gpu_paper_batch=False,
      model_changes={'d_model': 32, 'd_ff': 64, 'num_heads': 2, 'num_encoder_layers': 1, 'num_decoder_layers': 1,
                     'vocab_size': 64})
  return types.SimpleNamespace(**{**settings, **changes})


@pytest.mark.slow
def test_the_variant_is_ours_with_its_model_changes_and_compiler_options():
  """`ours_variant`: an A/B timed in the same rounds as `ours` (e.g. with a logits bias, or an XLA option off)."""
  args = _settings(variant_changes={'logits_bias': True},
                   variant_xla_options={'xla_llvm_disable_expensive_passes': True})
  cfg, rows, source_len, target_len = train_throughput.model_dims('base', args)
  batch = train_throughput.random_batch(rows, source_len, target_len, cfg.vocab_size)
  ours, variant = train_throughput.make_runners(['ours', 'ours_variant'], cfg, batch, args, 'cpu')
  assert variant.name == 'ours_variant'
  assert variant.xla_options == {**ours.xla_options, 'xla_llvm_disable_expensive_passes': True}
  assert 'logits_bias' in variant.state.params['decoder'] and 'logits_bias' not in ours.state.params['decoder']
  assert float(variant.step()) == float(ours.step())  # the bias starts at zero
  with pytest.raises(Exception, match="No such compile option: 'xla_no_such_option'"):  # the options reach XLA
    train_throughput.Ours(cfg, batch, compiler_options={'xla_no_such_option': 1})


def test_variant_changes_without_the_variant_runner_are_refused():
  for changes in ({'variant_changes': {'logits_bias': True}},
                  {'variant_xla_options': {'xla_gpu_dot_merger_threshold_mb': 0}}):
    with pytest.raises(SystemExit, match='change ours_variant only: add it to --impls'):
      train_throughput.run(_settings(**changes))


@pytest.mark.slow
def test_the_command_takes_model_changes_as_train_py_does(entry_points):
  """--config.model.KEY=VALUE reaches every model of the run, --variant.model.KEY=VALUE ours_variant's on top; a key
  the model lacks is named in full in one line, and a value ModelConfig refuses is one line too."""
  tiny = ['--config.model.d_model=32', '--config.model.d_ff=64', '--config.model.num_heads=2',
          '--config.model.num_encoder_layers=1', '--config.model.num_decoder_layers=1', '--config.model.vocab_size=64']
  command = ['-m', 'bench.train_throughput', '--models=base', '--rows=2', '--source_len=8', '--target_len=8',
             '--rounds=1', '--steps=1', '--warmup=0', '--malloc=system', *tiny]
  result = entry_points.run([*command, '--impls=ours,ours_variant', '--config.model.attention=chunked',
                             '--variant.model.logits_bias=True'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{')]
  assert records[0]['model_changes'] == {'d_model': 32, 'd_ff': 64, 'num_heads': 2, 'num_encoder_layers': 1,
                                         'num_decoder_layers': 1, 'vocab_size': 64, 'attention': 'chunked'}
  steps = {r['impl']: r for r in records if 'impl' in r}
  assert steps['ours']['attention'] == steps['ours_variant']['attention'] == 'chunked'
  # the variant's logits bias: 64 floats more in the params and in each of Adam's two moments
  assert steps['ours_variant']['argument_bytes'] - steps['ours']['argument_bytes'] == 3 * 64 * 4
  assert records[-1]['variant_changes'] == {'logits_bias': True}
  assert 'ours_variant ' in result.stdout.splitlines()[-1] and 'logits_bias=True' in result.stdout.splitlines()[-1]

  unknown = entry_points.run([*command, '--variant.model.atention=chunked'], text=True)
  assert unknown.returncode == 1 and unknown.stderr.splitlines()[-1].startswith(
      'FATAL Flags parsing error: --variant.model.atention: the config has no key model.atention; did you mean '
      'model.attention')
  refused = entry_points.run([*command, '--impls=ours', '--config.model.dropout=1.5'], text=True)
  assert refused.returncode == 1
  assert refused.stderr.splitlines()[-1] == 'error: model.dropout must be in [0, 1), got 1.5.'
