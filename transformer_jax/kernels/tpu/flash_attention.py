"""`flash_tpu`: jax's Pallas splash-attention kernel for a TPU, and with attention dropout our own kernel, an online
softmax over key blocks with the dropout bits drawn inside (`kernels/flash_blocks.py` holds what both backends'
kernels share)."""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from transformer_jax.kernels import attention_masks
from transformer_jax.kernels import flash_blocks as flash
from transformer_jax.runtime import pallas_mode


def _heads_major(x):
  return jnp.swapaxes(x, 1, 2)  # [b, len, h, d] <-> [b, h, len, d]


def _scaled(q, d_k: int):
  """q · 1/√d_k (d_k before any padding of the head dim), which jax's splash kernel takes instead of scaled
  scores (our kernels scale the scores themselves)."""
  return q * jnp.asarray(1.0 / math.sqrt(d_k), q.dtype)


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
  that elsewhere). With attention dropout (`dropout_seeds`, `dropout_masks.seeds`): our kernel
  (`_flash_tpu_dropout`).
  """
  if dropout_rate > 0.0 and dropout_seeds is not None:
    return _flash_tpu_dropout(q, k, v, spec, dropout_rate, dropout_seeds)
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask  # pylint: disable=g-import-not-at-top
  q_len, k_len, d_k, d_v = q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]
  q_size, k_size, head = flash.round_up(q_len, 128), flash.round_up(k_len, 128), max(d_k, d_v)
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

  out = flash.per_device(
      kernel,
      (flash.pad_to(flash.pad_to(q, 1, q_size), 3, head), flash.pad_to(flash.pad_to(k, 1, k_size), 3, head),
       flash.pad_to(flash.pad_to(v, 1, k_size), 3, head)),
      *flash.padded_segment_ids(spec, q_size, k_size))
  out = out[:, :q_len, :, :d_v]
  return out * attention_masks.any_key(spec, out.dtype)


# --- with attention dropout: our kernel, an online softmax over key blocks with the hash's bits inside


def _tpu_dropout_blocks(q_size: int, k_size: int) -> tuple[int, int]:
  """(block_q, block_k) for lengths padded to 128: keys in one block up to 512 (one key block: dq needs no sum
  over blocks), else blocks of 512, 256 or 128, whichever divides; queries in 256s where that divides and the
  keys are at most 256, else 128s."""
  block_k = k_size if k_size <= 512 else next(b for b in (512, 256, 128) if k_size % b == 0)
  return (256 if q_size % 256 == 0 and k_size <= 256 else 128), block_k


def _tile_scores(hash_keys, q, k, q_ids_ref, k_ids_ref, q_block, k_block, *, keep: float, causal: bool,
                 scale: float):
  """The grid step's tile of scores [block_q, block_k] (q·k scaled by `scale` in float32), its mask, and where
  attention dropout keeps the weights (positions from 2-D iotas, as Mosaic lays them out)."""
  s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
  q_pos = q_block * s.shape[0] + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
  k_pos = k_block * s.shape[1] + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
  return (s, *flash.mask_and_bits(hash_keys, q_ids_ref[...], k_ids_ref[...], q_pos, k_pos, keep=keep, causal=causal))


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
  q_block, k_block, hash_keys = pl.program_id(2), pl.program_id(3), flash.grid_step_keys(scalars_ref, 0)

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
  k_block, q_block, hash_keys = pl.program_id(2), pl.program_id(3), flash.grid_step_keys(scalars_ref, 0)

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
  weights = flash.computed_weights((batch, heads, q_len, k_len), block_q, block_k, causal)
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
  q_size, k_size = flash.round_up(q_len, 128), flash.round_up(k_len, 128)
  block_q, block_k = _tpu_dropout_blocks(q_size, k_size)
  keep = 1.0 - dropout_rate

  def attend(q, k, v, q_ids, kv_ids, scalars):
    out = _dropout_attention(_heads_major(q), _heads_major(k), _heads_major(v), q_ids[:, :, None],
                             kv_ids[:, None, :], scalars, keep=keep, causal=spec.causal,
                             scale=1.0 / math.sqrt(d_k), block_q=block_q, block_k=block_k)
    return _heads_major(out)

  ids = flash.padded_segment_ids(spec, q_size, k_size, flash.KEY_PAD_ID)
  arrays = (flash.pad_to(q, 1, q_size), flash.pad_to(k, 1, k_size), flash.pad_to(v, 1, k_size))
  out = flash.dropout_per_device(attend, arrays, *ids, dropout_seeds)
  return out[:, :q_len]
