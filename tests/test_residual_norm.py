"""The GPU's post-LN residual block kernels (`residual_norm`) equal XLA's LayerNorm(x + dropout(y)) with the GPU's
dropout mask, forward and gradients, on a mesh too; the model runs them on a GPU with the same parameters.

Run on a CPU in Pallas interpret mode (`pallas_mode.interpret_kernels`); tests/test_aot.py compiles them for an
H100 inside a train step.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from transformer_jax.config import mesh as mesh_section
from transformer_jax.config.model import ModelConfig
from transformer_jax.kernels import dropout_masks
from transformer_jax.kernels.gpu import residual_norm
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime import pallas_mode


@pytest.mark.parametrize('dtype,out_dtype,keep,shape,on_mesh', [
    ('float32', 'float32', 0.9, (4, 12, 64), True),  # 2 devices' rows: the mask of the whole batch's row indices
    ('float32', 'float32', 1.0, (4, 12, 64), False),
    ('float32', 'float32', 0.7, (3, 7, 32), False),  # 21 rows: blocks of one row
    ('bfloat16', 'bfloat16', 0.9, (4, 12, 64), False),
    ('float32', 'bfloat16', 0.9, (4, 12, 64), False),  # LayerNorm's compute dtype below its input's
])
def test_kernels_equal_xlas_layer_norm_of_the_dropped_residual(dtype, out_dtype, keep, shape, on_mesh):
  rng = np.random.default_rng(0)
  dtype, out_dtype = jnp.dtype(dtype), jnp.dtype(out_dtype)
  x, y = (jnp.asarray(rng.normal(size=shape), dtype) for _ in range(2))
  cotangent = jnp.asarray(rng.normal(size=shape), out_dtype)
  scale = jnp.asarray(1 + 0.1 * rng.normal(size=shape[-1]), jnp.float32)
  bias = jnp.asarray(0.1 * rng.normal(size=shape[-1]), jnp.float32)
  key = jax.random.key(3)
  layer_norm = nn.LayerNorm(epsilon=1e-6, dtype=out_dtype)

  def xla(x, y, scale, bias):
    if keep < 1.0:
      y = jax.lax.select(dropout_masks.hashed_keep(key, keep, y.shape), y / keep, jnp.zeros_like(y))
    return layer_norm.apply({'params': {'scale': scale, 'bias': bias}}, x + y)

  kernels = lambda x, y, scale, bias: residual_norm.residual_norm(x, y, scale, bias, dropout_masks.seeds(key), keep,
                                                                  1e-6, out_dtype)

  def output_and_grads(f):
    out, vjp = jax.vjp(f, x, y, scale, bias)
    return out, *vjp(cotangent)

  want = jax.jit(lambda: output_and_grads(xla))()
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 1, 2), mesh_section.MESH_AXES)
  with pallas_mode.interpret_kernels():
    jaxpr = str(jax.make_jaxpr(lambda: output_and_grads(kernels))())
    assert 'residual_norm_fwd' in jaxpr and 'residual_norm_bwd' in jaxpr and 'shard_map' not in jaxpr
    if on_mesh:
      with jax.set_mesh(mesh), nn.logical_axis_rules(mesh_section.DEFAULT_RULES):
        jaxpr = str(jax.make_jaxpr(lambda: output_and_grads(kernels))())
        assert 'shard_map' in jaxpr
        got = jax.jit(lambda: output_and_grads(kernels))()
    else:
      got = jax.jit(lambda: output_and_grads(kernels))()
  assert got[0].dtype == out_dtype and got[1].dtype == got[2].dtype == dtype
  # float32: rounding; bfloat16: a few roundings of 2^-8 apart (the kernel rounds where XLA's fusions do not)
  tolerance = 1e-5 if dtype == out_dtype == jnp.float32 else 2e-2
  for name, g, w in zip(('out', 'dx', 'dy', 'dscale', 'dbias'), got, want):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    assert np.abs(g - w).max() <= tolerance * np.abs(w).max(), name
  if keep < 1.0:  # the dropped elements get no gradient, as with XLA's mask
    np.testing.assert_array_equal(np.asarray(got[2]) == 0, np.asarray(want[2]) == 0)


@pytest.mark.parametrize('d_model, kernel', [(32, True), (48, True), (32, False)])
def test_the_model_runs_the_kernels_on_a_gpu_with_layer_norms_parameters(d_model, kernel):
  """On a GPU a post-LN model's residual blocks run the kernels where d_model is a power of two (else XLA's
  ops) unless `model.residual_norm_kernel` is off, with LayerNorm's parameters: the same logits and gradients as
  XLA's path."""
  config = ModelConfig(vocab_size=40, d_model=d_model, d_ff=64, num_heads=4, num_encoder_layers=1,
                       num_decoder_layers=1, dropout=0.0, max_len=64, attention='reference', cpu_kernels='off',
                       residual_norm_kernel=kernel)
  inputs, targets = helpers.tokens(0, (2, 7), [7, 5]), helpers.tokens(1, (2, 9), [9, 4])
  cpu_model, gpu_model = Transformer(config), Transformer(config.replace(platform='gpu'))
  params = nn.unbox(cpu_model.init(jax.random.key(0), inputs, targets)['params'])
  loss = lambda model: lambda p: jnp.sum(jnp.sin(model.apply({'params': p}, inputs, targets, deterministic=False)))
  run = lambda model: jax.jit(lambda p: (model.apply({'params': p}, inputs, targets), jax.grad(loss(model))(p)))(
      params)
  expected = run(cpu_model)
  with pallas_mode.interpret_kernels():
    gpu_params = nn.unbox(gpu_model.init(jax.random.key(0), inputs, targets)['params'])
    assert jax.tree.structure(gpu_params) == jax.tree.structure(params)
    kernels = [eqn.params['name'] for eqn in helpers.equations(jax.make_jaxpr(loss(gpu_model))(params).jaxpr)
               if eqn.primitive.name == 'pallas_call']
    assert kernels == (['residual_norm_fwd'] * 5 if d_model == 32 and kernel else [])  # 2 encoder, 3 decoder blocks
    got = run(gpu_model)
  np.testing.assert_allclose(got[0], expected[0], atol=1e-5, rtol=1e-5)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got[1]), jax.tree.leaves(expected[1])):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
