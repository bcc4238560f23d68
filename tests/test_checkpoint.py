"""Checkpoints and restarts with the real loop on a tiny model (the translator and the language model): saves
every N steps and keeps the last K; a checkpoint holds params, optimizer state, step, rng and the input
iterator's position; a rerun in the same workdir resumes and repeats the uninterrupted run step for step
(dropout on); SIGTERM saves and
exits 0; kill -9 during an async save leaves a restorable checkpoint; a checkpoint of another model shape
is an error that lists the shapes and changes nothing, as is one that would resume with other batches."""

import os
import queue
import signal
import subprocess
import threading
import time

import jax
import numpy as np
import pytest

import helpers
from transformer_jax.config.model import ModelConfig
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import pipeline, sources
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.jobs import trainer
from transformer_jax.runtime import sharding
from transformer_jax.training import checkpoint, steps

pytestmark = pytest.mark.slow  # every test runs the training loop

NUM_STEPS, STOP_AT = 8, 5
SAVE_EVERY, KEEP = 2, 2


def _config(architecture='encoder_decoder', **overrides):
  # Dropout on (the default config's 0.1): exact resume also shows the dropout masks repeat.
  return helpers.tiny_config(**{'train__num_steps': NUM_STEPS, 'train__checkpoint_every': SAVE_EVERY,
                                'train__keep_checkpoints': KEEP, **helpers.ARCHITECTURES[architecture], **overrides})


@pytest.fixture(scope='module', params=list(helpers.ARCHITECTURES))
def uninterrupted(request, tmp_path_factory):
  """(workdir, result, architecture) of an uninterrupted run of each architecture."""
  workdir = str(tmp_path_factory.mktemp(f'uninterrupted_{request.param}'))
  result = trainer.train_and_evaluate(_config(request.param), workdir)
  return workdir, result, request.param


translator_only = pytest.mark.parametrize('uninterrupted', ['encoder_decoder'], indirect=True)


@pytest.fixture(scope='module')
def resumed(tmp_path_factory, uninterrupted):
  """The same run stopped at STOP_AT (its last step: a forced save), then rerun to NUM_STEPS."""
  architecture = uninterrupted[2]
  workdir = helpers.prepare_workdir(str(tmp_path_factory.mktemp(f'resumed_{architecture}')), uninterrupted[0])
  first = trainer.train_and_evaluate(_config(architecture, train__num_steps=STOP_AT), workdir)
  assert first['metrics']['step'] == STOP_AT
  saved_after_first = helpers.checkpoint_steps(workdir)
  second = trainer.train_and_evaluate(_config(architecture), workdir)
  return workdir, saved_after_first, second


def test_resume_repeats_the_uninterrupted_run(uninterrupted, resumed):
  full = helpers.losses_by_step(uninterrupted[0])
  workdir, saved_after_first, second = resumed
  assert saved_after_first == [4, 5]  # every 2 steps, the last 2 kept, and the stop step forced
  records = helpers.read_metrics(workdir)
  assert [r['step'] for r in records] == list(range(1, NUM_STEPS + 1))  # resumed at 6, nothing repeated
  interrupted = helpers.losses_by_step(workdir)
  assert sorted(full) == list(range(1, NUM_STEPS + 1))
  np.testing.assert_array_equal([interrupted[s] for s in sorted(full)], [full[s] for s in sorted(full)])
  assert len(set(full.values())) == NUM_STEPS  # it trained (the losses change step to step)
  assert second['metrics']['step'] == NUM_STEPS
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(second['state'].params),
               jax.device_get(uninterrupted[1]['state'].params))


def _abstract_state(config):
  mesh, rules = sharding.mesh_and_rules(config.mesh)
  model, tx, _ = helpers.train_objects(config)
  abstract, _ = steps.abstract_state_and_shardings(model, tx, config.train.seed,
                                                   (sharding.data_parallel_size(mesh), 8), mesh, rules,
                                                   shard_optimizer=sharding.shards_optimizer(
                                                       config.mesh.shard_optimizer, mesh))
  return abstract


def _fresh_iterator(config, workdir):
  pairs = sources.load(config.data, 'train', ModelConfig.from_dict(config.model).decoder_only)
  tok = tokenizer_lib.load_tokenizer(Workdir(workdir).tokenizer_model)
  return iter(pipeline.make_train_dataset(pairs, tok, config.pipeline))


