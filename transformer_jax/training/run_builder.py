"""The one builder of a training run's compiled parts, used by the trainer, `--compile_only` (`aot`) and bench/:
from a config and the devices it will run on, the mesh and rules, the model, optimizer and schedule, the abstract
state and its shardings, the jitted train and eval steps and every batch shape they are called with.

The platform is chosen here, once, from the devices: the model's kernels are those of the mesh's platform
(`ModelConfig.platform`, `config/platform.py`), so a program built here for a TPU slice on a CPU host is the one
the TPU runs.
"""

import dataclasses

import flax.linen as nn
import jax
import ml_collections
import optax

from transformer_jax.data import pipeline
from transformer_jax.model import ensemble
from transformer_jax.runtime import sharding
from transformer_jax.training import steps


@dataclasses.dataclass(frozen=True)
class Run:
  """A training run's compiled parts for one config on one set of devices."""

  config: ml_collections.ConfigDict
  mesh: jax.sharding.Mesh
  rules: tuple
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract_state: steps.TrainState  # ShapeDtypeStructs with their shardings
  state_shardings: steps.TrainState
  train_step: steps.TrainStep  # (state, batch) -> (state, metrics); the state donated (`steps.donates_params`)
  eval_step: jax.stages.Wrapped  # (members, batch) -> token sums
  train_batch_shapes: tuple[dict[str, tuple[int, int]], ...]  # global shapes of every training batch
  eval_batch_shape: dict[str, tuple[int, int]]  # the widest evaluation batch

  def activate(self):
    """The context every step of this run is traced and run in (its mesh and logical-axis rules)."""
    return sharding.activate(self.mesh, self.rules)

  def initial_state(self) -> steps.TrainState:
    """The seeded initial state, created in its sharded layout."""
    return steps.sharded_initial_state(self.model, self.tx, self.config.train.seed, _init_shape(self.mesh),
                                       self.state_shardings)

  def abstract_batch(self, shapes: dict[str, tuple[int, int]]) -> dict[str, jax.ShapeDtypeStruct]:
    """A batch of `shapes` as the steps receive it (int32, split over data × fsdp), without data."""
    batch_sharding = sharding.batch_sharding(self.mesh)
    return {key: jax.ShapeDtypeStruct(shape, jax.numpy.int32, sharding=batch_sharding)
            for key, shape in shapes.items()}

  @property
  def eval_members(self) -> tuple[ensemble.Member, ...]:
    """The eval step's first argument for this run's own params, abstract."""
    return ensemble.of_one(self.model, self.abstract_state.params)


def _init_shape(mesh) -> tuple[int, int]:
  return sharding.data_parallel_size(mesh), 8  # any shape: the params do not depend on it


def build(config: ml_collections.ConfigDict, devices=None) -> Run:
  """The run of `config` on `devices` (default: all of this process's JAX devices; for `--compile_only`, a TPU
  slice's compile-only devices). Every batch size is checked against the mesh first. The batch shapes are those
  the hosts of `devices` make together (token-budget rows split over every host)."""
  devices = jax.devices() if devices is None else list(devices)
  mesh, rules = sharding.mesh_and_rules(config.mesh, devices)
  sharding.check_batches(config, mesh)
  model, tx, schedule = steps.training_objects(config, sharding.mesh_platform(mesh))
  shard_optimizer = sharding.shards_optimizer(config.mesh.shard_optimizer, mesh)
  abstract, shardings = steps.abstract_state_and_shardings(model, tx, config.train.seed, _init_shape(mesh), mesh,
                                                           rules, shard_optimizer=shard_optimizer)
  sides = ('targets',) if model.config.decoder_only else pipeline.SIDES
  process_count = len({device.process_index for device in devices})
  train_shapes = tuple(pipeline.batch_shapes(config.pipeline, sides, process_count))
  eval_shape = {key: (config.eval.batch_size, pipeline.padded_length(model.config.max_len)) for key in train_shapes[0]}
  return Run(config=config, mesh=mesh, rules=rules, model=model, tx=tx, schedule=schedule, abstract_state=abstract,
             state_shardings=shardings,
             train_step=steps.jit_train_step(model, tx, schedule, config.train, shardings, mesh,
                                             donate_params=steps.donates_params(mesh, shard_optimizer)),
             eval_step=steps.jit_eval_step(config.train.label_smoothing, ensemble.of_one(model, shardings.params),
                                           mesh),
             train_batch_shapes=train_shapes, eval_batch_shape=eval_shape)
