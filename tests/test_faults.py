"""Fault injection: what disks, schedulers and kills do to a run directory. Each faulted train.py run either
resumes or stops with one line, and a run killed and resumed (as often as it takes) logs exactly the losses of
the uninterrupted run, bit for bit."""

import contextlib
import gc
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

import helpers
from transformer_jax import config as config_lib
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import sources
from transformer_jax.inference import restoring
from transformer_jax.jobs import trainer
from transformer_jax.training import checkpoint

pytestmark = pytest.mark.slow

NUM_STEPS = 12
RUN = dict(train__num_steps=NUM_STEPS, train__checkpoint_every=2, train__keep_checkpoints=3, train__log_every=1,
           train__eval_every=1000)


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  """The reference: the same run in this process, never interrupted; its workdir holds the tokenizer to reuse."""
  workdir = str(tmp_path_factory.mktemp('uninterrupted'))
  trainer.train_and_evaluate(helpers.tiny_config(**RUN), workdir)
  losses = helpers.losses_by_step(workdir)
  assert sorted(losses) == list(range(1, NUM_STEPS + 1))
  return workdir, losses


@pytest.fixture(scope='module')
def four_steps(tmp_path_factory, uninterrupted):
  """The run's first 4 steps, trained in this process (checkpoints 2 and 4): the start of the runs that fault later."""
  workdir = helpers.prepare_workdir(str(tmp_path_factory.mktemp('four_steps') / 'run'), uninterrupted[0])
  trainer.train_and_evaluate(helpers.tiny_config(**{**RUN, 'train__num_steps': 4}), workdir)
  assert helpers.checkpoint_steps(workdir) == [2, 4]
  return workdir


# train.py run as `python train.py ...` would run it, except that the process stops and waits for a byte on stdin at
# each point named in its first argument: 'importing jax' (train.py's first import of jax: start-up, before main),
# 'exiting' (an exit hook, after main), 'finalizing' (the interpreter's finalization, after every exit hook, as it
# clears its modules), and in the final report 'restoring' (a checkpoint about to be read), 'compiling' (a
# program lowered, before XLA compiles it), 'decoding' (a translation batch running on the device) and 'writing'
# (the translations written, results.json not yet). Pauses write and read the file descriptors themselves: they
# work while the interpreter finalizes.
_PAUSED = r"""
import atexit, builtins, os, runpy, sys, types
points, sys.argv = sys.argv[1].split(','), sys.argv[2:]
def pause(where, points=points, write=os.write, read=os.read):  # bound now: finalization clears the globals
  if where in points:
    write(1, f'paused {where}\n'.encode())
    read(0, 1)
class Finalizing:
  def __del__(self, pause=pause):
    pause('finalizing')
finalizing = types.ModuleType('finalizing')  # a module's own dict: cleared as the interpreter finalizes its modules
finalizing.pause = Finalizing()
sys.modules['finalizing'] = finalizing
del finalizing
in_report, paused_in_report = False, False
def once(where):  # the first time the final report reaches `where`
  global paused_in_report
  if in_report and where in points and not paused_in_report:
    paused_in_report = True
    pause(where)
def watch_report():
  import jax
  from jax.experimental import multihost_utils
  from transformer_jax.jobs import scoring
  from transformer_jax.training import checkpoint
  report, restore, gather, write = (scoring.final_report, checkpoint.restore_params,
                                    multihost_utils.process_allgather, scoring.write_translations)
  def final_report(*args, **kwargs):
    global in_report
    in_report = True
    return report(*args, **kwargs)
  def restore_params(*args, **kwargs):
    once('restoring')
    return restore(*args, **kwargs)
  def process_allgather(*args, **kwargs):
    once('decoding')  # the batch's program dispatched, its tokens not yet fetched
    return gather(*args, **kwargs)
  def write_translations(*args, **kwargs):
    paths = write(*args, **kwargs)
    once('writing')
    return paths
  scoring.final_report, checkpoint.restore_params = final_report, restore_params
  multihost_utils.process_allgather, scoring.write_translations = process_allgather, write_translations
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, *args, **kwargs: event.endswith('jaxpr_to_mlir_module_duration') and once('compiling'))
real_import, watching = builtins.__import__, False
def import_(name, *args, **kwargs):
  global watching
  if name == 'jax' and 'jax' not in sys.modules:
    pause('importing jax')
  module = real_import(name, *args, **kwargs)
  if not watching and hasattr(sys.modules.get('transformer_jax.jobs.scoring'), 'final_report'):  # imported whole
    watching = True
    watch_report()
  return module
builtins.__import__ = import_
atexit.register(pause, 'exiting')
runpy.run_path(sys.argv[0], run_name='__main__')
"""
REPORT_PHASES = ('restoring', 'compiling', 'decoding', 'writing')
_AROUND_MAIN = ('importing jax', 'exiting')


