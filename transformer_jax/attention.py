"""Attention masks (padding, causal, packed segments) and interchangeable attention implementations.

Masks are described compactly by `MaskSpec` (per-token validity, segment ids, causality) and turned into
boolean blocks on demand, so the chunked implementation never materialises a [q, k] mask. Every
implementation shares one signature (`attend`) and returns zeros for a query that may attend to nothing:
`reference`, `dot_product` and `chunked` (XLA), and the accelerators' Pallas flash-attention kernels
`flash_tpu` and `flash_gpu`, each run by `jax.shard_map` on every device's block of batch × heads.
"""

import contextlib
import contextvars
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

_NEG = -1e30  # finite "minus infinity": keeps exp() and max() free of NaNs on fully masked rows


@flax.struct.dataclass
class MaskSpec:
  """Which keys each query may attend to.

  A query i and key j are connected iff both are valid, they share a segment id (when segments are given),
  and, if `causal`, j <= i + q_offset (q_offset > 0 when queries continue a cached prefix).
  """

  q_valid: jax.Array  # [batch, q] bool
  kv_valid: jax.Array  # [batch, k] bool
  q_segment: jax.Array | None = None  # [batch, q] int; packed rows
  kv_segment: jax.Array | None = None  # [batch, k] int
  q_offset: jax.Array | int | None = None  # None: 0, and known to be 0 through jit and remat (an int 0 is traced)
  causal: bool = flax.struct.field(pytree_node=False, default=False)

  # True when queries and keys are the same positions with the same validity and segments (self-attention),
  # set by `self_attention`; the GPU kernel takes one segment-id array for both sides and needs to know.
  shared_sides: bool = flax.struct.field(pytree_node=False, default=False)

  @classmethod
  def self_attention(cls, valid, segment=None, causal=False) -> 'MaskSpec':
    """Queries and keys are the same tokens: one validity and one segment array serve both sides."""
    return cls(q_valid=valid, kv_valid=valid, q_segment=segment, kv_segment=segment, causal=causal,
               shared_sides=True)

  @property
  def has_segments(self) -> bool:
    return self.q_segment is not None

  @property
  def has_offset(self) -> bool:
    """Queries may start after key 0 (cached decoding): anything but None or a literal 0."""
    return self.q_offset is not None and not (isinstance(self.q_offset, int) and self.q_offset == 0)

  @property
  def sides_match(self) -> bool:
    """Statically known to describe queries and keys alike (declared, or the very same arrays)."""
    return self.shared_sides or (self.q_valid is self.kv_valid and self.q_segment is self.kv_segment)


def mask_block(spec: MaskSpec, q_start, q_len: int, k_start, k_len: int) -> jax.Array:
  """The boolean mask [batch, 1, q_len, k_len] of queries q_start.. against keys k_start.."""
  q_valid = jax.lax.dynamic_slice_in_dim(spec.q_valid, q_start, q_len, axis=1)
  kv_valid = jax.lax.dynamic_slice_in_dim(spec.kv_valid, k_start, k_len, axis=1)
  mask = q_valid[:, :, None] & kv_valid[:, None, :]
  if spec.has_segments:
    q_seg = jax.lax.dynamic_slice_in_dim(spec.q_segment, q_start, q_len, axis=1)
    kv_seg = jax.lax.dynamic_slice_in_dim(spec.kv_segment, k_start, k_len, axis=1)
    mask &= q_seg[:, :, None] == kv_seg[:, None, :]
  if spec.causal:
    q_idx = q_start + (0 if spec.q_offset is None else spec.q_offset) + jnp.arange(q_len)
    k_idx = k_start + jnp.arange(k_len)
    mask &= (k_idx[None, :] <= q_idx[:, None])[None]
  return mask[:, None]


def full_mask(spec: MaskSpec) -> jax.Array:
  return mask_block(spec, 0, spec.q_valid.shape[1], 0, spec.kv_valid.shape[1])


