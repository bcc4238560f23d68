"""Attention masks (padding, causal, packed segments) and three interchangeable attention implementations.

Masks are described compactly by `MaskSpec` (per-token validity, segment ids, causality) and turned into
boolean blocks on demand, so the chunked implementation never materialises a [q, k] mask. All three
implementations share one signature (`attend`) and return zeros for a query that may attend to nothing.
"""

import math

import flax.struct
import jax
import jax.numpy as jnp

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
  q_offset: jax.Array | int = 0
  causal: bool = flax.struct.field(pytree_node=False, default=False)

  @property
  def has_segments(self) -> bool:
    return self.q_segment is not None


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
    q_idx = q_start + spec.q_offset + jnp.arange(q_len)
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
          and not spec.has_segments and isinstance(spec.q_offset, int) and spec.q_offset == 0
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


def attend(q, k, v, spec: MaskSpec, *, implementation='reference', chunk_size=512, dropout_rate=0.0,
           dropout_rng=None):
  """One signature for every implementation: q [b, q, h, d_k], k [b, k, h, d_k], v [b, k, h, d_v]."""
  if implementation == 'reference':
    return reference_attention(q, k, v, spec, dropout_rate=dropout_rate, dropout_rng=dropout_rng)
  if implementation == 'dot_product':
    return dot_product_attention(q, k, v, spec)
  if implementation == 'chunked':
    return chunked_attention(q, k, v, spec, chunk_size=chunk_size)
  raise ValueError(f"unknown attention implementation {implementation!r}: use 'reference', "
                   "'dot_product' or 'chunked'.")

