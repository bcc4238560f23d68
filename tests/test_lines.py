"""A workdir written on one of requirements.txt's two lines (jax 0.10 on Python 3.11, jax 0.12 on Python 3.12+) is
evaluated and resumed on the other: its orbax checkpoints, input pipeline state, config and tokenizer carry across.

The other line's Python is TRANSFORMER_JAX_OTHER_PYTHON, which `.ci/run` sets where it installs both lines (a
Python >= 3.12 beside the default 3.11). Without it, this machine has one line and nothing to compare with: the
test skips and says how to run it. Set, it must be the other line's Python. `.ci/run` starts this line's tests
while the other line still installs: TRANSFORMER_JAX_OTHER_PYTHON_INSTALLED names the file it writes when that
install ends ('ok' or 'failed'), which the test waits for.

Tolerances: the same float32 computation compiled by two XLA versions, which may fuse and order its reductions
differently: evaluation sums a few hundred per-token losses (a few ulps: rtol 1e-5), training adds two optimizer
steps on top (rtol 1e-4). A restore that lost anything (a fresh initialisation, Adam's moments, the pipeline's
position) moves these losses by more than 1e-2.
"""

import functools
import json
import os
import shutil
import subprocess
import sys
import time
import warnings

import jax
import numpy as np
import pytest

import helpers
from transformer_jax.core.workdir import Workdir

OTHER_PYTHON = os.environ.get('TRANSFORMER_JAX_OTHER_PYTHON')
OTHER_INSTALLED = os.environ.get('TRANSFORMER_JAX_OTHER_PYTHON_INSTALLED')
INSTALL_WAIT_SECONDS = 1800  # the longest install .ci/run has taken is a few minutes
EVAL_PY = os.path.join(helpers.REPO, 'eval.py')
RUN = {'train__num_steps': 6, 'train__checkpoint_every': 2}


def _other_line() -> str:
  if not OTHER_PYTHON:
    pytest.skip('no Python of the other line on this machine: set TRANSFORMER_JAX_OTHER_PYTHON to one with the other '
                'line of requirements.txt installed (.ci/run does where a Python >= 3.12 exists)')
  if OTHER_INSTALLED:
    _wait_for_install(OTHER_INSTALLED)
  other_jax = subprocess.run([OTHER_PYTHON, '-c', 'import jax; print(jax.__version__)'], capture_output=True,
                             text=True, check=True).stdout.strip()
  assert other_jax != jax.__version__, f'TRANSFORMER_JAX_OTHER_PYTHON runs this line\'s jax {other_jax}'
  return OTHER_PYTHON


def _wait_for_install(marker: str, seconds: float = INSTALL_WAIT_SECONDS) -> None:
  """Waits until the file `marker` says how the other line's install ended; fails unless it says 'ok'."""
  deadline = time.monotonic() + seconds
  while not os.path.exists(marker):
    if time.monotonic() > deadline:
      pytest.fail(f'the other line\'s install wrote nothing to {marker} in {seconds:.0f} s: see .ci/run\'s output')
    time.sleep(1)
  with open(marker, encoding='utf-8') as f:
    outcome = f.read().strip()
  if outcome != 'ok':
    pytest.fail(f'the other line\'s install ended "{outcome}" ({marker}): see .ci/run\'s output for pip\'s error')


@functools.cache
def _xla_flags(python: str) -> str:
  """The tests' fast-compile XLA flags for one device as the line of `python` takes them (`xla_test_flags`: one of
  them only the older line's XLA has, and the newer stops at an unknown flag)."""
  return subprocess.run([python, '-c', 'import xla_test_flags; print(xla_test_flags.xla_flags(1))'],
                        cwd=os.path.dirname(os.path.abspath(__file__)), capture_output=True, text=True,
                        check=True).stdout.strip()


def _run(python: str, args: list[str]) -> str:
  env = helpers.subprocess_env(1) | {'XLA_FLAGS': _xla_flags(python)}  # one device, each line's own flags
  result = subprocess.run([python, *args], cwd=helpers.REPO, env=env, capture_output=True, text=True, timeout=1200)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout + result.stderr


def _results(workdir: str) -> dict:
  split = Workdir(workdir).load_config().eval.test_split
  with open(Workdir(workdir).results_file(split, split)) as f:
    return json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize('writer', ['this', 'other'])
def test_a_workdir_written_on_one_line_evaluates_and_resumes_on_the_other(tmp_path, writer):
  pythons = {'this': sys.executable, 'other': _other_line()}
  write, read = pythons[writer], pythons['other' if writer == 'this' else 'this']
  written = str(tmp_path / 'written')
  _run(write, helpers.train_args(written, **RUN))
  logged, written_results = helpers.losses_by_step(written), _results(written)

  _run(read, [EVAL_PY, f'--workdir={written}'])  # the final model, step 6, restored by the other line
  np.testing.assert_allclose(_results(written)['test_loss'], written_results['test_loss'], rtol=1e-5)

  resumed = str(tmp_path / 'resumed')
  shutil.copytree(written, resumed)
  shutil.rmtree(os.path.join(Workdir(resumed).checkpoints, '6'))
  output = _run(read, helpers.train_args(resumed, **RUN))
  assert f'resumed from step 4 in {Workdir(resumed).checkpoints}' in output
  assert helpers.checkpoint_steps(resumed)[-1] == 6
  again = {r['step']: r['loss'] for r in helpers.read_metrics(resumed)[len(logged):]}
  assert sorted(again) == [5, 6]
  np.testing.assert_allclose([again[5], again[6]], [logged[5], logged[6]], rtol=1e-4)


@pytest.mark.parametrize('module, message, outcome', [
    ('jax._src.interpreters.mlir', 'jax.foo is deprecated', 'error'),  # jax on its own behalf
    ('transformer_jax.model.loss', 'jax.foo is deprecated', 'error'),  # a deprecated API our code calls
    ('test_lines', 'jax.foo is deprecated', 'error'),
    ('flax.linen.module', 'jax.foo is deprecated', 'shown'),  # another library's call: its own to fix
    ('jax._src.interpreters.mlir', 'The Pallas Triton backend is deprecated and will be removed', 'ignored')])
def test_deprecations_are_errors_as_pytest_ini_says(module, message, outcome):
  """pytest.ini's filters, as this test runs under them: a deprecation jax raises, or one our code triggers, fails
  the test; another library's is shown as a warning; the Triton backend's (our GPU kernels, bench/RESULTS.md) is
  ignored."""
  warn = lambda: warnings.warn_explicit(message, DeprecationWarning, 'f.py', 1, module=module)
  with warnings.catch_warnings(record=True) as shown:  # the filters stay pytest.ini's; what they show is kept here
    if outcome == 'error':
      with pytest.raises(DeprecationWarning, match=message):
        warn()
    else:
      warn()
  assert [str(w.message) for w in shown] == ([message] if outcome == 'shown' else [])


@pytest.mark.parametrize('outcome', ['ok', 'failed', None])
def test_the_cross_line_test_waits_for_the_other_lines_install_and_fails_on_a_failed_one(tmp_path, outcome):
  """`.ci/run` writes 'ok' or 'failed' when the newer line's install ends; until then (here: no time left to wait)
  nothing is written."""
  marker = tmp_path / 'installed'
  if outcome:
    marker.write_text(f'{outcome}\n')
  if outcome == 'ok':
    _wait_for_install(str(marker), seconds=0)
    return
  expected = 'ended "failed"' if outcome else 'wrote nothing'
  with pytest.raises(pytest.fail.Exception, match=expected):
    _wait_for_install(str(marker), seconds=0)
