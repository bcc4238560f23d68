"""The training step and loop: the label-smoothed loss per non-pad token (by hand), accuracy and perplexity;
dropout randomness that depends on the step only; non-finite updates that are never applied, never saved,
and stop the loop with a message (or are skipped); the logs; and one-line errors for bad input."""

import functools
import glob
import io
import itertools
import json
import logging
import math
import os
import shutil
import signal
import struct
import subprocess
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

import helpers
from transformer_jax.config import pipeline as pipeline_section
from transformer_jax.core import stops
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import pipeline, sources
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.jobs import preemption, reporting, trainer
from transformer_jax.model import loss as loss_lib
from transformer_jax.runtime import sharding
from transformer_jax.training import checkpoint, metrics, steps

# --- loss, accuracy, perplexity


def test_label_smoothed_cross_entropy_by_hand():
  # Uniform logits over V=3: every log-prob is -log 3. The smoothed target (ε=0.1) puts 0.9 on the gold
  # token and 0.05 on each other; the loss is its cross-entropy minus its entropy (so a perfect model
  # scores 0): log 3 - H(0.9, 0.05, 0.05).
  logits = jnp.zeros((1, 2, 3))
  targets = jnp.array([[2, 1]])
  loss, nll, _ = loss_lib.cross_entropy(logits, targets, 0.1)
  entropy = -(0.9 * math.log(0.9) + 2 * 0.05 * math.log(0.05))
  np.testing.assert_allclose(loss, [[math.log(3) - entropy] * 2], rtol=1e-6)  # ≈ 0.7042
  np.testing.assert_allclose(nll, [[math.log(3)] * 2], rtol=1e-6)
  # A confident correct prediction: p(gold) = e^4 / (e^4 + 2) under logits (4, 0, 0).
  logits = jnp.array([[[4.0, 0.0, 0.0]]])
  p = np.exp([4.0, 0.0, 0.0]) / np.exp([4.0, 0.0, 0.0]).sum()
  loss, nll, _ = loss_lib.cross_entropy(logits, jnp.array([[0]]), 0.1)
  by_hand = -(0.9 * np.log(p[0]) + 0.05 * np.log(p[1]) + 0.05 * np.log(p[2])) - entropy
  np.testing.assert_allclose(loss, [[by_hand]], rtol=1e-5)
  np.testing.assert_allclose(nll, [[-np.log(p[0])]], rtol=1e-5)
  # ε = 0: plain cross-entropy.
  loss, nll, _ = loss_lib.cross_entropy(logits, jnp.array([[0]]), 0.0)
  np.testing.assert_allclose(loss, nll)


def test_token_metrics_count_non_pad_tokens_only():
  rng = np.random.default_rng(0)
  vocab = 7
  logits = rng.normal(size=(2, 4, vocab)).astype(np.float32)
  targets = np.array([[3, 5, 1, 0], [6, 0, 0, 0]])  # 4 real tokens, 4 pads
  logits[targets == 0] = 1e4 * rng.normal(size=(4, vocab))  # whatever the model says at pads does not count
  sums = jax.device_get(metrics.token_metrics(jnp.asarray(logits), jnp.asarray(targets), 0.1))
  real = targets > 0
  log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  gold = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
  q_other = 0.1 / (vocab - 1)
  smoothed = -(0.9 * gold + q_other * (log_probs.sum(-1) - gold)) \
      + (0.9 * np.log(0.9) + (vocab - 1) * q_other * np.log(q_other))
  assert float(sums['tokens']) == 4
  np.testing.assert_allclose(sums['nll'], -gold[real].sum(), rtol=1e-5)
  np.testing.assert_allclose(sums['loss'], smoothed[real].sum(), rtol=1e-5)
  assert float(sums['correct']) == np.sum((logits.argmax(-1) == targets) & real)
  normalized = metrics.normalize(sums)  # per non-pad token
  np.testing.assert_allclose(normalized['loss'], smoothed[real].mean(), rtol=1e-5)
  np.testing.assert_allclose(normalized['nll'], -gold[real].mean(), rtol=1e-5)
  np.testing.assert_allclose(normalized['perplexity'], np.exp(-gold[real].mean()), rtol=1e-5)
  assert normalized['accuracy'] == np.sum((logits.argmax(-1) == targets) & real) / 4