def reference_attention(q, k, v, spec, *, dropout_rate=0.0, dropout_rng=None, return_weights=False):
  """softmax(QK^T/sqrt(d_k))V with einsums, softmax in float32 (§3.2.1); optionally returns the weights."""
  scores = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
  scores = scores / math.sqrt(q.shape[-1])
  mask = full_mask(spec)
  scores = jnp.where(mask, scores, _NEG)
  weights = jax.nn.softmax(scores, axis=-1) * jnp.any(mask, axis=-1, keepdims=True)
  if dropout_rate > 0.0 and dropout_rng is not None:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
    weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
  out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
  return (out, weights) if return_weights else out


def dot_product_attention(q, k, v, spec):
  """`jax.nn.dot_product_attention`: cuDNN's fused kernel on GPU where the mask allows it, else XLA.

  cuDNN takes only sequence lengths and causality (right-padded rows), so packed segments or a
  cached-prefix offset go through XLA with the full boolean mask, which honours every mask form.
  """
  if _cudnn_applicable(q, k, spec):
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=spec.causal,
        query_seq_lengths=jnp.sum(spec.q_valid, axis=1, dtype=jnp.int32),
        key_value_seq_lengths=jnp.sum(spec.kv_valid, axis=1, dtype=jnp.int32),
        implementation='cudnn')
  mask = full_mask(spec)
  out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation='xla')
  return out * jnp.any(mask, axis=-1)[:, 0, :, None, None].astype(out.dtype)


def _cudnn_applicable(q, k, spec) -> bool:
  return (jax.default_backend() == 'gpu' and q.dtype in (jnp.bfloat16, jnp.float16)
          and not spec.has_segments and not spec.has_offset
          and (not spec.causal or q.shape[1] == k.shape[1]) and q.shape[-1] % 8 == 0
          and q.shape[-1] <= 128)


def chunked_attention(q, k, v, spec, *, chunk_size=512):
  """Memory-efficient attention: query blocks (rematerialised in the backward pass) × an online softmax
  over key blocks, so peak memory grows with chunk_size × length instead of length².
  """
  batch, q_len, heads, _ = q.shape
  k_len = k.shape[1]
  cq, ck = min(chunk_size, q_len), min(chunk_size, k_len)
  q, spec = _pad_queries(q, spec, -q_len % cq)
  k, v, spec = _pad_keys(k, v, spec, -k_len % ck)
  num_q, num_k = q.shape[1] // cq, k.shape[1] // ck
  scale = 1.0 / math.sqrt(q.shape[-1])

  def query_block(q_start):
    q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, cq, axis=1)

    def key_block(carry, k_start):
      m, l, acc = carry
      k_blk = jax.lax.dynamic_slice_in_dim(k, k_start, ck, axis=1)
      v_blk = jax.lax.dynamic_slice_in_dim(v, k_start, ck, axis=1)
      s = jnp.einsum('bqhd,bkhd->bhqk', q_blk, k_blk, preferred_element_type=jnp.float32) * scale
      mask = mask_block(spec, q_start, cq, k_start, ck)
      s = jnp.where(mask, s, _NEG)
      m_new = jnp.maximum(m, s.max(axis=-1))
      p = jnp.exp(s - m_new[..., None]) * mask
      correction = jnp.exp(m - m_new)
      l = l * correction + p.sum(axis=-1)
      pv = jnp.einsum('bhqk,bkhd->bqhd', p.astype(v.dtype), v_blk, preferred_element_type=jnp.float32)
      acc = acc * jnp.swapaxes(correction, 1, 2)[..., None] + pv
      return (m_new, l, acc), None

    init = (jnp.full((batch, heads, cq), _NEG, jnp.float32), jnp.zeros((batch, heads, cq), jnp.float32),
            jnp.zeros((batch, cq, heads, v.shape[-1]), jnp.float32))
    (_, l, acc), _ = jax.lax.scan(key_block, init, jnp.arange(num_k) * ck)
    l = jnp.swapaxes(l, 1, 2)[..., None]
    return (acc / jnp.where(l > 0, l, 1.0)).astype(v.dtype)

  blocks = jax.lax.map(jax.checkpoint(query_block), jnp.arange(num_q) * cq)  # [num_q, b, cq, h, dv]
  out = jnp.moveaxis(blocks, 0, 1).reshape(batch, num_q * cq, heads, v.shape[-1])
  return out[:, :q_len]


