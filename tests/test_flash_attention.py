"""The Pallas flash-attention kernels agree with 'reference', forward and gradients, on every mask form.

Run on a CPU in Pallas interpret mode (`pallas_mode.interpret_kernels`). That the TPU kernel also compiles for a
real TPU inside the train step is tested in test_aot.py.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from transformer_jax.config import mesh as mesh_section
from transformer_jax.config.model import ModelConfig
from transformer_jax.kernels import attention_masks
from transformer_jax.model import attention
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime import pallas_mode

# Lengths not a multiple of any kernel block, so the wrappers' padding is exercised.
CASES = {
    'padding': dict(q_len=20, k_len=20, segments=False, causal=False),
    'causal': dict(q_len=20, k_len=20, segments=False, causal=True),
    'packed_causal': dict(q_len=20, k_len=20, segments=True, causal=True),
    'packed_cross': dict(q_len=9, k_len=17, segments=True, causal=False, d_v=12),
    # The TPU kernel's block choices: keys in one block of 256 with one fused backward kernel, whose key and value
    # gradients it accumulates over two query blocks of 256; and 3 blocks of 128 with separate backward kernels.
    'one_key_block': dict(q_len=500, k_len=200, segments=False, causal=False),
    'long_causal': dict(q_len=300, k_len=300, segments=False, causal=True),
    # Several key blocks for the dropout kernels (TPU: 5 of 128, causal tiles above the diagonal skipped; 9 of 128).
    'many_key_blocks': dict(q_len=600, k_len=600, segments=True, causal=True),
    'long_cross': dict(q_len=200, k_len=1100, segments=False, causal=False),
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
    return q, k, v, attention_masks.MaskSpec.self_attention(q_valid, segment, causal=c['causal'])
  if not c['segments']:  # cross-attention over padded rows
    return q, k, v, attention_masks.MaskSpec(q_valid=q_valid, kv_valid=kv_valid, causal=c['causal'])
  # Packed cross-attention: row 1's third target segment has no source segment, so its queries see no key.
  q_segment = jnp.asarray(np.stack([_segments(q_len, q_lens[0], (4, 5)), _segments(q_len, q_lens[1], (2, 2, 2))]))
  kv_segment = jnp.asarray(np.stack([_segments(k_len, k_lens[0], (9, 8)), _segments(k_len, k_lens[1], (6, 6))]))
  return q, k, v, attention_masks.MaskSpec(q_valid=q_valid, kv_valid=kv_valid, q_segment=q_segment,
                                     kv_segment=kv_segment, causal=c['causal'])


def _output_and_grads(implementation, q, k, v, spec, cotangent):
  def run(q, k, v, spec):
    kernels = helpers.kernels(implementation)
    out, vjp = jax.vjp(lambda q, k, v: attention.attend(q, k, v, spec, kernels=kernels), q, k, v)
    return out, vjp(cotangent)

  return jax.jit(run)(q, k, v, spec)


def _runs_a_kernel(implementation, q, k, v, spec) -> bool:
  """Whether the implementation runs a Pallas kernel when the spec is traced too (as through jit or remat)."""
  run = lambda q, k, v, spec: attention.attend(q, k, v, spec, kernels=helpers.kernels(implementation))
  return 'pallas_call' in str(jax.make_jaxpr(run)(q, k, v, spec))


@pytest.mark.parametrize('implementation', ['flash_tpu', 'flash_gpu'])
@pytest.mark.parametrize('case', list(CASES))
def test_kernel_matches_reference(implementation, case):
  q, k, v, spec = _case(case)
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape[:3] + v.shape[-1:]), jnp.float32)
  expected = _output_and_grads('reference', q, k, v, spec, cotangent)
  with pallas_mode.interpret_kernels():
    jaxpr = str(jax.make_jaxpr(lambda *a: attention.attend(*a, kernels=helpers.kernels(implementation)))(q, k, v, spec))
    assert 'pallas_call' in jaxpr
    jitted_out, grads = _output_and_grads(implementation, q, k, v, spec, cotangent)
    # Also op by op: there jax's splash kernel gives fully masked rows uniform weights (jitted, XLA happens to give
    # 0), which `any_key` zeroes; our kernels give them zeros themselves.
    eager_out = attention.attend(q, k, v, spec, kernels=helpers.kernels(implementation))
  no_key = ~np.asarray(attention_masks.full_mask(spec)).any(axis=-1)[:, 0]
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
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 1, 2), mesh_section.MESH_AXES)
  expected = attention.attend(q, k, v, spec, kernels=helpers.kernels('reference'))
  with pallas_mode.interpret_kernels(), jax.set_mesh(mesh), nn.logical_axis_rules(mesh_section.DEFAULT_RULES):
    jaxpr = str(jax.make_jaxpr(lambda *a: attention.attend(*a, kernels=helpers.kernels(implementation)))(q, k, v, spec))
    assert 'shard_map' in jaxpr and 'pallas_call' in jaxpr
    out = jax.jit(lambda *a: attention.attend(*a, kernels=helpers.kernels(implementation)))(q, k, v, spec)
  np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)


def _kernels(jaxpr):
  return [eqn for eqn in helpers.equations(jaxpr.jaxpr) if eqn.primitive.name == 'pallas_call']


@pytest.mark.parametrize('case,on_mesh', [('padding', False), ('packed_causal', True), ('packed_cross', False),
                                          ('long_cross', True)])
def test_flash_gpu_reads_a_stack_of_projections_in_place(case, on_mesh):
  """The fused projections' product on a GPU, [b, len, n, h, d] with keys, values and (self-attending) queries
  (`model.project`), goes to flash_gpu as it is: its kernels read every slot through the stack and write its
  gradient as one array (keys' and values' into the queries'), equal to the reference's on the slices."""
  q, k, v, spec = _case(case)
  self_attention = q.shape[1] == k.shape[1]
  stack = jnp.stack([k, v[..., :k.shape[-1]]] + [q] * self_attention, axis=2)  # projections of one shape
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape[:3] + k.shape[-1:]), jnp.float32)

  def run(implementation):
    def attend(q, stack):
      q = stack[:, :, 2] if self_attention else q
      return attention.attend(q, stack[:, :, 0], stack[:, :, 1], spec, kernels=helpers.kernels(implementation),
                              stacked=stack)

    def output_and_grads(q, stack):
      out, vjp = jax.vjp(attend, q, stack)
      return out, vjp(cotangent)
    return output_and_grads

  expected = jax.jit(run('reference'))(q, stack)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 1, 2), mesh_section.MESH_AXES)
  with pallas_mode.interpret_kernels():
    kernels = _kernels(jax.make_jaxpr(run('flash_gpu'))(q, stack))
    assert [eqn.params['name'] for eqn in kernels] == ['attention_gpu_fwd', 'attention_gpu_dq', 'attention_gpu_dkv']
    for eqn in kernels:  # q (self-attending), k and v: the stack itself, padded where its length is
      operands = [x.aval.shape for x in eqn.invars if x.aval.ndim >= 4]
      assert operands[:3] == [operands[1]] * 3 if self_attention else operands[1] == operands[2]
      assert len(operands[1]) == 5 and operands[1][2:4] == stack.shape[2:4]  # head dims padded to 16
    assert bool(kernels[2].params['input_output_aliases']) == self_attention  # into dq's array
    if on_mesh:
      with jax.set_mesh(mesh), nn.logical_axis_rules(mesh_section.DEFAULT_RULES):
        got = jax.jit(run('flash_gpu'))(q, stack)
    else:
      got = jax.jit(run('flash_gpu'))(q, stack)
  np.testing.assert_allclose(got[0], expected[0], atol=2e-5, rtol=2e-5)
  for name, g, want in zip(('q', 'stack'), got[1], expected[1]):
    np.testing.assert_allclose(g, want, atol=2e-5, rtol=2e-5, err_msg=f'd{name}')


def _dropout_output_and_grads(implementation, q, k, v, spec, cotangent, rng):
  def run(q, k, v, spec):
    attend = lambda q, k, v: attention.attend(q, k, v, spec, kernels=helpers.kernels(implementation), dropout_rate=0.3,
                                              dropout_rng=rng)
    out, vjp = jax.vjp(attend, q, k, v)
    return out, vjp(cotangent)

  return jax.jit(run)(q, k, v, spec)


DROPOUT_KERNELS = {'flash_tpu': 'attention_dropout_fwd', 'flash_gpu': 'attention_gpu_fwd'}  # their names


@pytest.mark.parametrize('case', list(CASES))
@pytest.mark.parametrize('implementation', list(DROPOUT_KERNELS))
def test_kernel_with_dropout_matches_reference(implementation, case):
  """Our kernels with attention dropout draw the reference's bits (`attention_masks.dropout_keep`)."""
  q, k, v, spec = _case(case)
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape[:3] + v.shape[-1:]), jnp.float32)
  rng = jax.random.key(7)
  expected = _dropout_output_and_grads('reference', q, k, v, spec, cotangent, rng)
  with pallas_mode.interpret_kernels():
    run = lambda q, k, v, spec: attention.attend(q, k, v, spec, kernels=helpers.kernels(implementation),
                                                 dropout_rate=0.3, dropout_rng=rng)
    assert DROPOUT_KERNELS[implementation] in str(jax.make_jaxpr(run)(q, k, v, spec))
    out, grads = _dropout_output_and_grads(implementation, q, k, v, spec, cotangent, rng)
  assert not np.allclose(out, _output_and_grads('reference', q, k, v, spec, cotangent)[0])  # dropout did something
  np.testing.assert_allclose(out, expected[0], atol=2e-5, rtol=2e-5)
  # The kernels zero the queries that see no key (padding ones included) themselves: exact zeros.
  assert np.all(np.asarray(out)[~np.asarray(attention_masks.full_mask(spec)).any(axis=-1)[:, 0]] == 0.0)
  for name, got, want in zip('qkv', grads, expected[1]):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5, err_msg=f'd{name}')