def test_accuracy_and_perplexity_of_a_perfect_prediction():
  targets = jnp.array([[4, 5, 6, 0]])
  logits = 50.0 * jax.nn.one_hot(targets, 8)
  normalized = metrics.normalize(metrics.token_metrics(logits, targets, 0.0))
  assert normalized['accuracy'] == 1.0
  assert normalized['perplexity'] == pytest.approx(1.0, abs=1e-6)
  assert normalized['loss'] == pytest.approx(0.0, abs=1e-6)
  assert metrics.normalize({'loss': 0.0, 'nll': 0.0, 'correct': 0.0, 'tokens': 0.0})['loss'] == 0.0  # no tokens


# --- the train step: dropout randomness and non-finite updates


@functools.lru_cache(maxsize=None)
def _step_setup(settings: str, **overrides):
  """Model, 1-device mesh, initial state and jitted train step for helpers.DROPOUT_STEP / NO_DROPOUT_STEP."""
  config = helpers.tiny_config(**{**getattr(helpers, settings), **overrides})
  model, tx, schedule = helpers.train_objects(config)
  mesh, rules = helpers.one_device_mesh(config)
  state, shardings = steps.create_sharded_state(model, tx, config.train.seed, (helpers.STEP_ROWS, 8), mesh, rules,
                                                shard_optimizer=True)
  step_fn = helpers.jitted_train_step(config, model, tx, schedule, shardings, mesh)
  batches = [sharding.place_batch(b, mesh) for b in helpers.synthetic_batches(3, helpers.STEP_ROWS,
                                                                              helpers.STEP_LENGTH, seed=1)]

  def run(state, batch):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return step_fn(state, batch)

  return config, model, mesh, rules, state, run, batches


def _mean_loss(m):
  return float(m['loss']) / float(m['tokens'])


def test_dropout_randomness_is_fold_in_of_the_step():
  config, model, mesh, rules, initial, run, batches = _step_setup('DROPOUT_STEP')
  batch = batches[0]
  at = lambda state, step: state.replace(step=jnp.asarray(step, jnp.int32))
  same = [_mean_loss(run(at(initial, 5), batch)[1]) for _ in range(2)]
  assert same[0] == same[1]  # deterministic
  other_step = _mean_loss(run(at(initial, 6), batch)[1])
  assert abs(other_step - same[0]) > 1e-4  # same params and batch, another step: other dropout masks
  # History: three updates leave the rng untouched; step 5's masks are fold_in(rng, 5) whatever came before.
  state = initial
  for b in batches:
    state, _ = run(state, b)
  np.testing.assert_array_equal(jax.device_get(state.rng), jax.device_get(initial.rng))

  @jax.jit
  def forward(params, step):  # the model with dropout rng fold_in(initial rng, step), outside train_step
    rng = jax.random.fold_in(jax.random.wrap_key_data(initial.rng), step)
    logits = model.apply({'params': params}, **steps.model_inputs(batch), deterministic=False, rngs={'dropout': rng})
    return metrics.token_metrics(logits, batch['targets'], config.train.label_smoothing)

  def by_hand(params, step):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return _mean_loss(forward(params, step))

  np.testing.assert_allclose(by_hand(initial.params, 5), same[0], rtol=1e-5)
  trained_at_5 = _mean_loss(run(at(state, 5), batch)[1])
  np.testing.assert_allclose(by_hand(state.params, 5), trained_at_5, rtol=1e-5)
  assert abs(by_hand(state.params, 6) - trained_at_5) > 1e-4