def test_checkpoint_cadence_and_contents(uninterrupted):
  workdir, result, architecture = uninterrupted
  config = _config(architecture)
  assert helpers.checkpoint_steps(workdir) == [6, 8]  # saved at 2, 4, 6, 8; the last KEEP kept
  for step in (6, 8):
    step_dir = os.path.join(Workdir(workdir).checkpoints, str(step))
    assert set(os.listdir(step_dir)) >= {checkpoint.STATE, checkpoint.DATA}
    assert 'process_0-of-1.json' in os.listdir(os.path.join(step_dir, checkpoint.DATA))  # the iterator state

  abstract = _abstract_state(config)
  manager = checkpoint.make_manager(Workdir(workdir).checkpoints, create=False, async_save=False)
  restored_iter = _fresh_iterator(config, workdir)
  try:
    assert manager.latest_step() == NUM_STEPS
    restored = checkpoint.restore_state(manager, NUM_STEPS, abstract.as_dict(), restored_iter)
  finally:
    manager.close()
  assert set(restored) == {'step', 'params', 'opt_state', 'rng'}
  final = jax.device_get(result['state'].as_dict())
  assert int(restored['step']) == NUM_STEPS
  for key in ('params', 'opt_state', 'rng'):
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored[key]), final[key])
  # The rng is the run's seed-derived key: fold_in(key(seed), 1), never advanced (steps fold in their index).
  expected_rng = jax.random.key_data(jax.random.fold_in(jax.random.key(config.train.seed), 1))
  np.testing.assert_array_equal(jax.device_get(restored['rng']), expected_rng)
  # Adam's step count is in the optimizer state.
  counts = [x for x in jax.tree.leaves(final['opt_state']) if np.ndim(x) == 0]
  assert counts and all(int(c) == NUM_STEPS for c in counts)
  # The iterator state puts a fresh pipeline at batch NUM_STEPS + 1 of the run.
  reference = _fresh_iterator(config, workdir)
  for _ in range(NUM_STEPS):
    next(reference)
  expected, got = next(reference), next(restored_iter)
  for key in expected:
    np.testing.assert_array_equal(got[key], expected[key])


def _refused_resume(workdir: str, config) -> str:
  """The one-line error of resuming `workdir` with `config`, which leaves its checkpoints and config.json alone
  (the workdir's config still describes its checkpoints)."""
  before = helpers.tree_digest(Workdir(workdir).checkpoints)
  with open(Workdir(workdir).config_file) as f:
    config_before = f.read()
  with pytest.raises(ValueError) as error:
    trainer.train_and_evaluate(config, workdir)
  assert helpers.tree_digest(Workdir(workdir).checkpoints) == before
  with open(Workdir(workdir).config_file) as f:
    assert f.read() == config_before
  assert '\n' not in str(error.value)
  return str(error.value)


@translator_only
def test_checkpoint_of_another_model_shape_is_refused(uninterrupted):
  workdir = uninterrupted[0]
  message = _refused_resume(workdir, _config(model__d_model=32, model__d_ff=64, train__num_steps=NUM_STEPS + 2))
  assert 'other shapes' in message and f'step {NUM_STEPS}' in message
  assert '(31 differences)' in message  # every d_model/d_ff-sized parameter of the 1+1 layer model
  assert "['decoder']['layer_0']['ffn']['wi']['kernel']: checkpoint (16, 32) vs config (32, 64)" in message


@translator_only
def test_resuming_with_other_batches_is_refused_and_changes_nothing(uninterrupted):
  """A checkpoint holds its place in the run's batch sequence: other pipeline values would make other batches."""
  workdir = uninterrupted[0]
  other = _config(pipeline__batch_size=16, pipeline__shuffle_seed=3, train__num_steps=NUM_STEPS + 2)
  assert _refused_resume(workdir, other) == (
      f'{workdir} was trained with pipeline.batch_size=8 (now 16), pipeline.shuffle_seed=0 (now 3): its checkpoints '
      "continue the batches those values make; pass the run's values to resume it, or train in a new --workdir.")


# --- subprocess runs of train.py: SIGTERM and kill -9


