"""The post-LN residual block's LayerNorm(x + dropout(y)) as one Pallas Triton kernel a pass, for a GPU.

XLA:GPU splits it into two kernels each way (the row statistics, then what needs them), so x + dropout(y) is
written and read back forward and the backward pass reads its inputs twice: 5 passes over [tokens, d_model]
forward and 6 backward, against 4 and 4 here (bench/RESULTS.md, "Compiled for TPU slices and GPU hosts"). The
dropout mask is `dropout_masks.hashed_keep`'s (what a GPU draws), computed inside from each element's row and
column, so both paths keep the same elements.
The statistics are float32, the variance E[z²] − E[z]² as Flax's LayerNorm computes it.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec as P

from transformer_jax.kernels import dropout_masks
from transformer_jax.runtime import pallas_mode
from transformer_jax.runtime import sharding

_ELEMENTS = 2048  # of a [rows, d_model] block a program (forward) or a loop step (backward) takes at most: 16 a
# thread of 4 warps, which Triton holds in registers (ptxas -v: bench/RESULTS.md, "Compiled for TPU slices
# and GPU hosts")
_BACKWARD_ROWS = 32  # rows a backward program at most: the scale and bias gradients are one row of partial sums
# a program


def serves(x) -> bool:
  """Whether the kernels take x [..., d_model]: a power-of-two d_model, as Triton's blocks need."""
  d = x.shape[-1]
  return d >= 16 and d & (d - 1) == 0


def _block_rows(rows: int, most: int) -> int:
  """The largest power of two up to `most` that divides `rows`: blocks that tile the rows exactly."""
  return next(b for b in (most >> i for i in range(most.bit_length())) if rows % b == 0)


