"""The accelerators' Pallas flash-attention kernels, `flash_tpu` (jax's splash attention; with attention dropout,
our own kernel) and `flash_gpu` (our own Triton kernels), each run by `jax.shard_map` on every device's block of
batch × heads of the context mesh. They serve what their kernels can (`attention.serving` sends the rest to the
XLA implementations); `pallas_mode.interpret_kernels` runs them on a CPU for tests."""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec as P

from transformer_jax import attention_masks
from transformer_jax import pallas_mode
from transformer_jax import sharding

# The segment id of padding. For jax's splash kernel, queries and keys alike: padding queries then attend to
# padding keys, and their outputs are zeroed (`attention_masks.any_key`) like every query's that may attend to
# nothing. Our kernels zero such rows themselves; there padding keys get an id of their own, so padding queries
# see no key.
_PAD_ID = int(jnp.iinfo(jnp.int32).min)
_KEY_PAD_ID = _PAD_ID + 1


def _segment_ids(valid, segment, pad_id):
  ids = jnp.zeros(valid.shape, jnp.int32) if segment is None else segment.astype(jnp.int32)
  return jnp.where(valid, ids, pad_id)


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _computed_weights(shape, block_q: int, block_k: int, causal: bool) -> int:
  """How many of the [batch, heads, q, k] weights a kernel computes in tiles of block_q × block_k: causal
  kernels skip the tiles whose keys every query of the tile is before (their cost estimates count only the rest)."""
  batch, heads, q_len, k_len = shape
  num_q, num_k = q_len // block_q, k_len // block_k
  tiles = sum(1 for i in range(num_q) for j in range(num_k) if not causal or j * block_k < (i + 1) * block_q)
  return batch * heads * tiles * block_q * block_k


def _pad_to(x, axis: int, size: int, value=0):
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def _padded_segment_ids(spec, q_size: int, k_size: int, key_pad_id: int = _PAD_ID):
  """Query and key segment ids apart (the TPU kernels', our GPU ones'), padding an id of its own, padded to q_size
  and k_size. A `key_pad_id` other than the queries' leaves padding queries no key (for kernels that zero such
  rows themselves)."""
  return (_pad_to(_segment_ids(spec.q_valid, spec.q_segment, _PAD_ID), 1, q_size, _PAD_ID),
          _pad_to(_segment_ids(spec.kv_valid, spec.kv_segment, key_pad_id), 1, k_size, key_pad_id))


def _heads_major(x):
  return jnp.swapaxes(x, 1, 2)  # [b, len, h, d] <-> [b, h, len, d]


def _scaled(q, d_k: int):
  """q · 1/√d_k (d_k before any padding of the head dim), which jax's splash kernel takes instead of scaled
  scores (our kernels scale the scores themselves)."""
  return q * jnp.asarray(1.0 / math.sqrt(d_k), q.dtype)


def _per_device(kernel, arrays, q_ids, kv_ids, *dropout):
  """kernel(*arrays, q_ids, kv_ids, *dropout) on each device's block of batch × heads (`sharding.per_device`);
  `arrays`: q, k and v as the kernel takes them, each [b, len, h, d] or a stack [b, len, n, h, d] (`_places`);
  `dropout`: the batch rows' and heads' indices, [batch] and [heads], and attention dropout's seeds [2]."""

  def specs(mesh):
    batch = sharding.mesh_axes(mesh, 'batch', q_ids.shape[0])
    heads = sharding.mesh_axes(mesh, 'heads', arrays[0].shape[-2])
    heads_of = lambda x: P(batch, None, *[None] * (x.ndim - 4), heads, None)
    dropout_specs = (P(batch), P(heads), P()) if dropout else ()
    return (*map(heads_of, arrays), P(batch, None), P(batch, None), *dropout_specs), P(batch, None, heads, None)

  return sharding.per_device(kernel, *arrays, q_ids, kv_ids, *dropout, specs=specs)


def _dropout_per_device(attend, arrays, q_ids, kv_ids, seeds):
  """attend(*arrays, q_ids, kv_ids, scalars) of a dropout kernel on each device's block (`_per_device`); scalars
  [4]: attention dropout's two seeds, then the indices of the block's first batch row and head."""

  def kernel(*args):
    *arrays, q_ids, kv_ids, batch_index, head_index, seeds = args
    return attend(*arrays, q_ids, kv_ids, jnp.concatenate([seeds, batch_index[:1], head_index[:1]]))

  return _per_device(kernel, arrays, q_ids, kv_ids, jnp.arange(q_ids.shape[0], dtype=jnp.int32),
                     jnp.arange(arrays[0].shape[-2], dtype=jnp.int32), seeds)


def _splash_blocks(splash, q_size: int, k_size: int):
  """The splash kernel's blocks for padded lengths (multiples of 128). Keys that fit one block of up to 256: one
  fused backward kernel (the scores computed once for dq, dk and dv; its dq has one part per key block, summed
  outside it, so one block makes that free), queries in blocks of 256 where that divides. Longer keys: blocks of
  128 and separate dq and dk, dv kernels."""
  if k_size <= 256:
    block_q = 256 if q_size % 256 == 0 else 128
    return splash.BlockSizes(block_q=block_q, block_kv=k_size, block_q_dkv=block_q, block_kv_dkv=k_size,
                             use_fused_bwd_kernel=True)
  return splash.BlockSizes(block_q=128, block_kv=128, block_q_dkv=128, block_kv_dkv=128, block_q_dq=128,
                           block_kv_dq=128)


