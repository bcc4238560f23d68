"""The model's named ops whose implementation depends on the platform: each takes the model's `Kernels`
(`config/platform.py`) and runs what they choose, so the model calls every one of them unconditionally.

- `project_qkv`, `dot_general`, `remat_policy`: attention's projections (on a GPU those of one shape as one matrix
  product) and every dense layer's product (on a CPU with XLA:CPU's backward pass, `kernels/cpu/projections.py`).
- `einsum_f32`: products with float32 results.
- `relu_dropout`: max(0, h) then dropout, differentiated from its output alone.
- `layer_norm`, `residual_norm`: LayerNorm, and post-LN's LayerNorm(x + dropout(y)) (on a GPU one Pallas kernel a
  pass, `kernels/gpu/residual_norm.py`).

Dropout's masks are `dropout_masks.keep_mask`'s, chosen the same way.
"""

import functools

import jax
import jax.numpy as jnp

from transformer_jax.config.platform import Kernels
from transformer_jax.kernels import dropout_masks
from transformer_jax.kernels.cpu import projections as cpu_projections
from transformer_jax.kernels.gpu import residual_norm as gpu_residual_norm

_STACK_ORDER = ('key', 'value', 'query')  # fused projections' order: the stack `attention.attend` takes


# --------------------------------------------------------------------------------------- products


def dot_general(kernels: Kernels):
  """`nn.DenseGeneral`'s dot_general: XLA:CPU's backward pass where the kernels take it, else flax's own (None)."""
  return cpu_projections.dot_general if kernels.cpu_projections else None


def remat_policy(policy, kernels: Kernels):
  """A remat policy that also saves the CPU projections' products, which a stock policy cannot see."""
  return cpu_projections.remat_policy(policy) if kernels.cpu_projections else policy


def einsum_f32(subscripts: str, a, b, kernels: Kernels):
  """`jnp.einsum` of compute-dtype operands with float32 accumulation and result. XLA:CPU has no product of bf16
  operands with a float32 result (the step fails when it runs), so on a CPU the operands are cast to float32 first
  (f16 ones too, for one rule): the same products exactly (a bf16 or f16 product fits float32's mantissa), and
  gradients that are float32 products too. On accelerators the operands stay in their dtype."""
  if kernels.float32_products:
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  return jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32)


def project(x, projections, dtype, kernels: Kernels):
  """x [..., d_in] through projections of one shape ((kernel, bias) pairs) as one matrix product: several kernels
  stacked on a new axis, [..., n, heads, head_dim], so x is read once and the product is as wide as all of them
  (the backward pass's too); a lone kernel as it is (a unit stack axis changes XLA's layouts). In `dtype`."""
  stacked = len(projections) > 1
  join = (lambda arrays: jnp.stack(arrays, axis=-3)) if stacked else (lambda arrays: arrays[0])
  kernel = join([kernel for kernel, _ in projections]).astype(dtype)  # [d_in, (n,) heads, head_dim]
  dot = cpu_projections.dot_general if kernels.cpu_projections else jax.lax.dot_general
  out = dot(x.astype(dtype), kernel, (((x.ndim - 1,), (0,)), ((), ())))
  if projections[0][1] is not None:
    out = out + join([bias for _, bias in projections]).astype(dtype)
  return out


def project_qkv(x, params: dict, names, dtype, kernels: Kernels):
  """The projections `names` of x (params: name -> (kernel, bias or None)), and the product keys and values were
  sliced from if it stacks them first (then queries), which `flash_gpu` reads in place; else None. With fused
  projections (a GPU) those of one shape, all unless d_k != d_v, are one matrix product, which cuBLAS runs faster
  than three narrow ones (a TPU program moves more bytes that way: one each)."""
  fuse, groups = kernels.fused_projections, {}
  for name in sorted(names, key=_STACK_ORDER.index) if fuse else names:
    groups.setdefault(params[name][0].shape if fuse else name, []).append(name)
  out, stacked = {}, None
  for group in groups.values():
    with jax.named_scope('_'.join(group)):  # op names that hlo_costs attributes to the projections
      product = project(x, [params[name] for name in group], dtype, kernels)
      out.update(zip(group, [product[..., i, :, :] for i in range(len(group))] if len(group) > 1 else [product]))
    if group[:2] == ['key', 'value']:
      stacked = product
  return [out[name] for name in names], stacked