@pytest.fixture(scope='module')
def forks(tmp_path_factory):
  """The warm fork server (`helpers.EntryPoints`) that `_Run` starts train.py from: one of its own, so that a test can
  run another train.py through the session's `entry_points` while one of these runs."""
  server = helpers.EntryPoints(str(tmp_path_factory.mktemp('forks')))
  yield server
  server.close()


class _Forked:
  """A run started by `helpers.EntryPoints.start`, with what the tests use of `subprocess.Popen`: pid, send_signal,
  kill and wait."""

  def __init__(self, server: helpers.EntryPoints, pid: int):
    self._server, self.pid, self.returncode = server, pid, None

  def send_signal(self, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # ended and reaped by the server: no signal, as for Popen's
      os.kill(self.pid, signum)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)

  def wait(self, timeout: float) -> int:
    if self.returncode is None:
      if (status := self._server.wait(timeout)) is None:
        raise subprocess.TimeoutExpired(f'train.py (pid {self.pid})', timeout)
      self.returncode = status
    return self.returncode


class _Run:
  """train.py as `python train.py ...` runs it, its output lines read by a thread (so waits can time out).
  `paused`: the points of `_PAUSED` where it stops until `resume()`. Forked from the warm server `forks` (without
  a new interpreter's seconds of imports), except a run that pauses at 'importing jax', which only a new
  interpreter reaches."""

  def __init__(self, forks: helpers.EntryPoints, workdir: str, *extra: str, limit_file_size: int | None = None,
               paused: tuple[str, ...] = (), **overrides):
    args = helpers.train_args(workdir, *extra, **{**RUN, **overrides})
    if paused:
      args = ['-c', _PAUSED, ','.join(paused), *args]
    if 'importing jax' in paused:
      assert limit_file_size is None, 'a file-size limit is for forked runs'
      self.process = subprocess.Popen([sys.executable, *args], cwd=helpers.REPO, env=helpers.subprocess_env(),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
      self._stdin, output = self.process.stdin, lambda: self.process.stdout
    else:  # standard streams on named pipes: output read here as it comes, stdin written by resume()
      pipes = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(workdir)))
      stdin, stdout = os.path.join(pipes, 'stdin'), os.path.join(pipes, 'output')
      os.mkfifo(stdin)
      os.mkfifo(stdout)
      self._stdin = os.fdopen(os.open(stdin, os.O_RDWR), 'w')  # read-write: opening it does not wait for the run
      writes = (stdout, os.O_WRONLY)
      self.process = _Forked(forks, forks.start(args, [(stdin, os.O_RDONLY), writes, writes], limit_file_size))
      output = lambda: open(stdout, encoding='utf-8')  # pylint: disable=consider-using-with  (the reader's)
    self.lines, self._queue = [], queue.Queue()
    threading.Thread(target=self._read, args=(output,), daemon=True).start()

  def _read(self, output):
    with output() as lines:  # a named pipe's open waits for the run to open its end
      for line in lines:
        self._queue.put(line)
    self._queue.put(None)

  def wait_for(self, pattern: str, timeout: float = 300) -> str:
    deadline = time.time() + timeout
    while (line := self._queue.get(timeout=max(deadline - time.time(), 0.01))) is not None:
      self.lines.append(line)
      if pattern in line:
        return line
    raise AssertionError(f'no line with {pattern!r}; got:\n' + ''.join(self.lines[-30:]))

  def finish(self, timeout: float = 300) -> int:
    deadline = time.time() + timeout
    try:
      while (line := self._queue.get(timeout=max(deadline - time.time(), 0.01))) is not None:
        self.lines.append(line)
    except queue.Empty:
      self.process.kill()
      raise AssertionError(f'no end of output after {timeout} s; got:\n' + ''.join(self.lines[-30:])) from None
    return self.process.wait(timeout=60)

  def resume(self) -> None:
    self._stdin.write('\n')
    self._stdin.flush()

  @property
  def output(self) -> str:
    return ''.join(self.lines)