def flash_tpu_attention(q, k, v, spec, *, dropout_rate=0.0, dropout_seeds=None):
  """The Pallas TPU splash-attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`).

  Padding and packed segments become segment ids (padding an id of its own), and causality the kernel's static
  mask, whose fully masked blocks it skips. Its residual is one log-sum-exp per query; blocks and backward
  kernels as `_splash_blocks` chooses. With segment ids its blocks need query and key lengths in multiples of
  128: both are padded here, and head dims to max(d_k, d_v). Not for cached decoding (`attention.serving` sends
  that elsewhere). With attention dropout (`dropout_seeds`, `attention_masks.dropout_seeds`): our kernel
  (`_flash_tpu_dropout`).
  """
  if dropout_rate > 0.0 and dropout_seeds is not None:
    return _flash_tpu_dropout(q, k, v, spec, dropout_rate, dropout_seeds)
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask  # pylint: disable=g-import-not-at-top
  q_len, k_len, d_k, d_v = q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]
  q_size, k_size, head = _round_up(q_len, 128), _round_up(k_len, 128), max(d_k, d_v)
  blocks = _splash_blocks(splash, q_size, k_size)

  def kernel(q, k, v, q_ids, kv_ids):
    heads = q.shape[2]
    shape = (q_size, k_size)
    one = splash_mask.CausalMask(shape) if spec.causal else splash_mask.FullMask(shape)
    attend = splash.make_splash_mha(splash_mask.MultiHeadMask([one] * heads), block_sizes=blocks, head_shards=1,
                                    q_seq_shards=1, interpret=pallas_mode.interpreting())
    out = jax.vmap(lambda q, k, v, qi, ki: attend(q, k, v, segment_ids=splash.SegmentIds(qi, ki)))(
        _heads_major(_scaled(q, d_k)), _heads_major(k), _heads_major(v), q_ids, kv_ids)
    return _heads_major(out)

  out = _per_device(
      kernel,
      (_pad_to(_pad_to(q, 1, q_size), 3, head), _pad_to(_pad_to(k, 1, k_size), 3, head),
       _pad_to(_pad_to(v, 1, k_size), 3, head)),
      *_padded_segment_ids(spec, q_size, k_size))
  out = out[:, :q_len, :, :d_v]
  return out * attention_masks.any_key(spec, out.dtype)


# --- flash_tpu with attention dropout: our kernel, an online softmax over key blocks with the hash's bits inside


def _tpu_dropout_blocks(q_size: int, k_size: int) -> tuple[int, int]:
  """(block_q, block_k) for lengths padded to 128: keys in one block up to 512 (one key block: dq needs no sum
  over blocks), else blocks of 512, 256 or 128, whichever divides; queries in 256s where that divides and the
  keys are at most 256, else 128s."""
  block_k = k_size if k_size <= 512 else next(b for b in (512, 256, 128) if k_size % b == 0)
  return (256 if q_size % 256 == 0 and k_size <= 256 else 128), block_k


def _hash_keys(scalars_ref, batch_axis: int):
  """The grid step's batch row and head's key for `attention_masks.dropout_keep`, and its seed; scalars: the two
  seeds, then the indices of this device's first batch row and head; the grid's batch axis, its head axis next.
  Read in a kernel's body, outside its loops and conditions (interpret mode needs that)."""
  seeds = (scalars_ref[0], scalars_ref[1])
  return (attention_masks.dropout_row_keys(seeds, scalars_ref[2] + pl.program_id(batch_axis),
                                           scalars_ref[3] + pl.program_id(batch_axis + 1)), seeds[1])


def _mask_and_bits(hash_keys, q_ids, k_ids, q_pos, k_pos, *, keep: float, causal: bool):
  """Both backends' kernels: a tile's mask (same segment id; causal: no key after its query) and where attention
  dropout keeps the weights (None without dropout: keep = 1), from ids and positions that broadcast to the tile."""
  mask = q_ids == k_ids
  if causal:
    mask &= k_pos <= q_pos
  if keep == 1.0:
    return mask, None
  return mask, attention_masks.dropout_keep(hash_keys[0], hash_keys[1], q_pos, k_pos, keep)


def _tile_scores(hash_keys, q, k, q_ids_ref, k_ids_ref, q_block, k_block, *, keep: float, causal: bool,
                 scale: float):
  """The grid step's tile of scores [block_q, block_k] (q·k scaled by `scale` in float32), its mask, and where
  attention dropout keeps the weights (positions from 2-D iotas, as Mosaic lays them out)."""
  s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
  q_pos = q_block * s.shape[0] + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
  k_pos = k_block * s.shape[1] + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
  return (s, *_mask_and_bits(hash_keys, q_ids_ref[...], k_ids_ref[...], q_pos, k_pos, keep=keep, causal=causal))


def _unless_hidden(causal: bool, q_block, k_block, block_q: int, block_k: int, body, hidden=None):
  """body() for a tile with a key some query may see (causal: the key block starts at or before the query block's
  end), else hidden() if given."""
  if not causal:
    return body()
  visible = k_block * block_k < (q_block + 1) * block_q
  pl.when(visible)(body)
  if hidden is not None:
    pl.when(jnp.logical_not(visible))(hidden)


