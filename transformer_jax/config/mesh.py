"""The `mesh` section: the device mesh's axis sizes and the logical-axis rules (`transformer_jax.runtime.sharding` builds
the mesh from them)."""

import math

import ml_collections

MESH_AXES = ('data', 'fsdp', 'tensor')
# mesh.shard_optimizer: 'auto' splits the optimizer state over the data axis when the mesh's devices are
# accelerators (`sharding.shards_optimizer`); 'on' and 'off' on every platform.
SHARD_OPTIMIZER = ('auto', 'on', 'off')

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
  """`shape`: ICI axis sizes (-1 fills the remaining devices); `dcn_shape`: axis sizes across slices; `rules`:
  logical axis -> mesh axes; `shard_optimizer`: the optimizer state also split over `data`."""
  return ml_collections.ConfigDict({
      'shape': {'data': -1, 'fsdp': 1, 'tensor': 1},
      'dcn_shape': {'data': 1, 'fsdp': 1, 'tensor': 1},
      'rules': [list(rule) for rule in DEFAULT_RULES],
      # The optimizer state (Adam's moments) and its update split over the data axis too (ZeRO-1): each
      # data-parallel device updates its part, and the updated parameters are gathered. See SHARD_OPTIMIZER.
      'shard_optimizer': 'auto',
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


def rules_from_config(mesh_config: ml_collections.ConfigDict) -> tuple:
  """The rules as (logical axis, mesh axis or axes or None) tuples; an unknown mesh axis is an error."""
  rules = []
  for rule in mesh_config.rules:
    logical, mesh_axes = rule
    for axis in (mesh_axes if isinstance(mesh_axes, (list, tuple)) else [mesh_axes]):
      if axis is not None and axis not in MESH_AXES:
        raise ValueError(f'mesh.rules maps {logical!r} to unknown mesh axis {axis!r}; use one of {MESH_AXES}.')
    rules.append((logical, tuple(mesh_axes) if isinstance(mesh_axes, (list, tuple)) else mesh_axes))
  return tuple(rules)


def validate(mesh_config: ml_collections.ConfigDict, model) -> None:
  """Axis names, -1s and rules; with fixed sizes, that the sharded parameter dimensions of `model` (a
  ModelConfig) divide. The device count is checked when the mesh is made."""
  if mesh_config.shard_optimizer not in SHARD_OPTIMIZER:
    raise ValueError(f'mesh.shard_optimizer={mesh_config.shard_optimizer!r}: use one of {SHARD_OPTIMIZER}.')
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
