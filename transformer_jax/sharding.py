"""Device mesh from config, logical-axis rules, and helpers that place states and batches on the mesh.

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

MESH_AXES = ('data', 'fsdp', 'tensor')

# Batch over data × fsdp; parameters' embed dimension over fsdp (ZeRO-3 style, optimizer state follows);
# heads, mlp and vocab over tensor (Megatron-style). Unused mesh axes have size 1, so one rule set serves
# pure data parallel, FSDP and FSDP × tensor parallel. A mesh axis already used by an earlier dimension of
# the same array is skipped (flax's rule resolution), e.g. activations' embed stays unsharded.
DEFAULT_RULES = (
    ('batch', ('data', 'fsdp')),
    ('embed', 'fsdp'),
    ('heads', 'tensor'),
    ('mlp', 'tensor'),
    ('vocab', 'tensor'),
    ('kv', None),
    ('length', None),
    ('layers', None),  # the stacked layer axis of model.scan_layers: every device holds every layer's shard
)


def default_config() -> ml_collections.ConfigDict:
  """The `mesh` section. `shape`: ICI axis sizes (-1 fills the remaining devices); `dcn_shape`: axis sizes across
  slices; `rules`: logical axis -> mesh axes."""
  return ml_collections.ConfigDict({
      'shape': {'data': -1, 'fsdp': 1, 'tensor': 1},
      'dcn_shape': {'data': 1, 'fsdp': 1, 'tensor': 1},
      'rules': [list(rule) for rule in DEFAULT_RULES],
  })


def resolve_shape(shape: dict, num_devices: int, what: str = 'mesh.shape') -> tuple[int, ...]:
  """Axis sizes in MESH_AXES order with -1 filled in; errors say which config key to change."""
  unknown = sorted(set(shape) - set(MESH_AXES))
  if unknown:
    raise ValueError(f'{what} has unknown mesh axes {unknown}; the axes are {list(MESH_AXES)}.')
  sizes = [int(shape.get(axis, 1)) for axis in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f'{what}={dict(shape)} has more than one -1; at most one axis can fill the rest.')
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f'{what}={dict(shape)} cannot fill {num_devices} devices: {known} does not divide it.')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f'{what}={dict(shape)} uses {math.prod(sizes)} devices but {num_devices} are available; '
                     f'set the sizes to multiply to {num_devices} or use -1 for one axis.')
  return tuple(sizes)


def validate(mesh_config: ml_collections.ConfigDict, model) -> None:
  """Axis names, -1s and rules; with fixed sizes, that the sharded parameter dimensions of `model` (a
  ModelConfig) divide. The device count is checked when the mesh is made."""
  resolve_shape(mesh_config.shape, _any_count(mesh_config.shape))
  resolve_shape(mesh_config.dcn_shape, _any_count(mesh_config.dcn_shape), 'mesh.dcn_shape')
  rules = rules_from_config(mesh_config)
  sizes = {axis: mesh_config.shape.get(axis, 1) * mesh_config.dcn_shape.get(axis, 1)
           if mesh_config.shape.get(axis, 1) > 0 and mesh_config.dcn_shape.get(axis, 1) > 0 else None
           for axis in MESH_AXES}
  dims = {'embed': ('model.d_model', model.d_model), 'heads': ('model.num_heads', model.num_heads),
          'mlp': ('model.d_ff', model.d_ff), 'vocab': ('model.vocab_size', model.vocab_size),
          'kv': ('model.d_k', model.head_dim_k)}
  for logical, mesh_axes in rules:
    if logical not in dims or mesh_axes is None:
      continue
    axes = mesh_axes if isinstance(mesh_axes, tuple) else (mesh_axes,)
    if any(sizes[axis] is None for axis in axes):
      continue  # a -1 axis: its size is known only on the machine
    shards = math.prod(sizes[axis] for axis in axes)
    key, size = dims[logical]
    if size % shards:
      raise ValueError(f'{key}={size} does not divide over the {shards} devices of mesh axes {list(axes)} '
                       f"(mesh.rules shard '{logical}' over them): change {key} or the mesh.")


def _any_count(shape) -> int:
  """A device count that a mesh shape can fill (checks the axis names and -1s, not the machine)."""
  return math.prod(size if size > 0 else 1 for size in shape.values())


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


def rules_from_config(mesh_config: ml_collections.ConfigDict) -> tuple:
  rules = []
  for rule in mesh_config.rules:
    logical, mesh_axes = rule
    for axis in (mesh_axes if isinstance(mesh_axes, (list, tuple)) else [mesh_axes]):
      if axis is not None and axis not in MESH_AXES:
        raise ValueError(f'mesh.rules maps {logical!r} to unknown mesh axis {axis!r}; use one of {MESH_AXES}.')
    rules.append((logical, tuple(mesh_axes) if isinstance(mesh_axes, (list, tuple)) else mesh_axes))
  return tuple(rules)


@contextlib.contextmanager
def activate(mesh: Mesh, rules):
  """Traces and runs under `mesh` with the logical-axis `rules` (what every jitted step of the project needs)."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def logical_shardings(abstract_tree, mesh: Mesh, rules) -> object:
  """NamedShardings for a tree of (possibly nn.LogicallyPartitioned) abstract values; others replicated."""
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


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


def bytes_per_device(tree) -> dict:
  """Bytes of a tree's arrays held by each device (for memory accounting and the FSDP test)."""
  totals = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
  return totals