def _dropout_forward_kernel(scalars_ref, q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, o_ref, *refs, keep: float,
                            causal: bool, scale: float, whole_rows: bool):
  """A block of queries against one block of keys (grid: batch row, head, query block, key block): the softmax's
  running max and sum over all (undropped) weights, the weighted sum over the kept ones; at the last key block
  the output and, unless the tiles hold whole rows (one key block), each query's log-sum-exp (refs: lse, then the
  scratch)."""
  lse_ref, m_acc, l_acc, o_acc = (None, *refs) if whole_rows else refs
  q_block, k_block, hash_keys = pl.program_id(2), pl.program_id(3), _hash_keys(scalars_ref, 0)

  @pl.when(k_block == 0)
  def _():
    m_acc[...] = jnp.full(m_acc.shape, attention_masks.NEG, jnp.float32)
    l_acc[...] = jnp.zeros_like(l_acc)
    o_acc[...] = jnp.zeros_like(o_acc)

  def update():
    s, mask, kept = _tile_scores(hash_keys, q_ref[...], k_ref[...], q_ids_ref, k_ids_ref, q_block, k_block,
                                 keep=keep, causal=causal, scale=scale)
    m_prev = m_acc[...]
    m_new = jnp.maximum(m_prev, jnp.max(jnp.where(mask, s, attention_masks.NEG), axis=1, keepdims=True))
    p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
    correction = jnp.exp(m_prev - m_new)
    l_acc[...] = l_acc[...] * correction + jnp.sum(p, axis=1, keepdims=True)
    o_acc[...] = o_acc[...] * correction + jnp.dot(jnp.where(kept, p, 0.0).astype(v_ref.dtype), v_ref[...],
                                                   preferred_element_type=jnp.float32)
    m_acc[...] = m_new

  _unless_hidden(causal, q_block, k_block, q_ref.shape[0], k_ref.shape[0], update)

  @pl.when(k_block == pl.num_programs(3) - 1)
  def _():
    seen = l_acc[...] > 0  # queries that may attend to no key get zeros, and a log-sum-exp that gives no weights
    total = jnp.where(seen, l_acc[...], 1.0)
    o_ref[...] = jnp.where(seen, o_acc[...] / (keep * total), 0.0).astype(o_ref.dtype)
    if not whole_rows:
      lse_ref[...] = jnp.where(seen, m_acc[...] + jnp.log(total), jnp.inf)


