"""The training loop, in labelled sections: the run, input, checkpoints and state, jitted steps, loop.

The run's compiled parts (mesh, model, optimizer, state shardings, steps, batch shapes) come from
`run_builder.build`, as `--compile_only` builds them; the math is in `training/steps.py`; numbers go through
`reporting.TrainReport`; stop requests through `preemption`; teacher-forced evaluation through `scoring`; the run
directory's layout through `workdir.Workdir`.
"""

import collections
import contextlib
import dataclasses
import functools
import os
import time

import jax
import ml_collections
from absl import logging
from jax.experimental import multihost_utils

from transformer_jax import config as config_lib
from transformer_jax.config import pipeline as pipeline_section
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import device_feed
from transformer_jax.data import pipeline
from transformer_jax.data import sources
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.jobs import preemption
from transformer_jax.jobs import reporting
from transformer_jax.jobs import scoring
from transformer_jax.model import ensemble
from transformer_jax.runtime import concurrent_compiles
from transformer_jax.runtime import progress
from transformer_jax.training import checkpoint
from transformer_jax.training import run_builder
from transformer_jax.training import steps


def compilation_cache_dir(train: ml_collections.ConfigDict, workdir: str) -> str:
  """Where compiled programs persist: `train.compilation_cache_dir`, else `jax_compilation_cache` in the workdir's
  parent (shared by the runs of a sweep, which compile the same programs)."""
  return train.compilation_cache_dir or os.path.join(os.path.dirname(os.path.abspath(workdir)), 'jax_compilation_cache')


class NonFiniteLossError(FloatingPointError):
  """The loss, gradients or update went non-finite (train.on_nonfinite='stop'): one line naming the step and the
  checkpoint to resume from (an ArithmeticError: cli.run reports it without a traceback)."""


class DispatchWindow:
  """At most `size` steps in flight: adding one more first waits for the oldest (a step dispatched `size` steps
  ago, usually done by then), so the host never runs far ahead of the device and a stop request is honoured
  within a step or two, without a host sync on the newest step."""

  def __init__(self, size: int):
    self._size, self._in_flight = size, collections.deque()

  def add(self, step_output):
    self._in_flight.append(step_output)
    if len(self._in_flight) > self._size:
      jax.block_until_ready(self._in_flight.popleft())


class _CompiledSteps:
  """The train step compiled for every batch shape of the run before the first step (token budgets have one per
  length bucket): the longest first, alone, then the others as many at once as the memory its compile took allows
  (`concurrent_compiles`, as `--compile_only` compiles them), each lowered while those before it compile; the time
  reported. A shape nobody foresaw still compiles when it comes, and is reported as such."""

  def __init__(self, run: run_builder.Run, state, report: reporting.TrainReport, step: int):
    self._jitted, self._report = run.train_step, report
    start = time.time()
    shapes = run.train_batch_shapes[::-1]  # the longest (the last bucket's) first
    with progress.Progress('compiling the train step', total=len(shapes), unit='batch shapes',
                           memory=True) as compiling:
      self._compiled = {}
      for shape, compiled in concurrent_compiles.compile_all(
          shapes, lambda shape: run.train_step.lower(state, run.abstract_batch(shape)),
          lambda shape, lowered: lowered.compile()):
        self._compiled[self._key(shape)] = compiled
        compiling.advance()
    report.compilation(step, time.time() - start, f'the train step for {len(shapes)} batch shape(s)')

  @staticmethod
  def _key(shapes: dict) -> tuple:
    return tuple(sorted((k, tuple(v)) for k, v in shapes.items()))

  def __call__(self, state, batch, step: int):
    key = self._key({k: v.shape for k, v in batch.items()})
    if key not in self._compiled:
      start = time.time()
      self._compiled[key] = self._jitted.lower(state, batch).compile()
      self._report.compilation(step, time.time() - start, f'an unforeseen batch shape {dict(key)} mid-run')
    return self._compiled[key](state, batch)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       stop: preemption.StopRequest | None = None) -> dict:
  """Trains `config` in `workdir`, resuming from its latest checkpoint; returns the state and last metrics.

  stop: the stop request whose signal handlers train.py installed before its imports (else one is made here).
  """
  imported = config.train.fine_tune_workdir
  if imported and os.path.realpath(imported) != os.path.realpath(workdir):
    raise ValueError(f'configs/fine_tune.py:{imported} starts from the params imported into {imported} (its step 0) '
                     f'and trains there: pass --workdir={imported}, or copy {imported} to a new directory and pass '
                     'that to both.')
  run_dir = Workdir(workdir)
  run_dir.ensure_writable(jax.process_index())
  with contextlib.ExitStack() as cleanup:  # the workdir, report, checkpoints and signal handlers: released on exit
    if jax.process_index() == 0:  # the other processes of a run share its workdir
      cleanup.enter_context(run_dir.exclusive())
    finished = _trained_to_the_end(config, run_dir)
    if finished is not None:
      return finished
    if stop is None:
      stop = cleanup.enter_context(preemption.StopRequest(multi_process=jax.process_count() > 1))
    return _train(config, run_dir, stop, cleanup)