@pytest.mark.parametrize('implementation', list(DROPOUT_KERNELS))
def test_kernel_with_dropout_draws_the_same_bits_on_every_device_block(implementation):
  """Each device's rows and heads draw the bits the whole batch has there: sharding changes no weight."""
  q, k, v, spec = _case('packed_causal')
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 1, 2), mesh_section.MESH_AXES)
  rng = jax.random.key(8)
  attend = lambda *a: attention.attend(*a, kernels=helpers.kernels(implementation), dropout_rate=0.3, dropout_rng=rng)
  with pallas_mode.interpret_kernels():
    expected = attend(q, k, v, spec)
    with jax.set_mesh(mesh), nn.logical_axis_rules(mesh_section.DEFAULT_RULES):
      assert 'shard_map' in str(jax.make_jaxpr(attend)(q, k, v, spec))
      out = jax.jit(attend)(q, k, v, spec)
  np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)


def test_cached_decoding_falls_back_to_reference():
  q, k, v, _ = _case('causal')
  spec = attention_masks.MaskSpec(q_valid=jnp.ones(q.shape[:2], bool), kv_valid=jnp.ones(k.shape[:2], bool),
                                  causal=True, q_offset=jnp.int32(3))
  for implementation in ('flash_tpu', 'flash_gpu'):
    assert not _runs_a_kernel(implementation, q, k, v, spec)
    np.testing.assert_array_equal(attention.attend(q, k, v, spec, kernels=helpers.kernels(implementation)),
                                  attention.attend(q, k, v, spec, kernels=helpers.kernels('reference')))