def _dropout_backward_kernel(scalars_ref, q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, *refs, keep: float,
                             causal: bool, scale: float, whole_rows: bool):
  """One tile (grid: batch row, head, key block, query block): its weights and bits recomputed, this key block's
  part of dq, and dk, dv summed over the query blocks in VMEM. The weights come from each query's log-sum-exp and
  delta = rowsum(do ⊙ o) from inputs (refs: lse, delta, do, the outputs, the scratch), or where the tile holds
  whole rows (one key block), from the tile itself: the row's softmax and rowsum(p ⊙ dp) (refs: do, ...)."""
  lse_ref, delta_ref, do_ref, dq_ref, dk_ref, dv_ref, dk_acc, dv_acc = (None, None, *refs) if whole_rows else refs
  k_block, q_block, hash_keys = pl.program_id(2), pl.program_id(3), _hash_keys(scalars_ref, 0)

  @pl.when(q_block == 0)
  def _():
    dk_acc[...] = jnp.zeros_like(dk_acc)
    dv_acc[...] = jnp.zeros_like(dv_acc)

  def update():
    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    s, mask, kept = _tile_scores(hash_keys, q, k, q_ids_ref, k_ids_ref, q_block, k_block, keep=keep,
                                 causal=causal, scale=scale)
    if whole_rows:
      p = jnp.where(mask, jnp.exp(s - jnp.max(jnp.where(mask, s, attention_masks.NEG), axis=1, keepdims=True)), 0.0)
      total = jnp.sum(p, axis=1, keepdims=True)
      p = p / jnp.where(total > 0, total, 1.0)
    else:
      p = jnp.where(mask, jnp.exp(s - lse_ref[...]), 0.0)
    transposed_lhs = (((0,), (0,)), ((), ()))
    dropped = jnp.where(kept, p * (1.0 / keep), 0.0)
    dv_acc[...] += jax.lax.dot_general(dropped.astype(do.dtype), do, transposed_lhs,
                                       preferred_element_type=jnp.float32)
    dp = jax.lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    dp = jnp.where(kept, dp * (1.0 / keep), 0.0)
    ds = p * (dp - (jnp.sum(p * dp, axis=1, keepdims=True) if whole_rows else delta_ref[...])) * scale
    dq_ref[...] = jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32).astype(dq_ref.dtype)
    dk_acc[...] += jax.lax.dot_general(ds.astype(q.dtype), q, transposed_lhs, preferred_element_type=jnp.float32)

  def no_dq():
    dq_ref[...] = jnp.zeros(dq_ref.shape, dq_ref.dtype)

  _unless_hidden(causal, q_block, k_block, q_ref.shape[0], k_ref.shape[0], update, hidden=no_dq)

  @pl.when(q_block == pl.num_programs(3) - 1)
  def _():
    dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _dropout_attention(q, k, v, q_ids, k_ids, scalars, *, keep: float, causal: bool, scale: float, block_q: int,
                       block_k: int):
  """q [b, h, q, d_k], k [b, h, k, d_k], v [b, h, k, d_v] with ids [b, q, 1] and [b, 1, k] and `_tile_scores`'
  scalars [4]; scores q·k × `scale`: the kernels above as one differentiable function (`pallas_call`s in a custom
  VJP). Queries that may attend to no key come out 0.
  dq comes in one part per key block (float32 where there are several), summed here. With one key block (whole
  rows) the backward pass keeps only q, k and v, and recomputes the rows' softmax."""
  (batch, heads, q_len, d_k), (k_len, d_v) = q.shape, v.shape[2:]
  options = dict(keep=keep, causal=causal, scale=scale)
  num_q, num_k = q_len // block_q, k_len // block_k
  forward_grid, backward_grid = (batch, heads, num_q, num_k), (batch, heads, num_k, num_q)
  # Index maps take the grid's indices (batch, head, then the query and key blocks in the grid's order).
  q_at = lambda b, h, i, j, *_: (b, h, i, 0)
  k_at = lambda b, h, i, j, *_: (b, h, j, 0)
  q_ids_at, k_ids_at, rows_at = lambda b, h, i, j, *_: (b, i, 0), lambda b, h, i, j, *_: (b, 0, j), q_at
  swap = lambda at: lambda b, h, j, i, *_: at(b, h, i, j)  # the backward grid runs key blocks outside
  tile = lambda block, d, at: pl.BlockSpec((None, None, block, d), at)
  ids = [pl.BlockSpec((None, block_q, 1), q_ids_at), pl.BlockSpec((None, 1, block_k), k_ids_at)]
  stats = jax.ShapeDtypeStruct((batch, heads, q_len, 1), jnp.float32)  # each query's log-sum-exp, delta
  whole_rows = num_k == 1
  options.update(whole_rows=whole_rows)
  weights = _computed_weights((batch, heads, q_len, k_len), block_q, block_k, causal)
  item = q.dtype.itemsize
  # A block is fetched again only when its index changes from one grid step to the next: k and v once per query
  # block where there are several key blocks (forward), q, do and the rows' stats once per key block where there
  # are several query blocks (backward).
  k_reads, q_reads = (num_q if num_k > 1 else 1), (num_k if num_q > 1 else 1)
  interpret = pallas_mode.interpreting()

  def forward(q, k, v, q_ids, k_ids, scalars):
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=forward_grid,
        in_specs=[tile(block_q, d_k, q_at), tile(block_k, d_k, k_at), tile(block_k, d_v, k_at), *ids],
        out_specs=[tile(block_q, d_v, q_at), *[tile(block_q, 1, rows_at)] * (not whole_rows)],
        scratch_shapes=[pltpu.VMEM((block_q, 1), jnp.float32), pltpu.VMEM((block_q, 1), jnp.float32),
                        pltpu.VMEM((block_q, d_v), jnp.float32)])
    cost = pl.CostEstimate(flops=2 * weights * (d_k + d_v), transcendentals=weights,
                           bytes_accessed=item * (q.size + k_reads * (k.size + v.size) + q.size // d_k * d_v)
                           + 4 * ((not whole_rows) * stats.size + q_ids.size + k_reads * k_ids.size))
    return pl.pallas_call(
        functools.partial(_dropout_forward_kernel, **options), grid_spec=spec,
        out_shape=[jax.ShapeDtypeStruct((batch, heads, q_len, d_v), v.dtype), *[stats] * (not whole_rows)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=('parallel', 'parallel', 'parallel', 'arbitrary')),
        cost_estimate=cost, interpret=interpret, name='attention_dropout_fwd')(scalars, q, k, v, q_ids, k_ids)

  def backward(q, k, v, q_ids, k_ids, scalars, o, lse, do):
    # lse and delta, [b, h, q, 1] each, where the tiles do not hold whole rows
    stats_in = [] if whole_rows else [lse, jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1,
                                                    keepdims=True)]
    dq_dtype = q.dtype if whole_rows else jnp.float32
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=backward_grid,
        in_specs=[tile(block_q, d_k, swap(q_at)), tile(block_k, d_k, swap(k_at)), tile(block_k, d_v, swap(k_at)),
                  *(pl.BlockSpec(s.block_shape, swap(s.index_map)) for s in ids),
                  *[tile(block_q, 1, swap(rows_at))] * len(stats_in), tile(block_q, d_v, swap(q_at))],
        out_specs=[pl.BlockSpec((None, None, None, block_q, d_k), lambda b, h, j, i, *_: (j, b, h, i, 0)),
                   tile(block_k, d_k, swap(k_at)), tile(block_k, d_v, swap(k_at))],
        scratch_shapes=[pltpu.VMEM((block_k, d_k), jnp.float32), pltpu.VMEM((block_k, d_v), jnp.float32)])
    cost = pl.CostEstimate(flops=2 * weights * (3 * d_k + 2 * d_v), transcendentals=weights,
                           bytes_accessed=q_reads * item * (q.size + do.size) + item * 2 * (k.size + v.size)
                           + num_k * q.size * jnp.dtype(dq_dtype).itemsize
                           + 4 * (q_reads * (len(stats_in) * stats.size + q_ids.size) + k_ids.size))
    dq, dk, dv = pl.pallas_call(
        functools.partial(_dropout_backward_kernel, **options), grid_spec=spec,
        out_shape=[jax.ShapeDtypeStruct((num_k, *q.shape), dq_dtype),
                   *(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (k, v))],
        compiler_params=pltpu.CompilerParams(dimension_semantics=('parallel', 'parallel', 'parallel', 'arbitrary')),
        cost_estimate=cost, interpret=interpret, name='attention_dropout_bwd')(
            scalars, q, k, v, q_ids, k_ids, *stats_in, do)
    return jnp.sum(dq, axis=0).astype(q.dtype), dk, dv

  def forward_with_residuals(*args):
    o, *lse = forward(*args)
    return o, (*args, *((None, None) if whole_rows else (o, *lse)))

  attend = jax.custom_vjp(lambda *args: forward(*args)[0])  # ids and scalars are arguments: no tracer leaks
  attend.defvjp(forward_with_residuals, lambda res, do: (*backward(*res, do), None, None, None))
  return attend(q, k, v, q_ids, k_ids, scalars)


