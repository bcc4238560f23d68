"""The XLA attention implementations agree on every mask form, with attention dropout too; masks mean what they
say; and `attention.serving` picks the implementation the rules name."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from transformer_jax.config import model as model_config
from transformer_jax.kernels import attention_masks
from transformer_jax.kernels import dropout_masks
from transformer_jax.model import attention


def _random_case(seed, batch=2, q_len=13, k_len=13, heads=3, d_k=8, d_v=8, segments=False, causal=False):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(batch, q_len, heads, d_k)).astype(np.float32)
  k = rng.normal(size=(batch, k_len, heads, d_k)).astype(np.float32)
  v = rng.normal(size=(batch, k_len, heads, d_v)).astype(np.float32)
  q_lens, k_lens = [q_len, q_len - 4], [k_len, k_len - 5]
  q_valid = np.arange(q_len)[None] < np.array(q_lens)[:, None]
  kv_valid = np.arange(k_len)[None] < np.array(k_lens)[:, None]
  kwargs = {}
  if segments:
    kwargs['q_segment'] = np.where(q_valid, 1 + (np.arange(q_len)[None] >= q_len // 2), 0).astype(np.int32)
    kwargs['kv_segment'] = np.where(kv_valid, 1 + (np.arange(k_len)[None] >= k_len // 2), 0).astype(np.int32)
  spec = attention_masks.MaskSpec(q_valid=jnp.asarray(q_valid), kv_valid=jnp.asarray(kv_valid), causal=causal,
                                  **{n: jnp.asarray(a) for n, a in kwargs.items()})
  return q, k, v, spec


def _naive_mask(spec):
  """The mask built with Python loops, straight from MaskSpec's docstring."""
  b, lq = spec.q_valid.shape
  lk = spec.kv_valid.shape[1]
  out = np.zeros((b, 1, lq, lk), bool)
  for n, i, j in itertools.product(range(b), range(lq), range(lk)):
    ok = bool(spec.q_valid[n, i] and spec.kv_valid[n, j])
    if spec.q_segment is not None:
      ok &= bool(spec.q_segment[n, i] == spec.kv_segment[n, j])
    if spec.causal:
      ok &= j <= i + (spec.q_offset or 0)
    out[n, 0, i, j] = ok
  return out


@pytest.mark.parametrize('segments,causal', [(False, False), (False, True), (True, False), (True, True)])
def test_full_mask_matches_definition(segments, causal):
  _, _, _, spec = _random_case(0, segments=segments, causal=causal)
  np.testing.assert_array_equal(attention_masks.full_mask(spec), _naive_mask(spec))


def test_causal_offset_mask():
  spec = attention_masks.MaskSpec(q_valid=jnp.ones((1, 1), bool), kv_valid=jnp.ones((1, 6), bool), causal=True,
                            q_offset=3)
  np.testing.assert_array_equal(attention_masks.full_mask(spec)[0, 0, 0], [True] * 4 + [False] * 2)


@pytest.mark.parametrize('segments,causal', [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize('chunk', [4, 5, 64])
def test_implementations_agree(segments, causal, chunk):
  q, k, v, spec = _random_case(1, segments=segments, causal=causal)
  ref = attention.attend(q, k, v, spec, kernels=helpers.kernels('reference'))
  for impl in ('dot_product', 'chunked'):
    out = attention.attend(q, k, v, spec, kernels=helpers.kernels(impl), chunk_size=chunk)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5, err_msg=impl)


def test_implementations_agree_cross_lengths_and_dv():
  q, k, v, spec = _random_case(2, q_len=9, k_len=17, d_k=8, d_v=12, segments=True)
  ref = attention.attend(q, k, v, spec, kernels=helpers.kernels('reference'))
  out = attention.attend(q, k, v, spec, kernels=helpers.kernels('chunked'), chunk_size=4)
  np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)