def _pad_queries(q, spec, pad):
  if not pad:
    return q, spec
  q = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
  q_segment = None if spec.q_segment is None else jnp.pad(spec.q_segment, ((0, 0), (0, pad)))
  return q, spec.replace(q_valid=jnp.pad(spec.q_valid, ((0, 0), (0, pad))), q_segment=q_segment)


def _pad_keys(k, v, spec, pad):
  if not pad:
    return k, v, spec
  widths = ((0, 0), (0, pad), (0, 0), (0, 0))
  kv_segment = None if spec.kv_segment is None else jnp.pad(spec.kv_segment, ((0, 0), (0, pad)))
  spec = spec.replace(kv_valid=jnp.pad(spec.kv_valid, ((0, 0), (0, pad))), kv_segment=kv_segment)
  return jnp.pad(k, widths), jnp.pad(v, widths), spec


# --- Pallas flash-attention kernels

# The segment id of padding, queries and keys alike: padding queries then attend to padding keys, and their
# outputs are zeroed (`_any_key`) like every query's that may attend to nothing.
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


def _tpu_interpreted(fn):
  """fn with the Pallas TPU kernels of its forward and backward passes traced in interpret mode.

  The kernel's backward pass is traced when gradients are taken, after `fn` returns: a custom VJP re-enters
  interpret mode there. Mode `True` is Pallas's plain interpreter (a scan over the grid); the default
  `InterpretParams` simulates TPU memory with host callbacks, and deadlocked in eager use here.
  """
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top

  @jax.custom_vjp
  def run(*args):
    with pltpu.force_tpu_interpret_mode(True):
      return fn(*args)

  def forward(*args):
    with pltpu.force_tpu_interpret_mode(True):
      return jax.vjp(fn, *args)

  def backward(vjp, cotangent):
    with pltpu.force_tpu_interpret_mode(True):
      return vjp(cotangent)

  run.defvjp(forward, backward)
  return run


def _target_platform() -> str:
  """The platform being compiled for: the context mesh's devices' (AOT for a TPU on a CPU host), else the default."""
  device = jax.sharding.get_abstract_mesh().abstract_device
  return device.platform if device is not None else jax.default_backend()


def _segment_ids(valid, segment, pad_id):
  ids = jnp.zeros(valid.shape, jnp.int32) if segment is None else segment.astype(jnp.int32)
  return jnp.where(valid, ids, pad_id)


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _pad_to(x, axis: int, size: int, value=0):
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def _any_key(spec: MaskSpec, dtype):
  """[b, q, 1, 1]: 1 for queries that may attend to some key, 0 for the others (whose output must be 0).

  A reduction over the boolean mask, which XLA can fuse with building it; the kernels cannot tell, since a
  fully masked row softmaxes to uniform weights over its masked keys.
  """
  return jnp.any(full_mask(spec), axis=-1)[:, 0, :, None, None].astype(dtype)


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


def _fallback_needed(spec: MaskSpec) -> bool:
  """Cached decoding (queries after a prefix) is beyond the kernels' causal masks: 'reference' serves it."""
  return spec.has_offset


