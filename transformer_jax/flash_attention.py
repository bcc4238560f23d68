"""The accelerators' Pallas flash-attention kernels, `flash_tpu` (jax's splash attention) and `flash_gpu`, each
run by `jax.shard_map` on every device's block of batch × heads of the context mesh. They serve what their
kernels can (`attention.serving` sends the rest to the XLA implementations); `interpret_kernels` runs them on a
CPU for tests."""

import contextlib
import contextvars
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from transformer_jax import attention_masks
from transformer_jax import sharding

# The segment id of padding, queries and keys alike: padding queries then attend to padding keys, and their
# outputs are zeroed (`attention_masks.any_key`) like every query's that may attend to nothing.
_PAD_ID = int(jnp.iinfo(jnp.int32).min)
_INTERPRET = contextvars.ContextVar('interpret_kernels', default=False)


@contextlib.contextmanager
def interpret_kernels():
  """Attention traced inside runs the Pallas kernels in interpret mode, which a CPU can execute: for tests.

  Outside it the kernels are traced for their accelerator (also on a CPU host compiling for a TPU slice, or
  under `jax.eval_shape`); compiling them for a CPU then fails with Pallas's "Only interpret mode is supported".
  """
  token = _INTERPRET.set(True)
  try:
    yield
  finally:
    _INTERPRET.reset(token)


def _segment_ids(valid, segment, pad_id):
  ids = jnp.zeros(valid.shape, jnp.int32) if segment is None else segment.astype(jnp.int32)
  return jnp.where(valid, ids, pad_id)


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _pad_to(x, axis: int, size: int, value=0):
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def _mesh_axes(mesh, logical: str, size: int):
  """The mesh axes the logical-axis rules shard `logical` over, if they divide `size`; else None (replicated)."""
  axes = nn.logical_to_mesh_axes((logical,))[0]
  if axes is None:
    return None
  names = axes if isinstance(axes, tuple) else (axes,)
  names = tuple(name for name in names if name in mesh.shape)
  if not names or size % math.prod(mesh.shape[name] for name in names):
    return None
  return names


def _per_device(kernel, q, k, v, q_ids, kv_ids):
  """kernel(q, k, v, q_ids, kv_ids) on each device's block of batch × heads of the context mesh (if any)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return kernel(q, k, v, q_ids, kv_ids)
  batch, heads = _mesh_axes(mesh, 'batch', q.shape[0]), _mesh_axes(mesh, 'heads', q.shape[2])
  qkv, ids = P(batch, None, heads, None), P(batch, None)
  return jax.shard_map(kernel, mesh=mesh, in_specs=(qkv, qkv, qkv, ids, ids), out_specs=qkv,
                       check_vma=False)(q, k, v, q_ids, kv_ids)


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


def flash_tpu_attention(q, k, v, spec):
  """The Pallas TPU splash-attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`).

  Padding and packed segments become segment ids (padding an id of its own), and causality the kernel's static
  mask, whose fully masked blocks it skips. Its residual is one log-sum-exp per query; blocks and backward
  kernels as `_splash_blocks` chooses. With segment ids its blocks need query and key lengths in multiples of
  128: both are padded here, and head dims to max(d_k, d_v). Not for cached decoding (`attention.serving` sends
  that elsewhere).
  """
  platform = sharding.target_platform()
  if platform not in ('tpu', 'cpu'):
    raise ValueError(f"model.attention='flash_tpu' is the TPU kernel; on {platform} use 'flash_gpu' or "
                     "'dot_product'.")
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
                                    q_seq_shards=1, interpret=_INTERPRET.get())
    heads_major = lambda x: jnp.swapaxes(x, 1, 2)  # [b, len, h, d] <-> [b, h, len, d]
    scaled = q * jnp.asarray(1.0 / math.sqrt(d_k), q.dtype)
    out = jax.vmap(lambda q, k, v, qi, ki: attend(q, k, v, segment_ids=splash.SegmentIds(qi, ki)))(
        heads_major(scaled), heads_major(k), heads_major(v), q_ids, kv_ids)
    return heads_major(out)

  out = _per_device(
      kernel,
      _pad_to(_pad_to(q, 1, q_size), 3, head), _pad_to(_pad_to(k, 1, k_size), 3, head),
      _pad_to(_pad_to(v, 1, k_size), 3, head),
      _pad_to(_segment_ids(spec.q_valid, spec.q_segment, _PAD_ID), 1, q_size, _PAD_ID),
      _pad_to(_segment_ids(spec.kv_valid, spec.kv_segment, _PAD_ID), 1, k_size, _PAD_ID))
  out = out[:, :q_len, :, :d_v]
  return out * attention_masks.any_key(spec, out.dtype)


def flash_gpu_attention(q, k, v, spec):
  """The Pallas GPU (Triton) flash-attention kernel (`jax.experimental.pallas.ops.gpu.attention.mha`).

  That kernel takes ONE segment-id array for queries and keys alike, so it serves self-attention whose mask
  is statically known to describe both sides the same way (`MaskSpec.sides_match`); padding becomes a segment
  id of its own there (padding queries see padding keys; their outputs are zeroed); `attention.serving` sends
  everything else elsewhere. Lengths are padded to the kernel's blocks (a power of two from 16 to 128, then
  multiples of 128), head dims to max(d_k, d_v).
  """
  platform = sharding.target_platform()
  if platform not in ('gpu', 'cuda', 'rocm', 'cpu'):
    raise ValueError(f"model.attention='flash_gpu' is the GPU kernel; on {platform} use 'flash_tpu' or "
                     "'dot_product'.")
  from jax.experimental.pallas.ops.gpu import attention as gpu_flash  # pylint: disable=g-import-not-at-top
  length, d_k, d_v = q.shape[1], q.shape[-1], v.shape[-1]
  size = max(16, 1 << (length - 1).bit_length()) if length <= 128 else _round_up(length, 128)
  head = max(d_k, d_v)
  interpret = _INTERPRET.get()

  def kernel(q, k, v, ids, _):
    return gpu_flash.mha(q, k, v, ids, sm_scale=1.0 / math.sqrt(d_k), causal=spec.causal, interpret=interpret)

  ids = _pad_to(_segment_ids(spec.kv_valid, spec.kv_segment, _PAD_ID), 1, size, _PAD_ID)
  out = _per_device(kernel, _pad_to(_pad_to(q, 1, size), 3, head), _pad_to(_pad_to(k, 1, size), 3, head),
                    _pad_to(_pad_to(v, 1, size), 3, head), ids, ids)
  out = out[:, :length, :, :d_v]
  return out * attention_masks.any_key(spec, out.dtype)
