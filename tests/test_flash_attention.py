"""The Pallas flash-attention kernels agree with 'reference', forward and gradients, on every mask form.

Run on a CPU in Pallas interpret mode (`attention.interpret_kernels`). That the TPU kernel also compiles for a
real TPU inside the train step is tested in test_aot.py.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import attention
from transformer_jax import sharding

# Lengths not a multiple of any kernel block, so the wrappers' padding is exercised.
CASES = {
    'padding': dict(q_len=20, k_len=20, segments=False, causal=False),
    'causal': dict(q_len=20, k_len=20, segments=False, causal=True),
    'packed_causal': dict(q_len=20, k_len=20, segments=True, causal=True),
    'packed_cross': dict(q_len=9, k_len=17, segments=True, causal=False, d_v=12),
}


def _segments(length, valid_len, sizes):
  """Consecutive segments 1, 2, ... of the given sizes, then 0 (padding) from valid_len on."""
  ids = np.concatenate([np.full(n, i + 1) for i, n in enumerate(sizes)] + [np.zeros(length, int)])[:length]
  return np.where(np.arange(length) < valid_len, ids, 0).astype(np.int32)


def _case(name, seed=0, batch=2, heads=2, d_k=8):
  c = CASES[name]
  q_len, k_len, d_v = c['q_len'], c['k_len'], c.get('d_v', d_k)
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(batch, q_len, heads, d_k)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(batch, k_len, heads, d_k)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(batch, k_len, heads, d_v)), jnp.float32)
  q_lens, k_lens = (q_len, q_len - 3), (k_len, k_len - 5)
  q_valid = jnp.asarray(np.arange(q_len)[None] < np.array(q_lens)[:, None])
  kv_valid = jnp.asarray(np.arange(k_len)[None] < np.array(k_lens)[:, None])
  if q_len == k_len:  # self-attention: one validity (and segment) array for both sides
    segment = None
    if c['segments']:
      segment = jnp.asarray(np.stack([_segments(q_len, n, (7, 5, 8)) for n in q_lens]))
    return q, k, v, attention.MaskSpec.self_attention(q_valid, segment, causal=c['causal'])
  # Packed cross-attention: row 1's third target segment has no source segment, so its queries see no key.
  q_segment = jnp.asarray(np.stack([_segments(q_len, q_lens[0], (4, 5)), _segments(q_len, q_lens[1], (2, 2, 2))]))
  kv_segment = jnp.asarray(np.stack([_segments(k_len, k_lens[0], (9, 8)), _segments(k_len, k_lens[1], (6, 6))]))
  return q, k, v, attention.MaskSpec(q_valid=q_valid, kv_valid=kv_valid, q_segment=q_segment,
                                     kv_segment=kv_segment, causal=c['causal'])


def _output_and_grads(implementation, q, k, v, spec, cotangent):
  def run(q, k, v, spec):
    out, vjp = jax.vjp(lambda q, k, v: attention.attend(q, k, v, spec, implementation=implementation), q, k, v)
    return out, vjp(cotangent)

  return jax.jit(run)(q, k, v, spec)


def _runs_a_kernel(implementation, q, k, v, spec) -> bool:
  """Whether the implementation runs a Pallas kernel when the spec is traced too (as through jit or remat)."""
  run = lambda q, k, v, spec: attention.attend(q, k, v, spec, implementation=implementation)
  return 'pallas_call' in str(jax.make_jaxpr(run)(q, k, v, spec))


@pytest.mark.parametrize('implementation', ['flash_tpu', 'flash_gpu'])
@pytest.mark.parametrize('case', list(CASES))
def test_kernel_matches_reference(implementation, case):
  q, k, v, spec = _case(case)
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape[:3] + v.shape[-1:]), jnp.float32)
  expected = _output_and_grads('reference', q, k, v, spec, cotangent)
  with attention.interpret_kernels():
    # The GPU kernel takes one segment-id array for both sides: cross-attention goes to 'dot_product'.
    assert _runs_a_kernel(implementation, q, k, v, spec) == (implementation == 'flash_tpu' or spec.sides_match)
    jitted_out, grads = _output_and_grads(implementation, q, k, v, spec, cotangent)
    # Also op by op: there the kernels give fully masked rows uniform weights (jitted, XLA happens to give 0).
    eager_out = attention.attend(q, k, v, spec, implementation=implementation)
  no_key = ~np.asarray(attention.full_mask(spec)).any(axis=-1)[:, 0]
  assert no_key.any()
  for out in (jitted_out, eager_out):
    np.testing.assert_allclose(out, expected[0], atol=2e-5, rtol=2e-5)
    # Padding queries, and the packed cross case's queries whose segment has no key, get exact zeros.
    assert np.all(np.asarray(out)[no_key] == 0.0)
  for name, got, want in zip('qkv', grads, expected[1]):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5, err_msg=f'd{name}')


@pytest.mark.parametrize('implementation', ['flash_tpu', 'flash_gpu'])
def test_kernel_runs_per_device_block_on_a_mesh(implementation):
  """Under a data × tensor mesh each device runs the kernel on its rows and heads (shard_map), same result."""
  q, k, v, spec = _case('packed_causal')
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 1, 2), sharding.MESH_AXES)
  expected = attention.attend(q, k, v, spec, implementation='reference')
  with attention.interpret_kernels(), jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
    jaxpr = str(jax.make_jaxpr(lambda *a: attention.attend(*a, implementation=implementation))(q, k, v, spec))
    assert 'shard_map' in jaxpr and 'pallas_call' in jaxpr
    out = jax.jit(lambda *a: attention.attend(*a, implementation=implementation))(q, k, v, spec)
  np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)


def test_cached_decoding_falls_back_to_reference():
  q, k, v, _ = _case('causal')
  spec = attention.MaskSpec(q_valid=jnp.ones(q.shape[:2], bool), kv_valid=jnp.ones(k.shape[:2], bool), causal=True,
                            q_offset=jnp.int32(3))
  for implementation in ('flash_tpu', 'flash_gpu'):
    assert not _runs_a_kernel(implementation, q, k, v, spec)
    np.testing.assert_array_equal(attention.attend(q, k, v, spec, implementation=implementation),
                                  attention.attend(q, k, v, spec, implementation='reference'))


def test_kernel_on_a_cpu_without_interpret_mode_is_an_error():
  q, k, v, spec = _case('padding')
  with pytest.raises(ValueError, match='Only interpret mode is supported on CPU'):
    attention.attend(q, k, v, spec, implementation='flash_tpu')
