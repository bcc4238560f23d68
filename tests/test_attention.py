"""The three attention implementations agree on every mask form, and masks mean what they say."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import attention


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
  spec = attention.MaskSpec(q_valid=jnp.asarray(q_valid), kv_valid=jnp.asarray(kv_valid), causal=causal,
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
  np.testing.assert_array_equal(attention.full_mask(spec), _naive_mask(spec))


def test_causal_offset_mask():
  spec = attention.MaskSpec(q_valid=jnp.ones((1, 1), bool), kv_valid=jnp.ones((1, 6), bool), causal=True,
                            q_offset=3)
  np.testing.assert_array_equal(attention.full_mask(spec)[0, 0, 0], [True] * 4 + [False] * 2)


@pytest.mark.parametrize('segments,causal', [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize('chunk', [4, 5, 64])
def test_implementations_agree(segments, causal, chunk):
  q, k, v, spec = _random_case(1, segments=segments, causal=causal)
  ref = attention.attend(q, k, v, spec, implementation='reference')
  for impl in ('dot_product', 'chunked'):
    out = attention.attend(q, k, v, spec, implementation=impl, chunk_size=chunk)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5, err_msg=impl)


def test_implementations_agree_cross_lengths_and_dv():
  q, k, v, spec = _random_case(2, q_len=9, k_len=17, d_k=8, d_v=12, segments=True)
  ref = attention.attend(q, k, v, spec, implementation='reference')
  out = attention.attend(q, k, v, spec, implementation='chunked', chunk_size=4)
  np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)


def test_gradients_agree():
  q, k, v, spec = _random_case(3, segments=True, causal=True)

  def loss(impl, q, k, v):
    return jnp.sum(jnp.sin(attention.attend(q, k, v, spec, implementation=impl, chunk_size=4)))

  ref = jax.grad(lambda *a: loss('reference', *a), argnums=(0, 1, 2))(q, k, v)
  for impl in ('dot_product', 'chunked'):
    got = jax.grad(lambda *a: loss(impl, *a), argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(got, ref):
      np.testing.assert_allclose(g, r, atol=5e-5, rtol=5e-5, err_msg=impl)


def test_fully_masked_queries_give_zeros():
  q, k, v, spec = _random_case(4)
  for impl in ('reference', 'dot_product', 'chunked'):
    out = attention.attend(q, k, v, spec, implementation=impl, chunk_size=4)
    assert np.all(np.asarray(out)[1, -4:] == 0.0), impl  # padded queries of row 1
    assert np.all(np.isfinite(out))


def test_padding_keys_are_ignored():
  q, k, v, spec = _random_case(5)
  k2, v2 = k.copy(), v.copy()
  k2[1, -5:] += 100.0
  v2[1, -5:] -= 100.0
  for impl in ('reference', 'dot_product', 'chunked'):
    a = attention.attend(q, k, v, spec, implementation=impl, chunk_size=4)
    b = attention.attend(q, k2, v2, spec, implementation=impl, chunk_size=4)
    np.testing.assert_allclose(a, b, atol=1e-5, err_msg=impl)


def test_unknown_implementation_is_an_error():
  q, k, v, spec = _random_case(6)
  with pytest.raises(ValueError, match='unknown attention implementation'):
    attention.attend(q, k, v, spec, implementation='flash')