class _Output:
  """The lines a child process prints, read by a thread so that waiting for one can time out."""

  def __init__(self, process):
    self.lines, self._queue = [], queue.Queue()
    threading.Thread(target=lambda: [self._queue.put(line) for line in process.stdout] + [self._queue.put(None)],
                     daemon=True).start()

  def wait_for(self, pattern: str, timeout: float):
    deadline = time.time() + timeout
    while time.time() < deadline:
      try:
        line = self._queue.get(timeout=max(deadline - time.time(), 0.01))
      except queue.Empty:
        break
      if line is None:
        break
      self.lines.append(line)
      if pattern in line:
        return
    raise AssertionError(f'no line with {pattern!r} within {timeout}s; got:\n' + ''.join(self.lines[-30:]))

  def rest(self, timeout: float) -> str:
    """Everything printed after the last line read, until the process closes its output."""
    lines, deadline = [], time.time() + timeout
    while (line := self._queue.get(timeout=max(deadline - time.time(), 0.01))) is not None:
      lines.append(line)
    return ''.join(lines)


def _start(workdir, **overrides):
  return subprocess.Popen(helpers.train_command(workdir, **overrides), cwd=helpers.REPO, env=helpers.subprocess_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@translator_only
def test_sigterm_saves_and_exits_cleanly(tmp_path, uninterrupted):
  workdir = helpers.prepare_workdir(str(tmp_path / 'preempted'), uninterrupted[0])
  # Many steps, no periodic checkpoint: only the preemption save can write one.
  process = _start(workdir, train__num_steps=100_000, train__checkpoint_every=100_000, train__log_every=1)
  output = _Output(process)
  try:
    output.wait_for('step 1/', timeout=240)
    process.send_signal(signal.SIGTERM)
    rest = output.rest(timeout=120)
    process.wait(timeout=60)
  finally:
    process.kill()
  assert process.returncode == 0, rest[-3000:]
  assert any('host memory: freed memory kept for reuse' in line for line in output.lines)  # train.py's default
  saved = helpers.checkpoint_steps(workdir)
  assert len(saved) == 1 and saved[0] >= 1
  stop_step = saved[0]
  assert f'preempted: saved step {stop_step} in {Workdir(workdir).checkpoints}' in rest
  assert 'rerun the same command to resume' in rest
  assert max(r['step'] for r in helpers.read_metrics(workdir)) == stop_step  # it stopped right after saving
  # The saved step restores and the run continues from it.
  result = trainer.train_and_evaluate(_config(train__num_steps=stop_step + 2), workdir)
  assert result['metrics']['step'] == stop_step + 2
  assert [r['step'] for r in helpers.read_metrics(workdir)][-2:] == [stop_step + 1, stop_step + 2]
  assert np.isfinite(result['metrics']['loss'])


@translator_only
def test_kill_9_during_async_saves_leaves_a_restorable_checkpoint(tmp_path, uninterrupted):
  workdir = helpers.prepare_workdir(str(tmp_path / 'killed'), uninterrupted[0])
  # A save every step (async): a kill -9 almost always lands while one is being written.
  process = _start(workdir, train__num_steps=100_000, train__checkpoint_every=1, train__keep_checkpoints=3,
                   train__log_every=1)
  try:
    _Output(process).wait_for('step 4/', timeout=240)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
  finally:
    process.kill()
  assert process.returncode == -signal.SIGKILL
  finished = helpers.checkpoint_steps(workdir)  # finalized steps only (tmp dirs carry a suffix)
  assert finished and finished[-1] >= 2  # save(s) waits for save(s - 1): step 2 was done when step 4 ran
  leftovers = [n for n in os.listdir(Workdir(workdir).checkpoints) if not n.isdigit()]
  print(f'finalized steps {finished}, unfinished save directories {leftovers}')
  manager = checkpoint.make_manager(Workdir(workdir).checkpoints, create=False, async_save=False)
  try:
    latest = manager.latest_step()
  finally:
    manager.close()
  assert latest == finished[-1]
  result = trainer.train_and_evaluate(_config(train__num_steps=latest + 2, train__checkpoint_every=1,
                                              train__keep_checkpoints=3), workdir)
  assert result['metrics']['step'] == latest + 2
  records = helpers.read_metrics(workdir)
  assert records[-1]['step'] == latest + 2 and np.isfinite(records[-1]['loss'])
  assert helpers.checkpoint_steps(workdir)[-1] == latest + 2
