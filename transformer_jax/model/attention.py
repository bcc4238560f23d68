"""Interchangeable attention implementations behind one signature (`attend`), in one table (`IMPLEMENTATIONS`):
`reference`, `dot_product` and `chunked` (XLA) and the accelerators' flash kernels (`flash_tpu`, `flash_gpu`). Each
returns zeros for a query that may attend to nothing. `serving` is the one rule that says which implementation
serves a call: the model's kernels name one (`Kernels.attention`, for `auto` the platform's fastest), and where it
cannot serve a call (cached decoding, d_k != d_v, attention dropout in a kernel without it) one that can does.
"""

import math

import jax
import jax.numpy as jnp

from transformer_jax.config.platform import FLASH_KERNELS
from transformer_jax.config.platform import Kernels
from transformer_jax.kernels import attention_masks
from transformer_jax.kernels import dropout_masks
from transformer_jax.kernels import ops
from transformer_jax.kernels.attention_masks import NEG
from transformer_jax.kernels.gpu import flash_attention as flash_gpu
from transformer_jax.kernels.tpu import flash_attention as flash_tpu
from transformer_jax.runtime import pallas_mode


def dropout_scale(seeds, rate: float, q_start, k_start, shape) -> jax.Array:
  """Attention dropout's factors for the [batch, heads, q, k] block of weights at queries q_start.., keys
  k_start..: 0 (dropped) or 1 / (1 - rate), from `attention_masks.dropout_keep`'s hash of each weight's indices
  and the step's `seeds`, so that any block of any implementation draws the bits the full matrix has there."""
  batch, heads, q_len, k_len = shape
  rows = attention_masks.dropout_row_keys(seeds, jnp.arange(batch)[:, None, None, None],
                                          jnp.arange(heads)[None, :, None, None])
  keep = attention_masks.dropout_keep(rows, seeds[1], q_start + jnp.arange(q_len)[:, None],
                                      k_start + jnp.arange(k_len)[None, :], 1.0 - rate)
  return keep.astype(jnp.float32) / (1.0 - rate)


def reference_attention(q, k, v, spec, *, kernels: Kernels, dropout_rate=0.0, dropout_seeds=None,
                        return_weights=False):
  """softmax(QK^T/sqrt(d_k))V with einsums, softmax in float32 (§3.2.1); optionally returns the weights."""
  scores = ops.einsum_f32('bqhd,bkhd->bhqk', q, k, kernels)
  scores = scores / math.sqrt(q.shape[-1])
  mask = attention_masks.full_mask(spec)
  scores = jnp.where(mask, scores, NEG)
  weights = jax.nn.softmax(scores, axis=-1) * jnp.any(mask, axis=-1, keepdims=True)
  if dropout_rate > 0.0 and dropout_seeds is not None:
    weights = weights * dropout_scale(dropout_seeds, dropout_rate, 0, 0, weights.shape)
  out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
  return (out, weights) if return_weights else out


def dot_product_attention(q, k, v, spec, *, kernels: Kernels):
  """`jax.nn.dot_product_attention`: cuDNN's fused kernel on a GPU where the mask allows it, else XLA.

  cuDNN takes only sequence lengths and causality (right-padded rows), so packed segments or a
  cached-prefix offset go through XLA with the full boolean mask, which honours every mask form.
  """
  if _cudnn_applicable(q, spec, kernels):
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=spec.causal,
        query_seq_lengths=jnp.sum(spec.q_valid, axis=1, dtype=jnp.int32),
        key_value_seq_lengths=jnp.sum(spec.kv_valid, axis=1, dtype=jnp.int32),
        implementation='cudnn')
  out = jax.nn.dot_product_attention(q, k, v, mask=attention_masks.full_mask(spec), implementation='xla')
  return out * attention_masks.any_key(spec, out.dtype)  # the same mask, built once by XLA's CSE


def _cudnn_applicable(q, spec, kernels: Kernels) -> bool:
  return (kernels.cudnn_attention and q.dtype in (jnp.bfloat16, jnp.float16)
          and not spec.has_segments and not spec.has_offset
          and (not spec.causal or q.shape[1] == spec.kv_valid.shape[1]) and q.shape[-1] % 8 == 0
          and q.shape[-1] <= 128)