def test_a_non_finite_loss_is_not_applied():
  _, _, _, _, initial, run, batches = _step_setup('NO_DROPOUT_STEP')
  state, m = run(initial, batches[0])
  assert int(m['nonfinite']) == 0 and int(state.step) == 1
  assert not np.allclose(jax.device_get(state.params['encoder']['layer_0']['ffn']['wi']['kernel']),
                         jax.device_get(initial.params['encoder']['layer_0']['ffn']['wi']['kernel']))
  # One NaN weight makes the loss NaN: the step counts, but params and optimizer state stay as they were.
  kernel = state.params['encoder']['layer_0']['ffn']['wi']['kernel']
  poisoned = state.replace(params=jax.tree.map(lambda x: x, state.params))
  poisoned.params['encoder']['layer_0']['ffn']['wi']['kernel'] = kernel.at[0, 0].set(jnp.nan)
  after, m = run(poisoned, batches[1])
  assert int(m['nonfinite']) == 1 and not np.isfinite(float(m['loss']))
  assert int(after.step) == 2
  equal_nan = functools.partial(np.testing.assert_array_equal, strict=True)
  jax.tree.map(equal_nan, jax.device_get(after.params), jax.device_get(poisoned.params))
  jax.tree.map(equal_nan, jax.device_get(after.opt_state), jax.device_get(state.opt_state))


@pytest.mark.filterwarnings('ignore:overflow encountered in cast:RuntimeWarning')
def test_an_infinite_learning_rate_is_not_applied():
  # The gradients and loss are finite; the learning rate overflows float32, so the update would be infinite.
  _, _, _, _, initial, run, batches = _step_setup('NO_DROPOUT_STEP', train__learning_rate=1e39)
  after, m = run(initial, batches[0])
  assert int(m['nonfinite']) == 1 and np.isfinite(float(m['loss'])) and np.isfinite(float(m['grad_norm']))
  assert int(after.step) == 1
  equal = functools.partial(np.testing.assert_array_equal, strict=True)
  jax.tree.map(equal, jax.device_get(after.params), jax.device_get(initial.params))
  jax.tree.map(equal, jax.device_get(after.opt_state), jax.device_get(initial.opt_state))


# --- the loop: logs, non-finite stop/skip


SLOW_COMPILE = 1000.0  # seconds every compile seems to take on the loop's clock


class _SkewedClock:
  """The `time` module as the loop and its report read it: real time plus `skew` seconds."""

  def __init__(self):
    self.skew = 0.0

  def time(self) -> float:
    return time.time() + self.skew


@pytest.fixture(scope='module')
def good_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('good'))
  config = helpers.tiny_config(train__num_steps=4, train__checkpoint_every=2, train__keep_checkpoints=3)
  compile_, clock = jax.stages.Lowered.compile, _SkewedClock()

  def slow_compile(self, *args, **kwargs):  # so that the logs must tell compile time from step time
    clock.skew += SLOW_COMPILE
    return compile_(self, *args, **kwargs)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(jax.stages.Lowered, 'compile', slow_compile)
    patch.setattr(trainer, 'time', clock)
    patch.setattr(reporting, 'time', clock)
    result = trainer.train_and_evaluate(config, workdir)
  assert result['metrics']['step'] == 4
  return workdir


def _events(workdir):
  """(tag, step, value) of every scalar in the workdir's TensorBoard event files."""
  files = glob.glob(os.path.join(workdir, 'tensorboard', 'events.out.tfevents.*'))
  assert files, os.listdir(workdir)
  scalars = []
  for path in files:
    with open(path, 'rb') as f:
      data = f.read()
    offset = 0
    while offset < len(data):  # TFRecord: length, crc, payload, crc
      (length,) = struct.unpack('<Q', data[offset:offset + 8])
      event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
      offset += 12 + length + 4
      for value in event.summary.value:
        scalars.append((value.tag, event.step, value.simple_value))
  return scalars


