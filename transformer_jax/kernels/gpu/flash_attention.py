"""`flash_gpu`: our Pallas Triton kernels for a GPU, an online softmax over key blocks with the query and key segment
ids apart and attention dropout's bits drawn inside (`kernels/flash_blocks.py` holds what both backends' kernels
share)."""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from transformer_jax.kernels import attention_masks
from transformer_jax.kernels import flash_blocks as flash
from transformer_jax.runtime import pallas_mode

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
  return (s, *flash.mask_and_bits(hash_keys, q_ids[:, None], k_ids[None, :], q_pos, k_pos, keep=keep, causal=causal))


def _kept(kept, x):
  """x where attention dropout keeps it, else 0 (x itself without dropout)."""
  return x if kept is None else jnp.where(kept, x, 0.0)


def _gpu_forward_kernel(scalars_ref, q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, o_ref, lse_ref, *, keep: float,
                        causal: bool, scale: float, block_k: int):
  """Output rows for one block of queries: the softmax's running max and sum over all (undropped) weights, the
  weighted sum over the kept ones; and each row's log-sum-exp for the backward kernels."""
  block_q = q_ref.shape[0]
  q_start = pl.program_id(0) * block_q
  q, q_ids, hash_keys = q_ref[...], q_ids_ref[...], flash.grid_step_keys(scalars_ref, 1)

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
  hash_keys = flash.grid_step_keys(scalars_ref, 1)

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
  k, v, k_ids, hash_keys = k_ref[...], v_ref[...], k_ids_ref[...], flash.grid_step_keys(scalars_ref, 1)
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
  (`ops.project`): q, k and v apart [b, len, h, d]; q, then a stack [b, len, 2, h, d] of k and v (cross-attention
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
  weights, back_weights = (flash.computed_weights(shape, *blocks, causal) for blocks in (block, back))
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
  wrong in bf16 at 8-wide heads, and was not faster than ours: bench/RESULTS.md, "Attention implementations".) The
  kernels scale the scores and zero the rows of queries that may attend to no key (padding keys get an id of their
  own), so no pass over q or the output is left outside them. `stacked`: the fused projections' product k and v
  (and, self-attending, q) were sliced from (`attention.attend`), which the kernels then read in place instead."""
  dropout_rate = dropout_rate if dropout_seeds is not None else 0.0
  q_len, k_len, d_k, d_v = q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]
  q_size, k_size = (flash.round_up(n, _gpu_block(n, _GPU_BLOCKS[0])) for n in (q_len, k_len))
  head_k, head_v = _triton_head(d_k), _triton_head(d_v)
  attend = functools.partial(_gpu_attention, keep=1.0 - dropout_rate, causal=spec.causal, scale=1.0 / math.sqrt(d_k))
  seeds = jnp.zeros((2,), jnp.int32) if dropout_seeds is None else dropout_seeds  # unread without dropout
  # no-ops where nothing is padded
  padded = lambda x, size, head: flash.pad_to(flash.pad_to(x, 1, size), x.ndim - 1, head)
  if stacked is None:
    arrays = (padded(q, q_size, head_k), padded(k, k_size, head_k), padded(v, k_size, head_v))
  else:  # [b, k, n, h, d]: n = 3 holds q too (q_size = k_size)
    kv = padded(stacked, k_size, head_k)
    arrays = (kv,) if stacked.shape[2] == 3 else (padded(q, q_size, head_k), kv)
  ids = flash.padded_segment_ids(spec, q_size, k_size, flash.KEY_PAD_ID)
  out = flash.dropout_per_device(attend, arrays, *ids, seeds)
  return out[:, :q_len, :, :d_v]
