"""The training loop: mesh, input, model, sharded state, jitted step, logging, evals, checkpoints.

Side effects (I/O, logging, checkpoints, signals) live here; the math lives in `steps.py`.
"""

import contextlib
import dataclasses
import functools
import json
import os
import signal
import time

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from transformer_jax import checkpoint
from transformer_jax import metrics as metrics_lib
from transformer_jax import optim
from transformer_jax import sharding
from transformer_jax import steps
from transformer_jax.data import pipeline
from transformer_jax.data import sources
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.metric_writer import MetricWriter, format_duration
from transformer_jax.model import Transformer
from transformer_jax.model_config import ModelConfig

CONFIG_FILE = 'config.json'


class NonFiniteLossError(RuntimeError):
  pass


def check_workdir_writable(workdir: str):
  """Fails before any compilation if the workdir cannot be created or written."""
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f'.write_probe_{jax.process_index()}')
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    raise PermissionError(f'workdir {workdir} is not writable ({e.strerror}): pass a --workdir you can write to.')


def save_config(config: ml_collections.ConfigDict, workdir: str):
  """Writes the resolved config next to the checkpoints, for evaluation and translation."""
  if jax.process_index() == 0:
    with open(os.path.join(workdir, CONFIG_FILE), 'w') as f:
      f.write(config.to_json_best_effort(indent=2))


def load_saved_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f'{path} not found: {workdir} is not a training workdir (pass --config too).')
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
  return ModelConfig.from_dict(config.model)


def load_tokenizer_for_training(config, workdir, train_pairs) -> tokenizer_lib.Tokenizer:
  """Process 0 trains (or reuses) the tokenizer in the workdir; the others wait and load it."""
  if jax.process_index() == 0:
    tok = tokenizer_lib.load_or_train_tokenizer(config.tokenizer, workdir, train_pairs)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('tokenizer ready')
  if jax.process_index() != 0:
    tok = tokenizer_lib.load_tokenizer(workdir)
  tokenizer_lib.check_vocab_size(tok, config.model.vocab_size)
  return tok


def check_batch_layout(pipeline_cfg, mesh):
  """Every global batch must split evenly over the data-parallel devices (mesh data × fsdp)."""
  if pipeline_cfg.batching == 'packed':
    sharding.check_batch_divisible(pipeline_cfg.batch_size, mesh, 'pipeline.batch_size')
  else:
    sharding.check_batch_divisible(pipeline_cfg.batch_multiple, mesh, 'pipeline.batch_multiple')


