"""The label-smoothed cross-entropy (§5.4), and the training loss computed with the pre-softmax layer in chunks of
positions, so that the [tokens × vocab] logits of a whole batch never exist.

`token_sums` takes the decoder's final states, the pre-softmax weights and its bias, if any. Each chunk's logits
come from a compute-dtype matmul (float32 accumulation) and are reduced in float32 to the loss, NLL and accuracy
sums; when differentiated, the same pass also forms the chunk's gradient (softmax − smoothed target) and contracts
it with the states and the weights at once, so the backward pass only scales those products by the incoming
cotangents and no chunk is recomputed. The chunks are unrolled, so XLA's cost analysis counts every one of them.
On a GPU (the model's `Kernels.gpu_loss`) the gold logits come from the weights and the log-sum-exp from one pass;
with `Kernels.loss_kernel` a chunk's maximum, log-sum-exp and gradient come from one kernel
(`kernels/gpu/softmax_gradient.py`) where it serves.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config.platform import Kernels
from transformer_jax.kernels import ops
from transformer_jax.kernels.gpu import softmax_gradient as loss_kernel


def _smoothing_weights(vocab: int, smoothing: float) -> tuple[float, float]:
  """(gold, other): the smoothed target's probability of the gold token and of each other token."""
  return 1.0 - smoothing, smoothing / (vocab - 1)


# (running maximum, sum of exponentials rescaled to it) before any logit (`loss_kernel.LOWEST`: not -inf)
_LSE_START = (loss_kernel.LOWEST, np.float32(0.0))


def _lse_combine(a, b):
  """Two (running maximum, sum of exponentials rescaled to it) pairs as one."""
  top = jnp.maximum(a[0], b[0])
  return top, a[1] * jnp.exp(a[0] - top) + b[1] * jnp.exp(b[0] - top)


def _top_and_lse(logits, one_pass: bool):
  """Each row's maximum and log-sum-exp of float32 logits [..., vocab]. one_pass: both from one reduction
  (`_lse_combine`), where XLA:GPU otherwise reads the logits once for each (the TPU compiler fuses the two
  itself); it has no derivative, so only the loss's own VJP uses it."""
  if not one_pass:
    top = jnp.max(logits, axis=-1)
    return top, top + jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))
  top, total = jax.lax.reduce((logits, jnp.ones_like(logits)), _LSE_START, _lse_combine, (logits.ndim - 1,))
  return top, top + jnp.log(total)


def _per_token(logits, targets, smoothing: float, bias=None, logit_sum=None, gold_logit=None, one_pass=False,
               top_and_lse=None):
  """((smoothed loss, nll, gold logit is a maximum), log-sum-exp) per token from logits [..., vocab] of any float
  dtype plus a float32 `bias` [vocab] (or none), reduced in float32 (the gold logit is gathered before the cast:
  no float32 copy of them is needed). `logit_sum` (bias included) and `gold_logit` (bias excluded, in the logits'
  dtype): each token's sum of logits and its gold logit, where the caller has them without a pass over the logits.
  `one_pass`: the maximum and log-sum-exp from one reduction (`_top_and_lse`); `top_and_lse`: both, where the
  caller has them.

  The smoothed target puts (1-ε) on the gold token and ε/(V-1) on every other (§5.4). Its constant entropy is
  subtracted from the loss, so a perfect model scores 0 as with ε=0; the NLL is the plain cross-entropy.
  """
  vocab = logits.shape[-1]
  if gold_logit is None:
    gold_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  gold_logit = gold_logit.astype(jnp.float32)
  logits = logits.astype(jnp.float32)
  if bias is not None:
    gold_logit, logits = gold_logit + bias[targets], logits + bias
  top, lse = _top_and_lse(logits, one_pass) if top_and_lse is None else top_and_lse
  nll = lse - gold_logit
  correct = (gold_logit >= top).astype(jnp.float32)  # = argmax == target, up to exact ties
  if smoothing == 0.0:
    return (nll, nll, correct), lse
  gold, other = _smoothing_weights(vocab, smoothing)
  sum_log_probs = (jnp.sum(logits, axis=-1) if logit_sum is None else logit_sum) - vocab * lse
  entropy = -(gold * math.log(gold) + (vocab - 1) * other * math.log(other))
  return (gold * nll - other * (sum_log_probs + nll) - entropy, nll, correct), lse