def _train_py(entry_points, workdir: str):
  """`python train.py` of RUN in `workdir`, forked from the warm entry-point server (for runs that get no signal)."""
  return entry_points.run(helpers.train_args(workdir, **RUN), text=True)


def _workdir(tmp_path, uninterrupted, name='run') -> str:
  return helpers.prepare_workdir(str(tmp_path / name), uninterrupted[0])


def _copy(four_steps, tmp_path) -> str:
  return str(shutil.copytree(four_steps, tmp_path / 'run'))


def _assert_every_logged_loss_is_the_uninterrupted_one(workdir, uninterrupted):
  records = helpers.read_metrics(workdir)
  assert {r['step'] for r in records} == set(range(1, NUM_STEPS + 1))
  for record in records:  # steps logged twice (lost to a kill, then recomputed) must agree too
    assert record['loss'] == uninterrupted[1][record['step']], record['step']


def test_sigkill_at_random_moments_resumes_to_the_uninterrupted_losses(tmp_path, uninterrupted, entry_points, forks):
  workdir = _workdir(tmp_path, uninterrupted)
  rng = random.Random(0)
  for _ in range(3):  # kill at a random step (saves are asynchronous: often mid-save), then resume
    run = _Run(forks, workdir)
    run.wait_for(f'step {rng.randint(1, NUM_STEPS - 1)}/')
    time.sleep(rng.uniform(0, 0.2))
    run.process.send_signal(signal.SIGKILL)
    run.process.wait(timeout=60)
  result = _train_py(entry_points, workdir)  # the last resume, to the end: no signal, a fork of the warm server
  assert result.returncode == 0, result.stderr[-3000:]
  assert not [n for n in os.listdir(Workdir(workdir).checkpoints) if 'tmp' in n]  # stale save dirs removed
  _assert_every_logged_loss_is_the_uninterrupted_one(workdir, uninterrupted)