@pytest.mark.slow
def test_logs_hold_the_training_metrics(good_run):
  train = helpers.read_metrics(good_run)
  assert [r['step'] for r in train] == [1, 2, 3, 4]
  for key in ('loss', 'nll', 'perplexity', 'accuracy', 'learning_rate', 'grad_norm', 'tokens_per_second',
              'step_seconds', 'gflops_per_second_per_device', 'nonfinite', 'input_wait_share'):
    assert all(np.isfinite(r[key]) for r in train), key
  assert all(0 <= r['input_wait_share'] <= 1 for r in train)
  assert all(r['tokens_per_second'] > 0 and r['step_seconds'] > 0 and r['gflops_per_second_per_device'] > 0
             and r['grad_norm'] > 0 for r in train)
  assert all(isinstance(r['dropped_examples'], int) and r['dropped_examples'] >= 0 for r in train)
  # The paper's schedule as logged: scale · d_model^-0.5 · min(s^-0.5, s · warmup^-1.5) at step s.
  scale = helpers.tiny_config().train.learning_rate_scale  # 2 in configs/default.py; d_model 16, warmup 4
  for r in train:
    s = r['step']
    assert r['learning_rate'] == pytest.approx(scale * 16 ** -0.5 * min(s ** -0.5, s * 4 ** -1.5), rel=1e-5)
  (compile_record,) = helpers.read_metrics(good_run, 'compile')  # compile time separately, once
  assert compile_record['seconds'] >= SLOW_COMPILE and compile_record['step'] == 0
  assert train[0]['step_seconds'] < SLOW_COMPILE  # the first step's time leaves the compilation out
  (evaluation,) = helpers.read_metrics(good_run, 'eval')
  assert evaluation['step'] == 4 and np.isfinite(evaluation['loss'])
  events = _events(good_run)
  tags = {tag for tag, _, _ in events}
  assert {'train/loss', 'train/learning_rate', 'train/tokens_per_second', 'train/grad_norm', 'train/step_seconds',
          'train/gflops_per_second_per_device', 'compile/seconds', 'eval/loss'} <= tags
  tb_loss = {step: value for tag, step, value in events if tag == 'train/loss'}
  assert tb_loss == pytest.approx({r['step']: r['loss'] for r in train}, rel=1e-6)


@pytest.mark.slow
def test_worker_processes_claim_no_drop_count_and_a_resumed_run_keeps_their_number(tmp_path):
  # The workers filter (and log) on their own copies of the counts; the trainer's copy would read 0.
  workdir = str(tmp_path / 'workers')
  config = helpers.tiny_config(train__num_steps=2, pipeline__num_workers=1)
  with helpers.absl_flags_parsed(True):
    result = trainer.train_and_evaluate(config, workdir)
  train = helpers.read_metrics(workdir)
  assert result['metrics']['step'] == 2 and [r['step'] for r in train] == [1, 2]
  assert all(np.isfinite(r['loss']) and 'dropped_examples' not in r for r in train)
  # The batch sequence depends on the number of workers: resumed with num_workers=-1 (which on CPU devices alone
  # would choose none, and could not restore the workers' position), the run keeps the one it started with.
  config = helpers.tiny_config(train__num_steps=4)
  assert config.pipeline.num_workers == pipeline_section.AUTO_WORKERS
  with helpers.absl_flags_parsed(True):
    result = trainer.train_and_evaluate(config, workdir)
  train = helpers.read_metrics(workdir)
  assert result['metrics']['step'] == 4 and [r['step'] for r in train] == [1, 2, 3, 4]
  assert all('dropped_examples' not in r for r in train) and Workdir(workdir).load_config().pipeline.num_workers == 1


