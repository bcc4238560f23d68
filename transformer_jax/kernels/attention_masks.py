"""Attention masks: which keys each query may attend to (padding, causal, packed segments, a cached prefix),
described compactly by `MaskSpec` and turned into boolean blocks on demand, so that no implementation needs a
materialised [q, k] mask unless it asks for one; and which weights attention dropout keeps (`dropout_keep`)."""

import flax.struct
import jax
import jax.numpy as jnp

from transformer_jax.kernels import dropout_masks

NEG = -1e30  # finite "minus infinity": keeps exp() and max() free of NaNs on fully masked rows


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

  @classmethod
  def self_attention(cls, valid, segment=None, causal=False) -> 'MaskSpec':
    """Queries and keys are the same tokens: one validity and one segment array serve both sides."""
    return cls(q_valid=valid, kv_valid=valid, q_segment=segment, kv_segment=segment, causal=causal)

  @property
  def has_segments(self) -> bool:
    return self.q_segment is not None

  @property
  def has_offset(self) -> bool:
    """Queries may start after key 0 (cached decoding): anything but None or a literal 0."""
    return self.q_offset is not None and not (isinstance(self.q_offset, int) and self.q_offset == 0)


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


def any_key(spec: MaskSpec, dtype):
  """[b, q, 1, 1]: 1 for queries that may attend to some key, 0 for the others (whose output must be 0).

  A reduction over the boolean mask, which XLA can fuse with building it; for `jax.nn.dot_product_attention` and
  jax's splash kernel, which cannot tell (a fully masked row softmaxes to uniform weights over its masked keys).
  Our own kernels zero such rows themselves.
  """
  return jnp.any(full_mask(spec), axis=-1)[:, 0, :, None, None].astype(dtype)


# --- attention dropout's keep mask: `dropout_masks`' counter-based hash of (batch row, head, query, key), keyed
# by `dropout_masks.seeds`, so that every implementation, every block of one and every kernel draws the same bits
# without materialising them

MAX_DROPOUT_LENGTH = 1 << 16  # query and key positions share one 32-bit counter


def dropout_row_keys(seeds: jax.Array, batch_index: jax.Array, head_index: jax.Array) -> jax.Array:
  """The hash's key for each (batch row, head) the indices broadcast to."""
  mix = dropout_masks.mix
  return mix(mix(batch_index.astype(jnp.int32) ^ seeds[0]) ^ head_index.astype(jnp.int32))


def dropout_keep(row_key, seed, q_pos, k_pos, keep_prob: float) -> jax.Array:
  """True where attention dropout keeps the weight of query `q_pos` on key `k_pos` (positions below
  MAX_DROPOUT_LENGTH), for the (batch row, head) of `row_key`; `seed` is the second of `dropout_masks.seeds`.
  Kept with probability keep_prob to within 2^-24."""
  x = dropout_masks.mix(row_key + ((q_pos.astype(jnp.int32) << 16) | k_pos.astype(jnp.int32)))
  x = dropout_masks.mix(x ^ seed)
  return dropout_masks.below(x, keep_prob)