def _saved_config(config: ml_collections.ConfigDict, run_dir: Workdir) -> dict | None:
  """The run's config.json (None for a new run), `config`'s `pipeline.num_workers` resolved against it: the batch
  sequence depends on the number of worker processes, so a resumed run keeps the one it started with."""
  saved = run_dir.load_config().to_dict() if run_dir.has_config() else None
  if config.pipeline.num_workers == pipeline_section.AUTO_WORKERS:
    started = saved.get('pipeline', {}).get('num_workers') if saved else None
    auto = started in (None, pipeline_section.AUTO_WORKERS)
    config.pipeline.num_workers = pipeline.num_workers(config.pipeline) if auto else started
  return saved


def _trained_to_the_end(config: ml_collections.ConfigDict, run_dir: Workdir) -> dict | None:
  """A run whose checkpoints reach `train.num_steps`, found before anything is built, loaded or compiled: its
  result ({'state': None, 'metrics': {'step'}}) for train.py's final report, which reports the run's results.json
  if it has one. The command may change what the final evaluation reads only while that has not run (a finished
  and evaluated run's other settings are eval.py's). None while steps are left to train."""
  if not run_dir.has_config() or not os.path.isdir(run_dir.checkpoints):
    return None
  manager = checkpoint.make_manager(run_dir.checkpoints, create=False, async_save=False)
  try:
    latest = manager.latest_step()
  finally:
    manager.close()
  if latest != config.train.num_steps:
    return None
  changes = config_lib.changes_since(_saved_config(config, run_dir), config)
  if changes and run_dir.finished_results(latest) is not None:
    listed = ', '.join(f'{key}={new!r} (the run\'s: {old!r})' for key, (old, new) in changes.items())
    raise ValueError(f'{run_dir.path} is trained to train.num_steps={latest} and evaluated '
                     f'({run_dir.final_results_file}), but this command changes {listed}: evaluate other settings with '
                     f'python eval.py --workdir={run_dir.path} --config.KEY=VALUE, train on with a larger '
                     '--config.train.num_steps, or pass another --workdir.')
  config_lib.check_resume(changes, run_dir.path)
  if changes and jax.process_index() == 0:
    run_dir.save_config(config)
  changed = ''.join(f'; {key} changed from {old!r} to {new!r}' for key, (old, new) in changes.items())
  logging.info('%s is trained to train.num_steps=%d: nothing to train%s', run_dir.path, latest, changed)
  return {'state': None, 'metrics': {'step': latest}}