def _copy_run(good_run, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(good_run, workdir)
  return workdir


# An infinite learning rate (1e40 overflows float32): loss and gradients stay finite, the update does not.
BLOW_UP = {'train__learning_rate_scale': 1e40, 'train__checkpoint_every': 2, 'train__keep_checkpoints': 3}
overflow_ok = pytest.mark.filterwarnings('ignore:overflow encountered in cast:RuntimeWarning')


@overflow_ok
@pytest.mark.slow
def test_non_finite_stops_with_a_message_and_keeps_the_last_good_checkpoint(good_run, tmp_path):
  workdir = _copy_run(good_run, tmp_path)
  before = helpers.tree_digest(Workdir(workdir).checkpoints)
  with pytest.raises(trainer.NonFiniteLossError) as error:
    trainer.train_and_evaluate(helpers.tiny_config(train__num_steps=8, **BLOW_UP), workdir)
  message = str(error.value)
  assert 'non-finite' in message and 'by step 5' in message and 'last good checkpoint is step 4' in message
  assert helpers.tree_digest(Workdir(workdir).checkpoints) == before  # nothing saved, nothing removed
  assert helpers.read_metrics(workdir)[-1]['step'] == 5 and helpers.read_metrics(workdir)[-1]['nonfinite'] == 1


@overflow_ok
@pytest.mark.slow
def test_non_finite_skip_mode_never_applies_or_saves_it(good_run, tmp_path):
  workdir = _copy_run(good_run, tmp_path)
  config = helpers.tiny_config(train__num_steps=6, train__on_nonfinite='skip', **BLOW_UP)
  result = trainer.train_and_evaluate(config, workdir)
  assert result['metrics']['step'] == 6
  records = helpers.read_metrics(workdir)
  assert [(r['step'], r['nonfinite']) for r in records[-2:]] == [(5, 1), (6, 1)]
  assert helpers.checkpoint_steps(workdir) == [2, 4, 6]
  manager = checkpoint.make_manager(Workdir(workdir).checkpoints, create=False, async_save=False)
  try:
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            result['state'].params)
    saved_6 = jax.device_get(checkpoint.restore_params(manager, 6, abstract))
    saved_4 = jax.device_get(checkpoint.restore_params(manager, 4, abstract))
  finally:
    manager.close()
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(saved_6))
  jax.tree.map(np.testing.assert_array_equal, saved_6, saved_4)  # both updates skipped


# --- bad input: one-line errors


@pytest.mark.slow
def test_unknown_config_key_on_the_command_line(entry_points, tmp_path):
  """The key is named in full (not only its last part), with the closest keys and those of its section."""
  for override, expected in (
      ('model.foo', 'the config has no key model.foo; valid keys of model: activation, architecture, '),
      ('train.num_step', 'the config has no key train.num_step; did you mean train.num_steps or train.warmup_steps? '
                         'valid keys of train: adam_b1, '),
      ('modl.d_model', 'the config has no key modl; did you mean model? valid keys of the config: data, decode, eval, '
                       'mesh, model, pipeline, tokenizer, train.'),
      ('model.d_model.x', 'model.d_model is a value (int), not a section with keys.')):
    result = entry_points.run(helpers.train_args(str(tmp_path / 'unused'), f'--config.{override}=1'),
                              text=True)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f'FATAL Flags parsing error: --config.{override}: {expected}'), lines[0]
    assert not os.path.exists(tmp_path / 'unused')


def test_mesh_that_does_not_match_the_devices(tmp_path):
  config = helpers.tiny_config(mesh__shape={'data': 3, 'fsdp': 1, 'tensor': 1})
  with pytest.raises(ValueError, match=r"mesh.shape=.* uses 3 devices but 8 are available") as error:
    trainer.train_and_evaluate(config, str(tmp_path))
  assert '\n' not in str(error.value)


def test_batch_that_does_not_divide_over_the_data_axes(tmp_path):
  config = helpers.tiny_config(pipeline__batch_size=12, pipeline__batch_multiple=4)
  with pytest.raises(ValueError, match=r'pipeline.batch_size: a global batch of 12 rows does not divide over '
                                       r'the 8 data-parallel devices') as error:
    trainer.train_and_evaluate(config, str(tmp_path))
  assert '\n' not in str(error.value)


def test_unwritable_workdir_fails_before_any_work(tmp_path, monkeypatch):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')

  def must_not_run(*args, **kwargs):
    raise AssertionError('the workdir should have been checked first')

  monkeypatch.setattr(jax, 'jit', must_not_run)
  monkeypatch.setattr(sources, 'load_split', must_not_run)
  with pytest.raises(PermissionError, match=r'workdir .*a_file/run is not writable') as error:
    trainer.train_and_evaluate(helpers.tiny_config(), str(blocker / 'run'))
  assert '\n' not in str(error.value)