def test_gradients_agree():
  q, k, v, spec = _random_case(3, segments=True, causal=True)

  def loss(impl, q, k, v):
    return jnp.sum(jnp.sin(attention.attend(q, k, v, spec, kernels=helpers.kernels(impl), chunk_size=4)))

  ref = jax.grad(lambda *a: loss('reference', *a), argnums=(0, 1, 2))(q, k, v)
  for impl in ('dot_product', 'chunked'):
    got = jax.grad(lambda *a: loss(impl, *a), argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(got, ref):
      np.testing.assert_allclose(g, r, atol=5e-5, rtol=5e-5, err_msg=impl)


def test_fully_masked_queries_give_zeros():
  q, k, v, spec = _random_case(4)
  for impl in ('reference', 'dot_product', 'chunked'):
    out = attention.attend(q, k, v, spec, kernels=helpers.kernels(impl), chunk_size=4)
    assert np.all(np.asarray(out)[1, -4:] == 0.0), impl  # padded queries of row 1
    assert np.all(np.isfinite(out))


def test_padding_keys_are_ignored():
  q, k, v, spec = _random_case(5)
  k2, v2 = k.copy(), v.copy()
  k2[1, -5:] += 100.0
  v2[1, -5:] -= 100.0
  for impl in ('reference', 'dot_product', 'chunked'):
    a = attention.attend(q, k, v, spec, kernels=helpers.kernels(impl), chunk_size=4)
    b = attention.attend(q, k2, v2, spec, kernels=helpers.kernels(impl), chunk_size=4)
    np.testing.assert_allclose(a, b, atol=1e-5, err_msg=impl)


def test_unknown_implementation_is_an_error():
  with pytest.raises(ValueError, match=r"model.attention='flash' is not one of \('auto', 'reference'"):
    helpers.kernels('flash')


# --- attention dropout: one hash of each weight's indices, the same bits whichever implementation computes them

RATE = 0.3


def _dropped_reference(q, k, v, spec, rng):
  """softmax(QK^T/sqrt(d)) with its mask, times the factors of `attention.dropout_scale` on the full matrix, · V."""
  scores = jnp.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(q.shape[-1])
  mask = attention_masks.full_mask(spec)
  weights = jax.nn.softmax(jnp.where(mask, scores, attention_masks.NEG), axis=-1) * jnp.any(mask, -1, keepdims=True)
  factors = attention.dropout_scale(dropout_masks.seeds(rng), RATE, 0, 0, weights.shape)
  return jnp.einsum('bhqk,bkhd->bqhd', weights * factors, v)


@pytest.mark.parametrize('implementation,chunk', [('reference', 512), ('chunked', 4), ('chunked', 64)])
def test_attention_dropout_draws_the_full_matrix_bits_in_any_block(implementation, chunk):
  q, k, v, spec = _random_case(7, segments=True, causal=True)
  rng = jax.random.key(3)
  out = attention.attend(q, k, v, spec, kernels=helpers.kernels(implementation), chunk_size=chunk, dropout_rate=RATE,
                         dropout_rng=rng)
  np.testing.assert_allclose(out, _dropped_reference(q, k, v, spec, rng), atol=2e-5, rtol=2e-5)
  kernels = helpers.kernels(implementation)
  assert not np.allclose(out, attention.attend(q, k, v, spec, kernels=kernels, chunk_size=chunk))
  other = attention.attend(q, k, v, spec, kernels=kernels, chunk_size=chunk, dropout_rate=RATE,
                           dropout_rng=jax.random.key(4))
  assert not np.allclose(out, other)  # another step's key, other bits


def test_chunked_attention_dropout_gradients_follow_the_same_weights():
  q, k, v, spec = _random_case(8, segments=True, causal=True)
  rng = jax.random.key(4)
  chunked = lambda q, k, v: jnp.sum(jnp.sin(attention.attend(q, k, v, spec, kernels=helpers.kernels('chunked'),
                                                             chunk_size=4, dropout_rate=RATE, dropout_rng=rng)))
  dense = lambda q, k, v: jnp.sum(jnp.sin(_dropped_reference(q, k, v, spec, rng)))
  for got, want in zip(jax.grad(chunked, argnums=(0, 1, 2))(q, k, v), jax.grad(dense, argnums=(0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=5e-5)


def test_dropout_keeps_weights_at_the_rate_independently_per_row_head_and_position():
  keep = 1.0 - RATE
  seeds = dropout_masks.seeds(jax.random.key(5))
  rows = attention_masks.dropout_row_keys(seeds, jnp.arange(4)[:, None, None, None], jnp.arange(8)[None, :, None, None])
  kept = np.asarray(attention_masks.dropout_keep(rows, seeds[1], jnp.arange(256)[:, None], jnp.arange(256)[None],
                                                 keep))  # [4, 8, 256, 256]: 2M draws
  n = kept.size
  assert abs(kept.mean() - keep) < 5 * np.sqrt(keep * (1 - keep) / n)  # 5 standard deviations
  # No two rows or heads share a mask: the pairs agree as often as independent draws would.
  flat = kept.reshape(32, -1)
  agree = (flat[:, None] == flat[None]).mean(-1)[~np.eye(32, dtype=bool)]
  both = keep ** 2 + (1 - keep) ** 2
  assert np.all(np.abs(agree - both) < 5 * np.sqrt(both * (1 - both) / flat.shape[1]))
  # Neither are neighbouring queries' or keys' draws correlated.
  for a, b in ((kept[..., 1:, :], kept[..., :-1, :]), (kept[..., 1:], kept[..., :-1])):
    assert abs((a == b).mean() - both) < 5 * np.sqrt(both * (1 - both) / a.size)


def test_attention_dropout_on_longer_sequences_than_its_counter_is_an_error():
  length = attention_masks.MAX_DROPOUT_LENGTH + 1
  q = jnp.zeros((1, length, 1, 4))
  spec = attention_masks.MaskSpec.self_attention(jnp.ones((1, length), bool))
  with pytest.raises(ValueError, match='attention dropout takes sequences of up to 65536'):
    attention.attend(q, q, q, spec, kernels=helpers.kernels('chunked'), dropout_rate=RATE,
                     dropout_rng=jax.random.key(0))


# --- which implementation serves a call


def test_the_table_holds_every_configurable_implementation():
  assert set(model_config.ATTENTIONS) == {'auto', *attention.IMPLEMENTATIONS}


def test_auto_chooses_by_the_platform_compiled_for_and_falls_back_where_a_kernel_cannot_serve():
  q, k, v, spec = _random_case(9)
  self_spec = attention_masks.MaskSpec.self_attention(spec.q_valid, causal=True)
  decoding = spec.replace(q_offset=jnp.int32(3))
  long = attention_masks.MaskSpec.self_attention(jnp.ones((1, 1100), bool))
  serving = attention.serving
  cpu, tpu = helpers.kernels('auto', 'cpu'), helpers.kernels('auto', 'tpu')
  assert serving(cpu, spec, q, v, dropout=False) == 'reference'  # a CPU: XLA's ops
  assert serving(cpu, spec, q, v, dropout=True) == 'reference'  # a CPU's choice has dropout
  assert serving(tpu, self_spec, q, v, dropout=False) == 'flash_tpu'
  assert serving(tpu, spec, q, v, dropout=False) == 'flash_tpu'  # cross-attention: segment ids per side
  assert serving(tpu, decoding, q, v, dropout=False) == 'reference'  # a cached prefix: no kernel's mask
  assert serving(tpu, self_spec, q, v, dropout=True) == 'flash_tpu'  # its own kernel draws dropout
  assert serving(tpu, long, q, v, dropout=True) == 'flash_tpu'  # at any length
  flash_gpu = helpers.kernels('flash_gpu')
  assert serving(flash_gpu, self_spec, q, v, dropout=False) == 'flash_gpu'
  assert serving(flash_gpu, spec, q, v, dropout=False) == 'flash_gpu'  # cross-attention: our Triton kernels
  d_v = v[..., :4]
  dot_product = helpers.kernels('dot_product')
  assert serving(dot_product, spec, q, d_v, dropout=False) == 'reference'  # dot_product needs d_k == d_v
  assert serving(dot_product, spec, q, v, dropout=True) == 'chunked'  # dropout where the choice has none
  assert serving(helpers.kernels('chunked'), decoding, q, v, dropout=False) == 'reference'


def test_auto_on_a_gpu_takes_cudnn_where_it_serves_and_the_triton_kernel_for_packed_rows():
  q, _, v, padded = _random_case(10, segments=False, causal=True)
  _, _, _, packed = _random_case(10, segments=True, causal=True)
  padded_self = attention_masks.MaskSpec.self_attention(padded.q_valid, causal=True)
  packed_self = attention_masks.MaskSpec.self_attention(packed.q_valid, packed.q_segment, causal=True)
  bf16 = lambda x: jnp.asarray(x, jnp.bfloat16)
  serving, gpu = attention.serving, helpers.kernels('auto', 'gpu')  # the rule's input; cuDNN itself: test_gpu.py
  assert serving(gpu, padded_self, bf16(q), bf16(v), dropout=False) == 'dot_product'
  assert serving(gpu, padded, bf16(q), bf16(v), dropout=False) == 'dot_product'  # cross-attention too
  assert serving(gpu, packed_self, bf16(q), bf16(v), dropout=False) == 'flash_gpu'  # cuDNN takes no segments
  assert serving(gpu, packed, bf16(q), bf16(v), dropout=False) == 'flash_gpu'  # packed cross: our kernels
  assert serving(gpu, padded_self, q, v, dropout=False) == 'flash_gpu'  # float32: no cuDNN kernel
  # With attention dropout, which cuDNN's kernel lacks: our Triton kernel, for self- and cross-attention alike.
  assert serving(gpu, padded_self, bf16(q), bf16(v), dropout=True) == 'flash_gpu'
  assert serving(gpu, packed, bf16(q), bf16(v), dropout=True) == 'flash_gpu'
  assert serving(helpers.kernels('dot_product', 'gpu'), packed, bf16(q), bf16(v), dropout=True) == 'chunked'
  # An explicit flash_gpu stays ours where cuDNN would serve.
  assert serving(helpers.kernels('flash_gpu'), padded_self, bf16(q), bf16(v), dropout=False) == 'flash_gpu'
