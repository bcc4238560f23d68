"""A run written by an earlier version of the code (tests/data/legacy_run: 1 device, checkpoints at steps 2 and 4,
its config.json, tokenizer and metrics.jsonl) still evaluates and resumes: today's code restores its params to
the same validation loss and continues its training to the same losses it logged (with `model.cpu_kernels='off'`,
nn.Dropout's masks, which the run drew: the CPU seam's masks draw other bits)."""

import json
import os
import shutil

import numpy as np
import pytest

import helpers
from transformer_jax import config as config_lib
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import sources
from transformer_jax.inference import restoring
from transformer_jax.jobs import scoring
from transformer_jax.jobs import trainer

LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'legacy_run')


def _logged(split: str) -> dict[int, dict]:
  with open(Workdir(LEGACY).metrics_file) as f:
    return {r['step']: r for r in map(json.loads, f) if r['split'] == split}


def test_its_config_loads_on_todays_defaults():
  with open(Workdir(LEGACY).config_file) as f:
    saved = json.load(f)
  assert 'reuse_host_memory' in saved['train']  # a key this version no longer has
  config = config_lib.of_run(LEGACY)
  assert 'reuse_host_memory' not in config.train
  assert config.model.cpu_kernels == 'auto'  # a key added since: its default
  assert (config.model.d_model, config.train.num_steps) == (saved['model']['d_model'], saved['train']['num_steps'])


def test_its_params_restore_to_the_logged_validation_loss():
  config = config_lib.of_run(LEGACY)
  restored = restoring.restore(config, LEGACY, step=4)
  pairs = sources.load_split(config.data, config.eval.split)
  values = scoring.teacher_forced_metrics(restored, pairs, config.eval.split)
  with open(Workdir(LEGACY).final_results_file) as f:
    logged = json.load(f)
  np.testing.assert_allclose(values['loss'], logged['validation_loss'], rtol=1e-5)
  np.testing.assert_allclose(values['nll'], logged['validation_nll'], rtol=1e-5)


@pytest.mark.slow
def test_its_training_resumes_to_the_losses_it_logged(tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(LEGACY, workdir)
  shutil.rmtree(os.path.join(Workdir(workdir).checkpoints, '4'))  # resume from step 2
  config = config_lib.of_run(workdir)
  config.model.cpu_kernels = 'off'
  result = trainer.train_and_evaluate(config, workdir)
  assert result['metrics']['step'] == 4
  resumed = {r['step']: r for r in helpers.read_metrics(workdir) if r['time'] > _logged('train')[4]['time']}
  for step in (3, 4):
    np.testing.assert_allclose(resumed[step]['loss'], _logged('train')[step]['loss'], rtol=1e-5)