def test_the_dispatch_window_waits_for_the_oldest_step_only():
  waited = []

  class Output:
    def __init__(self, step):
      self.step = step

    def block_until_ready(self):
      waited.append(self.step)
      return self

  window = trainer.DispatchWindow(2)
  for step in range(1, 6):
    window.add(Output(step))
    assert waited == list(range(1, max(step - 2, 0) + 1))  # the host never has more than 2 steps in flight


@pytest.mark.slow
def test_every_bucket_shape_compiles_before_the_first_step(tmp_path):
  """Token budgets with four length buckets: one compile record, before step 1, for all four shapes."""
  workdir = str(tmp_path / 'buckets')
  trainer.train_and_evaluate(helpers.tiny_config(pipeline__batching='token_budget', train__num_steps=6), workdir)
  with open(Workdir(workdir).metrics_file) as f:
    records = [json.loads(line) for line in f]
  compiles = [r for r in records if r['split'] == 'compile']
  assert [r['step'] for r in compiles] == [0]
  widths = {len(batch['inputs'][0]) for batch in itertools.islice(iter(pipeline.make_train_dataset(
      sources.load_split(helpers.tiny_config().data, 'train'), tokenizer_lib.load_tokenizer(
          Workdir(workdir).tokenizer_model), helpers.tiny_config(pipeline__batching='token_budget').pipeline)), 40)}
  assert len(widths) > 1  # the run did meet several bucket shapes, none of them compiled mid-run


@pytest.mark.slow
def test_train_py_keeps_compiled_programs_beside_the_workdir_by_default(tmp_path):
  env = {k: v for k, v in helpers.subprocess_env().items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  workdir = tmp_path / 'run'
  result = subprocess.run(helpers.train_command(str(workdir), train__num_steps=4), cwd=helpers.REPO, env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  cache = tmp_path / 'jax_compilation_cache'
  assert f'compilation cache: {cache}' in result.stderr
  assert any(cache.iterdir())  # the train step (and more) stored for the next run


def test_a_signal_during_the_final_report_stops_it_at_the_next_safe_point_and_nowhere_else():
  """The handler never raises into what runs (here a line being logged, whose handler catches every Exception; as
  well an orbax restore or a compile): the request is remembered, and the report stops at its next safe point
  (`stops.here`). Outside the report, a safe point does nothing."""

  class SignalledWhileFlushing(logging.StreamHandler):
    def flush(self):
      os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode, inside emit's try
      super().flush()

  logger = logging.getLogger('test_signal_while_logging')
  stream = io.StringIO()
  handler = SignalledWhileFlushing(stream)
  logger.addHandler(handler)
  logger.propagate = False
  try:
    with preemption.StopRequest() as stop:
      with pytest.raises(preemption.StopRequested, match='signal 15'):
        with stop.at_safe_points():
          logger.warning('a line of the final report')
          logger.warning('and the next one')  # the signal came: nothing raised where it was handled
          stops.here()
      assert stream.getvalue() == 'a line of the final report\nand the next one\n'
      assert stop.requested(step=1)  # and the request is remembered
      stops.here()  # outside the report
      with pytest.raises(preemption.StopRequested):  # a signal that came before the report stops it at once
        with stop.at_safe_points():
          pass
  finally:  # else logging.shutdown flushes it as pytest exits, and the SIGTERM kills pytest (exit status 143)
    logger.removeHandler(handler)
  with preemption.StopRequest() as stop:  # where the report may block for good (reading a file): at once
    went_on = False
    with pytest.raises(preemption.StopRequested), stop.at_safe_points(), stops.interruptible():
      os.kill(os.getpid(), signal.SIGTERM)
      went_on = True
    assert not went_on and stops.at_once() == 0