def test_a_save_that_runs_out_of_space_stops_the_run_and_the_rerun_resumes(tmp_path, uninterrupted, four_steps,
                                                                           entry_points, forks):
  workdir = _copy(four_steps, tmp_path)
  # Files of at most 32 KiB: the config, logs and metrics fit, a checkpoint's data file does not.
  run = _Run(forks, workdir, limit_file_size=1 << 15)
  assert run.finish() != 0
  assert 'Traceback' not in run.output, run.output[-3000:]  # orbax's own error lines come without theirs
  (error,) = [line for line in run.lines if line.startswith('error:')]
  assert error.startswith('error: saving a checkpoint in ') and '(File too large)' in error
  assert 'the last good checkpoint is step 4' in error and 'rerun the same command' in error
  result = _train_py(entry_points, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  _assert_every_logged_loss_is_the_uninterrupted_one(workdir, uninterrupted)


def test_a_stopped_run_names_only_a_step_that_is_finished_on_disk(tmp_path):
  """What the full-disk and non-finite messages name: never a save in flight (orbax's in-memory latest step) nor
  None when there is no checkpoint yet."""
  manager = checkpoint.make_manager(str(tmp_path / 'checkpoints'), async_save=False)
  assert checkpoint.last_good(manager) == 'no checkpoint has been saved yet'
  checkpoint.save(manager, 2, {'step': np.int32(2)})
  (tmp_path / 'checkpoints' / '4.orbax-checkpoint-tmp-1').mkdir()  # what a save of step 4 in flight leaves
  assert checkpoint.last_good(manager) == 'the last good checkpoint is step 2'
  manager.close()


def test_a_checkpoint_whose_data_files_are_cut_is_skipped_by_eval_and_set_aside_by_train(tmp_path, uninterrupted,
                                                                                        four_steps, entry_points):
  """The reported case, end to end: the newest step's OCDBT data files cut to 10 bytes."""
  workdir = _copy(four_steps, tmp_path)
  damaged = os.path.join(Workdir(workdir).checkpoints, '4')
  helpers.damage_checkpoint(damaged, 'process_data_files', size=10)
  digest = helpers.tree_digest(damaged)
  # A process of its own, as a user starts it: the errors that nothing can catch, which the failed reads raise in
  # tensorstore's threads, did not show in a forked run (entry_points).
  result = subprocess.run([sys.executable, 'eval.py', f'--workdir={workdir}'], cwd=helpers.REPO,
                          env=helpers.subprocess_env(), capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'checkpoint step 4 in' in result.stderr and 'does not restore' in result.stderr
  assert f'restored the final model of {workdir} (its last eval.average_last=1 periodic saves): step 2' in result.stderr
  lines = result.stderr.splitlines()  # the first uncatchable error, then their count: not a line per failed read
  assert sum('nothing can catch it' in line for line in lines) <= 1, result.stderr[-3000:]
  assert sum('nothing can catch them' in line for line in lines) <= 1, result.stderr[-3000:]
  assert helpers.tree_digest(damaged) == digest  # evaluation changes nothing
  result = _train_py(entry_points, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'checkpoint step 4 in' in result.stderr and 'does not restore' in result.stderr
  assert f'resumed from step 2 in {Workdir(workdir).checkpoints}' in result.stderr
  assert helpers.tree_digest(damaged + '.damaged') == digest  # kept as it was, under another name
  _assert_every_logged_loss_is_the_uninterrupted_one(workdir, uninterrupted)


# The failed reads leave errors that nothing can catch (tensorstore's reads of the cut files, and its callbacks into
# orbax's closed event loops), dozens under load; train.py and eval.py log them as one line and a count (cli.run,
# checked end to end above). Here, in-process, pytest would show each with its traceback.
@pytest.mark.filterwarnings(r'ignore:Exception ignored in[\s\S]*(Encountered error while reading array index|Event loop '
                            r'is closed):pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('kind', sorted(helpers.CHECKPOINT_FILES))
def test_damage_to_any_file_of_a_checkpoint_falls_back_to_the_one_before(kind, tmp_path, uninterrupted, four_steps,
                                                                        caplog):
  """Each kind of file cut to 10 bytes: evaluation's restore (eval.py's) and training's resume (train.py's, here
  in-process) both name step 4 and use step 2; training sets step 4 aside unchanged and repeats the losses."""
  workdir = _copy(four_steps, tmp_path)
  damaged = os.path.join(Workdir(workdir).checkpoints, '4')
  helpers.damage_checkpoint(damaged, kind, size=10)
  digest = helpers.tree_digest(damaged)
  assert restoring.restore(config_lib.of_run(workdir), workdir).steps == [2]
  trainer.train_and_evaluate(helpers.tiny_config(**{**RUN, 'train__num_steps': 5}), workdir)
  checkpoints = Workdir(workdir).checkpoints
  assert caplog.text.count(f'checkpoint step 4 in {checkpoints} does not restore') == 2
  assert caplog.text.count(f'restored step 2 of {checkpoints}: the newer checkpoint(s) [4] are damaged') == 1
  assert helpers.tree_digest(damaged + '.damaged') == digest
  losses = helpers.losses_by_step(workdir)
  assert {step: losses[step] for step in (3, 4, 5)} == {step: uninterrupted[1][step] for step in (3, 4, 5)}
  gc.collect()  # the failed reads' coroutines raise here, under this test's filter, not in whichever test runs next


def test_a_truncated_tokenizer_stops_the_run_with_one_line(tmp_path, four_steps, entry_points):
  workdir = _copy(four_steps, tmp_path)
  before = helpers.tree_digest(Workdir(workdir).checkpoints)
  helpers.truncate(Workdir(workdir).tokenizer_model)
  result = _train_py(entry_points, workdir)
  assert result.returncode == 1
  assert result.stdout == ''
  assert result.stderr.splitlines()[-1] == (
      f'error: {Workdir(workdir).tokenizer_model} is not a SentencePiece model (truncated or damaged): restore it '
      "from a copy; a run's checkpoints need the tokenizer they were trained with.")
  assert helpers.tree_digest(Workdir(workdir).checkpoints) == before


def test_sigterm_while_python_imports_jax_stops_before_the_first_step_with_exit_0(tmp_path, uninterrupted, forks):
  workdir = _workdir(tmp_path, uninterrupted)
  run = _Run(forks, workdir, paused=_AROUND_MAIN)
  run.wait_for('paused importing jax')  # train.py's first import of jax: before main, long before training
  run.process.send_signal(signal.SIGTERM)
  run.resume()
  run.wait_for('paused exiting')
  run.resume()
  assert run.finish() == 0, run.output[-3000:]
  assert 'stopped before step 1: nothing was trained' in run.output
  assert helpers.checkpoint_steps(workdir) == []


def test_sigterm_under_compile_only_ends_the_process_by_the_signal_without_libtpus_stack_trace(tmp_path, forks):
  """--compile_only has nothing to save: a signal ends it as the signal's default action would, after one line.
  libtpu (loaded by the compile) prints a stack trace for a SIGTERM left at its default disposition."""
  run = _Run(forks, str(tmp_path / 'w'), '--compile_only', '--topology=v5e-8', paused=_AROUND_MAIN)
  run.wait_for('paused importing jax')
  run.resume()
  run.wait_for('paused exiting')  # every program compiled and reported: libtpu is loaded
  assert 'eval step, batch' in run.output
  run.process.send_signal(signal.SIGTERM)
  assert run.finish() == -signal.SIGTERM, run.output[-3000:]
  assert 'received signal 15: stopping' in run.output and 'stack trace' not in run.output, run.output[-3000:]


def test_more_signals_during_the_preemption_save_and_after_it_do_not_lose_it_or_kill_the_process(tmp_path,
                                                                                                 uninterrupted, forks):
  workdir = _workdir(tmp_path, uninterrupted)
  run = _Run(forks, workdir, paused=('exiting',), train__num_steps=100_000, train__checkpoint_every=100_000)
  run.wait_for('step 3/')
  sent = time.time()
  for _ in range(3):
    run.process.send_signal(signal.SIGTERM)
  line = run.wait_for('preempted: saved step')
  run.wait_for('paused exiting')  # main has returned: the process is on its way out
  run.process.send_signal(signal.SIGTERM)
  run.process.send_signal(signal.SIGINT)
  run.resume()
  assert run.finish() == 0, run.output[-3000:]
  step = int(line.split('preempted: saved step ')[1].split()[0])
  assert helpers.checkpoint_steps(workdir) == [step]  # on disk, as the message says
  step_seconds = [r['step_seconds'] for r in helpers.read_metrics(workdir)]
  print(f'SIGTERM to exit: {time.time() - sent:.1f} s; a step took {min(step_seconds):.3f}-{max(step_seconds):.3f} s')


def _preempted(forks, workdir, paused=()) -> tuple['_Run', int]:
  """train.py stopped by a SIGTERM after its third step: the run and the step its message says it saved."""
  run = _Run(forks, workdir, paused=paused, train__num_steps=100_000, train__checkpoint_every=100_000)
  run.wait_for('step 3/')
  run.process.send_signal(signal.SIGTERM)
  line = run.wait_for('preempted: saved step')
  return run, int(line.split('preempted: saved step ')[1].split()[0])


@pytest.mark.parametrize('delay', [0.0, 0.25, 0.5, 0.75, 1.0])
def test_a_second_signal_up_to_a_second_after_the_preemption_save_still_exits_0(tmp_path, uninterrupted, delay,
                                                                                forks):
  """The process exits 0 however late the second signal comes: while main returns, in the exit hooks or while the
  interpreter finalizes (which gives a signal with a Python handler back its default action)."""
  workdir = _workdir(tmp_path, uninterrupted)
  run, step = _preempted(forks, workdir)
  time.sleep(delay)
  run.process.send_signal(signal.SIGTERM)
  assert run.finish() == 0, run.output[-3000:]
  assert helpers.checkpoint_steps(workdir) == [step]


def test_signals_while_the_interpreter_finalizes_do_not_kill_the_stopped_run(tmp_path, uninterrupted, forks):
  """The moment itself, not a timing that may miss it: the process paused in its finalization, after every exit
  hook, where CPython has given SIGTERM and SIGINT their default action back unless they are ignored."""
  workdir = _workdir(tmp_path, uninterrupted)
  run, step = _preempted(forks, workdir, paused=('finalizing',))
  run.wait_for('paused finalizing')
  run.process.send_signal(signal.SIGTERM)
  run.process.send_signal(signal.SIGINT)
  run.resume()
  assert run.finish() == 0, run.output[-3000:]
  assert helpers.checkpoint_steps(workdir) == [step]


@pytest.mark.parametrize('phase', REPORT_PHASES)
def test_a_signal_anywhere_in_the_final_evaluation_ends_it_cleanly(tmp_path, uninterrupted, phase, forks):
  """A SIGTERM while the final evaluation restores, compiles, decodes (a batch on the device) or writes: the
  evaluation stops at its next safe point (between batches, before its files) with exit 0 and the training saved;
  nothing half-written, no fatal error. One that comes once the files are being written lets them finish."""
  workdir = _workdir(tmp_path, uninterrupted)
  run = _Run(forks, workdir, paused=(phase,), train__num_steps=4)
  run.wait_for(f'paused {phase}')
  run.process.send_signal(signal.SIGTERM)
  run.resume()
  assert run.finish() == 0, run.output[-3000:]
  assert 'Fatal Python error' not in run.output and 'Traceback' not in run.output, run.output[-3000:]
  assert helpers.checkpoint_steps(workdir)[-1] == 4
  results = Workdir(workdir).final_results_file
  if phase != 'writing':
    assert 'stopped during the final evaluation (signal 15): training is saved at step 4' in run.output
    assert not os.path.exists(results) and not os.path.exists(os.path.dirname(Workdir(workdir).translation_file(
        'test', 'hyp')))
    return
  assert 'stopped during the final evaluation' not in run.output  # past its last safe point: written whole
  with open(results, encoding='utf-8') as f:
    saved = json.load(f)
  for path in saved['translations'].values():
    with open(path, encoding='utf-8') as f:
      assert len(f.read().splitlines()) == saved['num_sentences']


def test_a_second_train_py_on_a_workdir_in_use_is_refused_in_one_line(tmp_path, uninterrupted, entry_points, forks):
  workdir = _workdir(tmp_path, uninterrupted)
  with Workdir(workdir).exclusive():  # held by this process, as a first run would hold it
    result = entry_points.run(helpers.train_args(workdir), text=True)
  assert result.returncode == 1
  assert result.stderr.splitlines()[-1] == (
      f'error: workdir {workdir} is in use by another training run (pid {os.getpid()} on {socket.gethostname()}): '
      'wait for it to finish or stop it, or pass another --workdir.')
  assert not os.path.exists(Workdir(workdir).checkpoints)
  first = _Run(forks, workdir, train__num_steps=100_000, train__checkpoint_every=1)  # a double launch of train.py
  first.wait_for('step 2/')
  second = entry_points.run(helpers.train_args(workdir), text=True)
  assert second.returncode == 1
  assert f'in use by another training run (pid {first.process.pid} on ' in second.stderr.splitlines()[-1]
  first.process.send_signal(signal.SIGTERM)
  line = first.wait_for('preempted: saved step')
  assert first.finish() == 0, first.output[-3000:]
  step = int(line.split('preempted: saved step ')[1].split()[0])
  assert helpers.checkpoint_steps(workdir)[-1] == step  # the first run's checkpoints, as it left them
  assert helpers.losses_by_step(workdir)[2] == uninterrupted[1][2]


def _tsv(path, pairs) -> str:
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(f'{source}\t{target}\n' for source, target in pairs)
  return str(path)


def test_sigterm_during_the_final_report_keeps_the_finished_training(tmp_path, uninterrupted, forks):
  workdir = _workdir(tmp_path, uninterrupted)
  # The built-in corpus as files, the test split a named pipe written once: the trainer's check at start reads that,
  # and the final report blocks reading it again, so the signal is sure to come during the report (which a fast
  # report could otherwise finish before).
  builtin = helpers.tiny_config().data
  train = _tsv(tmp_path / 'train.tsv', sources.load_split(builtin, 'train'))
  validation = _tsv(tmp_path / 'validation.tsv', sources.load_split(builtin, 'validation'))
  os.mkfifo(tmp_path / 'test.tsv')

  def write_once():
    with open(tmp_path / 'test.tsv', 'w', encoding='utf-8') as fifo, open(validation, encoding='utf-8') as pairs:
      fifo.write(pairs.read())

  threading.Thread(target=write_once, daemon=True).start()
  run = _Run(forks, workdir, train__num_steps=4, data__source='files', data__files__train__tsv=train,
             data__files__validation__tsv=validation, data__files__test__tsv=tmp_path / 'test.tsv')
  run.wait_for('step 4/')
  run.wait_for('restored the final model of')  # the final report has begun
  run.process.send_signal(signal.SIGTERM)
  assert run.finish() == 0, run.output[-3000:]
  assert 'stopped during the final evaluation' in run.output
  assert helpers.checkpoint_steps(workdir)[-1] == 4
  assert not os.path.exists(Workdir(workdir).final_results_file)