def _step_rows(rows: int, d: int) -> int:
  """Rows of width d a block of at most `_ELEMENTS` holds (at least one), tiling `rows` exactly."""
  return _block_rows(rows, max(1, _ELEMENTS // d))


def _compiler_params(rows: int, d: int):
  """4 warps, more for rows wider than `_ELEMENTS`, so that no thread holds more than 16 of a block's elements."""
  return plgpu.CompilerParams(num_warps=min(16, max(4, rows * d // 512)), num_stages=1)


def _kept(scalars_ref, first_row, shape, keep: float):
  """`dropout_masks.hashed_keep`'s mask for rows first_row.. (of the whole batch) of a [rows, d] block; scalars:
  the two words of `dropout_masks.seeds`, then the first row of this device's block."""
  rows = (first_row + jnp.arange(shape[0], dtype=jnp.int32))[:, None]  # a column and a row, as Triton builds them
  columns = jnp.arange(shape[1], dtype=jnp.int32)[None, :]
  return dropout_masks.keep_at(scalars_ref, rows, columns, keep)


def _forward_kernel(scalars_ref, x_ref, y_ref, scale_ref, bias_ref, out_ref, z_ref, mean_ref, rstd_ref, *,
                    keep: float, eps: float):
  """A block of rows: z = x + dropout(y), rounded to their dtype as XLA's add is; its float32 statistics; the
  output. z, the mean and 1/std are kept for the backward pass."""
  x, y = x_ref[...], y_ref[...]
  if keep < 1.0:
    dropped = (y.astype(jnp.float32) / keep).astype(y.dtype)
    kept = _kept(scalars_ref, scalars_ref[2] + pl.program_id(0) * x.shape[0], x.shape, keep)
    y = jnp.where(kept, dropped, jnp.zeros_like(y))
  z = (x.astype(jnp.float32) + y.astype(jnp.float32)).astype(z_ref.dtype)
  zf = z.astype(jnp.float32)
  mean = jnp.mean(zf, axis=1)
  rstd = jax.lax.rsqrt(jnp.maximum(jnp.mean(zf * zf, axis=1) - mean * mean, 0.0) + eps)
  out = (zf - mean[:, None]) * rstd[:, None] * scale_ref[...][None, :] + bias_ref[...][None, :]
  out_ref[...], z_ref[...] = out.astype(out_ref.dtype), z
  mean_ref[...], rstd_ref[...] = mean, rstd


def _backward_kernel(scalars_ref, dout_ref, z_ref, mean_ref, rstd_ref, scale_ref, dz_ref, dy_ref, dscale_ref,
                     dbias_ref, *, keep: float, step: int):
  """A block of rows' gradients, `step` rows at a time: dz (the residual's) and dy (dz where dropout kept y,
  scaled), from z and its statistics; and the block's sums of the scale's and bias's gradients."""
  block, d = dout_ref.shape
  scale, first_row = scale_ref[...][None, :], scalars_ref[2] + pl.program_id(0) * block

  def rows(i, sums):
    at = pl.ds(i * step, step)
    dout = dout_ref[at, :].astype(jnp.float32)
    mean, rstd = mean_ref[at][:, None], rstd_ref[at][:, None]
    xhat = (z_ref[at, :].astype(jnp.float32) - mean) * rstd
    g = dout * scale
    dz = rstd * (g - jnp.sum(g, axis=1, keepdims=True) / d - xhat * (jnp.sum(g * xhat, axis=1, keepdims=True) / d))
    dz = dz.astype(dz_ref.dtype)
    dy = (dz.astype(jnp.float32) / keep).astype(dy_ref.dtype)
    if keep < 1.0:
      dy = jnp.where(_kept(scalars_ref, first_row + i * step, (step, d), keep), dy, jnp.zeros_like(dy))
    dz_ref[at, :], dy_ref[at, :] = dz, dy
    return sums[0] + jnp.sum(dout * xhat, axis=0), sums[1] + jnp.sum(dout, axis=0)

  zeros = jnp.zeros((d,), jnp.float32)
  dscale_ref[...], dbias_ref[...] = jax.lax.fori_loop(0, block // step, rows, (zeros, zeros))


def _per_device(local, x, *args, batched: int, outputs: int):
  """local(*arrays, batch_index) on each device's rows of the batch (`sharding.per_device`): the first `batched`
  of `args` and x have the batch first, the rest are replicated; its `outputs` results have the batch first (the
  scale and bias gradients' partial sums: their blocks). batch_index [batch]: the rows' indices."""

  def specs(mesh):
    axes = sharding.mesh_axes(mesh, 'batch', x.shape[0])
    rows = lambda a: P(axes, *[None] * (a.ndim - 1))
    return (rows(x), *[rows(a) if i < batched else P() for i, a in enumerate(args)], P(axes)), (P(axes),) * outputs

  return sharding.per_device(local, x, *args, jnp.arange(x.shape[0], dtype=jnp.int32), specs=specs)


def _scalars(words, batch_index, length: int):
  return jnp.concatenate([words, batch_index[:1] * length])


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def residual_norm(x, y, scale, bias, words, keep: float, eps: float, dtype):
  """LayerNorm(x + dropout(y)) · scale + bias over the last axis of x and y [batch, length, d] (`serves`; one
  dtype, in which x + dropout(y) is rounded), the output in `dtype` (LayerNorm's); dropout keeps elements with
  probability `keep` by `words` (`dropout_masks.seeds` of the dropout key). Each device runs the kernels on its
  rows."""
  return _forward(x, y, scale, bias, words, keep, eps, dtype)[0]


def _forward(x, y, scale, bias, words, keep, eps, dtype):
  length, d = x.shape[1:]

  def local(x, y, scale, bias, words, batch_index):
    rows = x.shape[0] * length
    block = _step_rows(rows, d)
    row_block, row_stats = pl.BlockSpec((block, d), lambda i: (i, 0)), pl.BlockSpec((block,), lambda i: (i,))
    vector = pl.BlockSpec((d,), lambda i: (0,))
    stats = jax.ShapeDtypeStruct((rows,), jnp.float32)
    out, z, mean, rstd = pl.pallas_call(
        functools.partial(_forward_kernel, keep=keep, eps=eps), grid=(rows // block,),
        in_specs=[pl.BlockSpec((3,), lambda i: (0,)), row_block, row_block, vector, vector],
        out_specs=[row_block, row_block, row_stats, row_stats],
        out_shape=[jax.ShapeDtypeStruct((rows, d), dtype), jax.ShapeDtypeStruct((rows, d), x.dtype), stats, stats],
        compiler_params=_compiler_params(block, d), interpret=pallas_mode.interpreting(),
        name='residual_norm_fwd')(_scalars(words, batch_index, length), x.reshape(rows, d), y.reshape(rows, d),
                                  scale.astype(jnp.float32), bias.astype(jnp.float32))
    local_shape = (x.shape[0], length)
    return (out.reshape(x.shape), z.reshape(x.shape), mean.reshape(local_shape), rstd.reshape(local_shape))

  out, z, mean, rstd = _per_device(local, x, y, scale, bias, words, batched=1, outputs=4)
  return out, (z, mean, rstd, scale, bias, words)


def _residual_norm_fwd(x, y, scale, bias, words, keep, eps, dtype):
  return _forward(x, y, scale, bias, words, keep, eps, dtype)


def _residual_norm_bwd(keep, eps, dtype, residuals, dout):
  del eps, dtype
  z, mean, rstd, scale, bias, words = residuals
  length, d = z.shape[1:]

  def local(dout, z, mean, rstd, scale, words, batch_index):
    rows = z.shape[0] * length
    block = _block_rows(rows, _BACKWARD_ROWS)
    blocks, step = rows // block, _step_rows(block, d)
    row_block, row_stats = pl.BlockSpec((block, d), lambda i: (i, 0)), pl.BlockSpec((block,), lambda i: (i,))
    partial_sums = pl.BlockSpec((None, d), lambda i: (i, 0))
    dz, dy, dscale, dbias = pl.pallas_call(
        functools.partial(_backward_kernel, keep=keep, step=step), grid=(blocks,),
        in_specs=[pl.BlockSpec((3,), lambda i: (0,)), row_block, row_block, row_stats, row_stats,
                  pl.BlockSpec((d,), lambda i: (0,))],
        out_specs=[row_block, row_block, partial_sums, partial_sums],
        out_shape=[jax.ShapeDtypeStruct((rows, d), z.dtype)] * 2 + [jax.ShapeDtypeStruct((blocks, d), jnp.float32)] * 2,
        compiler_params=_compiler_params(step, d), interpret=pallas_mode.interpreting(),
        name='residual_norm_bwd')(_scalars(words, batch_index, length), dout.reshape(rows, d), z.reshape(rows, d),
                                  mean.reshape(rows), rstd.reshape(rows), scale.astype(jnp.float32))
    return dz.reshape(z.shape), dy.reshape(z.shape), dscale, dbias

  dz, dy, dscale, dbias = _per_device(local, dout, z, mean, rstd, scale, words, batched=3, outputs=4)
  return (dz, dy, jnp.sum(dscale, axis=0).astype(scale.dtype), jnp.sum(dbias, axis=0).astype(bias.dtype), None)


residual_norm.defvjp(_residual_norm_fwd, _residual_norm_bwd)