class PreemptionWatcher:
  """Turns SIGTERM/SIGINT into a request to save and stop at the end of the current step.

  With several processes, JAX's preemption sync point makes every host stop at the same step.
  """

  def __init__(self):
    self.requested = False
    self._previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    logging.warning('received signal %d: saving and stopping after this step', signum)
    self.requested = True

  def should_stop(self, step: int) -> bool:
    if jax.process_count() > 1:
      synced = multihost_utils.reached_preemption_sync_point(step)
      return synced or bool(multihost_utils.process_allgather(np.int32(self.requested)).max())
    return self.requested

  def restore(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


@dataclasses.dataclass
class _Throughput:
  """Accumulates work between two log lines."""

  steps: int = 0
  tokens: int = 0
  flops: float = 0.0
  start: float = dataclasses.field(default_factory=time.time)


class _CompiledSteps:
  """Compiles the train step once per batch shape (token-budget batches have a few) and logs the time."""

  def __init__(self, jitted, writer: MetricWriter):
    self._jitted, self._writer, self._compiled = jitted, writer, {}
    self._seconds = 0.0  # compile time not yet taken out of the throughput window

  def pop_seconds(self) -> float:
    seconds, self._seconds = self._seconds, 0.0
    return seconds

  def __call__(self, state, batch, step: int):
    key = tuple(sorted((k, v.shape) for k, v in batch.items()))
    if key not in self._compiled:
      start = time.time()
      self._compiled[key] = self._jitted.lower(state, batch).compile()
      seconds = time.time() - start
      self._seconds += seconds
      self._writer.write(step, 'compile', {'seconds': seconds})
      self._writer.progress(f'compiled the train step for batch {dict(key)["inputs"]} in {seconds:.1f}s')
    return self._compiled[key](state, batch)


def evaluate(config, params, eval_fn, pairs, tok, mesh, max_batches=None) -> dict:
  """Teacher-forced loss, perplexity and token accuracy over (a prefix of) a split; used by training and eval."""
  totals = {k: 0.0 for k in metrics_lib.SUM_KEYS}
  batches = pipeline.make_eval_batches(pairs, tok, config.eval.batch_size, process_index=jax.process_index(),
                                       process_count=jax.process_count())
  for i, batch in enumerate(batches):
    if max_batches is not None and i >= max_batches:
      break
    batch = sharding.place_batch({k: v for k, v in batch.items() if k != 'example_index'}, mesh)
    sums = jax.device_get(eval_fn(params, batch))
    totals = {k: totals[k] + float(sums[k]) for k in totals}
  return metrics_lib.normalize(totals)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains `config` in `workdir`, resuming from its latest checkpoint; returns the last metrics."""
  check_workdir_writable(workdir)
  with contextlib.ExitStack() as cleanup:  # writer, checkpoints and signal handlers are released on any exit
    return _train(config, workdir, cleanup)


def _train(config: ml_collections.ConfigDict, workdir: str, cleanup: contextlib.ExitStack) -> dict:
  train_cfg = config.train
  writer = MetricWriter(workdir, enabled=jax.process_index() == 0)
  cleanup.callback(writer.close)

  # --- mesh and sharding rules
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.rules_from_config(config.mesh)
  check_batch_layout(config.pipeline, mesh)

  # --- input
  train_pairs = sources.load_split(config.data, 'train')
  valid_pairs = sources.load_split(config.data, config.eval.split)
  tok = load_tokenizer_for_training(config, workdir, train_pairs)
  # With worker processes the filter counts live (and are logged) in the workers: no metric claims them here.
  filter_stats = None if config.pipeline.num_workers else pipeline.FilterStats()
  train_ds = pipeline.make_train_dataset(train_pairs, tok, config.pipeline, process_index=jax.process_index(),
                                         process_count=jax.process_count(), filter_stats=filter_stats)
  train_iter = iter(train_ds)

  # --- model, optimizer, sharded state
  mcfg = model_config(config)
  model = Transformer(mcfg)
  schedule = optim.make_schedule(train_cfg, mcfg.d_model)
  tx = optim.make_optimizer(train_cfg, mcfg.d_model)
  batch_shape = (sharding.data_parallel_size(mesh), 8)  # any shape: params do not depend on it
  abstract, state_shardings = steps.abstract_state_and_shardings(model, tx, train_cfg.seed, batch_shape, mesh, rules)

  # --- checkpoint: resume if the workdir has one
  manager = checkpoint.make_manager(workdir, save_every=train_cfg.checkpoint_every,
                                    keep=train_cfg.keep_checkpoints, async_save=train_cfg.async_checkpoints)
  cleanup.callback(manager.close)
  cleanup.callback(manager.wait_until_finished)  # runs first: callbacks run last-in, first-out
  latest = manager.latest_step()
  if latest is not None:
    restored = checkpoint.restore_state(manager, latest, abstract.as_dict(), train_iter)
    state = steps.TrainState.from_dict(restored)
    writer.progress(f'resumed from step {latest} in {checkpoint.checkpoint_dir(workdir)}')
  else:
    state, _ = steps.create_sharded_state(model, tx, train_cfg.seed, batch_shape, mesh, rules)
  save_config(config, workdir)  # only once the checkpoint (if any) matched: a refused config leaves it as it was

  # --- jitted steps
  batch_sharding = sharding.batch_sharding(mesh)
  train_fn = jax.jit(
      functools.partial(steps.train_step, model=model, tx=tx, schedule=schedule,
                        smoothing=train_cfg.label_smoothing, grad_accum_steps=train_cfg.grad_accum_steps),
      in_shardings=(state_shardings, batch_sharding), out_shardings=(state_shardings, None), donate_argnums=0)
  eval_fn = jax.jit(functools.partial(steps.eval_step, model=model, smoothing=train_cfg.label_smoothing),
                    in_shardings=(state_shardings.params, batch_sharding))
  compiled = _CompiledSteps(train_fn, writer)

  # --- loop
  peak = metrics_lib.peak_flops_per_device(jax.devices()[0])
  watcher = PreemptionWatcher()
  cleanup.callback(watcher.restore)
  step = int(jax.device_get(state.step))
  pending, window = [], _Throughput()
  last = {}
  start_time, start_step = time.time(), step
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    while step < train_cfg.num_steps:
      host_batch = next(train_iter)
      batch = sharding.place_batch(host_batch, mesh)
      state, step_metrics = compiled(state, batch, step)
      window.start += compiled.pop_seconds()  # compile time is logged on its own, not as step time
      step += 1
      pending.append(step_metrics)
      window.steps += 1
      window.tokens += int(np.count_nonzero(host_batch['inputs']) + np.count_nonzero(host_batch['targets'])) \
          * jax.process_count()
      window.flops += metrics_lib.train_flops(mcfg, batch['inputs'].shape[0], batch['inputs'].shape[1],
                                              batch['targets'].shape[1])
      stop = watcher.should_stop(step)
      if step % train_cfg.log_every == 0 or step == train_cfg.num_steps or stop:
        last = _log_train(writer, step, pending, window, train_cfg, peak, start_time, start_step, filter_stats)
        _check_finite(last, step, train_cfg, manager)
        pending, window = [], _Throughput()
      if step % train_cfg.eval_every == 0 or step == train_cfg.num_steps:
        eval_start = time.time()
        eval_metrics = evaluate(config, state.params, eval_fn, valid_pairs, tok, mesh, train_cfg.eval_batches)
        writer.write(step, 'eval', eval_metrics)
        writer.progress(f'step {step}: eval loss {eval_metrics["loss"]:.4f}  nll {eval_metrics["nll"]:.4f}  '
                        f'accuracy {eval_metrics["accuracy"]:.3f}')
        last.update({f'eval_{k}': v for k, v in eval_metrics.items()})
        window.start += time.time() - eval_start  # nor is evaluation
      if stop or step == train_cfg.num_steps:
        if pending:
          last = _log_train(writer, step, pending, window, train_cfg, peak, start_time, start_step, filter_stats)
          _check_finite(last, step, train_cfg, manager)
        checkpoint.save(manager, step, state.as_dict(), train_iter, force=True)
        if stop:
          writer.progress(f'preempted: saved step {step} in {checkpoint.checkpoint_dir(workdir)}; '
                          'rerun the same command to resume.')
          break
      else:
        if step % train_cfg.checkpoint_every == 0:
          _check_finite(_fetch(pending, last), step, train_cfg, manager)
          checkpoint.save(manager, step, state.as_dict(), train_iter, force=True)
  last['step'] = step
  return {'state': state, 'metrics': last, 'tokenizer': tok, 'model': model, 'mesh': mesh}


def _fetch(pending, last):
  if not pending:
    return last
  return {'nonfinite': int(sum(int(m['nonfinite']) for m in jax.device_get(pending)))}


def _check_finite(metrics: dict, step: int, train_cfg, manager):
  if metrics.get('nonfinite', 0) and train_cfg.on_nonfinite == 'stop':
    raise NonFiniteLossError(
        f'non-finite loss, gradients or update by step {step} ({metrics["nonfinite"]} updates skipped); stopping '
        f'without saving. The last good checkpoint is step {manager.latest_step()}; lower the learning rate or set '
        'train.on_nonfinite=skip.')


def _log_train(writer, step, pending, window, train_cfg, peak, start_time, start_step, filter_stats) -> dict:
  fetched = jax.device_get(pending)
  sums = {k: sum(float(m[k]) for m in fetched) for k in metrics_lib.SUM_KEYS}
  elapsed = max(time.time() - window.start, 1e-9)
  devices = jax.device_count()
  out = metrics_lib.normalize(sums)
  out.update({
      'grad_norm': float(np.mean([m['grad_norm'] for m in fetched])),
      'learning_rate': float(fetched[-1]['learning_rate']),
      'nonfinite': int(sum(int(m['nonfinite']) for m in fetched)),
      'step_seconds': elapsed / max(window.steps, 1),
      'tokens_per_second': window.tokens / elapsed,
      'gflops_per_second_per_device': window.flops / elapsed / devices / 1e9,
  })
  if filter_stats is not None:
    out['dropped_examples'] = filter_stats.dropped
  if peak:
    out['mfu'] = window.flops / elapsed / devices / peak
  writer.write(step, 'train', out)
  done = (step - start_step) / max(time.time() - start_time, 1e-9)
  eta = (train_cfg.num_steps - step) / max(done, 1e-9)
  mfu = f'  mfu {100 * out["mfu"]:.1f}%' if peak else f'  {out["gflops_per_second_per_device"]:.1f} GFLOP/s/dev'
  writer.progress(f'step {step}/{train_cfg.num_steps}  loss {out["loss"]:.4f}  lr {out["learning_rate"]:.2e}  '
                  f'{out["tokens_per_second"]:,.0f} tok/s{mfu}  ETA {format_duration(eta)}')
  return out
