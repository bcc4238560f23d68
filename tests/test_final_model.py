"""One final model per run: train.py's final evaluation and every tool's default use the same params (the average of
the run's last eval.average_last periodic saves), a preemption save never changes them, and a rerun of a finished
run's command reports its results without training, compiling or evaluating again."""

import json
import os
import shutil
import signal

import jax
import numpy as np
import pytest

import helpers
from transformer_jax import config as config_lib
from transformer_jax.core.workdir import Workdir
from transformer_jax.inference import restoring
from transformer_jax.jobs import preemption
from transformer_jax.jobs import scoring
from transformer_jax.jobs import trainer

pytestmark = pytest.mark.slow  # every test runs the training loop or a tool on a trained run

# Saves at 2, 4 and 6, all kept; the final model averages the last two: steps 4 and 6.
RUN = dict(train__num_steps=6, train__checkpoint_every=2, train__keep_checkpoints=3, eval__average_last=2)
FINAL_STEPS = [4, 6]


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  """(workdir, results of its final evaluation as train.py runs it) of a run trained to the end in this process."""
  workdir = str(tmp_path_factory.mktemp('finished'))
  config = helpers.tiny_config(**RUN)
  trainer.train_and_evaluate(config, workdir)
  return workdir, scoring.final_report(config, workdir)


def _host(params):
  return jax.tree.map(np.asarray, jax.device_get(params))


class _SignalAt(preemption.StopRequest):
  """A scheduler's preemption notice: SIGTERM to this process as step `at` ends, caught by the request's handlers."""

  def __init__(self, at: int):
    super().__init__()
    self._at = at

  def requested(self, step: int) -> bool:
    if step == self._at:
      signal.raise_signal(signal.SIGTERM)
    return super().requested(step)


def test_a_preempted_and_resumed_run_has_the_final_model_and_test_loss_of_the_uninterrupted_one(finished, tmp_path):
  workdir = helpers.prepare_workdir(str(tmp_path / 'preempted'), finished[0])
  config = helpers.tiny_config(**RUN)
  with _SignalAt(5) as stop:
    assert trainer.train_and_evaluate(config, workdir, stop)['metrics']['step'] == 5
  assert helpers.checkpoint_steps(workdir) == [2, 4, 5]  # the preemption save, beside the periodic ones
  trainer.train_and_evaluate(config, workdir)
  assert helpers.checkpoint_steps(workdir) == helpers.checkpoint_steps(finished[0]) == [2, 4, 6]  # 5 is spent
  results = scoring.final_report(config, workdir)
  assert results['averaged_steps'] == finished[1]['averaged_steps'] == FINAL_STEPS
  assert results['test_loss'] == finished[1]['test_loss']
  assert results['bleu'] == finished[1]['bleu']
  jax.tree.map(np.testing.assert_array_equal, _host(restoring.restore(config, workdir).params),
               _host(restoring.restore(config, finished[0]).params))


def test_every_tools_default_params_are_the_final_evaluations(finished, entry_points, tmp_path):
  workdir, final = finished
  said = (f'the final model of {workdir} (its last eval.average_last=2 periodic saves): the average of steps '
          f'{FINAL_STEPS}')
  result = entry_points.run(['eval.py', f'--workdir={workdir}'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert said in result.stderr and f'params of step(s) {FINAL_STEPS}' in result.stdout
  with open(Workdir(workdir).final_results_file, encoding='utf-8') as f:
    evaluated = json.load(f)
  assert {key: evaluated[key] for key in ('averaged_steps', 'bleu', 'test_loss')} == {
      key: final[key] for key in ('averaged_steps', 'bleu', 'test_loss')}

  lines = 'The dog sees the cat.\nHe sleeps.\n'
  default = entry_points.run(['-m', 'transformer_jax.translate', f'--workdir={workdir}'], lines, text=True)
  assert default.returncode == 0, default.stderr[-2000:]
  assert said in default.stderr
  averaged = entry_points.run(['-m', 'transformer_jax.translate', f'--workdir={workdir}', '--average_last=2'], lines,
                              text=True)
  assert default.stdout == averaged.stdout and len(default.stdout.splitlines()) == 2

  result = entry_points.run(['-m', 'transformer_jax.export', f'--workdir={workdir}', f'--out={tmp_path / "ct2"}'],
                            text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == f'wrote the ctranslate2 model to {tmp_path / "ct2"}: {said}'

  result = entry_points.run(['-m', 'transformer_jax.attention_plots', f'--workdir={workdir}',
                             '--sentence=The dog sees the cat.', '--kind=cross', '--layer=0',
                             f'--out={tmp_path / "plots"}'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert said in result.stderr and result.stdout.split() == [str(tmp_path / 'plots' / 'cross_layer0.png')]


def _train_py(entry_points, workdir, **overrides):
  return entry_points.run(helpers.train_args(workdir, **{**RUN, **overrides}), text=True)


def test_rerunning_a_finished_runs_command_reports_its_results_and_changes_nothing(finished, entry_points):
  workdir, final = finished
  before = helpers.tree_digest(workdir)
  result = _train_py(entry_points, workdir)
  assert result.returncode == 0, result.stderr[-2000:]
  report = scoring.describe(final, helpers.TINY['eval.num_samples']).splitlines()
  assert result.stdout.splitlines()[1] == report[0]  # the BLEU line of the final evaluation, then its samples
  assert result.stdout.splitlines()[2:] == report[2:]  # (not the line where it was written: it is not written)
  assert f'{Workdir(workdir).final_results_file}' in result.stdout.splitlines()[0]
  assert 'compiled' not in result.stderr and 'restored' not in result.stderr  # nothing built, nothing evaluated
  assert helpers.tree_digest(workdir) == before

  changed = _train_py(entry_points, workdir, decode__beam_size=2)
  assert changed.returncode == 1
  assert changed.stderr.splitlines()[-1] == (
      f'error: {workdir} is trained to train.num_steps=6 and evaluated ({Workdir(workdir).final_results_file}), but '
      "this command changes decode.beam_size=2 (the run's: 1): evaluate other settings with python eval.py "
      f'--workdir={workdir} --config.KEY=VALUE, train on with a larger --config.train.num_steps, or pass another '
      '--workdir.')
  assert helpers.tree_digest(workdir) == before


def test_a_larger_num_steps_continues_a_finished_run(finished, entry_points, tmp_path):
  workdir = str(shutil.copytree(finished[0], tmp_path / 'run'))
  result = _train_py(entry_points, workdir, train__num_steps=8)
  assert result.returncode == 0, result.stderr[-2000:]
  assert [r['step'] for r in helpers.read_metrics(workdir)][-2:] == [7, 8]
  assert 'params of step(s) [6, 8]' in result.stdout
  assert config_lib.of_run(workdir).train.num_steps == 8
  with open(Workdir(workdir).final_results_file, encoding='utf-8') as f:
    assert json.load(f)['averaged_steps'] == [6, 8]
  assert os.path.isdir(os.path.join(Workdir(workdir).checkpoints, '8'))
