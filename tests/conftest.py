"""Test setup: 8 simulated CPU devices for mesh tests, fast compiles, a persistent compilation cache, and the one
trained models that several test modules share.

The XLA flags that compile faster are `xla_test_flags`'s. The cache keeps every program, however quickly it
compiled: a re-run, and the train.py subprocesses of one run, reuse the thousands of small ones too.
"""

import fcntl
import os
import signal
import tempfile

import xla_test_flags

os.environ.setdefault('XLA_FLAGS', xla_test_flags.xla_flags(device_count=8))
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(tempfile.gettempdir(), 'transformer_jax_jit_cache'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')

import pytest  # noqa: E402  (after the environment above)

# A shell starts a background job (`.ci/run &`, nohup) with SIGINT ignored, and every subprocess would inherit that:
# the Ctrl-C tests' tools must start as from a terminal, with SIGINT at its default (a Python handler is reset to
# the default in a child, an ignored signal is not).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope='session')
def trained_lm(tmp_path_factory):
  """A tiny decoder-only model trained for 30 steps on an 8-device FSDP mesh, checkpoints every 10 steps (shared
  by the language model's evaluation, generation and layout tests)."""
  import helpers  # pylint: disable=import-outside-toplevel
  from transformer_jax.jobs import trainer  # pylint: disable=import-outside-toplevel
  config = helpers.tiny_config(**helpers.LM, train__num_steps=30, train__checkpoint_every=10,
                               train__keep_checkpoints=5, mesh__shape={'data': 1, 'fsdp': 8, 'tensor': 1})
  workdir = str(tmp_path_factory.mktemp('trained_lm'))
  trainer.train_and_evaluate(config, workdir)
  return config, workdir


@pytest.fixture(scope='session')
def entry_points(tmp_path_factory):
  """`helpers.EntryPoints`: the tests' runs of train.py, eval.py and the tools, forked from one warm process."""
  import helpers  # pylint: disable=import-outside-toplevel
  runner = helpers.EntryPoints(str(tmp_path_factory.mktemp('entry_points')))
  yield runner
  runner.close()


def made_once(tmp_path_factory, name: str, make) -> str:
  """The directory `name` that `make(directory)` fills once per test session, shared by the xdist workers (the
  first to ask makes it under a file lock, the others wait and reuse it)."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    root = root.parent  # this session's directory, above every worker's own
  directory = root / name
  with open(root / f'{name}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (root / f'{name}.done').exists():
      directory.mkdir()
      make(directory)
      (root / f'{name}.done').touch()
  return str(directory)


@pytest.fixture(scope='session')
def seeded_runs(tmp_path_factory):
  """The README's smoke test (`train.py --config=helpers.SMOKE_CONFIG`, its final report greedy:
  `helpers.SEEDED_DECODE`) run twice, the second with other seeds (initialisation and data order) and the first's
  tokenizer: the smoke training's own check and the installed package's run (test_install), the ensemble's members
  and the exported models. One device each with XLA's optimisations (300 steps train twice as fast so); made once per
  session for all workers."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  import helpers  # pylint: disable=import-outside-toplevel

  def make(root):
    for seed in (0, 1):
      workdir = str(root / f'seed{seed}')
      seeds = []
      if seed:
        helpers.prepare_workdir(workdir, str(root / 'seed0'))  # the first run's tokenizer
        seeds = [f'--config.train.seed={seed}', f'--config.pipeline.shuffle_seed={seed}']
      command = [sys.executable, helpers.TRAIN_PY, f'--config={helpers.SMOKE_CONFIG}', f'--workdir={workdir}',
                 *helpers.SEEDED_DECODE, *seeds]
      result = subprocess.run(command, cwd=helpers.REPO, env=helpers.subprocess_env(device_count=1, fast_compile=False),
                              capture_output=True, text=True, timeout=900)
      assert result.returncode == 0, result.stderr[-3000:]

  root = made_once(tmp_path_factory, 'seeded_runs', make)
  return [os.path.join(root, 'seed0'), os.path.join(root, 'seed1')]


# The modules that take longest, longest first (worker-seconds of the whole suite on 2 cores: bench/RESULTS.md, "CI
# time"); the rest follow in file order. xdist's loadscope hands each worker the next module as its current one ends
# (pytest.ini: in this order), so the long ones start early and the two workers end within a short module of each
# other. The seeded runs' first user comes first: the other modules that use them start after it has made them.
LONGEST_FIRST = ('test_hf.py', 'test_faults.py', 'test_aot.py', 'test_model.py', 'test_flash_attention.py',
                 'test_bad_inputs.py', 'test_lines.py', 'test_sharding.py', 'test_lm.py', 'test_training.py',
                 'test_evaluation.py', 'test_ensemble.py', 'test_sweep.py', 'test_install.py', 'test_checkpoint.py',
                 'test_export.py', 'test_scan.py', 'test_final_model.py', 'test_loss.py', 'test_cpu_backend.py')


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order within and after
