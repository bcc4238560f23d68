"""The Transformer: shapes, dtypes, masks by perturbation, packing, cached decoding, axis names, Table 3."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from configs import table3
from transformer_jax.config.model import ModelConfig
from transformer_jax.core.tokens import BOS_ID
from transformer_jax.kernels import attention_masks
from transformer_jax.kernels import dropout_masks
from transformer_jax.kernels import ops
from transformer_jax.model.transformer import MultiHeadAttention, Transformer, shift_right, sinusoidal_encoding
from transformer_jax.runtime import pallas_mode

TINY = ModelConfig(vocab_size=40, d_model=32, d_ff=64, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                   dropout=0.0, max_len=64)


_tokens = helpers.tokens


def _init(cfg, inputs, targets):
  return helpers.init_model(cfg, inputs=inputs, targets=targets)


def test_shapes_and_dtypes():
  inputs, targets = _tokens(0, (3, 7), [7, 5, 2]), _tokens(1, (3, 9), [9, 4, 6])
  model, params = _init(TINY, inputs, targets)
  encoded = model.apply({'params': params}, inputs, method=Transformer.encode)
  assert encoded.shape == (3, 7, 32) and encoded.dtype == jnp.float32
  logits = model.apply({'params': params}, encoded, inputs, shift_right(targets), method=Transformer.decode)
  assert logits.shape == (3, 9, 40) and logits.dtype == jnp.float32
  full = model.apply({'params': params}, inputs, targets)
  np.testing.assert_allclose(full, logits, atol=1e-6)


def test_bf16_compute_with_f32_params():
  cfg = TINY.replace(dtype='bfloat16')
  inputs, targets = _tokens(0, (2, 7), [7, 5]), _tokens(1, (2, 9), [9, 4])
  model, params = _init(cfg, inputs, targets)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  encoded = model.apply({'params': params}, inputs, method=Transformer.encode)
  assert encoded.dtype == jnp.bfloat16
  logits = model.apply({'params': params}, inputs, targets)
  assert logits.dtype == jnp.float32 and np.all(np.isfinite(logits))
  ref = Transformer(TINY).apply({'params': params}, inputs, targets)
  assert np.max(np.abs(np.asarray(logits) - np.asarray(ref))) < 0.1 * np.max(np.abs(np.asarray(ref)))


def test_shift_right_restarts_every_segment():
  targets = jnp.array([[5, 6, 1, 7, 1, 0, 0]])
  segs = jnp.array([[1, 1, 1, 2, 2, 0, 0]])
  np.testing.assert_array_equal(shift_right(targets, segs), [[BOS_ID, 5, 6, BOS_ID, 7, 0, 0]])
  np.testing.assert_array_equal(shift_right(targets), [[BOS_ID, 5, 6, 1, 7, 0, 0]])


def test_sinusoidal_encoding_matches_formula():
  pe = np.asarray(sinusoidal_encoding(jnp.array([[0, 3, 10]]), 8))
  pos, i = 10, 2
  np.testing.assert_allclose(pe[0, 2, 2 * i], np.sin(pos / 10000 ** (2 * i / 8)), rtol=1e-5)
  np.testing.assert_allclose(pe[0, 2, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / 8)), rtol=1e-5)
  np.testing.assert_allclose(pe[0, 0], np.tile([0.0, 1.0], 4), atol=1e-7)


VARIANT_CONFIGS = helpers.model_variants(TINY)


@pytest.mark.parametrize('name', helpers.fast_tier(list(VARIANT_CONFIGS), fast=['chunked']))
def test_future_targets_do_not_change_earlier_outputs(name):
  cfg = VARIANT_CONFIGS[name]
  inputs, targets = _tokens(0, (2, 6), [6, 4]), _tokens(1, (2, 8))
  model, params = _init(cfg, inputs, targets)
  changed = targets.at[:, 5].set((targets[:, 5] + 1) % 36 + 4)
  a = model.apply({'params': params}, inputs, targets)
  b = model.apply({'params': params}, inputs, changed)
  # logits at position t depend on targets[:t] (decoder inputs are shifted right)
  np.testing.assert_allclose(a[:, :6], b[:, :6], atol=1e-5)
  assert np.max(np.abs(np.asarray(a[:, 6:] - b[:, 6:]))) > 1e-4


@pytest.mark.parametrize('name', helpers.fast_tier(list(VARIANT_CONFIGS), fast=['dot_product']))
def test_padded_positions_change_nothing(name):
  cfg = VARIANT_CONFIGS[name]
  inputs, targets = _tokens(0, (2, 7), [7, 4]), _tokens(1, (2, 8), [8, 5])
  model, params = _init(cfg, inputs, targets)
  a = model.apply({'params': params}, inputs, targets)
  # a padded source position (id 0) given a different embedding: swap embedding row 0
  if cfg.share_embeddings:
    perturbed = jax.tree.map(lambda x: x, params)
    perturbed['shared_embedding']['embedding'] = params['shared_embedding']['embedding'].at[0].add(3.0)
  else:
    perturbed = jax.tree.map(lambda x: x, params)
    for key in ('source_embedding', 'target_embedding'):
      perturbed[key]['embedding'] = params[key]['embedding'].at[0].add(3.0)
  b = model.apply({'params': perturbed}, inputs, targets)
  np.testing.assert_allclose(a[0], b[0], atol=1e-5)
  np.testing.assert_allclose(a[1, :5], b[1, :5], atol=1e-5)
  # extending a row with more padding changes nothing either
  c = model.apply({'params': params}, jnp.pad(inputs, ((0, 0), (0, 3))), jnp.pad(targets, ((0, 0), (0, 2))))
  np.testing.assert_allclose(a[1, :5], c[1, :5], atol=1e-5)


def _packed_pair():
  """Two examples packed in one row (with trailing padding), and the same examples as separate rows."""
  src = [_tokens(10, (1, 5))[0], _tokens(11, (1, 3))[0]]
  tgt = [_tokens(12, (1, 4))[0], _tokens(13, (1, 6))[0]]
  pad_src, pad_tgt = 2, 1
  packed = dict(
      inputs=jnp.concatenate(src + [jnp.zeros(pad_src, jnp.int32)])[None],
      targets=jnp.concatenate(tgt + [jnp.zeros(pad_tgt, jnp.int32)])[None],
      inputs_segment_ids=jnp.array([[1] * 5 + [2] * 3 + [0] * pad_src]),
      targets_segment_ids=jnp.array([[1] * 4 + [2] * 6 + [0] * pad_tgt]),
      inputs_positions=jnp.array([list(range(5)) + list(range(3)) + [0] * pad_src]),
      targets_positions=jnp.array([list(range(4)) + list(range(6)) + [0] * pad_tgt]))
  return packed, src, tgt


@pytest.mark.parametrize('name', helpers.fast_tier(list(VARIANT_CONFIGS), fast=['pre_learned_unshared']))
def test_packed_row_equals_separate_examples(name):
  cfg = VARIANT_CONFIGS[name]
  packed, src, tgt = _packed_pair()
  model, params = _init(cfg, packed['inputs'], packed['targets'])
  logits = model.apply({'params': params}, **packed)
  first = model.apply({'params': params}, src[0][None], tgt[0][None])
  second = model.apply({'params': params}, src[1][None], tgt[1][None])
  np.testing.assert_allclose(logits[0, :4], first[0], atol=1e-5)
  np.testing.assert_allclose(logits[0, 4:10], second[0], atol=1e-5)


def test_changing_one_segment_leaves_the_other_alone():
  packed, _, _ = _packed_pair()
  model, params = _init(TINY, packed['inputs'], packed['targets'])
  a = model.apply({'params': params}, **packed)
  changed = dict(packed, inputs=packed['inputs'].at[0, 6].set(9), targets=packed['targets'].at[0, 5].set(9))
  b = model.apply({'params': params}, **changed)
  np.testing.assert_allclose(a[0, :4], b[0, :4], atol=1e-5)
  assert np.max(np.abs(np.asarray(a[0, 4:10] - b[0, 4:10]))) > 1e-4


@pytest.mark.parametrize('name', helpers.fast_tier(['post_sinusoidal', 'pre_learned_unshared', 'chunked', 'scanned'],
                                                   fast=['scanned']))
def test_cached_decoding_equals_full_pass(name):
  cfg = VARIANT_CONFIGS[name]
  inputs, targets = _tokens(0, (3, 6), [6, 4, 2]), _tokens(1, (3, 7))
  model, params = _init(cfg, inputs, targets)
  full = model.apply({'params': params}, inputs, targets)
  encoded = model.apply({'params': params}, inputs, method=Transformer.encode)
  _, cache_vars = model.module.apply({'params': params}, encoded, inputs, 7, method=Transformer.init_cache,
                                     mutable=['cache'])
  cache = cache_vars['cache']
  decoder_inputs = shift_right(targets)
  for t in range(7):
    step_logits, cache_vars = model.apply({'params': params, 'cache': cache}, None, inputs,
                                          decoder_inputs[:, t:t + 1], decode=True, method=Transformer.decode,
                                          mutable=('cache',))
    cache = cache_vars['cache']
    np.testing.assert_allclose(step_logits[:, 0], full[:, t], atol=2e-5, err_msg=f'step {t}')


@pytest.mark.parametrize('platform', ['gpu', 'tpu', 'cpu'])
@pytest.mark.parametrize('d_v', [None, 16])
def test_attention_projects_each_input_once_on_a_gpu(platform, d_v):
  # On a GPU, self-attention's queries, keys and values are one matrix product (with d_k != d_v, the values on
  # their own) and cross-attention's keys and values another; elsewhere each projection is its own product.
  cfg = TINY.replace(d_k=8, d_v=d_v or 8, attention='reference', cpu_kernels='off', platform=platform)
  x, memory = jnp.ones((2, 5, cfg.d_model)), jnp.ones((2, 7, cfg.d_model))
  spec = attention_masks.MaskSpec(q_valid=jnp.ones((2, 5), bool), kv_valid=jnp.ones((2, 7), bool), causal=False)
  self_spec = attention_masks.MaskSpec(q_valid=spec.q_valid, kv_valid=spec.q_valid, causal=True)

  def projection_products(cross, x_kv, spec):
    layer = MultiHeadAttention(cfg, deterministic=True, cross=cross)
    variables = layer.init(jax.random.key(0), x, x_kv, spec)
    jaxpr = jax.make_jaxpr(lambda v: layer.apply(v, x, x_kv, spec))(variables).jaxpr
    # each product's kernel's stack axes: (n,) for n projections stacked, () for a lone kernel as it is
    return sorted(eqn.invars[1].aval.shape[1:-2] for eqn in helpers.equations(jaxpr)
                  if eqn.primitive.name == 'dot_general' and eqn.invars[1].aval.shape[0] == cfg.d_model)

  if platform != 'gpu':
    assert projection_products(False, x, self_spec) == projection_products(True, memory, spec) == [(), (), ()]
  elif d_v is None:
    assert projection_products(False, x, self_spec) == [(3,)]
    assert projection_products(True, memory, spec) == [(), (2,)]
  else:
    assert projection_products(False, x, self_spec) == [(), (2,)]
    assert projection_products(True, memory, spec) == [(), (), ()]


def test_fused_projections_equal_separate_ones():
  cfg = TINY.replace(attention='reference', cpu_kernels='off', attention_bias=True)
  inputs, targets = _tokens(0, (3, 7), [7, 5, 2]), _tokens(1, (3, 9), [9, 4, 6])
  model, params = _init(cfg, inputs, targets)
  apply = lambda config: lambda p: Transformer(config).apply({'params': p}, inputs, targets)
  separate = jax.jit(apply(cfg))(params)
  with pallas_mode.interpret_kernels():  # the residual blocks' kernels, which a GPU runs too
    eqns = list(helpers.equations(jax.make_jaxpr(apply(cfg.replace(platform='gpu')))(params).jaxpr))
    kernels = [eqn.invars[1].aval.shape for eqn in eqns if eqn.primitive.name == 'dot_general']
    assert (cfg.d_model, 3, cfg.num_heads, cfg.d_model // cfg.num_heads) in kernels  # q, k and v: one product
    fused = jax.jit(apply(cfg.replace(platform='gpu')))(params)
  np.testing.assert_allclose(fused, separate, rtol=1e-5, atol=1e-6)


def test_every_parameter_has_logical_axis_names():
  cfg = TINY.replace(positional='learned', share_embeddings=False, norm='pre')
  inputs = _tokens(0, (1, 4))
  boxed = Transformer(cfg).init(jax.random.key(0), inputs, inputs)['params']
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert len(leaves) > 20
  for leaf in leaves:
    assert isinstance(leaf, nn.LogicallyPartitioned), type(leaf)
    assert len(leaf.names) == leaf.value.ndim and all(isinstance(n, str) for n in leaf.names)
    assert set(leaf.names) <= {'vocab', 'embed', 'heads', 'kv', 'mlp', 'length'}


def test_initialisation_scales():
  cfg = ModelConfig(vocab_size=1000, d_model=256, d_ff=1024, num_heads=4, num_encoder_layers=1,
                    num_decoder_layers=1)
  inputs = _tokens(0, (1, 4))
  _, params = _init(cfg, inputs, inputs)
  emb = np.asarray(params['shared_embedding']['embedding'])
  assert abs(emb.std() - 256 ** -0.5) < 0.1 * 256 ** -0.5
  wi = np.asarray(params['encoder']['layer_0']['ffn']['wi']['kernel'])
  limit = np.sqrt(6 / (256 + 1024))
  assert wi.max() <= limit and abs(wi.std() - limit / np.sqrt(3)) < 0.05 * limit


@pytest.mark.slow
def test_remat_gives_the_same_gradients():
  inputs, targets = _tokens(0, (2, 6), [6, 4]), _tokens(1, (2, 7), [7, 5])
  model, params = _init(TINY, inputs, targets)

  def grads(cfg):
    loss = lambda p: jnp.sum(Transformer(cfg).apply({'params': p}, inputs, targets) ** 2)
    return jax.jit(jax.grad(loss))(params)

  ref = grads(TINY)
  for policy in ('full', 'dots'):
    for g, r in zip(jax.tree.leaves(grads(TINY.replace(remat=policy))), jax.tree.leaves(ref)):
      np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_dropout_is_active_in_training_only():
  cfg = TINY.replace(dropout=0.3)
  inputs, targets = _tokens(0, (2, 6)), _tokens(1, (2, 7))
  model, params = _init(cfg, inputs, targets)
  det = model.apply({'params': params}, inputs, targets)
  a = model.apply({'params': params}, inputs, targets, deterministic=False, rngs={'dropout': jax.random.key(1)})
  b = model.apply({'params': params}, inputs, targets, deterministic=False, rngs={'dropout': jax.random.key(2)})
  assert np.max(np.abs(np.asarray(a - det))) > 1e-3 and np.max(np.abs(np.asarray(a - b))) > 1e-3


@pytest.mark.parametrize('with_mask', [True, False])
def test_relu_dropout_keeps_only_its_output_for_the_backward_pass(with_mask):
  """The FFN's ReLU + dropout: the values and gradients of max(0, h) with the mask (without one: no dropout, or
  a deterministic pass, whose gradient is unscaled whatever `keep` says), from the output alone."""
  h = jax.random.normal(jax.random.key(0), (4, 8, 16)).at[0, 0, :4].set(0.0)  # ReLU's kink too
  key, keep, kernels = jax.random.key(1), 0.7, helpers.kernels()
  mask = dropout_masks.keep_mask(key, keep, h.shape, kernels)
  plain = (lambda h: jnp.where(mask, jax.nn.relu(h) / keep, 0)) if with_mask else jax.nn.relu  # autodiff's
  ours = lambda h: ops.relu_dropout(h, key if with_mask else None, keep, kernels)
  dy = jax.random.normal(jax.random.key(2), h.shape)
  both = lambda f: jax.jit(lambda h, dy: (f(h), jax.vjp(f, h)[1](dy)))(h, dy)  # compiled, as in the train step
  for got, want in zip(jax.tree.leaves(both(ours)), jax.tree.leaves(both(plain))):
    np.testing.assert_array_equal(got, want)
  y, vjp = jax.vjp(ours, h)
  residuals = [x for x in jax.tree.leaves(vjp) if getattr(x, 'ndim', 0)]
  assert len(residuals) == 1 and np.array_equal(residuals[0], y)  # neither h nor the mask


def test_attention_dropout_trains_alike_in_chunked_and_reference():
  """With attention dropout, 'auto' runs our flash_tpu kernel on a TPU, our flash_gpu kernel on a GPU and the
  reference on a CPU, and `chunked` serves a choice that has none (`dot_product`); all draw the same dropout bits
  (`attention_masks.dropout_keep`), so training computes the same loss and gradients. The kernels' loss and
  gradients in a train step: tests/test_flash_attention.py (`test_compiled_train_steps_with_the_dropout_...`)."""
  cfg = TINY.replace(attention_dropout=0.2, relu_dropout=0.1, num_encoder_layers=1, num_decoder_layers=1)
  inputs, targets = _tokens(0, (2, 6)), _tokens(1, (2, 7))
  _, params = _init(cfg, inputs, targets)

  def loss(implementation, rate=cfg.attention_dropout):
    model = Transformer(cfg.replace(attention=implementation, attention_dropout=rate))
    return lambda p: jnp.sum(jnp.sin(model.apply({'params': p}, inputs, targets, deterministic=False,
                                                 rngs={'dropout': jax.random.key(5)})))

  loss_and_grads = lambda implementation: jax.jit(jax.value_and_grad(loss(implementation)))(params)
  assert 'scan[' in str(jax.make_jaxpr(loss('chunked'))(params))  # the chunked path's scan over key blocks
  assert 'scan[' not in str(jax.make_jaxpr(loss('auto'))(params))  # on this CPU: the reference
  with pallas_mode.interpret_kernels():
    assert 'attention_dropout_fwd' in str(jax.make_jaxpr(loss('flash_tpu'))(params))
    assert 'attention_gpu_fwd' in str(jax.make_jaxpr(loss('flash_gpu'))(params))
  reference, chunked = loss_and_grads('reference'), loss_and_grads('chunked')
  assert abs(float(reference[0]) - float(jax.jit(loss('reference', rate=0.0))(params))) > 1e-3  # the dropout acts
  np.testing.assert_allclose(chunked[0], reference[0], rtol=1e-5)
  for g, want in zip(jax.tree.leaves(chunked[1]), jax.tree.leaves(reference[1])):
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)  # float32, as test_remat_...


@pytest.mark.parametrize('bad,match', [
    (dict(d_model=30, num_heads=4), 'not divisible'),
    (dict(norm='sandwich'), 'model.norm'),
    (dict(attention='dot_product', d_k=4), 'd_k == d_v'),
    (dict(attention='dot_product', attention_dropout=0.1), 'attention_dropout'),
    (dict(dropout=1.0), 'model.dropout'),
])
def test_bad_model_configs_are_clear_errors(bad, match):
  with pytest.raises(ValueError, match=match):
    TINY.replace(**bad)


def _closed_form_params(c: ModelConfig) -> int:
  """The parameter count of the architecture the paper describes, term by term: shared embeddings, attention
  projections without biases, the FFN with b1 and b2, a LayerNorm (scale, bias) per sublayer."""
  d, f, h, dk, dv = c.d_model, c.d_ff, c.num_heads, c.head_dim_k, c.head_dim_v
  attention = 2 * d * h * dk + 2 * d * h * dv
  ffn = 2 * d * f + f + d
  norm = 2 * d
  encoder = attention + ffn + 2 * norm
  decoder = 2 * attention + ffn + 3 * norm
  positions = 2 * c.max_len * d if c.positional == 'learned' else 0
  return c.vocab_size * d + c.num_encoder_layers * encoder + c.num_decoder_layers * decoder + positions


@pytest.mark.parametrize('name', list(table3.VARIANTS))
def test_table3_rows_have_the_closed_form_parameter_count(name):
  config = table3.model_config_for(table3.VARIANTS[name], ModelConfig(vocab_size=table3.PAPER_VOCAB_SIZE))
  assert table3.count_params(config) == _closed_form_params(config)


def test_docs_parameter_table_is_what_configs_table3_prints(capsys):
  table3.main()
  printed = capsys.readouterr().out.strip().splitlines()
  with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'docs', 'model.md')) as f:
    document = f.read()
  assert len(printed) == 13 and all(line in document for line in printed)