def _train(config: ml_collections.ConfigDict, run_dir: Workdir, stop: preemption.StopRequest,
           cleanup: contextlib.ExitStack) -> dict:
  # --- the run: mesh and rules (every batch size checked against them), model, optimizer, abstract sharded state,
  # jitted steps and batch shapes
  run = run_builder.build(config)
  mesh, model, train_cfg = run.mesh, run.model, config.train
  logging.info('%s', model.config.kernels.describe())

  # --- input: sentence pairs, or documents for a decoder-only model
  documents = model.config.decoder_only
  train_pairs = sources.load(config.data, 'train', documents)
  valid_pairs = sources.load(config.data, config.eval.split, documents)
  if config.eval.test_split not in ('train', config.eval.split):  # read by the final evaluation, checked now
    sources.load(config.data, config.eval.test_split, documents)
  tok = tokenizer_lib.for_training(config.tokenizer, run_dir.tokenizer_model, train_pairs, config.model.vocab_size)
  saved = _saved_config(config, run_dir)
  # With worker processes the filter counts live (and are logged) in the workers: no metric claims them here.
  filter_stats = None if config.pipeline.num_workers else pipeline.FilterStats()
  train_iter = iter(pipeline.make_train_dataset(train_pairs, tok, config.pipeline, process_index=jax.process_index(),
                                                process_count=jax.process_count(), filter_stats=filter_stats))

  # --- checkpoints: resume from the newest that restores
  manager = checkpoint.make_manager(run_dir.checkpoints, save_every=train_cfg.checkpoint_every,
                                    keep=train_cfg.keep_checkpoints, async_save=train_cfg.async_checkpoints,
                                    periodic=functools.partial(checkpoint.is_periodic, train_cfg))
  cleanup.enter_context(checkpoint.closing(manager))
  stop.watch(manager)
  latest, damaged, changes = None, [], {}
  imported = checkpoint.params_only(manager, 0) if manager.all_steps() == [0] else None  # transformer_jax.convert's
  if imported is not None:
    state = dataclasses.replace(run.initial_state(),
                                params=checkpoint.restore_params(manager, 0, run.abstract_state.params, imported))
    logging.info('training starts from the imported params of step 0 in %s', run_dir.checkpoints)
  elif manager.latest_step() is not None:
    if manager.latest_step() > train_cfg.num_steps:
      raise ValueError(f'{run_dir.checkpoints} holds step {manager.latest_step()}, past train.num_steps='
                       f'{train_cfg.num_steps}: nothing to train (nothing was changed); pass a larger '
                       'train.num_steps to continue, or another --workdir.')
    changes = config_lib.changes_since(saved, config) if saved is not None else {}
    config_lib.check_resume(changes, run_dir.path)
    latest, restored, damaged = checkpoint.restore_newest(
        manager, lambda s: checkpoint.restore_state(manager, s, run.abstract_state.as_dict(), train_iter))
    state = steps.TrainState.from_dict(restored)
  else:
    state = run.initial_state()
  if jax.process_index() == 0:
    if damaged:
      logging.warning('set aside damaged checkpoints as %s', checkpoint.set_aside(manager, damaged))
    run_dir.save_config(config)  # only once the checkpoint (if any) matched: a refused config leaves it as it was
  if damaged and jax.process_count() > 1:
    multihost_utils.sync_global_devices('damaged checkpoints set aside')
    manager.reload()
  step = int(jax.device_get(state.step))

  report = reporting.TrainReport(run_dir, model.config, train_cfg.num_steps, step, filter_stats)
  cleanup.callback(report.close)
  if latest is not None:
    changed = ''.join(f'; {key} changed from {old!r} to {new!r}' for key, (old, new) in changes.items())
    report.log(f'resumed from step {latest} in {run_dir.checkpoints}{changed}')

  # --- jitted steps, compiled for every batch shape before the loop
  with run.activate():
    train_fn = _CompiledSteps(run, state, report, step)

  def check_finite(nonfinite: int):
    if nonfinite and train_cfg.on_nonfinite == 'stop':
      raise NonFiniteLossError(
          f'non-finite loss, gradients or update by step {step} ({nonfinite} updates skipped); stopping without '
          f'saving; {checkpoint.last_good(manager)}. Lower the learning rate or set train.on_nonfinite=skip.')

  def save():
    check_finite(report.nonfinite())
    checkpoint.save(manager, step, state.as_dict(), feed.position(), force=True)

  # --- loop
  last, window = {}, DispatchWindow(train_cfg.max_steps_ahead)
  if stop.requested(step):  # a signal during start-up: nothing new to save
    report.log(f'stopped before step {step + 1}: nothing was trained; rerun the same command to start.')
    return {'state': state, 'metrics': {'step': step}}
  feed = device_feed.DeviceFeed(train_iter, mesh)  # batches on the devices ahead of the step
  cleanup.callback(feed.close)
  with run.activate():
    while step < train_cfg.num_steps:
      batch = next(feed)
      state, step_metrics = train_fn(state, batch.device, step)
      step += 1
      report.add(step_metrics, batch.host, batch.waited)
      window.add(step_metrics['loss'])
      checkpoint.check_saves(manager)  # an asynchronous save that failed stops the run here
      stop_requested = stop.requested(step)
      final = step == train_cfg.num_steps
      if step % train_cfg.log_every == 0 or final or stop_requested:
        last = report.flush(step)
        check_finite(last['nonfinite'])
      if step % train_cfg.eval_every == 0 or final:
        start = time.time()
        values = scoring.teacher_forced(ensemble.of_one(model, state.params), run.eval_step, valid_pairs, tok, mesh,
                                        config.eval.batch_size, max_batches=train_cfg.eval_batches,
                                        max_length=model.config.position_limit,
                                        what=f'step {step}: scoring {config.eval.split} (teacher-forced)')
        report.evaluation(step, values)
        last.update({f'eval_{k}': v for k, v in values.items()})
        report.exclude(time.time() - start)
      if final or stop_requested or step % train_cfg.checkpoint_every == 0:
        save()
      if stop_requested:
        checkpoint.check_saves(manager, wait=True)  # on disk before it is reported
        report.log(f'preempted: saved step {step} in {run_dir.checkpoints}; rerun the same command to resume.')
        break
  last['step'] = step
  logging.info('training stopped at step %d', step)
  return {'state': state, 'metrics': last}
