"""What the accelerators' flash-attention kernels share (`flash_tpu`: jax's splash attention, and our kernel for
attention dropout; `flash_gpu`: our Triton kernels): segment ids for padding and packed rows, lengths padded to
blocks, the run on every device's block of batch × heads of the context mesh (`jax.shard_map`), and a tile's mask
and attention-dropout bits, the same hash in every kernel. They serve what their kernels can (`attention.serving`
sends the rest to the XLA implementations); `pallas_mode.interpret_kernels` runs them on a CPU for tests."""

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from transformer_jax.kernels import attention_masks
from transformer_jax.runtime import sharding

# The segment id of padding. For jax's splash kernel, queries and keys alike: padding queries then attend to
# padding keys, and their outputs are zeroed (`attention_masks.any_key`) like every query's that may attend to
# nothing. Our kernels zero such rows themselves; there padding keys get an id of their own, so padding queries
# see no key.
_PAD_ID = int(jnp.iinfo(jnp.int32).min)
KEY_PAD_ID = _PAD_ID + 1


def _segment_ids(valid, segment, pad_id):
  ids = jnp.zeros(valid.shape, jnp.int32) if segment is None else segment.astype(jnp.int32)
  return jnp.where(valid, ids, pad_id)


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def computed_weights(shape, block_q: int, block_k: int, causal: bool) -> int:
  """How many of the [batch, heads, q, k] weights a kernel computes in tiles of block_q × block_k: causal
  kernels skip the tiles whose keys every query of the tile is before (their cost estimates count only the rest)."""
  batch, heads, q_len, k_len = shape
  num_q, num_k = q_len // block_q, k_len // block_k
  tiles = sum(1 for i in range(num_q) for j in range(num_k) if not causal or j * block_k < (i + 1) * block_q)
  return batch * heads * tiles * block_q * block_k


def pad_to(x, axis: int, size: int, value=0):
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def padded_segment_ids(spec, q_size: int, k_size: int, key_pad_id: int = _PAD_ID):
  """Query and key segment ids apart (the TPU kernels', our GPU ones'), padding an id of its own, padded to q_size
  and k_size. A `key_pad_id` other than the queries' leaves padding queries no key (for kernels that zero such
  rows themselves)."""
  return (pad_to(_segment_ids(spec.q_valid, spec.q_segment, _PAD_ID), 1, q_size, _PAD_ID),
          pad_to(_segment_ids(spec.kv_valid, spec.kv_segment, key_pad_id), 1, k_size, key_pad_id))


def per_device(kernel, arrays, q_ids, kv_ids, *dropout):
  """kernel(*arrays, q_ids, kv_ids, *dropout) on each device's block of batch × heads (`sharding.per_device`);
  `arrays`: q, k and v as the kernel takes them, each [b, len, h, d] or a stack [b, len, n, h, d]
  (`gpu/flash_attention.py`'s `_places`);
  `dropout`: the batch rows' and heads' indices, [batch] and [heads], and attention dropout's seeds [2]."""

  def specs(mesh):
    batch = sharding.mesh_axes(mesh, 'batch', q_ids.shape[0])
    heads = sharding.mesh_axes(mesh, 'heads', arrays[0].shape[-2])
    heads_of = lambda x: P(batch, None, *[None] * (x.ndim - 4), heads, None)
    dropout_specs = (P(batch), P(heads), P()) if dropout else ()
    return (*map(heads_of, arrays), P(batch, None), P(batch, None), *dropout_specs), P(batch, None, heads, None)

  return sharding.per_device(kernel, *arrays, q_ids, kv_ids, *dropout, specs=specs)


def dropout_per_device(attend, arrays, q_ids, kv_ids, seeds):
  """attend(*arrays, q_ids, kv_ids, scalars) of a dropout kernel on each device's block (`per_device`); scalars
  [4]: attention dropout's two seeds, then the indices of the block's first batch row and head."""

  def kernel(*args):
    *arrays, q_ids, kv_ids, batch_index, head_index, seeds = args
    return attend(*arrays, q_ids, kv_ids, jnp.concatenate([seeds, batch_index[:1], head_index[:1]]))

  return per_device(kernel, arrays, q_ids, kv_ids, jnp.arange(q_ids.shape[0], dtype=jnp.int32),
                     jnp.arange(arrays[0].shape[-2], dtype=jnp.int32), seeds)


def grid_step_keys(scalars_ref, batch_axis: int):
  """The grid step's batch row and head's key for `attention_masks.dropout_keep`, and its seed; scalars: the two
  seeds, then the indices of this device's first batch row and head; the grid's batch axis, its head axis next.
  Read in a kernel's body, outside its loops and conditions (interpret mode needs that)."""
  seeds = (scalars_ref[0], scalars_ref[1])
  return (attention_masks.dropout_row_keys(seeds, scalars_ref[2] + pl.program_id(batch_axis),
                                           scalars_ref[3] + pl.program_id(batch_axis + 1)), seeds[1])


def mask_and_bits(hash_keys, q_ids, k_ids, q_pos, k_pos, *, keep: float, causal: bool):
  """Both backends' kernels: a tile's mask (same segment id; causal: no key after its query) and where attention
  dropout keeps the weights (None without dropout: keep = 1), from ids and positions that broadcast to the tile."""
  mask = q_ids == k_ids
  if causal:
    mask &= k_pos <= q_pos
  if keep == 1.0:
    return mask, None
  return mask, attention_masks.dropout_keep(hash_keys[0], hash_keys[1], q_pos, k_pos, keep)