def flash_tpu_attention(q, k, v, spec):
  """The Pallas TPU flash-attention kernel (`jax.experimental.pallas.ops.tpu.flash_attention`).

  Padding and packed segments become segment ids (padding an id of its own), and causality the kernel's own
  mask. Its blocks need key lengths in multiples of 128 and query lengths in multiples of 8 (of 128 above
  128): both are padded here, and head dims to max(d_k, d_v) (a multiple of 128 above 128). Cached decoding
  (q_offset > 0) falls back to 'reference'.
  """
  if _fallback_needed(spec):
    return reference_attention(q, k, v, spec)
  platform = _target_platform()
  if platform not in ('tpu', 'cpu'):
    raise ValueError(f"model.attention='flash_tpu' is the TPU kernel; on {platform} use 'flash_gpu' or "
                     "'dot_product'.")
  from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash  # pylint: disable=g-import-not-at-top
  q_len, k_len, d_k, d_v = q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]
  q_size = _round_up(q_len, 128 if q_len > 128 else 8)
  k_size = _round_up(k_len, 128)
  head = max(d_k, d_v) if max(d_k, d_v) <= 128 else _round_up(max(d_k, d_v), 128)
  block_q = min(128, q_size)
  blocks = tpu_flash.BlockSizes(
      block_q=block_q, block_k_major=128, block_k=128, block_b=1, block_q_major_dkv=block_q,
      block_k_major_dkv=128, block_k_dkv=128, block_q_dkv=block_q, block_k_major_dq=128, block_k_dq=128,
      block_q_dq=block_q)

  def kernel(q, k, v, q_ids, kv_ids):
    heads_major = lambda x: jnp.swapaxes(x, 1, 2)  # [b, len, h, d] <-> [b, h, len, d]
    out = tpu_flash.flash_attention(
        heads_major(q), heads_major(k), heads_major(v), segment_ids=tpu_flash.SegmentIds(q_ids, kv_ids),
        causal=spec.causal, sm_scale=1.0 / math.sqrt(d_k), block_sizes=blocks)
    return heads_major(out)

  out = _per_device(
      _tpu_interpreted(kernel) if _INTERPRET.get() else kernel,
      _pad_to(_pad_to(q, 1, q_size), 3, head), _pad_to(_pad_to(k, 1, k_size), 3, head),
      _pad_to(_pad_to(v, 1, k_size), 3, head),
      _pad_to(_segment_ids(spec.q_valid, spec.q_segment, _PAD_ID), 1, q_size, _PAD_ID),
      _pad_to(_segment_ids(spec.kv_valid, spec.kv_segment, _PAD_ID), 1, k_size, _PAD_ID))
  out = out[:, :q_len, :, :d_v]
  return out * _any_key(spec, out.dtype)


def flash_gpu_attention(q, k, v, spec):
  """The Pallas GPU (Triton) flash-attention kernel (`jax.experimental.pallas.ops.gpu.attention.mha`).

  That kernel takes ONE segment-id array for queries and keys alike, so it serves self-attention whose mask
  is statically known to describe both sides the same way (`MaskSpec.sides_match`); padding becomes a segment
  id of its own there (padding queries see padding keys; their outputs are zeroed). Everything else
  (cross-attention, a spec not known to match) goes to 'dot_product' (cuDNN for right-padded bf16/f16 batches,
  else XLA; 'reference' when d_k != d_v), and cached decoding (q_offset > 0) to 'reference'. Lengths are
  padded to the kernel's blocks (a power of two from 16 to 128, then multiples of 128), head dims to
  max(d_k, d_v).
  """
  if _fallback_needed(spec):
    return reference_attention(q, k, v, spec)
  if not spec.sides_match or q.shape[1] != k.shape[1]:
    if q.shape[-1] != v.shape[-1]:
      return reference_attention(q, k, v, spec)
    return dot_product_attention(q, k, v, spec)
  platform = _target_platform()
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
  return out * _any_key(spec, out.dtype)


IMPLEMENTATIONS = ('reference', 'dot_product', 'chunked', 'flash_tpu', 'flash_gpu')


def attend(q, k, v, spec: MaskSpec, *, implementation='reference', chunk_size=512, dropout_rate=0.0,
           dropout_rng=None):
  """One signature for every implementation: q [b, q, h, d_k], k [b, k, h, d_k], v [b, k, h, d_v]."""
  if implementation == 'reference':
    return reference_attention(q, k, v, spec, dropout_rate=dropout_rate, dropout_rng=dropout_rng)
  if implementation == 'dot_product':
    return dot_product_attention(q, k, v, spec)
  if implementation == 'chunked':
    return chunked_attention(q, k, v, spec, chunk_size=chunk_size)
  if implementation == 'flash_tpu':
    return flash_tpu_attention(q, k, v, spec)
  if implementation == 'flash_gpu':
    return flash_gpu_attention(q, k, v, spec)
  raise ValueError(f'unknown attention implementation {implementation!r}: use one of {IMPLEMENTATIONS}.')

