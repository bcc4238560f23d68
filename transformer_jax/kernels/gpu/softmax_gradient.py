"""The training loss's pass over a chunk's logits as one Pallas Triton kernel, for a GPU.

XLA:GPU reads the [tokens × vocab] logits once for each row's maximum and log-sum-exp and once more for the gradient
(softmax − smoothed target), two kernels with the whole logits between them. Here a program takes one row and
sweeps it twice, the second time over what it has just read, and writes the gradient over the logits (an aliased
buffer: no second [tokens × vocab] array). Its programs are wide (up to 16 warps), so few run at once and a row's
second sweep can find it still in the GPU's L2 cache; where it does not, the kernel reads what XLA's two kernels
read. bench/RESULTS.md, "The loss", has its bytes.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec as P

from transformer_jax.runtime import pallas_mode
from transformer_jax.runtime import sharding

_COLUMNS = 4096  # vocabulary entries a step of a sweep at most, 8 a thread of 16 warps
# A running maximum's start before any logit, here and in `loss`'s one-pass reduction: not -inf, whose
# exp(-inf - -inf) would make NaN where two such starts meet.
LOWEST = np.float32(np.finfo(np.float32).min)


def serves(logits, bias) -> bool:
  """Whether the kernel takes logits [batch, length, vocab]: no bias, a vocabulary of at least 16 (Triton's
  smallest block), on a mesh neither length nor vocabulary split over devices (a row's sums need all of it), and
  fewer than 2³¹ logits a device (the kernel's offsets are 32-bit)."""
  if bias is not None or logits.shape[-1] < 16:
    return False
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return logits.size < 2**31
  devices = lambda axis, size: math.prod(mesh.shape[name] for name in sharding.mesh_axes(mesh, axis, size) or ())
  return (devices('length', logits.shape[1]) == devices('vocab', logits.shape[2]) == 1
          and logits.size // devices('batch', logits.shape[0]) < 2**31)


def _kernel(targets_ref, logits_ref, top_ref, lse_ref, grad_ref, *, gold: float, other: float, columns: int):
  """A block of rows (one, as called): their maximum and log-sum-exp over the vocabulary, then (target > 0) ·
  (softmax − smoothed target) into grad_ref, which holds the same buffer as logits_ref (so the gradient's sweep
  reads it through grad_ref: one pointer, whose reads and writes keep their order). Steps of `columns` entries;
  the last step starts at vocab − columns (it overlaps the one before where they do not tile the vocabulary) and
  is read before the gradient's other steps overwrite it."""
  rows, vocab = logits_ref.shape
  steps, last = vocab // columns, vocab - columns
  index = jnp.arange(columns, dtype=jnp.int32)[None, :]

  def read(ref, start):
    return ref[:, pl.ds(start, columns)].astype(jnp.float32)

  def add(carry, x):
    top, total = carry
    new_top = jnp.maximum(top, jnp.max(x, axis=1))
    return new_top, total * jnp.exp(top - new_top) + jnp.sum(jnp.exp(x - new_top[:, None]), axis=1)

  start = (jnp.full((rows,), LOWEST), jnp.zeros((rows,), jnp.float32))
  top, total = jax.lax.fori_loop(0, steps, lambda i, carry: add(carry, read(logits_ref, i * columns)), start)
  tail = read(grad_ref, last)
  top, total = add((top, total), jnp.where(last + index >= steps * columns, tail, LOWEST))
  lse = top + jnp.log(total)
  top_ref[...], lse_ref[...] = top, lse

  targets = targets_ref[...][:, None]
  weight = (targets > 0).astype(jnp.float32)

  def gradient(start, x):
    return weight * (jnp.exp(x - lse[:, None]) - jnp.where(start + index == targets, gold, other))

  def write(i, _):
    step = pl.ds(i * columns, columns)
    grad_ref[:, step] = gradient(i * columns, read(grad_ref, i * columns)).astype(grad_ref.dtype)

  jax.lax.fori_loop(0, steps, write, None)
  grad_ref[:, pl.ds(last, columns)] = gradient(last, tail).astype(grad_ref.dtype)


def softmax_gradient(logits, targets, gold: float, other: float):
  """For logits [batch, length, vocab] (`serves`) and targets [batch, length] (0: padding): each token's float32
  maximum and log-sum-exp, and (target > 0) · (softmax − q) in the logits' dtype, where q puts `gold` on the target
  and `other` elsewhere. The logits' buffer is reused for it. Each device runs the kernel on its rows."""
  batch, length, vocab = logits.shape

  def local(logits, targets):
    n = logits.shape[0] * length
    columns = min(_COLUMNS, 1 << (vocab.bit_length() - 1))  # the largest power of two up to the vocabulary
    stats = jax.ShapeDtypeStruct((n,), jnp.float32)
    row_stats, row = pl.BlockSpec((1,), lambda i: (i,)), pl.BlockSpec((1, vocab), lambda i: (i, 0))
    top, lse, grad = pl.pallas_call(
        functools.partial(_kernel, gold=gold, other=other, columns=columns), grid=(n,),
        in_specs=[row_stats, row], out_specs=[row_stats, row_stats, row],
        out_shape=[stats, stats, jax.ShapeDtypeStruct((n, vocab), logits.dtype)], input_output_aliases={1: 2},
        compiler_params=plgpu.CompilerParams(num_warps=max(1, columns // 256), num_stages=1),
        interpret=pallas_mode.interpreting(),
        name='loss_softmax_gradient')(targets.reshape(n).astype(jnp.int32), logits.reshape(n, vocab))
    shape = (logits.shape[0], length)
    return top.reshape(shape), lse.reshape(shape), grad.reshape(logits.shape)

  def specs(mesh):
    rows = sharding.mesh_axes(mesh, 'batch', batch)
    return (P(rows, None, None), P(rows, None)), (P(rows, None), P(rows, None), P(rows, None, None))

  return sharding.per_device(local, logits, targets, specs=specs)