# --------------------------------------------------------------------------------------- the feed-forward network


def relu_dropout(h, rng, keep: float, kernels: Kernels):
  """max(0, h), then dropout keeping elements with probability `keep` by the dropout key `rng` (None: none
  dropped), scaled by 1/keep."""
  mask = None if rng is None else dropout_masks.keep_mask(rng, keep, h.shape, kernels)
  return _relu_then_drop(h, mask, 1.0 if mask is None else keep, kernels.relu_output_barrier)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _relu_then_drop(h, mask, keep: float, barrier: bool):
  """`relu_dropout`, differentiated from its output alone: the output is > 0 exactly where h > 0 and the mask
  keeps, so the backward pass needs neither h nor the mask, and the next product's backward pass keeps the output
  anyway. With `barrier` (a GPU) the residual passes an optimization barrier, without which XLA reads `output > 0`
  as `h > 0` and keeps h: without a mask h's one user is then the ReLU, which cuBLAS computes in the product's
  epilogue."""
  del barrier
  y = jnp.maximum(h, 0)
  return y if mask is None else jax.lax.select(mask, y / keep, jnp.zeros_like(h))


def _relu_then_drop_fwd(h, mask, keep, barrier):
  y = _relu_then_drop(h, mask, keep, barrier)
  return y, jax.lax.optimization_barrier(y) if barrier else y


def _relu_then_drop_bwd(keep, barrier, y, dy):
  del barrier
  return jax.lax.select(y > 0, dy / keep, jnp.zeros_like(dy)), None


_relu_then_drop.defvjp(_relu_then_drop_fwd, _relu_then_drop_bwd)


# --------------------------------------------------------------------------------------- layer normalisation


def layer_norm(z, scale, bias, epsilon: float, dtype):
  """LayerNorm over the last axis with `scale` and `bias` [d], in `dtype`: float32 statistics and the variance
  E[z²] − E[z]², computed as `nn.LayerNorm` computes them."""
  stats = z.astype(jnp.promote_types(dtype, jnp.float32))
  squares = jax.lax.square(stats)
  mean, mean_of_squares = stats.mean(-1), squares.mean(-1)
  variance = jnp.maximum(0.0, mean_of_squares - jax.lax.square(mean))
  mean, variance = jnp.expand_dims(mean, -1), jnp.expand_dims(variance, -1)
  features = (1,) * (z.ndim - 1) + (z.shape[-1],)
  y = z - mean
  mul = jax.lax.rsqrt(variance + epsilon)
  mul *= scale.reshape(features)
  y *= mul
  y += bias.reshape(features)
  return jnp.asarray(y, dtype)


def residual_norm(x, y, scale, bias, *, rng, keep: float, epsilon: float, dtype, kernels: Kernels):
  """Post-LN's LayerNorm(x + dropout(y)) · scale + bias (§5.4) over the last axis of x and y [batch, length, d],
  dropout keeping elements of y with probability `keep` by the dropout key `rng` (None: none dropped). On a GPU
  (where the kernels take it and d is a power of two) one Pallas kernel a pass, its mask drawn inside: the mask
  `dropout_masks.hashed_keep` draws."""
  if kernels.residual_norm_kernel and gpu_residual_norm.serves(x):
    summed = jnp.result_type(x, y)  # the dtype x + dropout(y) has
    seeds = jnp.zeros((2,), jnp.int32) if rng is None else dropout_masks.seeds(rng)
    return gpu_residual_norm.residual_norm(x.astype(summed), y.astype(summed), scale, bias, seeds, keep, epsilon,
                                           dtype)
  return layer_norm(x + dropout_masks.drop(y, rng, keep, kernels), scale, bias, epsilon, dtype)
