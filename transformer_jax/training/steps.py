"""The train state and the pure step functions: (state, batch) -> (state, metrics).

Dropout randomness of step s is `fold_in(state.rng, s)`, so a step's randomness does not depend on
history and a resumed run repeats the uninterrupted one. An update whose loss, gradients or learning rate are
not finite is not applied (the state keeps its last finite values); the loop decides whether to stop.
"""

import dataclasses
import functools

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from transformer_jax.config.model import ModelConfig
from transformer_jax.data import pipeline
from transformer_jax.model import ensemble
from transformer_jax.model import loss as loss_lib
from transformer_jax.model import transformer as model_lib
from transformer_jax.runtime import sharding
from transformer_jax.runtime import xla_options
from transformer_jax.training import metrics as metrics_lib
from transformer_jax.training import optim


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState
  rng: jax.Array  # raw uint32 key data (checkpoint friendly)

  def as_dict(self) -> dict:
    return {'step': self.step, 'params': self.params, 'opt_state': self.opt_state, 'rng': self.rng}

  @classmethod
  def from_dict(cls, d: dict) -> 'TrainState':
    return cls(step=d['step'], params=d['params'], opt_state=d['opt_state'], rng=d['rng'])


def model_inputs(batch: dict) -> dict:
  """The model's keyword arguments: a batch's `pipeline.BATCH_KEYS` (other fields, e.g. 'example_index', stay).

  A language model's batches hold only the 'targets' keys, which are its arguments.
  """
  return {key: batch[key] for key in pipeline.BATCH_KEYS if key in batch}


def init_state(model: nn.Module, tx: optax.GradientTransformation, seed: int, batch_shape) -> TrainState:
  """A fresh state with boxed (logically named) params; run under eval_shape or jit."""
  rng = jax.random.key(seed)
  inputs = model_lib.init_inputs(model.config, batch_shape)
  params = model.init({'params': jax.random.fold_in(rng, 0)}, **inputs)['params']
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    rng=jax.random.key_data(jax.random.fold_in(rng, 1)))