@pytest.mark.parametrize('implementation,platform', [('flash_tpu', 'TPU'), ('flash_gpu', 'GPU')])
def test_a_kernel_on_a_cpu_without_interpret_mode_is_one_line_naming_the_choices(implementation, platform):
  q, k, v, spec = _case('padding')
  with pytest.raises(ValueError) as error:
    attention.attend(q, k, v, spec, kernels=helpers.kernels(implementation, 'cpu'))
  assert str(error.value) == (
      f"model.attention='{implementation}' is a {platform} kernel, and this step is compiled for CPU devices: set "
      "model.attention='auto' (the fastest this platform has) or one of ('reference', 'dot_product', 'chunked').")


def _packed_batch():
  """Two rows of two packed examples each, then padding: tokens, positions and segment ids per side."""
  rng = np.random.default_rng(2)

  def side(lengths, total):
    tokens = np.zeros((len(lengths), total), np.int32)
    segments, positions = np.zeros_like(tokens), np.zeros_like(tokens)
    for row, parts in enumerate(lengths):
      start = 0
      for seg, n in enumerate(parts, 1):
        tokens[row, start:start + n] = rng.integers(4, 40, n)
        segments[row, start:start + n], positions[row, start:start + n] = seg, np.arange(n)
        start += n
    return jnp.asarray(tokens), jnp.asarray(segments), jnp.asarray(positions)

  inputs, inputs_segment_ids, inputs_position = side([(7, 6), (9, 4)], 18)
  targets, targets_segment_ids, targets_position = side([(5, 8), (10, 3)], 18)
  return dict(inputs=inputs, targets=targets, inputs_positions=inputs_position, targets_positions=targets_position,
              inputs_segment_ids=inputs_segment_ids, targets_segment_ids=targets_segment_ids)


