"""Training losses and token metrics, a language model's bits per byte and unigram baseline, and the analytic FLOP
count behind MFU."""

import math
from collections.abc import Iterable, Sequence

import jax.numpy as jnp
import numpy as np

from transformer_jax.config.model import ModelConfig
from transformer_jax.model import loss as loss_lib

# Dense bf16 peak FLOP/s per JAX device (a chip, but for TPU7x's two a chip), from the vendors' data sheets.
PEAK_BF16_FLOPS = {
    'TPU v4': 275e12, 'TPU v5 lite': 197e12, 'TPU v5e': 197e12, 'TPU v5p': 459e12, 'TPU v5': 459e12,
    'TPU v6 lite': 918e12, 'TPU v6e': 918e12,
    'TPU7x': 2307e12 / 2,  # a chip's peak, shared by its two devices (TensorCores): compile/topologies.py
    'A100': 312e12, 'H100': 989e12, 'H200': 989e12,
}

SUM_KEYS = ('loss', 'nll', 'correct', 'tokens')  # what `token_metrics` returns


def token_metrics(logits, targets, smoothing: float, first_id: int = 0) -> dict:
  """Sums over non-pad target tokens (combine across steps/devices, then divide by 'tokens') from whole logits or
  log-probabilities (evaluation, ensembles) over the ids from `first_id` on (`loss.cross_entropy`); training makes
  them in chunks (`loss.token_sums`)."""
  weights = (targets > 0).astype(jnp.float32)
  loss, nll, correct = loss_lib.cross_entropy(logits, targets, smoothing, first_id)
  return {'loss': jnp.sum(loss * weights), 'nll': jnp.sum(nll * weights), 'correct': jnp.sum(correct * weights),
          'tokens': jnp.sum(weights)}


def bits_per_byte(total_nll: float, num_bytes: int) -> float:
  """A language model's total negative log-likelihood (nats) over a text, in bits per UTF-8 byte of the text:
  comparable across tokenizers, unlike per-token perplexity."""
  return total_nll / math.log(2) / max(num_bytes, 1)


def unigram_perplexity(train_ids: Iterable[Sequence[int]], heldout_ids: Iterable[Sequence[int]],
                       vocab_size: int) -> float:
  """Perplexity on `heldout_ids` of the unigram model of `train_ids` (documents' token ids) with add-one
  smoothing: p(w) = (count(w) + 1) / (tokens + vocab_size). The baseline a language model must beat."""
  counts = np.zeros(vocab_size, np.int64)
  for ids in train_ids:
    np.add.at(counts, np.asarray(ids, np.int64), 1)
  log_probs = np.log(counts + 1.0) - np.log(counts.sum() + vocab_size)
  total, tokens = 0.0, 0
  for ids in heldout_ids:
    total -= float(log_probs[np.asarray(ids, np.int64)].sum())
    tokens += len(ids)
  return math.exp(total / max(tokens, 1))


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
  A decoder-only model has no encoder and no cross-attention (its source_len is 0).
  """
  d, h, dk, dv, f = config.d_model, config.num_heads, config.head_dim_k, config.head_dim_v, config.d_ff
  qkvo = d * h * (2 * dk + 2 * dv)  # MACs per token of the four projections
  scores = lambda kv_len: kv_len * h * (dk + dv)  # MACs per query token: QK^T and weights·V
  ffn = 2 * d * f
  cross = 0 if config.decoder_only else 1
  enc_token = qkvo + scores(source_len) + ffn
  dec_token = qkvo + scores(target_len) + cross * (d * h * (dk + dv) + scores(source_len)) + ffn  # + cross Q, O
  cross_kv_source_token = cross * d * h * (dk + dv)  # cross-attention K, V over the encoder output
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