def _labels(targets, first_id: int):
  """Each target's column among the ids from `first_id` on (padding, id 0, reads column 0: masked by the caller)."""
  return targets if not first_id else jnp.maximum(targets - first_id, 0)


def cross_entropy(logits, targets, smoothing: float, first_id: int = 0):
  """Per token: (label-smoothed loss, negative log-likelihood, whether the gold token is the argmax), from logits
  (or log-probabilities) [..., vocab] of any float dtype, over the ids from `first_id` on (the model's
  `first_output_id`: the columns before it are not the model's)."""
  return _per_token(logits[..., first_id:], _labels(targets, first_id), smoothing)[0]


def _chunks(length: int, chunk_length: int) -> list[tuple[int, int]]:
  return [(start, min(chunk_length, length - start)) for start in range(0, length, chunk_length)]


def _chunk_logits(hidden, weights, start, size):
  """Logits [batch, size, vocab] in the compute dtype of positions start.. (weights [vocab, d_model])."""
  chunk = jax.lax.slice_in_dim(hidden, start, start + size, axis=1)
  logits = jnp.einsum('bcd,vd->bcv', chunk, weights)
  return nn.with_logical_constraint(logits, ('batch', 'length', 'vocab')), chunk


def _forward(hidden, weights, bias, targets, smoothing, chunk_length, kernels, first_id, with_gradients):
  """(loss, nll, correct) sums over non-pad tokens and, with_gradients, the loss's gradient products:
  G = Σ_t w_t (p_t − q_t) ⊗ h_t [vocab, d], Dy_t = w_t (p_t − q_t) · W [batch, length, d] and, with a bias,
  Db = Σ_t w_t (p_t − q_t) [vocab], in float32. `weights` and `bias` hold the rows of ids from `first_id` on."""
  vocab = weights.shape[0]
  gold, other = _smoothing_weights(vocab, smoothing)
  sums = [jnp.zeros((), jnp.float32)] * 3
  g_t = jnp.zeros((weights.shape[1], vocab), jnp.float32)  # Gᵀ: the small [d, ...] side is what gets transposed
  d_bias = None if bias is None else jnp.zeros((vocab,), jnp.float32)
  # Σ_v logit_v = h · Σ_v W_v (+ Σ bias): the smoothing term's logit sums without another pass over the logits
  weight_sum = jnp.sum(weights.astype(jnp.float32), axis=0)
  bias_sum = 0.0 if bias is None else jnp.sum(bias)
  dy, gpu = [], kernels.gpu_loss
  for start, size in _chunks(hidden.shape[1], chunk_length):
    logits, chunk = _chunk_logits(hidden, weights, start, size)
    chunk_targets = jax.lax.slice_in_dim(targets, start, start + size, axis=1)
    mask = (chunk_targets > 0).astype(jnp.float32)
    labels = _labels(chunk_targets, first_id)
    logit_sum = jnp.einsum('bcd,d->bc', chunk.astype(jnp.float32), weight_sum) + bias_sum
    gold_logit = None  # gathered from the logits, which the TPU compiler fuses with their maximum
    if gpu:  # from the gold tokens' weights, rounded as the logits are: no gather over the logits on a GPU
      # (bench/RESULTS.md, "The loss")
      gold_logit = jnp.einsum('bcd,bcd->bc', chunk.astype(jnp.float32),
                              weights[labels].astype(jnp.float32)).astype(logits.dtype)
    # The kernel reads target 0 as padding, so it serves only columns that start at id 0 (`first_id` 0).
    kernel = with_gradients and kernels.loss_kernel and not first_id and loss_kernel.serves(logits, bias)
    stats = None
    if kernel:  # the maximum, log-sum-exp and gradient from one kernel, the gradient over the logits' buffer
      *stats, grad = loss_kernel.softmax_gradient(logits, chunk_targets, gold, other)
    per_token, lse = _per_token(logits, labels, smoothing, bias, logit_sum, gold_logit, one_pass=gpu,
                                top_and_lse=stats)
    sums = [total + jnp.sum(value * mask) for total, value in zip(sums, per_token)]
    if with_gradients:
      if not kernel:
        is_gold = jnp.arange(vocab) == labels[..., None]
        shifted = logits.astype(jnp.float32) - lse[..., None]
        probs = jnp.exp(shifted if bias is None else shifted + bias)
        grad = mask[..., None] * (probs - jnp.where(is_gold, gold, other))
        if bias is not None:
          d_bias += jnp.sum(grad, axis=(0, 1))
      grad = grad.astype(hidden.dtype)
      g_t += ops.einsum_f32('bcd,bcv->dv', chunk, grad, kernels)
      dy.append(ops.einsum_f32('bcv,vd->bcd', grad, weights, kernels))
  if not with_gradients:
    return tuple(sums)
  return tuple(sums), (g_t.T, jnp.concatenate(dy, axis=1), d_bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _sums(hidden, weights, bias, targets, smoothing, chunk_length, kernels, first_id):
  return _forward(hidden, weights, bias, targets, smoothing, chunk_length, kernels, first_id, with_gradients=False)


def _sums_fwd(hidden, weights, bias, targets, smoothing, chunk_length, kernels, first_id):
  # symbolic_zeros wraps the primals
  hidden, weights, bias, targets = jax.tree.map(lambda x: x.value, (hidden, weights, bias, targets))
  sums, products = _forward(hidden, weights, bias, targets, smoothing, chunk_length, kernels, first_id,
                            with_gradients=True)
  return sums, (products, hidden, weights, bias, targets)


def _sums_bwd(smoothing, chunk_length, kernels, first_id, residuals, cotangents):
  """d loss/d logits = w (p − q); d nll/d logits = w (p − onehot) = w (p − q) + w (ε'·1 − (ε + ε')·onehot),
  whose second term needs only the states and weights of the gold tokens (ε' = ε/(V−1)). A cotangent that is a
  symbolic zero (the NLL when only the loss is differentiated) costs nothing."""
  del chunk_length, kernels
  (g, dy, db), hidden, weights, bias, targets = residuals
  zero = lambda x: isinstance(x, jax.custom_derivatives.SymbolicZero)
  d_loss, d_nll, _ = cotangents  # the accuracy is piecewise constant
  scale = sum(c for c in (d_loss, d_nll) if not zero(c))
  d_weights, d_hidden = scale * g, scale * dy
  d_bias = None if bias is None else scale * db
  if smoothing and not zero(d_nll):
    gold, other = _smoothing_weights(weights.shape[0], smoothing)
    mask, labels = (targets > 0).astype(jnp.float32), _labels(targets, first_id)
    w32, h32 = weights.astype(jnp.float32), hidden.astype(jnp.float32)
    d_hidden += d_nll * mask[..., None] * (other * jnp.sum(w32, axis=0) - (1 - gold + other) * w32[labels])
    gold_states = jnp.zeros_like(w32).at[labels.reshape(-1)].add((mask[..., None] * h32).reshape(-1, h32.shape[-1]))
    d_weights += d_nll * (other * jnp.einsum('bt,btd->d', mask, h32)[None] - (1 - gold + other) * gold_states)
    if bias is not None:
      gold_counts = jnp.zeros_like(bias).at[labels.reshape(-1)].add(mask.reshape(-1))
      d_bias += d_nll * (other * jnp.sum(mask) - (1 - gold + other) * gold_counts)
  return (d_hidden.astype(hidden.dtype), d_weights.astype(weights.dtype),
          None if bias is None else d_bias.astype(bias.dtype), np.zeros(targets.shape, jax.dtypes.float0))


_sums.defvjp(_sums_fwd, _sums_bwd, symbolic_zeros=True)


def token_sums(hidden, weights, bias, targets, smoothing: float, chunk_length: int, kernels: Kernels,
               first_id: int = 0) -> dict:
  """Sums over non-pad target tokens of the loss, NLL and correct predictions, and their count (combine across
  steps and devices, then divide by 'tokens'): `cross_entropy` of the logits hidden · weightsᵀ (+ bias), made
  `chunk_length` positions at a time.

  hidden: the decoder's final states [batch, length, d_model]; weights: the pre-softmax layer [vocab, d_model],
  both in the compute dtype; bias: float32 [vocab] or None; targets: [batch, length] token ids, 0 = padding;
  kernels: the model's (`ModelConfig.kernels`); first_id: the softmax covers the ids from there on (the model's
  `first_output_id`).
  """
  if first_id:  # the rows before it are not the model's outputs: they get no gradient from the loss
    weights, bias = weights[first_id:], None if bias is None else bias[first_id:]
  loss, nll, correct = _sums(hidden, weights, bias, targets, smoothing, chunk_length, kernels, first_id)
  return {'loss': loss, 'nll': nll, 'correct': correct, 'tokens': jnp.sum((targets > 0).astype(jnp.float32))}
