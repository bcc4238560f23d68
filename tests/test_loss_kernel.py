"""The GPU's loss kernel (`loss_kernel`): each token's maximum, log-sum-exp and (softmax − smoothed target) equal the
formula, at vocabularies its steps tile and do not, on a mesh too; and where it does not serve.

Run on a CPU in Pallas interpret mode (`pallas_mode.interpret_kernels`); tests/test_aot.py compiles it for an
H100 inside a train step. Tolerances: float32 sums over the vocabulary in another order, a few ulps (rtol 1e-5,
as tests/test_loss.py); bfloat16 gradients, one bfloat16 rounding apart at most (values below 1).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.config import mesh as mesh_section
from transformer_jax.kernels.gpu import softmax_gradient as loss_kernel
from transformer_jax.runtime import pallas_mode

GOLD, SMOOTHING = 0.9, 0.1


def _case(vocab: int, dtype, seed=0, shape=(4, 6)):
  rng = np.random.default_rng(seed)
  logits = jnp.asarray(rng.normal(size=(*shape, vocab)) * 4, dtype)
  targets = rng.integers(1, vocab, shape)
  targets[0, -2:] = 0  # padding
  return logits, jnp.asarray(targets, jnp.int32)


def _formula(logits, targets):
  x = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(x, axis=-1)
  other = SMOOTHING / (logits.shape[-1] - 1)
  q = jnp.where(jnp.arange(logits.shape[-1]) == targets[..., None], GOLD, other)
  grad = (targets > 0)[..., None] * (jnp.exp(x - lse[..., None]) - q)
  return jnp.max(x, axis=-1), lse, grad.astype(logits.dtype)


def _kernel(logits, targets):
  other = SMOOTHING / (logits.shape[-1] - 1)
  with pallas_mode.interpret_kernels():
    jaxpr = str(jax.make_jaxpr(lambda l: loss_kernel.softmax_gradient(l, targets, GOLD, other))(logits))
    assert 'loss_softmax_gradient' in jaxpr
    return jax.jit(lambda l: loss_kernel.softmax_gradient(l, targets, GOLD, other))(logits)


@pytest.mark.parametrize('vocab,dtype', [
    (29, 'float32'),  # under one step: one step of 16, its last overlapping
    (4096, 'float32'),  # exactly one step of 4,096
    (9000, 'float32'),  # two steps and a last one that overlaps the second
    (9000, 'bfloat16'),
])
def test_kernel_equals_the_formula(vocab, dtype):
  logits, targets = _case(vocab, jnp.dtype(dtype))
  top, lse, grad = _kernel(logits, targets)
  want_top, want_lse, want_grad = _formula(logits, targets)
  np.testing.assert_array_equal(top, want_top)
  np.testing.assert_allclose(lse, want_lse, rtol=1e-5)
  atol = 1e-6 if dtype == 'float32' else float(jnp.finfo(jnp.bfloat16).eps)
  np.testing.assert_allclose(grad.astype(jnp.float32), want_grad.astype(jnp.float32), rtol=1e-5, atol=atol)
  assert float(jnp.max(jnp.abs(grad[0, -2:].astype(jnp.float32)))) == 0.0  # padding: no gradient
  assert grad.dtype == logits.dtype


def test_kernel_runs_on_each_devices_rows_of_a_mesh():
  """Under a data × tensor mesh each device runs the kernel on its batch rows (vocabulary whole): the same values."""
  logits, targets = _case(300, jnp.float32, shape=(4, 5))
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]).reshape(2, 1, 1), mesh_section.MESH_AXES)
  with jax.set_mesh(mesh), nn.logical_axis_rules(mesh_section.DEFAULT_RULES):
    assert loss_kernel.serves(logits, None)
    got = _kernel(logits, targets)
  for a, b in zip(got, _formula(logits, targets)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_kernel_serves_whole_rows_without_a_bias_only():
  logits = jnp.zeros((4, 6, 300), jnp.float32)
  assert loss_kernel.serves(logits, None)
  assert not loss_kernel.serves(logits, jnp.zeros((300,), jnp.float32))  # a logits bias: XLA's path
  assert not loss_kernel.serves(jnp.zeros((4, 6, 15), jnp.float32), None)  # under Triton's smallest block
  huge = jax.ShapeDtypeStruct((2**16, 1, 2**15), jnp.bfloat16)  # 2³¹ logits: past the kernel's 32-bit offsets
  assert not loss_kernel.serves(huge, None)
  assert loss_kernel.serves(jax.ShapeDtypeStruct((2**16 - 1, 1, 2**15), jnp.bfloat16), None)
  split = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 1, 2), mesh_section.MESH_AXES)
  with jax.set_mesh(split), nn.logical_axis_rules(mesh_section.DEFAULT_RULES):
    assert not loss_kernel.serves(logits, None)  # the vocabulary split over the tensor axis