def _flash_tpu_dropout(q, k, v, spec, dropout_rate: float, dropout_seeds):
  """flash_tpu with attention dropout: our kernel (`_dropout_attention`) at any length, padded to 128, in the
  blocks `_tpu_dropout_blocks` chooses."""
  q_len, k_len, d_k = q.shape[1], k.shape[1], q.shape[-1]
  q_size, k_size = _round_up(q_len, 128), _round_up(k_len, 128)
  block_q, block_k = _tpu_dropout_blocks(q_size, k_size)
  keep = 1.0 - dropout_rate

  def attend(q, k, v, q_ids, kv_ids, scalars):
    out = _dropout_attention(_heads_major(q), _heads_major(k), _heads_major(v), q_ids[:, :, None],
                             kv_ids[:, None, :], scalars, keep=keep, causal=spec.causal,
                             scale=1.0 / math.sqrt(d_k), block_q=block_q, block_k=block_k)
    return _heads_major(out)

  out = _dropout_per_device(attend, (_pad_to(q, 1, q_size), _pad_to(k, 1, k_size), _pad_to(v, 1, k_size)),
                            *_padded_segment_ids(spec, q_size, k_size, _KEY_PAD_ID), dropout_seeds)
  return out[:, :q_len]


# --- flash_gpu's Triton kernels: an online softmax over key blocks, the query and key segment ids apart, attention
# dropout's bits drawn inside

_GPU_BLOCKS = (64, 32)  # queries and keys per tile: the forward's, the backward's (lengths pad to the first)


def _triton_head(d: int) -> int:
  """A head dim padded for a Triton kernel: a power of two, at least 16 (Triton's smallest bf16 dot)."""
  return max(16, pl.next_power_of_2(d))


def _gpu_block(size: int, block: int) -> int:
  return min(block, max(16, pl.next_power_of_2(size)))


def _gpu_scores(hash_keys, q, k, q_ids, k_ids, q_start, k_start, *, keep: float, causal: bool, scale: float):
  """One tile of scores [rows, keys] (q·k scaled by `scale` in float32), the mask, and where attention dropout keeps
  the weights (None without dropout; positions from 1-D ranges made a column and a row, as Triton builds them)."""
  s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
  q_pos = (q_start + jnp.arange(q.shape[0], dtype=jnp.int32))[:, None]
  k_pos = (k_start + jnp.arange(k.shape[0], dtype=jnp.int32))[None, :]
  return (s, *_mask_and_bits(hash_keys, q_ids[:, None], k_ids[None, :], q_pos, k_pos, keep=keep, causal=causal))


def _kept(kept, x):
  """x where attention dropout keeps it, else 0 (x itself without dropout)."""
  return x if kept is None else jnp.where(kept, x, 0.0)


def _gpu_forward_kernel(scalars_ref, q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, o_ref, lse_ref, *, keep: float,
                        causal: bool, scale: float, block_k: int):
  """Output rows for one block of queries: the softmax's running max and sum over all (undropped) weights, the
  weighted sum over the kept ones; and each row's log-sum-exp for the backward kernels."""
  block_q = q_ref.shape[0]
  q_start = pl.program_id(0) * block_q
  q, q_ids, hash_keys = q_ref[...], q_ids_ref[...], _hash_keys(scalars_ref, 1)

  def body(i, carry):
    m, l, acc = carry
    keys = pl.ds(i * block_k, block_k)
    s, mask, kept = _gpu_scores(hash_keys, q, k_ref[keys, :], q_ids, k_ids_ref[keys], q_start, i * block_k,
                                keep=keep, causal=causal, scale=scale)
    m_new = jnp.maximum(m, jnp.max(jnp.where(mask, s, attention_masks.NEG), axis=1))
    p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
    correction = jnp.exp(m - m_new)
    pv = jnp.dot(_kept(kept, p).astype(v_ref.dtype), v_ref[keys, :], preferred_element_type=jnp.float32)
    return m_new, l * correction + jnp.sum(p, axis=1), acc * correction[:, None] + pv

  num_k = k_ref.shape[0] // block_k
  if causal:
    num_k = jnp.minimum(num_k, (q_start + block_q + block_k - 1) // block_k)
  init = (jnp.full((block_q,), attention_masks.NEG, jnp.float32), jnp.zeros((block_q,), jnp.float32),
          jnp.zeros((block_q, o_ref.shape[1]), jnp.float32))
  m, l, acc = jax.lax.fori_loop(0, num_k, body, init)
  seen = l > 0  # rows that may attend to no key get zeros, and a log-sum-exp that gives them no weights
  total = jnp.where(seen, l, 1.0)
  o_ref[...] = jnp.where(seen[:, None], acc / (keep * total)[:, None], 0.0).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log(total), jnp.inf)


