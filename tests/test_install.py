"""The README's smoke test (configs/default.py:smoke, conftest's first seeded run) trains to a test BLEU far above
0; pip install . puts transformer_jax into a fresh environment, from which, in another directory, train.py continues
that run, the tools read its workdir, and rerunning the finished command only reports its results."""

import json
import os
import re
import shutil
import subprocess
import sysconfig
import venv

import pytest

import helpers
from transformer_jax.core.workdir import Workdir

pytestmark = pytest.mark.slow

# What `pip install .` reads: the package, its metadata and the requirements files it takes its dependencies from.
SOURCES = ('pyproject.toml', 'README.md', 'requirements.txt', 'requirements-gpu.txt', 'requirements-tpu.txt',
           'requirements-hf.txt', 'transformer_jax')


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
  """(python of a fresh virtual environment with the package installed, a user's directory holding copies of
  train.py and configs/, an empty directory to run from). The install is `pip install --no-deps
  --no-build-isolation` of a copy of the sources (pip builds beside them); the dependencies are this environment's
  packages, reached by a .pth file: nothing is downloaded."""
  tmp = tmp_path_factory.mktemp('install')
  source = tmp / 'source'
  for name in SOURCES:
    if os.path.isdir(os.path.join(helpers.REPO, name)):
      shutil.copytree(os.path.join(helpers.REPO, name), source / name, ignore=shutil.ignore_patterns('__pycache__'))
    else:
      os.makedirs(source, exist_ok=True)
      shutil.copy(os.path.join(helpers.REPO, name), source / name)
  venv.create(tmp / 'venv', with_pip=False)
  python = str(tmp / 'venv' / 'bin' / 'python')
  purelib = subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                           capture_output=True, text=True, check=True).stdout.strip()
  with open(os.path.join(purelib, 'dependencies.pth'), 'w', encoding='utf-8') as f:
    f.write(sysconfig.get_paths()['purelib'] + '\n')
  install = subprocess.run([python, '-m', 'pip', 'install', '-q', '--no-deps', '--no-build-isolation', str(source)],
                           cwd=tmp, capture_output=True, text=True, timeout=600)
  assert install.returncode == 0, install.stdout + install.stderr
  user = tmp / 'scripts'
  user.mkdir()
  shutil.copy(helpers.TRAIN_PY, user)
  shutil.copytree(os.path.join(helpers.REPO, 'configs'), user / 'configs', ignore=shutil.ignore_patterns('__pycache__'))
  elsewhere = tmp / 'elsewhere'
  elsewhere.mkdir()
  return python, user, elsewhere, purelib


def _run(installed, *args, stdin=None, fast_compile=False):
  """`python ARGS` of the fresh environment in the empty directory; XLA's optimisations kept unless
  `fast_compile` (for a run whose few steps do not repay them)."""
  python, _, elsewhere, _ = installed
  env = helpers.subprocess_env(device_count=1, fast_compile=fast_compile)
  del env['PYTHONPATH']  # the repository's package: not this environment's
  return subprocess.run([python, *args], input=stdin, cwd=elsewhere, env=env, capture_output=True, text=True,
                        timeout=900)


def test_the_smoke_config_trains_a_model_that_translates(seeded_runs):
  with open(Workdir(seeded_runs[0]).final_results_file, encoding='utf-8') as f:
    results = json.load(f)  # greedy (helpers.SEEDED_DECODE); the README's command searches with beam 4
  assert results['bleu'] > 20, results  # far above 0: a model that translates
  assert results['averaged_steps'] == [200, 300] and results['num_sentences'] == 200


def test_the_installed_package_continues_the_smoke_run_from_another_directory(installed, seeded_runs):
  _, user, elsewhere, purelib = installed
  where = _run(installed, '-c', 'import transformer_jax; print(transformer_jax.__file__)')
  assert where.stdout.strip() == os.path.join(purelib, 'transformer_jax', '__init__.py'), where.stderr

  shutil.copytree(seeded_runs[0], elsewhere / 'runs' / 'smoke')  # the README's smoke command's workdir
  command = [str(user / 'train.py'), f'--config={user / "configs" / "default.py"}:smoke', '--workdir=runs/smoke',
             '--config.train.num_steps=320']
  trained = _run(installed, *command)
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert 'resumed from step 300' in trained.stderr, trained.stderr[-3000:]
  headline = next(line for line in trained.stdout.splitlines() if line.startswith('test: BLEU'))
  assert float(re.match(r'test: BLEU (\d+\.\d+)', headline).group(1)) > 20, headline
  assert headline.endswith('on 200 sentences; params of step(s) [300, 320]')

  translated = _run(installed, '-m', 'transformer_jax.translate', '--workdir=runs/smoke',
                    stdin='The dog sees the cat.\n\nHe sleeps.\n', fast_compile=True)  # two sentences
  assert translated.returncode == 0, translated.stderr[-3000:]
  assert len(translated.stdout.splitlines()) == 3 and translated.stdout.splitlines()[1] == ''
  assert 'the final model of runs/smoke (its last eval.average_last=2 periodic saves): the average of steps ' \
         '[300, 320]' in translated.stderr

  rerun = _run(installed, *command)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert 'nothing was run again' in rerun.stdout.splitlines()[0] and rerun.stdout.splitlines()[1] == headline
  assert 'compiled' not in rerun.stderr
