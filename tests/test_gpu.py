"""GPU-only checks (marker `gpu`): skipped where JAX has no GPU, run on one with
`JAX_PLATFORMS=cuda python -m pytest -q -m gpu tests/test_gpu.py`.

The cuDNN fused attention path of `dot_product` (bf16, right-padded rows) and our Triton kernels (`flash_gpu`,
bf16 at any head dim, with attention dropout, on a stack of projections; `residual_norm`; `loss_kernel`) agree with
the reference implementation, and a bf16 training step (float32 params and optimizer state) follows the float32 one.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from transformer_jax.kernels import attention_masks
from transformer_jax.kernels import dropout_masks
from transformer_jax.kernels.gpu import residual_norm
from transformer_jax.model import attention
from transformer_jax.model import loss
from transformer_jax.runtime import sharding
from transformer_jax.training import steps


def _why_not_here() -> str | None:
  """Why these tests cannot run in this process, or None on a GPU. With JAX_PLATFORMS=cuda and no GPU (or no CUDA
  plugin), starting JAX fails: jax raises, or asserts where no backend started at all."""
  try:
    backend = jax.default_backend()
  except (RuntimeError, AssertionError) as error:
    return f'JAX started no GPU backend ({type(error).__name__}: {error})'
  return None if backend == 'gpu' else f'needs a GPU (JAX_PLATFORMS=cuda); JAX runs on {backend}'


_WHY_NOT = _why_not_here()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or '')]


def test_cudnn_fused_attention_agrees_with_the_reference():
  rng = np.random.default_rng(0)
  batch, length, heads, dim = 4, 128, 8, 64
  q, k, v = (jnp.asarray(rng.normal(size=(batch, length, heads, dim)), jnp.bfloat16) for _ in range(3))
  lengths = np.array([128, 100, 64, 7])
  valid = jnp.asarray(np.arange(length)[None] < lengths[:, None])
  for causal in (False, True):
    spec = attention_masks.MaskSpec(q_valid=valid, kv_valid=valid, causal=causal)
    # auto takes cuDNN here
    assert attention.serving(helpers.kernels('auto', 'gpu'), spec, q, v, dropout=False) == 'dot_product'
    fused = jax.jit(lambda a, b, c, s=spec: attention.attend(a, b, c, s, kernels=helpers.kernels('dot_product', 'gpu')))
    assert 'cudnn' in fused.lower(q, k, v).compile().as_text().lower()  # the fused kernel, not XLA's path
    reference = attention.attend(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), spec,
                                 kernels=helpers.kernels('reference', 'gpu'))
    out = fused(q, k, v).astype(jnp.float32)
    rows = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(reference)[rows], atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize('head_dim', [8, 64])
def test_flash_gpu_self_attention_agrees_in_bf16_at_any_head_dim(head_dim):
  """flash_gpu on padded self-attention in bf16, outputs and gradients, at 8-wide heads (which Triton's dots cannot
  take as they are: jax's `mha`, given them, was off by up to 0.74 of the largest output on an H100) and 64."""
  rng = np.random.default_rng(2)
  valid = jnp.asarray(np.arange(32)[None] < rng.integers(16, 33, size=4)[:, None])
  spec = attention_masks.MaskSpec.self_attention(valid, valid.astype(jnp.int32), causal=True)
  q, k, v = (jnp.asarray(rng.normal(size=(4, 32, 2, head_dim)), jnp.bfloat16) for _ in range(3))
  cotangent = jnp.asarray(rng.normal(size=(4, 32, 2, head_dim)), jnp.float32) * valid[:, :, None, None]

  def run(implementation, *qkv):
    kernels = helpers.kernels(implementation, 'gpu')
    out, vjp = jax.vjp(lambda *x: attention.attend(*x, spec, kernels=kernels).astype(jnp.float32), *qkv)
    return out, *vjp(cotangent)

  assert 'attention_gpu_fwd' in str(jax.make_jaxpr(lambda: run('flash_gpu', q, k, v))())
  got = jax.jit(lambda: run('flash_gpu', q, k, v))()
  with jax.default_matmul_precision('highest'):
    want = jax.jit(lambda: run('reference', *(x.astype(jnp.float32) for x in (q, k, v))))()
  rows = np.asarray(valid)
  for name, g, w in zip(('out', 'dq', 'dk', 'dv'), got, want):
    g, w = np.asarray(g, np.float32)[rows], np.asarray(w, np.float32)[rows]
    assert np.abs(g - w).max() <= 2e-2 * np.abs(w).max(), name  # bf16 inputs: ~4 roundings of 2^-8


def test_triton_dropout_kernels_agree_with_the_reference():
  """Compiled by Triton (no interpret mode): the reference's dropout bits, outputs and gradients, self-attention
  (causal, packed segments) and cross-attention (padded rows, d_k != d_v)."""
  rng = np.random.default_rng(1)
  segments = jnp.asarray(np.repeat([[1, 2, 3, 0]], 2, axis=0).repeat([30, 40, 26, 4], axis=1))
  packed = attention_masks.MaskSpec.self_attention(segments > 0, segments, causal=True)
  cross = attention_masks.MaskSpec(q_valid=jnp.ones((2, 100), bool),
                                   kv_valid=jnp.asarray(np.arange(70)[None] < np.array([[70], [33]])), causal=False)
  for spec, k_len, d_v in ((packed, 100, 64), (cross, 70, 32)):
    q, k = (jnp.asarray(rng.normal(size=(2, n, 4, 64)), jnp.float32) for n in (100, k_len))
    v = jnp.asarray(rng.normal(size=(2, k_len, 4, d_v)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(2, 100, 4, d_v)), jnp.float32)

    def run(implementation, spec=spec):
      attend = lambda q, k, v: attention.attend(q, k, v, spec, kernels=helpers.kernels(implementation, 'gpu'),
                                                dropout_rate=0.2, dropout_rng=jax.random.key(3))
      out, vjp = jax.vjp(attend, q, k, v)
      return out, *vjp(cotangent)

    with jax.default_matmul_precision('highest'):
      assert 'attention_gpu_fwd' in str(jax.make_jaxpr(lambda: run('flash_gpu'))())
      got, want = jax.jit(lambda: run('flash_gpu'))(), jax.jit(lambda: run('reference'))()
    for name, g, w in zip(('out', 'dq', 'dk', 'dv'), got, want):
      np.testing.assert_allclose(g, w, atol=1e-5 * float(jnp.max(jnp.abs(w))), err_msg=name)


def test_flash_gpu_reads_a_stack_of_projections_compiled_by_triton():
  """Compiled by Triton: a fused projections' product read in place (self-attention's keys, values and queries;
  cross-attention's keys and values) and its gradient written by both backward kernels into one array
  (`flash_gpu._places`), equal to the reference on the slices."""
  rng = np.random.default_rng(4)
  valid = jnp.asarray(np.arange(96)[None] < np.array([[96], [50]]))
  self_spec = attention_masks.MaskSpec.self_attention(valid, valid.astype(jnp.int32), causal=True)
  cross = attention_masks.MaskSpec(q_valid=jnp.ones((2, 40), bool), kv_valid=valid, causal=False)
  for spec, n in ((self_spec, 3), (cross, 2)):
    q = jnp.asarray(rng.normal(size=(2, 40, 4, 64)), jnp.float32)
    stack = jnp.asarray(rng.normal(size=(2, 96, n, 4, 64)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(2, 96 if n == 3 else 40, 4, 64)), jnp.float32)

    def run(implementation, spec=spec, n=n):
      def attend(q, stack):
        q = stack[:, :, 2] if n == 3 else q
        return attention.attend(q, stack[:, :, 0], stack[:, :, 1], spec, kernels=helpers.kernels(implementation, 'gpu'),
                                dropout_rate=0.2, dropout_rng=jax.random.key(3), stacked=stack)
      out, vjp = jax.vjp(attend, q, stack)
      return out, *vjp(cotangent)

    with jax.default_matmul_precision('highest'):
      got, want = jax.jit(lambda: run('flash_gpu'))(), jax.jit(lambda: run('reference'))()
    for name, g, w in zip(('out', 'dq', 'dstack'), got, want):
      np.testing.assert_allclose(g, w, atol=1e-5 * float(jnp.max(jnp.abs(w))), err_msg=f'{name}, {n} slots')


def test_residual_norm_kernels_compiled_by_triton_agree_with_xla():
  """The post-LN residual block's kernels (`residual_norm`), compiled by Triton: XLA's LayerNorm(x + dropout(y))
  with the GPU's dropout mask, forward and gradients, at base's width."""
  rng = np.random.default_rng(5)
  x, y, cotangent = (jnp.asarray(rng.normal(size=(4, 100, 512)), jnp.float32) for _ in range(3))
  scale, bias = (jnp.asarray(rng.normal(size=512), jnp.float32) for _ in range(2))
  key, keep = jax.random.key(6), 0.9

  def xla(x, y, scale, bias):
    y = jax.lax.select(dropout_masks.hashed_keep(key, keep, y.shape), y / keep, jnp.zeros_like(y))
    return nn.LayerNorm(epsilon=1e-6).apply({'params': {'scale': scale, 'bias': bias}}, x + y)

  def run(f):
    out, vjp = jax.vjp(f, x, y, scale, bias)
    return out, *vjp(cotangent)

  kernels = lambda *a: residual_norm.residual_norm(*a, dropout_masks.seeds(key), keep, 1e-6, jnp.float32)
  assert 'residual_norm_fwd' in jax.jit(lambda: run(kernels)).lower().compile().as_text()
  got, want = jax.jit(lambda: run(kernels))(), jax.jit(lambda: run(xla))()
  for name, g, w in zip(('out', 'dx', 'dy', 'dscale', 'dbias'), got, want):
    np.testing.assert_allclose(g, w, atol=1e-5 * float(jnp.max(jnp.abs(w))), err_msg=name)


def test_loss_kernel_compiled_by_triton_agrees_with_xlas_loss():
  """The loss's kernel (`loss_kernel`), compiled by Triton at the paper's vocabulary (37,000, which its steps do not
  tile): the training loss's sums and gradients as XLA's path computes them (taken here with a zero logits bias,
  which the kernel does not serve)."""
  rng = np.random.default_rng(7)
  hidden = jnp.asarray(rng.normal(size=(4, 50, 512)), jnp.float32)
  weights = jnp.asarray(0.05 * rng.normal(size=(37000, 512)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 37000, (4, 50)), jnp.int32).at[0, -5:].set(0)

  def run(bias):
    def train(h, w):
      sums = loss.token_sums(h, w, bias, targets, 0.1, 32, helpers.kernels('auto', 'gpu'))
      return sums['loss'], sums

    step = jax.jit(jax.grad(train, argnums=(0, 1), has_aux=True))
    kernel = 'loss_softmax_gradient' in step.lower(hidden, weights).compile().as_text()
    return kernel, step(hidden, weights)

  with jax.default_matmul_precision('highest'):  # float32 products on both paths: a GPU's default rounds to TF32
    (kernel, ((dh, dw), sums)), (xla, ((want_dh, want_dw), want)) = run(None), run(jnp.zeros((37000,), jnp.float32))
  assert kernel and not xla
  for key in ('loss', 'nll', 'correct'):
    np.testing.assert_allclose(sums[key], want[key], rtol=1e-5, err_msg=key)
  for name, g, w in (('d hidden', dh, want_dh), ('d weights', dw, want_dw)):
    np.testing.assert_allclose(g, w, atol=1e-5 * float(jnp.max(jnp.abs(w))), err_msg=name)


def test_bf16_train_step_follows_the_float32_step():
  losses = {}
  for dtype in ('float32', 'bfloat16'):
    config = helpers.tiny_config(model__dtype=dtype, model__dropout=0.0)
    mesh, rules = helpers.one_device_mesh(config)
    model, tx, schedule = steps.training_objects(config, 'gpu')
    state, shardings = steps.create_sharded_state(model, tx, 0, (1, 8), mesh, rules, shard_optimizer=True)
    step = steps.jit_train_step(model, tx, schedule, config.train, shardings, mesh, donate=False)
    batch = sharding.place_batch(helpers.synthetic_batches(1, 8, 32)[0], mesh)
    losses[dtype] = []
    with sharding.activate(mesh, rules):
      for _ in range(3):
        state, metrics = step(state, batch)
        losses[dtype].append(float(metrics['loss'] / metrics['tokens']))
    assert jax.tree.leaves(state.params)[0].dtype == jnp.float32  # params stay float32
  np.testing.assert_allclose(losses['bfloat16'], losses['float32'], rtol=2e-2)