def _gpu_weights(hash_keys, q, k, v, do, q_ids, k_ids, lse, delta, q_start, k_start, *, keep, causal, scale):
  """A tile's dropped weights (for dv) and the gradient of its scaled scores (for dq and dk: times `scale` again
  for q·k's), recomputed from the log-sum-exp; delta = rowsum(do ⊙ o)."""
  s, mask, kept = _gpu_scores(hash_keys, q, k, q_ids, k_ids, q_start, k_start, keep=keep, causal=causal,
                              scale=scale)
  p = jnp.where(mask, jnp.exp(s - lse[:, None]), 0.0)
  dp = jax.lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
  dp = _kept(kept, dp * (1.0 / keep))
  return _kept(kept, p * (1.0 / keep)), p * (dp - delta[:, None])


def _gpu_dq_kernel(scalars_ref, q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, lse_ref, o_ref, do_ref, dq_ref, delta_ref,
                   *, keep: float, causal: bool, scale: float, block_k: int):
  """dq for one block of queries, summed over key blocks; and its rows' delta = rowsum(o ⊙ do), for the dkv kernel
  (from the tiles of o and do it reads, so no pass over them is left outside the kernels)."""
  block_q = q_ref.shape[0]
  q_start = pl.program_id(0) * block_q
  q, do, q_ids, lse = q_ref[...], do_ref[...], q_ids_ref[...], lse_ref[...]
  delta = jnp.sum(o_ref[...].astype(jnp.float32) * do.astype(jnp.float32), axis=1)
  delta_ref[...] = delta
  hash_keys = _hash_keys(scalars_ref, 1)

  def body(i, dq):
    keys = pl.ds(i * block_k, block_k)
    k = k_ref[keys, :]
    _, ds = _gpu_weights(hash_keys, q, k, v_ref[keys, :], do, q_ids, k_ids_ref[keys], lse, delta, q_start,
                         i * block_k, keep=keep, causal=causal, scale=scale)
    return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

  num_k = k_ref.shape[0] // block_k
  if causal:
    num_k = jnp.minimum(num_k, (q_start + block_q + block_k - 1) // block_k)
  dq = jax.lax.fori_loop(0, num_k, body, jnp.zeros(dq_ref.shape, jnp.float32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _gpu_dkv_kernel(scalars_ref, q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, lse_ref, delta_ref, do_ref, *out_refs,
                    keep: float, causal: bool, scale: float, block_q: int):
  """dk and dv for one block of keys, summed over query blocks: into dk_ref and dv_ref, or into one block
  [keys, 2, d] of a stack's gradient (`_places`; after the stack's dq, an aliased input this kernel leaves alone)."""
  block_k = k_ref.shape[0]
  k_start = pl.program_id(0) * block_k
  k, v, k_ids, hash_keys = k_ref[...], v_ref[...], k_ids_ref[...], _hash_keys(scalars_ref, 1)
  transposed_lhs = (((0,), (0,)), ((), ()))

  def body(i, carry):
    dk, dv = carry
    rows = pl.ds(i * block_q, block_q)
    q, do = q_ref[rows, :], do_ref[rows, :]
    dropped, ds = _gpu_weights(hash_keys, q, k, v, do, q_ids_ref[rows], k_ids, lse_ref[rows], delta_ref[rows],
                               i * block_q, k_start, keep=keep, causal=causal, scale=scale)
    dv = dv + jax.lax.dot_general(dropped.astype(do.dtype), do, transposed_lhs, preferred_element_type=jnp.float32)
    dk = dk + jax.lax.dot_general(ds.astype(q.dtype), q, transposed_lhs, preferred_element_type=jnp.float32)
    return dk, dv

  first = k_start // block_q if causal else 0  # earlier queries see none of these keys
  dk, dv = jax.lax.fori_loop(first, q_ref.shape[0] // block_q, body,
                             (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)))
  dk, dv = (dk * scale).astype(out_refs[-1].dtype), dv.astype(out_refs[-1].dtype)
  if out_refs[-1].ndim == 3:  # the stack's keys and values
    out_refs[-1][:, 0, :] = dk
    out_refs[-1][:, 1, :] = dv
  else:
    out_refs[0][...], out_refs[1][...] = dk, dv


def _places(count: int):
  """(operand, slot) of q, k and v among a kernel's `count` head arrays, as the projections produce them
  (`model.project`): q, k and v apart [b, len, h, d]; q, then a stack [b, len, 2, h, d] of k and v (cross-attention
  on a GPU); or one stack [b, len, 3, h, d] of k, v and q (self-attention on a GPU). Slot None: no stack axis."""
  return {3: ((0, None), (1, None), (2, None)), 2: ((0, None), (1, 0), (1, 1)), 1: ((0, 2), (0, 0), (0, 1))}[count]


def _rows(length: int, d: int, slot, tiled: bool):
  """The BlockSpec of `length` positions × d of one head, of a [b, len, h, d] array (slot None) or of one slot of a
  stack [b, len, n, h, d]: the grid's block i of positions (tiled), or those from 0."""
  if slot is None:
    return pl.BlockSpec((None, length, None, d), lambda i, b, h: (b, i if tiled else 0, h, 0))
  return pl.BlockSpec((None, length, None, None, d), lambda i, b, h: (b, i if tiled else 0, slot, h, 0))


def _gpu_attention(*args, keep: float, causal: bool, scale: float):
  """args: q, k and v as one to three head arrays (`_places`), then ids [b, q] and [b, k] and scalars [4]; q
  [b, q, h, d_k], k [b, k, h, d_k], v [b, k, h, d_v], lengths multiples of _GPU_BLOCKS[0] (or one block) and head
  dims powers of two; scores q·k × `scale`: the kernels above as one differentiable function (`pallas_call`s in a
  custom VJP). A stack is read in place and its gradient written as one array (the dkv kernel writes into the
  dq kernel's), so no copy of q, k and v is made either way. Rows that may attend to no key come out 0."""
  arrays = args[:-3]
  places = _places(len(arrays))
  (q_array, q_slot), (k_array, k_slot), (v_array, v_slot) = [(arrays[i], slot) for i, slot in places]
  batch, q_len, heads, d_k = *q_array.shape[:2], *q_array.shape[-2:]  # a stack's slot axis between them
  k_len, d_v = k_array.shape[1], v_array.shape[-1]
  options = dict(keep=keep, causal=causal, scale=scale)
  params = plgpu.CompilerParams(num_warps=4 if max(d_k, d_v) <= 64 else 8, num_stages=2)
  interpret = pallas_mode.interpreting()
  item = q_array.dtype.itemsize
  q_tile, q_whole = (lambda block: _rows(block, d_k, q_slot, tiled=True)), _rows(q_len, d_k, q_slot, tiled=False)
  k_tile, k_whole = (lambda block: _rows(block, d_k, k_slot, tiled=True)), _rows(k_len, d_k, k_slot, tiled=False)
  v_tile, v_whole = (lambda block: _rows(block, d_v, v_slot, tiled=True)), _rows(k_len, d_v, v_slot, tiled=False)
  o_tile, o_whole = (lambda block: _rows(block, d_v, None, tiled=True)), _rows(q_len, d_v, None, tiled=False)
  ids_tile = lambda block: pl.BlockSpec((None, block), lambda i, b, h: (b, i))
  ids_whole = lambda length: pl.BlockSpec((None, length), lambda i, b, h: (b, 0))
  rows_tile = lambda block: pl.BlockSpec((None, None, block), lambda i, b, h: (b, h, i))  # lse, delta [b, h, q]
  rows_whole = lambda length: pl.BlockSpec((None, None, length), lambda i, b, h: (b, h, 0))
  seeds = pl.BlockSpec((4,), lambda i, b, h: (0,))
  stats = jax.ShapeDtypeStruct((batch, heads, q_len), jnp.float32)
  block = [_gpu_block(q_len, _GPU_BLOCKS[0]), _gpu_block(k_len, _GPU_BLOCKS[0])]
  back = [_gpu_block(q_len, _GPU_BLOCKS[1]), _gpu_block(k_len, _GPU_BLOCKS[1])]
  shape = (batch, heads, q_len, k_len)
  weights, back_weights = (_computed_weights(shape, *blocks, causal) for blocks in (block, back))
  q_size, k_size, v_size = batch * heads * q_len * d_k, batch * heads * k_len * d_k, batch * heads * k_len * d_v
  o_size = batch * heads * q_len * d_v
  picked = lambda arrays: [arrays[i] for i, _ in places]  # the kernels' q, k and v operands: a stack once per slot

  def forward(*args):
    arrays, (q_ids, k_ids, scalars) = args[:-3], args[-3:]
    cost = pl.CostEstimate(flops=2 * weights * (d_k + d_v), transcendentals=weights,
                           bytes_accessed=item * (q_size + k_size + v_size + o_size) + 4 * stats.size)
    return pl.pallas_call(
        functools.partial(_gpu_forward_kernel, block_k=block[1], **options), grid=(q_len // block[0], batch, heads),
        in_specs=[seeds, q_tile(block[0]), k_whole, v_whole, ids_tile(block[0]), ids_whole(k_len)],
        out_specs=[o_tile(block[0]), rows_tile(block[0])],
        out_shape=[jax.ShapeDtypeStruct((batch, q_len, heads, d_v), q_array.dtype), stats], compiler_params=params,
        cost_estimate=cost, interpret=interpret, name='attention_gpu_fwd')(scalars, *picked(arrays), q_ids, k_ids)

  def backward(*args):
    arrays, (q_ids, k_ids, scalars, o, lse), do = args[:-6], args[-6:-1], args[-1]
    dq, delta = pl.pallas_call(
        functools.partial(_gpu_dq_kernel, block_k=back[1], **options), grid=(q_len // back[0], batch, heads),
        in_specs=[seeds, q_tile(back[0]), k_whole, v_whole, ids_tile(back[0]), ids_whole(k_len),
                  rows_tile(back[0]), o_tile(back[0]), o_tile(back[0])],
        out_specs=[q_tile(back[0]), rows_tile(back[0])],
        out_shape=[jax.ShapeDtypeStruct(q_array.shape, q_array.dtype), stats], compiler_params=params,
        cost_estimate=pl.CostEstimate(flops=2 * back_weights * (2 * d_k + d_v), transcendentals=back_weights,
                                      bytes_accessed=item * (2 * q_size + k_size + v_size + 2 * o_size)
                                      + 4 * 2 * stats.size),
        interpret=interpret, name='attention_gpu_dq')(scalars, *picked(arrays), q_ids, k_ids, lse, o, do)
    operands = (scalars, *picked(arrays), q_ids, k_ids, lse, delta, do)
    dkv_in_specs = [seeds, q_whole, k_tile(back[1]), v_tile(back[1]), ids_whole(q_len), ids_tile(back[1]),
                    rows_whole(q_len), rows_whole(q_len), o_whole]
    if k_slot is None:
      dkv_shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in arrays[1:]]
      dkv_specs, into = [k_tile(back[1]), v_tile(back[1])], {}
    else:  # the stack's keys and values, one block of both slots; with its queries, into dq's array
      dkv_shapes = jax.ShapeDtypeStruct(k_array.shape, k_array.dtype)
      dkv_specs = pl.BlockSpec((None, back[1], 2, None, d_k), lambda i, b, h: (b, i, 0, h, 0))
      into = {} if q_slot is None else {len(operands): 0}
      if into:
        operands, dkv_in_specs = (*operands, dq), [*dkv_in_specs, dkv_specs]
    dkv = pl.pallas_call(
        functools.partial(_gpu_dkv_kernel, block_q=back[0], **options), grid=(k_len // back[1], batch, heads),
        in_specs=dkv_in_specs, out_specs=dkv_specs, out_shape=dkv_shapes, input_output_aliases=into,
        compiler_params=params,
        cost_estimate=pl.CostEstimate(flops=4 * back_weights * (d_k + d_v), transcendentals=back_weights,
                                      bytes_accessed=item * (q_size + 2 * k_size + 2 * v_size + o_size)),
        interpret=interpret, name='attention_gpu_dkv')(*operands)
    return {3: lambda: (dq, *dkv), 2: lambda: (dq, dkv), 1: lambda: (dkv,)}[len(arrays)]()

  def forward_with_residuals(*args):
    o, lse = forward(*args)
    return o, (*args, o, lse)

  attend = jax.custom_vjp(lambda *args: forward(*args)[0])  # ids and scalars are arguments, as the TPU kernel's
  attend.defvjp(forward_with_residuals, lambda res, do: (*backward(*res, do), None, None, None))
  return attend(*args)


def flash_gpu_attention(q, k, v, spec, *, dropout_rate=0.0, dropout_seeds=None, stacked=None):
  """flash_gpu: our Triton kernels (`_gpu_attention`), for self- and cross-attention at any length, packed or
  padded, with attention dropout where `dropout_seeds` are given; lengths padded to their blocks, head dims by
  `_triton_head`. (jax's `pallas.ops.gpu.attention.mha`, which served self-attention before, is deprecated, was
  wrong in bf16 at 8-wide heads, and was not faster on an H100: bench/RESULTS.md.) The kernels scale the scores
  and zero the rows of queries that may attend to no key (padding keys get an id of their own), so no pass over
  q or the output is left outside them. `stacked`: the fused projections' product k and v (and, self-attending, q)
  were sliced from (`attention.attend`), which the kernels then read in place instead."""
  dropout_rate = dropout_rate if dropout_seeds is not None else 0.0
  q_len, k_len, d_k, d_v = q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]
  q_size, k_size = (_round_up(n, _gpu_block(n, _GPU_BLOCKS[0])) for n in (q_len, k_len))
  head_k, head_v = _triton_head(d_k), _triton_head(d_v)
  attend = functools.partial(_gpu_attention, keep=1.0 - dropout_rate, causal=spec.causal, scale=1.0 / math.sqrt(d_k))
  seeds = jnp.zeros((2,), jnp.int32) if dropout_seeds is None else dropout_seeds  # unread without dropout
  padded = lambda x, size, head: _pad_to(_pad_to(x, 1, size), x.ndim - 1, head)  # no-ops where nothing is padded
  if stacked is None:
    arrays = (padded(q, q_size, head_k), padded(k, k_size, head_k), padded(v, k_size, head_v))
  else:  # [b, k, n, h, d]: n = 3 holds q too (q_size = k_size)
    kv = padded(stacked, k_size, head_k)
    arrays = (kv,) if stacked.shape[2] == 3 else (padded(q, q_size, head_k), kv)
  out = _dropout_per_device(attend, arrays, *_padded_segment_ids(spec, q_size, k_size, _KEY_PAD_ID), seeds)
  return out[:, :q_len, :, :d_v]
