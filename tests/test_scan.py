"""`model.scan_layers`: a stack as one nn.scan over stacked parameters computes what the unrolled stack computes
(logits, loss and gradients, with rematerialisation and the CPU kernels), the two parameter layouts convert into
each other exactly, stacked parameters carry an unsharded 'layers' axis, and a checkpoint restores into a model of
the other layout with the same logits. (Compile time against depth: bench/compile_depth.py, not a timed test.)"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import helpers
from transformer_jax import config as config_lib
from transformer_jax.config.model import ModelConfig
from transformer_jax.inference import restoring
from transformer_jax.model import layer_layout
from transformer_jax.model.transformer import make_model
from transformer_jax.runtime import sharding
from transformer_jax.training import metrics

TRANSLATOR = ModelConfig(vocab_size=40, d_model=32, d_ff=64, num_heads=4, num_encoder_layers=3, num_decoder_layers=3,
                         dropout=0.0, max_len=64)
LM = TRANSLATOR.replace(architecture='decoder_only', num_encoder_layers=0)
CASES = {
    'translator': (TRANSLATOR, ('inputs', 'targets')),
    'translator_remat_full': (TRANSLATOR.replace(remat='full'), ('inputs', 'targets')),
    'lm': (LM, ('targets',)),
    'lm_remat_dots_pre_untied': (LM.replace(remat='dots', norm='pre', share_embeddings=False), ('targets',)),
}


def _batch(sides):
  return {k: jnp.asarray(v) for k, v in helpers.synthetic_batches(1, 2, 8, vocab=40, seed=3, sides=sides)[0].items()}


def _loss(model, params, batch):
  logits = model.apply({'params': params}, **batch)
  return metrics.token_metrics(logits, batch['targets'], 0.1)['loss'], logits


@pytest.mark.parametrize('name', helpers.fast_tier(list(CASES),
                                                   fast=['lm_remat_dots_pre_untied']))
def test_scanned_stack_computes_what_the_unrolled_stack_computes(name):
  cfg, sides = CASES[name]
  batch = _batch(sides)
  unrolled_model, params = helpers.init_model(cfg, **batch)
  scanned = make_model(cfg.replace(scan_layers=True))
  step = jax.jit(jax.value_and_grad(_loss, argnums=1, has_aux=True), static_argnums=0)
  (loss, logits), grads = step(unrolled_model.module, params, batch)
  (scanned_loss, scanned_logits), scanned_grads = step(scanned, layer_layout.convert(params, True), batch)
  np.testing.assert_allclose(scanned_logits, logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(scanned_loss, loss, rtol=1e-5)
  back = layer_layout.convert(scanned_grads, False)
  assert jax.tree.structure(back) == jax.tree.structure(grads)
  for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(grads)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) > 1e-3  # the gradients are not all ~0


def test_layouts_convert_into_each_other_exactly():
  batch = _batch(('inputs', 'targets'))
  _, params = helpers.init_model(TRANSLATOR, **batch)
  scanned = layer_layout.convert(params, True)
  for stack in ('encoder', 'decoder'):
    assert 'layers' in scanned[stack] and not any(key.startswith('layer_') for key in scanned[stack])
    for i in range(3):
      jax.tree.map(lambda s, p, i=i: np.testing.assert_array_equal(s[i], p), scanned[stack]['layers'],
                   params[stack][f'layer_{i}'])
  # The stacked layout is the scanned model's own: same tree, same shapes.
  own = jax.eval_shape(lambda: make_model(TRANSLATOR.replace(scan_layers=True)).init(jax.random.key(0), **batch))
  assert jax.tree.map(jnp.shape, nn.unbox(own['params'])) == jax.tree.map(jnp.shape, scanned)
  assert layer_layout.is_scanned(scanned) and not layer_layout.is_scanned(params)
  jax.tree.map(np.testing.assert_array_equal, layer_layout.convert(scanned, False), params)
  # An optimizer state mirrors the params (tuples and NamedTuples of dicts) and converts the same way.
  adam = optax.adam(1e-3)
  state = adam.update(params, adam.init(params), params)[1]  # non-zero moments
  converted = layer_layout.convert(state, True)
  assert jax.tree.structure(converted) == jax.tree.structure(adam.init(scanned))
  jax.tree.map(np.testing.assert_array_equal, layer_layout.convert(converted, False), state)


def test_stacked_parameters_carry_an_unsharded_layers_axis():
  batch = _batch(('targets',))
  boxed = make_model(LM.replace(scan_layers=True)).init(jax.random.key(0), **batch)['params']
  layers = jax.tree.leaves(boxed['decoder']['layers'], is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert layers and all(leaf.names[0] == 'layers' and leaf.value.shape[0] == 3 for leaf in layers)
  config = helpers.tiny_config()
  config.mesh.shape = {'data': 1, 'fsdp': 8, 'tensor': 1}
  shardings = sharding.logical_shardings(boxed, *sharding.mesh_and_rules(config.mesh))
  kernel = shardings['decoder']['layers']['ffn']['wi']['kernel'].spec  # [layers, embed, mlp]
  assert kernel[0] is None and kernel[1] == 'fsdp'


def test_a_checkpoint_restores_into_the_other_layout_with_the_same_logits(trained_lm):
  config, workdir = trained_lm
  unrolled = restoring.restore(config, workdir)
  scanned_config = config_lib.for_evaluation(workdir, {'model.scan_layers': True}, 'test')  # eval.py may ask for it
  scanned = restoring.restore(scanned_config, workdir)
  assert layer_layout.is_scanned(scanned.params) and not layer_layout.is_scanned(unrolled.params)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(layer_layout.convert(scanned.params, False)),
               jax.device_get(unrolled.params))
  batch = _batch(('targets',))
  logits = [jax.jit(restored.model.apply)({'params': restored.params}, **batch) for restored in (unrolled, scanned)]
  np.testing.assert_allclose(logits[1], logits[0], rtol=1e-5, atol=1e-5)