@pytest.mark.parametrize('implementation,platform', [('flash_tpu', 'cpu'), ('flash_gpu', 'cpu'), ('flash_gpu', 'gpu')])
def test_model_with_kernels_matches_reference_on_packed_rows(implementation, platform):
  """The whole model (remat on, so the mask spec is traced as in training) runs the kernel (its self-attention
  specs say that queries and keys match: `MaskSpec.self_attention`; flash_gpu's cross-attention runs our Triton
  kernels): same logits and gradients as the reference. Compiled for a GPU, the projections are fused and the
  kernels read their products in place."""
  batch = _packed_batch()
  config = ModelConfig(vocab_size=40, d_model=32, d_ff=64, num_heads=4, num_encoder_layers=1,
                       num_decoder_layers=1, dropout=0.0, max_len=64, remat='full')
  params = nn.unbox(Transformer(config).init(jax.random.key(0), batch['inputs'], batch['targets'])['params'])

  def logits_and_grads(attention_impl, platform='cpu'):
    model = Transformer(config.replace(attention=attention_impl, platform=platform))
    loss = lambda p: jnp.sum(jnp.sin(model.apply({'params': p}, **batch)))
    return jax.jit(lambda p: (model.apply({'params': p}, **batch), jax.grad(loss)(p)))(params)

  expected = logits_and_grads('reference')  # XLA's ops on this CPU
  with pallas_mode.interpret_kernels():
    model = Transformer(config.replace(attention=implementation, platform=platform))
    jaxpr = jax.make_jaxpr(lambda p: model.apply({'params': p}, **batch))(params)
    assert 'pallas_call' in str(jaxpr) and (implementation == 'flash_tpu' or 'attention_gpu_fwd' in str(jaxpr))
    stacks = [x.aval.shape[2] for eqn in _kernels(jaxpr) for x in eqn.invars[1:3] if x.aval.ndim == 5]
    assert stacks == ([3, 3, 3, 3, 2] if platform == 'gpu' else [])  # q, k of self-attention x 2, k of cross
    got = logits_and_grads(implementation, platform)
  np.testing.assert_allclose(got[0], expected[0], atol=1e-4, rtol=1e-4)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got[1]), jax.tree.leaves(expected[1])):
    np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_compiled_train_steps_with_the_dropout_kernels_match_reference():
  """The trainer's way (lower, compile, call the executable) through each kernel with attention dropout: the
  program takes the state and batch alone (nothing of the kernel's VJP becomes an input) and computes the
  reference's loss and gradient norm, dropout bits and all."""
  step_metrics = lambda implementation: helpers.small_step_loss_and_grad_norm(attention=implementation,
                                                                             attention_dropout=0.3)
  expected = step_metrics('reference')
  with pallas_mode.interpret_kernels():
    for implementation in DROPOUT_KERNELS:
      np.testing.assert_allclose(step_metrics(implementation), expected, rtol=1e-5, err_msg=implementation)


def test_causal_tpu_dropout_kernel_costs_only_the_tiles_it_computes():
  """flash_tpu's kernel skips the causal tiles above the diagonal, and its cost estimate counts the rest: 15 of 25
  tiles of 128 × 128 for 600 (padded to 640) queries and keys."""
  q, k, v, spec = _case('many_key_blocks')
  run = lambda: attention.attend(q, k, v, spec, kernels=helpers.kernels('flash_tpu'), dropout_rate=0.1,
                                 dropout_rng=jax.random.key(0))
  def pallas_calls(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'pallas_call':
        yield eqn
      for value in eqn.params.values():
        inner = getattr(value, 'jaxpr', value)  # closed jaxprs of custom_vjp and the like
        if hasattr(inner, 'eqns'):
          yield from pallas_calls(inner)

  with pallas_mode.interpret_kernels():
    calls = list(pallas_calls(jax.make_jaxpr(run)().jaxpr))
  (forward,) = [e for e in calls if e.params['name'] == 'attention_dropout_fwd']
  batch, heads, d_k, d_v = q.shape[0], q.shape[2], q.shape[-1], v.shape[-1]
  assert forward.params['cost_estimate'].flops == 2 * batch * heads * 15 * 128 * 128 * (d_k + d_v)
