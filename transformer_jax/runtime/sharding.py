"""Device mesh from config, logical-axis rules, helpers that place states and batches on the mesh, and one that runs a
kernel on each device's block of it (`per_device`).

The model names its axes (`batch`, `length`, `embed`, `heads`, `kv`, `mlp`, `vocab`, `layers`); the config's rules map
them to the mesh axes `data`, `fsdp` and `tensor`, so changing the parallelism is a config change.
"""

import contextlib
import math

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from transformer_jax.config.mesh import MESH_AXES, resolve_shape, rules_from_config


def make_mesh(mesh_config: ml_collections.ConfigDict, devices=None) -> Mesh:
  """A mesh over all (or the given) devices; several slices get a hybrid ICI × DCN layout."""
  devices = jax.devices() if devices is None else list(devices)
  num_slices = len({getattr(d, 'slice_index', 0) for d in devices})
  if num_slices > 1:
    dcn = resolve_shape(mesh_config.dcn_shape, num_slices, 'mesh.dcn_shape')
    ici = resolve_shape(mesh_config.shape, len(devices) // num_slices)
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
  else:
    shape = resolve_shape(mesh_config.shape, len(devices))
    try:
      grid = mesh_utils.create_device_mesh(shape, devices)
    except (ValueError, NotImplementedError, AssertionError):
      grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def mesh_axes(mesh, logical: str, size: int):
  """The mesh axes the logical-axis rules shard `logical` over, if they divide `size`; else None (replicated)."""
  axes = nn.logical_to_mesh_axes((logical,))[0]
  if axes is None:
    return None
  names = axes if isinstance(axes, tuple) else (axes,)
  names = tuple(name for name in names if name in mesh.shape)
  if not names or size % math.prod(mesh.shape[name] for name in names):
    return None
  return names


def per_device(fn, *args, specs):
  """fn(*args) on each device's block of the context mesh (`jax.shard_map`), or fn(*args) itself outside one: for
  Pallas kernels, which see one device's arrays. specs(mesh): the PartitionSpecs of args and of the results."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return fn(*args)
  in_specs, out_specs = specs(mesh)
  return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*args)


def devices_platform(devices) -> str:
  """The platform ('cpu', 'gpu', 'tpu') of `devices`: what a step compiled for them runs on, and what the model's
  kernels are chosen for (`ModelConfig.platform`)."""
  platform = list(devices)[0].platform
  return 'gpu' if platform in ('cuda', 'rocm') else platform


def mesh_platform(mesh: Mesh) -> str:
  """The platform of `mesh`'s devices (`devices_platform`)."""
  return devices_platform(mesh.devices.flat)


def mesh_and_rules(mesh_config: ml_collections.ConfigDict, devices=None) -> tuple[Mesh, tuple]:
  """The `mesh` section's mesh over all (or the given) devices, and its logical-axis rules."""
  return make_mesh(mesh_config, devices), rules_from_config(mesh_config)


@contextlib.contextmanager
def activate(mesh: Mesh, rules):
  """Traces and runs under `mesh` with the logical-axis `rules` (what every jitted step of the project needs)."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def logical_shardings(abstract_tree, mesh: Mesh, rules) -> object:
  """NamedShardings for a tree of (possibly nn.LogicallyPartitioned) abstract values; others replicated."""
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def shards_optimizer(setting: str, mesh: Mesh) -> bool:
  """Whether `mesh.shard_optimizer=setting` (`config/mesh.py`'s `SHARD_OPTIMIZER`) splits the optimizer state over
  the data axis on `mesh`: 'auto' when its devices are accelerators. A CPU host's devices share one memory, where
  the split saves nothing and costs collectives and compile time."""
  return setting == 'on' or (setting == 'auto' and mesh_platform(mesh) != 'cpu')


def optimizer_shardings(abstract_tree, mesh: Mesh, rules) -> object:
  """NamedShardings for the optimizer state: the parameters' (`logical_shardings`), with the `data` axis added
  wherever `fsdp` splits a dimension, so each data-parallel device holds and updates its part (ZeRO-1). An array
  whose dimension that does not divide keeps the parameters' sharding, and so does all of it on a mesh whose
  data axis has one device."""
  by_params = logical_shardings(abstract_tree, mesh, rules)
  if mesh.shape['data'] == 1:
    return by_params
  by_data = logical_shardings(abstract_tree, mesh, tuple((logical, _with_data(axes)) for logical, axes in rules))
  return jax.tree.map(lambda x, data, params: data if _divides(data, x.shape) else params,
                      nn.unbox(abstract_tree), by_data, by_params)


def _with_data(axes):
  names = axes if isinstance(axes, tuple) else (axes,)
  return (*names, 'data') if 'fsdp' in names and 'data' not in names else axes


def _divides(named: NamedSharding, shape: tuple[int, ...]) -> bool:
  for size, axes in zip(shape, named.spec):
    names = axes if isinstance(axes, tuple) else (axes,)
    if size % int(np.prod([named.mesh.shape[n] for n in names if n is not None])):
      return False
  return True


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape['data'] * mesh.shape['fsdp']


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec(('data', 'fsdp')))


def check_batch_divisible(global_batch: int, mesh: Mesh, what: str, devices: int | None = None):
  """`global_batch` rows must split over the mesh's data-parallel devices (or `devices`, e.g. all of them)."""
  size = data_parallel_size(mesh) if devices is None else devices
  if global_batch % size:
    where = 'data-parallel devices (mesh data × fsdp)' if devices is None else 'devices evaluation decodes on'
    raise ValueError(f'{what}: a global batch of {global_batch} rows does not divide over the {size} {where}; '
                     f'use a multiple of {size}.')


def check_batches(config: ml_collections.ConfigDict, mesh: Mesh) -> None:
  """Every batch size of a run against the mesh, before anything compiles: training rows (packed batch size or
  the token-budget row multiple) and in-training evaluation over the training mesh, and the final evaluation's
  teacher-forced and decoding batches over all devices (the inference mesh puts every device on the batch)."""
  pipe = config.pipeline
  if pipe.batching == 'packed':
    check_batch_divisible(pipe.batch_size, mesh, 'pipeline.batch_size')
  else:
    check_batch_divisible(pipe.batch_multiple, mesh, 'pipeline.batch_multiple')
  check_batch_divisible(config.eval.batch_size, mesh, 'eval.batch_size')
  for key, value in (('eval.batch_size', config.eval.batch_size), ('decode.batch_size', config.decode.batch_size)):
    check_batch_divisible(value, mesh, key, devices=mesh.devices.size)


def place_batch(batch: dict, mesh: Mesh) -> dict:
  """Turns this process's rows (numpy) into global arrays sharded over data × fsdp."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}