def _with_shardings(boxed, shardings):
  """The abstract values of a boxed tree, carrying their NamedShardings."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nn.unbox(boxed), shardings)


def abstract_state_and_shardings(model, tx, seed, batch_shape, mesh, rules, *, shard_optimizer: bool):
  """Shapes and NamedShardings of the train state, computed without allocating it; `shard_optimizer`
  (`mesh.shard_optimizer` as `sharding.shards_optimizer` resolves it): the optimizer state split over the data
  axis too (`sharding.optimizer_shardings`)."""
  with sharding.activate(mesh, rules):
    boxed = jax.eval_shape(functools.partial(init_state, model, tx, seed, batch_shape))
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  if shard_optimizer:
    shardings = shardings.replace(opt_state=sharding.optimizer_shardings(boxed.opt_state, mesh, rules))
  return _with_shardings(boxed, shardings), shardings


def abstract_params(model: nn.Module, mesh, rules):
  """The params' shapes with their NamedShardings on `mesh` (what a checkpoint's params restore onto)."""
  inputs = model_lib.init_inputs(model.config, (1, 2))
  with sharding.activate(mesh, rules):
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), **inputs)['params'])
  return _with_shardings(boxed, sharding.logical_shardings(boxed, mesh, rules))


def create_sharded_state(model, tx, seed, batch_shape, mesh, rules, *,
                         shard_optimizer: bool) -> tuple[TrainState, TrainState]:
  """The initial state, created directly in its sharded layout (no full copy on any one device)."""
  _, shardings = abstract_state_and_shardings(model, tx, seed, batch_shape, mesh, rules,
                                              shard_optimizer=shard_optimizer)
  return sharded_initial_state(model, tx, seed, batch_shape, shardings), shardings


def sharded_initial_state(model, tx, seed, batch_shape, shardings) -> TrainState:
  """The initial state created in `shardings` (`abstract_state_and_shardings`'), each device making its shard."""
  return jax.jit(lambda: nn.unbox(init_state(model, tx, seed, batch_shape)), out_shardings=shardings)()


def _micro_batches(batch: dict, count: int) -> dict:
  """[B, ...] -> [count, B/count, ...] taking every count-th row, so each micro-batch spans all devices."""

  def split(x):
    rows = x.shape[0]
    if rows % count:
      raise ValueError(f'a batch of {rows} rows does not split into train.grad_accum_steps={count} micro-batches.')
    return jnp.swapaxes(x.reshape(rows // count, count, *x.shape[1:]), 0, 1)

  return jax.tree.map(split, batch)


def _loss_sums_and_grads(model, params, batch, rng, smoothing):
  def loss_fn(p):
    hidden, weights, bias = model.apply({'params': p}, **model_inputs(batch), deterministic=False,
                                        rngs={'dropout': rng}, return_hidden=True)
    with jax.named_scope('loss'):  # op names that hlo_costs attributes to the loss
      sums = loss_lib.token_sums(hidden, weights, bias, batch['targets'], smoothing, model.config.loss_chunk_length,
                                 model.config.kernels, model.config.first_output_id)
    return sums['loss'], sums

  (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return sums, grads


def train_step(state: TrainState, batch: dict, *, model: nn.Module, tx: optax.GradientTransformation,
               schedule: optax.Schedule, smoothing: float, grad_accum_steps: int = 1, param_shardings=None):
  """One optimizer update on the per-token mean loss of `batch` (accumulated over micro-batches).

  `param_shardings`: the gradients are laid out as the parameters are before the update, so that a sharded
  optimizer state (ZeRO-1) does not pull its `data` split back into the backward pass."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  if grad_accum_steps == 1:
    sums, grads = _loss_sums_and_grads(model, state.params, batch, rng, smoothing)
  else:
    def accumulate(carry, xs):
      index, micro = xs
      sums, grads = _loss_sums_and_grads(model, state.params, micro, jax.random.fold_in(rng, index), smoothing)
      return jax.tree.map(jnp.add, carry, (sums, grads)), None

    zeros = ({k: jnp.zeros((), jnp.float32) for k in metrics_lib.SUM_KEYS},
             jax.tree.map(jnp.zeros_like, state.params))
    (sums, grads), _ = jax.lax.scan(accumulate, zeros,
                                    (jnp.arange(grad_accum_steps), _micro_batches(batch, grad_accum_steps)))
  if param_shardings is not None:
    grads = jax.lax.with_sharding_constraint(grads, param_shardings)
  with jax.named_scope('optimizer'):  # op names that hlo_costs attributes to the update
    tokens = jnp.maximum(sums['tokens'], 1.0)
    grads = jax.tree.map(lambda g: g / tokens, grads)
    grad_norm = optax.tree.norm(grads)
    learning_rate = schedule(state.step)
    # With adam_eps > 0 (a config check), finite gradients and learning rate make a finite Adam update (a schedule
    # is finite at every step or at none, so this step's rate speaks for the optimizer's count), so the guard is
    # known before the update and each leaf's update and select fuse into one pass over its state.
    finite = jnp.isfinite(sums['loss']) & jnp.isfinite(grad_norm) & jnp.isfinite(learning_rate)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = state.replace(step=state.step + 1, params=keep(params, state.params),
                              opt_state=keep(opt_state, state.opt_state))
  step_metrics = dict(sums, grad_norm=grad_norm, learning_rate=learning_rate, nonfinite=(~finite).astype(jnp.int32))
  return new_state, step_metrics


def eval_step(members: tuple[ensemble.Member, ...], batch: dict, *, smoothing: float) -> dict:
  """Teacher-forced token sums (loss, nll, correct, tokens) of a batch, dropout off, for one model (a member) or
  an ensemble (scored by `ensemble.mean_log_softmax`, as ensemble decoding scores tokens)."""
  log_probs = ensemble.teacher_forced_log_probs(members, model_inputs(batch))
  first_id = max(m.model.config.first_output_id for m in members)
  return metrics_lib.token_metrics(log_probs, batch['targets'], smoothing, first_id)


def training_objects(config, platform: str) -> tuple[nn.Module, optax.GradientTransformation, optax.Schedule]:
  """The model (of `model.architecture`, its kernels those of `platform`), optimizer and learning-rate schedule of
  a run's config."""
  model = model_lib.make_model(ModelConfig.from_dict(config.model, platform))
  d_model = model.config.d_model
  return model, optim.make_optimizer(config.train, d_model), optim.make_schedule(config.train, d_model)


def donates_params(mesh, shard_optimizer: bool) -> bool:
  """Whether the train step donates the parameters to its result (the rest of the state it always donates): not on
  a TPU mesh where the optimizer state is split over a `data` axis of several devices (ZeRO-1). There each step
  gathers the updated parameters into the buffers it read them from, and the TPU compiler then copies every
  parameter before the step (docs/step_costs.md)."""
  return not (shard_optimizer and mesh.shape['data'] > 1 and sharding.mesh_platform(mesh) == 'tpu')


_FIELDS = tuple(field.name for field in dataclasses.fields(TrainState))


def _fields(state: TrainState) -> tuple:
  """The state as the jitted step takes and returns it: each field an argument of its own, in the state's order."""
  return tuple(getattr(state, name) for name in _FIELDS)


def _joined(*values) -> tuple[TrainState, dict]:
  """(*the state's fields, one more value) as (state, that value): the step's arguments or its results."""
  return TrainState(*values[:-1]), values[-1]


@dataclasses.dataclass(frozen=True)
class _Stage:
  """A TrainStep lowered or compiled: jax's stage, compiled and called with (state, batch)."""
  stage: jax.stages.Lowered | jax.stages.Compiled

  def compile(self, compiler_options: dict | None = None) -> '_Stage':
    return _Stage(self.stage.compile(compiler_options))

  def __call__(self, state: TrainState, batch: dict):
    return _joined(*self.stage(*_fields(state), batch))

  def __getattr__(self, name: str):  # as_text, cost_analysis, memory_analysis, ...
    return getattr(self.stage, name)


@dataclasses.dataclass(frozen=True)
class TrainStep:
  """`train_step` jitted, called and lowered with (state, batch); inside, each field of the state is an argument of
  its own, so that whether the parameters are donated is chosen apart from the rest (`donates_params`)."""
  jitted: jax.stages.Wrapped  # (*the state's fields, batch) -> (*the new state's fields, metrics)

  def __call__(self, state: TrainState, batch: dict):
    return _joined(*self.jitted(*_fields(state), batch))

  def lower(self, state: TrainState, batch: dict) -> _Stage:
    return _Stage(self.jitted.lower(*_fields(state), batch))


def jit_train_step(model, tx, schedule, train_config, state_shardings, mesh, *, donate: bool = True,
                   donate_params: bool = True) -> TrainStep:
  """`train_step` jitted: the state keeps its shardings and is donated (`donate`; its parameters only if
  `donate_params` too: `donates_params`), the gradients take the parameters', the batch is split over data × fsdp;
  compiled with the XLA options of the mesh's platform (`xla_options`)."""
  step = functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                           smoothing=train_config.label_smoothing, grad_accum_steps=train_config.grad_accum_steps,
                           param_shardings=state_shardings.params)

  def on_fields(*arguments):
    state, metrics = step(*_joined(*arguments))
    return *_fields(state), metrics

  on_fields.__name__ = 'train_step'  # the program's name, as in its op names: jit(train_step)/...
  donated = tuple(i for i, name in enumerate(_FIELDS) if donate and (donate_params or name != 'params'))
  return TrainStep(jax.jit(on_fields, in_shardings=(*_fields(state_shardings), sharding.batch_sharding(mesh)),
                           out_shardings=(*_fields(state_shardings), None), donate_argnums=donated,
                           compiler_options=xla_options.for_mesh(mesh)))


def jit_eval_step(smoothing: float, members_shardings, mesh):
  """`eval_step` jitted over members with their params' shardings (`ensemble.Member`s holding shardings) and a
  batch split over data × fsdp."""
  return jax.jit(functools.partial(eval_step, smoothing=smoothing),
                 in_shardings=(members_shardings, sharding.batch_sharding(mesh)))
