"""Training losses and token metrics, and the analytic FLOP count behind MFU."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.model_config import ModelConfig

# Dense bf16 peak FLOP/s per chip, from the vendors' data sheets.
PEAK_BF16_FLOPS = {
    'TPU v4': 275e12, 'TPU v5 lite': 197e12, 'TPU v5e': 197e12, 'TPU v5p': 459e12, 'TPU v5': 459e12,
    'TPU v6 lite': 918e12, 'TPU v6e': 918e12,
    'A100': 312e12, 'H100': 989e12, 'H200': 989e12,
}

SUM_KEYS = ('loss', 'nll', 'correct', 'tokens')  # what `token_metrics` returns


def label_smoothed_loss(logits, targets, smoothing: float):
  """Per-token cross-entropy against (1-ε) on the gold token and ε/(V-1) elsewhere (§5.4).

  The constant entropy of the smoothed target is subtracted, so a perfect model scores 0 as with ε=0.
  Returns (smoothed loss, unsmoothed negative log-likelihood), both [batch, length].
  """
  loss, nll, _ = _cross_entropy(logits.astype(jnp.float32), targets, smoothing)
  return loss, nll


def _smoothing_weights(vocab: int, smoothing: float):
  """(gold, other): the smoothed target's probability of the gold token and of each other token."""
  return 1.0 - smoothing, smoothing / (vocab - 1)


def _cross_entropy_and_lse(logits, targets, smoothing):
  """((smoothed loss, nll, gold logit is a maximum), log-sum-exp) per token from float32 logits [..., vocab]."""
  vocab = logits.shape[-1]
  top = jnp.max(logits, axis=-1)
  lse = top + jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))
  gold_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = lse - gold_logit
  correct = (gold_logit >= top).astype(jnp.float32)  # = argmax == target, up to exact ties
  if smoothing == 0.0:
    return (nll, nll, correct), lse
  gold, other = _smoothing_weights(vocab, smoothing)
  sum_log_probs = jnp.sum(logits, axis=-1) - vocab * lse
  entropy = -(gold * jnp.log(gold) + (vocab - 1) * other * jnp.log(other))
  return (gold * nll - other * (sum_log_probs + nll) - entropy, nll, correct), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cross_entropy(logits, targets, smoothing):
  """(smoothed loss, nll, gold logit is a maximum) per token, differentiable in the logits.

  Reads the logits a few times without materialising log-probabilities or a one-hot target, and the
  backward pass is one elementwise pass over them; autodiff of the same formula materialises several
  [tokens, vocab] arrays (see bench/RESULTS.md).
  """
  return _cross_entropy_and_lse(logits, targets, smoothing)[0]


def _cross_entropy_fwd(logits, targets, smoothing):
  outputs, lse = _cross_entropy_and_lse(logits, targets, smoothing)
  return outputs, (logits, targets, lse)


def _cross_entropy_bwd(smoothing, residuals, cotangents):
  """d loss/d logits = softmax - q (q the smoothed target, summing to 1); d nll/d logits = softmax - one-hot."""
  logits, targets, lse = residuals
  d_loss, d_nll, _ = cotangents  # `correct` is piecewise constant
  gold, other = _smoothing_weights(logits.shape[-1], smoothing)  # (1, 0) without smoothing
  is_gold = jnp.arange(logits.shape[-1]) == targets[..., None]
  probs = jnp.exp(logits - lse[..., None])
  target_mass = d_loss[..., None] * jnp.where(is_gold, gold, other) + d_nll[..., None] * is_gold
  d_logits = (d_loss + d_nll)[..., None] * probs - target_mass
  return d_logits, np.zeros(targets.shape, jax.dtypes.float0)


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def token_metrics(logits, targets, smoothing: float) -> dict:
  """Sums over non-pad target tokens (combine across steps/devices, then divide by 'tokens')."""
  weights = (targets > 0).astype(jnp.float32)
  loss, nll, correct = _cross_entropy(logits.astype(jnp.float32), targets, smoothing)
  return {'loss': jnp.sum(loss * weights), 'nll': jnp.sum(nll * weights), 'correct': jnp.sum(correct * weights),
          'tokens': jnp.sum(weights)}


def normalize(sums: dict) -> dict:
  """Per-token means from `token_metrics` sums: loss, nll, perplexity, accuracy."""
  tokens = max(float(sums['tokens']), 1.0)
  nll = float(sums['nll']) / tokens
  return {'loss': float(sums['loss']) / tokens, 'nll': nll, 'perplexity': float(jnp.exp(min(nll, 50.0))),
          'accuracy': float(sums['correct']) / tokens}


def forward_flops(config: ModelConfig, batch: int, source_len: int, target_len: int) -> float:
  """Matmul FLOPs of one teacher-forced forward pass over padded [batch, length] arrays.

  Counts every projection, the attention scores and weighted sums (self, causal self over the full
  square as the kernels compute it, and cross), the FFNs and the pre-softmax layer; 2 FLOPs per MAC.
  """
  d, h, dk, dv, f = config.d_model, config.num_heads, config.head_dim_k, config.head_dim_v, config.d_ff
  qkvo = d * h * (2 * dk + 2 * dv)  # MACs per token of the four projections
  scores = lambda kv_len: kv_len * h * (dk + dv)  # MACs per query token: QK^T and weights·V
  ffn = 2 * d * f
  enc_token = qkvo + scores(source_len) + ffn
  dec_token = qkvo + scores(target_len) + d * h * (dk + dv) + scores(source_len) + ffn  # + cross Q, O
  cross_kv_source_token = d * h * (dk + dv)  # cross-attention K, V over the encoder output
  macs = batch * (source_len * config.num_encoder_layers * enc_token
                  + target_len * config.num_decoder_layers * dec_token
                  + source_len * config.num_decoder_layers * cross_kv_source_token
                  + target_len * d * config.vocab_size)
  return 2.0 * macs


def train_flops(config: ModelConfig, batch: int, source_len: int, target_len: int) -> float:
  """Forward + backward (≈ 2× forward) model FLOPs of one training step; rematerialisation not counted."""
  return 3.0 * forward_flops(config, batch, source_len, target_len)


def peak_flops_per_device(device) -> float | None:
  """The device's dense bf16 peak, or None where unknown (e.g. a CPU: report achieved FLOP/s instead)."""
  kind = getattr(device, 'device_kind', '')
  for name, peak in sorted(PEAK_BF16_FLOPS.items(), key=lambda kv: -len(kv[0])):
    if name.lower() in kind.lower():
      return peak
  return None
