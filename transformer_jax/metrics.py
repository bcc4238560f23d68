"""Training losses and token metrics, and the analytic FLOP count behind MFU."""

import jax
import jax.numpy as jnp

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
  vocab = logits.shape[-1]
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  if smoothing == 0.0:
    return nll, nll
  confidence, low = 1.0 - smoothing, smoothing / (vocab - 1)
  smoothed = confidence * nll - low * (jnp.sum(log_probs, axis=-1) + nll)
  normalizer = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low))
  return smoothed - normalizer, nll


def token_metrics(logits, targets, smoothing: float) -> dict:
  """Sums over non-pad target tokens (combine across steps/devices, then divide by 'tokens')."""
  weights = (targets > 0).astype(jnp.float32)
  loss, nll = label_smoothed_loss(logits, targets, smoothing)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
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