def chunked_attention(q, k, v, spec, *, kernels: Kernels, chunk_size=512, dropout_rate=0.0, dropout_seeds=None):
  """Memory-efficient attention: query blocks (rematerialised in the backward pass) × an online softmax
  over key blocks, so peak memory grows with chunk_size × length instead of length². Attention dropout is drawn
  block by block (`dropout_scale`, the full matrix's bits) and applied to the weights' numerator.
  """
  batch, q_len, heads, _ = q.shape
  k_len = k.shape[1]
  cq, ck = min(chunk_size, q_len), min(chunk_size, k_len)
  q, spec = _pad_queries(q, spec, -q_len % cq)
  k, v, spec = _pad_keys(k, v, spec, -k_len % ck)
  num_q, num_k = q.shape[1] // cq, k.shape[1] // ck
  scale = 1.0 / math.sqrt(q.shape[-1])

  dropping = dropout_rate > 0.0 and dropout_seeds is not None

  def query_block(q_start):
    q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, cq, axis=1)

    def key_block(carry, k_start):
      m, l, acc = carry
      k_blk = jax.lax.dynamic_slice_in_dim(k, k_start, ck, axis=1)
      v_blk = jax.lax.dynamic_slice_in_dim(v, k_start, ck, axis=1)
      s = ops.einsum_f32('bqhd,bkhd->bhqk', q_blk, k_blk, kernels) * scale
      mask = attention_masks.mask_block(spec, q_start, cq, k_start, ck)
      s = jnp.where(mask, s, NEG)
      m_new = jnp.maximum(m, s.max(axis=-1))
      p = jnp.exp(s - m_new[..., None]) * mask
      correction = jnp.exp(m - m_new)
      l = l * correction + p.sum(axis=-1)
      if dropping:
        p = p * dropout_scale(dropout_seeds, dropout_rate, q_start, k_start, p.shape)
      pv = ops.einsum_f32('bhqk,bkhd->bqhd', p.astype(v.dtype), v_blk, kernels)
      acc = acc * jnp.swapaxes(correction, 1, 2)[..., None] + pv
      return (m_new, l, acc), None

    init = (jnp.full((batch, heads, cq), NEG, jnp.float32), jnp.zeros((batch, heads, cq), jnp.float32),
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


IMPLEMENTATIONS = {
    'reference': reference_attention,
    'dot_product': dot_product_attention,
    'chunked': chunked_attention,
    'flash_tpu': flash_tpu.flash_tpu_attention,
    'flash_gpu': flash_gpu.flash_gpu_attention,
}
_DROPOUT = ('reference', 'chunked', 'flash_tpu', 'flash_gpu')  # the implementations with attention dropout
_XLA = ('reference', 'dot_product', 'chunked')  # the implementations written with XLA's ops (they take the kernels)


def serving(kernels: Kernels, spec: attention_masks.MaskSpec, q, v, dropout: bool) -> str:
  """The implementation that serves this call: the kernels' (`Kernels.attention`), on a GPU cuDNN's
  (`dot_product`) instead where it serves and the kernels take it (bf16/f16, no packed segments, no attention
  dropout). Then, for any choice: cached decoding (queries after a prefix) goes to 'reference'; attention dropout
  to 'chunked' where the choice has none ('dot_product'); 'dot_product' needs d_k == d_v (else 'reference').
  """
  implementation = kernels.attention
  if implementation == 'flash_gpu' and not dropout and _cudnn_applicable(q, spec, kernels):
    implementation = 'dot_product'  # cuDNN's fused kernel (bench/RESULTS.md, "Attention implementations")
  if spec.has_offset:
    return 'reference'
  if dropout and implementation not in _DROPOUT:
    return 'chunked'
  if implementation == 'dot_product' and q.shape[-1] != v.shape[-1]:
    return 'reference'
  _check_kernel_platform(implementation, kernels)
  return implementation


def _check_kernel_platform(implementation: str, kernels: Kernels) -> None:
  """A flash kernel compiles only for its own platform (a CPU runs it in `pallas_mode.interpret_kernels`):
  elsewhere, one line that says what to choose instead of Pallas's own error."""
  platform = FLASH_KERNELS.get(implementation)
  if platform not in (None, kernels.platform) and not pallas_mode.interpreting():
    raise ValueError(f'model.attention={implementation!r} is a {platform.upper()} kernel, and this step is compiled '
                     f'for {kernels.platform.upper()} devices: set model.attention=\'auto\' (the fastest this platform '
                     f'has) or one of {tuple(name for name in IMPLEMENTATIONS if name not in FLASH_KERNELS)}.')


def attend(q, k, v, spec: attention_masks.MaskSpec, *, kernels: Kernels, chunk_size=512, dropout_rate=0.0,
           dropout_rng=None, stacked=None):
  """One signature for every implementation: q [b, q, h, d_k], k [b, k, h, d_k], v [b, k, h, d_v]; `serving`
  picks the one that runs. Dropout (`dropout_rate` > 0 with a `dropout_rng`) applies to the attention weights,
  with the same bits in every implementation that has it (`attention_masks.dropout_keep`). `stacked`: the one
  product k and v were sliced from, [b, k, n, h, d] with k at 0, v at 1 and, n = 3, q at 2 (the fused projections
  on a GPU), which `flash_gpu` reads in place: the slices, then unused, are never copied."""
  dropout = dropout_rate > 0.0 and dropout_rng is not None
  name = serving(kernels, spec, q, v, dropout)
  options = {'kernels': kernels} if name in _XLA else {}
  if name == 'chunked':
    options['chunk_size'] = chunk_size
  if name == 'flash_gpu' and stacked is not None:
    options['stacked'] = stacked
  if dropout:
    length = max(q.shape[1], k.shape[1])
    if length > attention_masks.MAX_DROPOUT_LENGTH:
      raise ValueError(f'attention dropout takes sequences of up to {attention_masks.MAX_DROPOUT_LENGTH} '
                       f'positions, not {length}: shorten them or set model.attention_dropout=0.')
    options.update(dropout_rate=dropout_rate, dropout_seeds=dropout_masks.seeds(dropout_rng))
  return IMPLEMENTATIONS[name](q, k, v, spec, **options)
