"""The encoder-decoder Transformer of "Attention Is All You Need" (§3) as Flax linen modules, and its decoder
stack alone as a language model (`model.architecture='decoder_only'`).

Reads top to bottom like the paper: embeddings and positional encodings (§3.4–3.5), multi-head attention
(§3.2), the position-wise feed-forward network (§3.3), the residual block (§3.1, §5.4), encoder and decoder
stacks (§3.1), then the two models; the stock Flax layers they are made of, with the paper's initialisation,
close the file. Where a platform has a faster way to compute a piece (fused projections, a residual-block kernel,
dropout masks, XLA:CPU's backward passes), the model calls a named op of `kernels/ops.py` that runs what the
model config's `kernels` choose (`config/platform.py`); attention's implementations are `model/attention.py`'s.

A stack's N layers are `layer_0`..`layer_{N-1}`, or with `model.scan_layers` one `nn.scan` named `layers` over
parameters stacked on a leading `layers` axis, so that compile time and program size do not grow with depth.

Initialisation: every projection matrix is Xavier-uniform over its [fan_in, fan_out] matrix view, as in
tensor2tensor and fairseq; embeddings are normal(0, d_model^-0.5), so that after the ×√d_model of §3.4
the embedded tokens have unit variance and the tied pre-softmax layer starts with small logits; biases 0,
LayerNorm scales 1. Every parameter and key activation carries logical axis names
(`batch`, `length`, `embed`, `heads`, `kv`, `mlp`, `vocab`, and `layers` when scanned) that `runtime/sharding.py`
maps to mesh axes.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.config.model import ModelConfig
from transformer_jax.core.tokens import BOS_ID
from transformer_jax.kernels import attention_masks
from transformer_jax.kernels import dropout_masks
from transformer_jax.kernels import ops
from transformer_jax.model import attention

# A logit whose softmax probability is 0 (finite: no inf - inf = nan), for ids a model never outputs.
MASKED_LOGIT = -1e9

# --------------------------------------------------------------------------------------- §3.4–3.5 embeddings


def sinusoidal_encoding(positions: jax.Array, d_model: int, layout: str = 'interleaved') -> jax.Array:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (§3.5), for any positions; layout
  'split' puts the same sines in the first half and the cosines in the second (transformers' Marian)."""
  inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  if layout == 'split':
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, d_model)


def make_embedding(config: ModelConfig) -> nn.Embed:
  return nn.Embed(config.vocab_size, config.d_model, dtype=config.compute_dtype,
                  param_dtype=config.weight_dtype,
                  embedding_init=_param(nn.initializers.normal(config.d_model ** -0.5), ('vocab', 'embed')))


class Embedder(nn.Module):
  """Token embedding ×√d_model (unless `model.scale_embeddings` is off) plus positional encoding, then dropout
  (§3.4, §3.5, §5.4)."""

  config: ModelConfig
  embedding: nn.Embed

  @nn.compact
  def __call__(self, tokens, positions, *, deterministic):
    cfg = self.config
    x = self.embedding(tokens)
    if cfg.pad_is_bos:  # BOS reads Marian's pad row, which as an input takes no gradient (torch's padding_idx)
      x = jnp.where((tokens == BOS_ID)[..., None], jax.lax.stop_gradient(x), x)
    if cfg.scale_embeddings:
      x = x * math.sqrt(cfg.d_model)
    if cfg.positional == 'sinusoidal':
      pe = sinusoidal_encoding(positions, cfg.d_model, cfg.sinusoids)
    else:  # a table of max_len rows: padding past it reads the last row (real tokens never get there, see
      # ModelConfig.position_limit), where an out-of-range lookup would be NaN and leak through attention
      pe = nn.Embed(cfg.max_len, cfg.d_model, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
                    embedding_init=_param(nn.initializers.normal(cfg.d_model ** -0.5), ('length', 'embed')),
                    name='position_embedding')(jnp.minimum(positions, cfg.max_len - 1))
    x = (x + pe).astype(cfg.compute_dtype)
    x = Dropout(cfg, cfg.dropout)(x, deterministic)
    return _constrain(x, ('batch', 'length', 'embed'))


# --------------------------------------------------------------------------------------- §3.2 attention


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V) (§3.2.2).

  With `decode=True` keys and values live in the 'cache' collection: self-attention appends its tokens (one step,
  or a whole prompt) at `decode_index`, with their validity, so a query never sees a padded cache slot;
  cross-attention projects the encoder output once, when the cache is created.
  """

  config: ModelConfig
  deterministic: bool
  cross: bool = False
  decode: bool = False

  @nn.compact
  def __call__(self, x_q, x_kv, spec: attention_masks.MaskSpec, decode_index=None):
    cfg, dtype = self.config, self.config.compute_dtype
    heads_k, heads_v = (cfg.num_heads, cfg.head_dim_k), (cfg.num_heads, cfg.head_dim_v)
    params = {name: ProjectionParams(cfg, heads, cfg.attention_bias, name=name)()
              for name, heads in (('query', heads_k), ('key', heads_k), ('value', heads_v))}
    qkv_names = ('batch', 'length', 'heads', 'kv')

    if not self.cross:
      (q, k, v), stacked = ops.project_qkv(x_q, params, ('query', 'key', 'value'), dtype, cfg.kernels)
      if self.decode:
        (k, v, spec), stacked = self._append_to_cache(k, v, spec, decode_index), None
    else:
      (q,), _ = ops.project_qkv(x_q, params, ('query',), dtype, cfg.kernels)
      if self.decode and self.has_variable('cache', 'cached_key'):  # projected once, when the cache was made
        (k, v), stacked = (self.get_variable('cache', 'cached_key'), self.get_variable('cache', 'cached_value')), None
      else:
        (k, v), stacked = ops.project_qkv(x_kv, params, ('key', 'value'), dtype, cfg.kernels)
        if self.decode:
          self.put_variable('cache', 'cached_key', k)
          self.put_variable('cache', 'cached_value', v)
    q, k, v = _constrain(q, qkv_names), _constrain(k, qkv_names), _constrain(v, qkv_names)

    dropout_rng = None
    if cfg.attention_dropout > 0 and not self.deterministic:
      dropout_rng = self.make_rng('dropout')
    if self.is_mutable_collection('intermediates'):
      out, weights = attention.reference_attention(q, k, v, spec, kernels=cfg.kernels, return_weights=True)
      self.sow('intermediates', 'attention_weights', weights)
    else:
      out = attention.attend(q, k, v, spec, kernels=cfg.kernels, chunk_size=cfg.attention_chunk_size,
                             dropout_rate=cfg.attention_dropout, dropout_rng=dropout_rng, stacked=stacked)
    out = _constrain(out, qkv_names)
    out_proj = dense(cfg, cfg.d_model, ('heads', 'kv', 'embed'), axis=(-2, -1), use_bias=cfg.attention_bias, name='out')
    return out_proj(out)

  def _append_to_cache(self, k, v, spec, decode_index):
    """Writes these tokens' keys/values and validity at decode_index; a query then sees the valid cache
    positions up to its own."""
    creating = not self.has_variable('cache', 'cached_key')
    cached_k = self.variable('cache', 'cached_key', jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable('cache', 'cached_value', jnp.zeros, v.shape, v.dtype)
    cached_valid = self.variable('cache', 'cached_valid', jnp.zeros, spec.kv_valid.shape, bool)
    if creating:  # the call that sizes the cache: nothing to append yet
      return k, v, spec
    update = lambda cached, new: jax.lax.dynamic_update_slice_in_dim(cached, new, decode_index, axis=1)
    cached_k.value = update(cached_k.value, k)
    cached_v.value = update(cached_v.value, v)
    cached_valid.value = update(cached_valid.value, spec.kv_valid)
    spec = attention_masks.MaskSpec(q_valid=spec.q_valid, kv_valid=cached_valid.value, causal=True,
                                    q_offset=decode_index)
    return cached_k.value, cached_v.value, spec


# --------------------------------------------------------------------------------------- §3.3 feed-forward network

_ACTIVATION_FNS = {'gelu': lambda x: nn.gelu(x, approximate=False), 'swish': nn.swish}  # ReLU: `ops.relu_dropout`


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3), or GELU / swish in place of max(0, ·) (`model.activation`), with
  dropout on the hidden layer (`model.relu_dropout`)."""

  config: ModelConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x):
    cfg, det = self.config, self.deterministic
    h = dense(cfg, cfg.d_ff, ('embed', 'mlp'), use_bias=True, name='wi')(x)
    dropout = Dropout(cfg, cfg.relu_dropout)
    if cfg.activation == 'relu':
      h = _constrain(ops.relu_dropout(h, dropout.rng(det), dropout.keep(det), cfg.kernels), ('batch', 'length', 'mlp'))
    else:
      h = dropout(_constrain(_ACTIVATION_FNS[cfg.activation](h), ('batch', 'length', 'mlp')), det)
    return dense(cfg, cfg.d_model, ('mlp', 'embed'), use_bias=True, name='wo')(h)


# --------------------------------------------------------------------------------------- §3.1, §5.4 residual block


class Residual(nn.Module):
  """A sublayer with its residual connection and dropout (§5.4): post-LN LayerNorm(x + Dropout(f(x))) as in the
  paper (§3.1), or pre-LN x + Dropout(f(LayerNorm(x))) (`model.norm`)."""

  config: ModelConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x, sublayer):
    cfg, det = self.config, self.deterministic
    dropout = Dropout(cfg, cfg.dropout)
    if cfg.norm == 'pre':
      return x + dropout(sublayer(layer_norm(cfg, x, 'norm')), det)
    y = sublayer(x)
    scale, bias = NormParams(cfg, name='norm')()
    return ops.residual_norm(x, y, scale, bias, rng=dropout.rng(det), keep=dropout.keep(det),
                             epsilon=cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, kernels=cfg.kernels)


# --------------------------------------------------------------------------------------- §3.1 encoder and decoder


class EncoderLayer(nn.Module):
  config: ModelConfig
  deterministic: bool
  scanned: bool = False  # a step of nn.scan: returns (x, None)

  @nn.compact
  def __call__(self, x, spec):
    cfg, det = self.config, self.deterministic
    attn = MultiHeadAttention(cfg, det, name='self_attention')
    x = Residual(cfg, det, name='self_attention_block')(x, lambda y: attn(y, y, spec))
    x = Residual(cfg, det, name='ffn_block')(x, FeedForward(cfg, det, name='ffn'))
    x = _constrain(x, ('batch', 'length', 'embed'))
    return (x, None) if self.scanned else x


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention (not in a decoder-only model) and FFN."""

  config: ModelConfig
  deterministic: bool
  decode: bool = False
  scanned: bool = False  # a step of nn.scan: returns (x, None)

  @nn.compact
  def __call__(self, x, encoded, self_spec, cross_spec, decode_index=None):
    cfg, det = self.config, self.deterministic
    self_attn = MultiHeadAttention(cfg, det, decode=self.decode, name='self_attention')
    x = Residual(cfg, det, name='self_attention_block')(x, lambda y: self_attn(y, y, self_spec, decode_index))
    if not cfg.decoder_only:
      cross_attn = MultiHeadAttention(cfg, det, cross=True, decode=self.decode, name='cross_attention')
      x = Residual(cfg, det, name='cross_attention_block')(x, lambda y: cross_attn(y, encoded, cross_spec))
    x = Residual(cfg, det, name='ffn_block')(x, FeedForward(cfg, det, name='ffn'))
    x = _constrain(x, ('batch', 'length', 'embed'))
    return (x, None) if self.scanned else x


_REMAT_POLICIES = {
    'full': None,  # save nothing, recompute the whole layer
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def _layer_stack(layer_cls, config: ModelConfig, num_layers: int, x, *args, **attributes):
  """x through `num_layers` layers: unrolled (`layer_0`..) or one `nn.scan` named `layers` (`model.scan_layers`).

  The scan stacks every parameter on a leading `layers` axis (unsharded by default, see config/mesh.py)
  and the decoding cache on axis 1, so that cache leaves keep the batch first (decoding reorders their rows).
  Rematerialisation (`model.remat`, not while decoding) wraps the layer inside the scan.
  """
  if config.remat != 'none' and not attributes.get('decode'):
    policy = ops.remat_policy(_REMAT_POLICIES[config.remat], config.kernels)
    layer_cls = nn.remat(layer_cls, policy=policy,
                         prevent_cse=not config.scan_layers)  # a scan already keeps XLA from merging recomputation
  if not config.scan_layers:
    for i in range(num_layers):
      x = layer_cls(config, name=f'layer_{i}', **attributes)(x, *args)
    return x
  scan = nn.scan(layer_cls, variable_axes={'params': 0, 'cache': 1, 'intermediates': 0},
                 split_rngs={'params': True, 'dropout': True}, in_axes=(nn.broadcast,) * len(args),
                 length=num_layers, metadata_params={nn.PARTITION_NAME: 'layers'})
  x, _ = scan(config, scanned=True, name='layers', **attributes)(x, *args)
  return x


def _positions_or_default(tokens, positions):
  if positions is not None:
    return positions
  return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


class Encoder(nn.Module):
  """N identical layers of self-attention and FFN over the embedded source (§3.1)."""

  config: ModelConfig
  embedding: nn.Embed

  @nn.compact
  def __call__(self, inputs, inputs_positions=None, inputs_segment_ids=None, *, deterministic=True):
    cfg = self.config
    spec = attention_masks.MaskSpec.self_attention(inputs > 0, inputs_segment_ids)
    x = Embedder(cfg, self.embedding, name='embedder')(
        inputs, _positions_or_default(inputs, inputs_positions), deterministic=deterministic)
    x = _layer_stack(EncoderLayer, cfg, cfg.num_encoder_layers, x, spec, deterministic=deterministic)
    if cfg.norm == 'pre':
      x = layer_norm(cfg, x, 'final_norm')
    return x


class Decoder(nn.Module):
  """N layers of masked self-attention, encoder-decoder attention (not in a decoder-only model) and FFN, then the
  pre-softmax layer (or, with return_hidden, the final states, the pre-softmax weights [vocab, d_model] and the
  logits bias [vocab] or None, for `loss.token_sums`, which leaves out the ids below `first_output_id` as the
  logits do)."""

  config: ModelConfig
  embedding: nn.Embed

  @nn.compact
  def __call__(self, encoded, inputs, decoder_inputs, targets_positions=None, inputs_segment_ids=None,
               targets_segment_ids=None, *, deterministic=True, decode=False, return_hidden=False):
    cfg = self.config
    target_valid = decoder_inputs > 0
    decode_index = None
    if decode:
      creating = not self.has_variable('cache', 'index')
      index = self.variable('cache', 'index', lambda: jnp.zeros((), jnp.int32))
      if not creating:
        decode_index = index.value
        if targets_positions is None:
          targets_positions = _positions_or_default(decoder_inputs, None) + decode_index
        index.value = decode_index + decoder_inputs.shape[1]
    self_spec = attention_masks.MaskSpec.self_attention(target_valid, targets_segment_ids, causal=True)
    cross_spec = None if cfg.decoder_only else attention_masks.MaskSpec(
        q_valid=target_valid, kv_valid=inputs > 0, q_segment=targets_segment_ids, kv_segment=inputs_segment_ids)
    y = Embedder(cfg, self.embedding, name='embedder')(
        decoder_inputs, _positions_or_default(decoder_inputs, targets_positions), deterministic=deterministic)
    y = _layer_stack(DecoderLayer, cfg, cfg.num_decoder_layers, y, encoded, self_spec, cross_spec, decode_index,
                     deterministic=deterministic, decode=decode)
    if cfg.norm == 'pre':
      y = layer_norm(cfg, y, 'final_norm')
    y = y.astype(cfg.compute_dtype)
    if cfg.share_embeddings:
      weights = self.embedding.embedding.astype(cfg.compute_dtype)
    else:
      weights = PreSoftmaxWeights(cfg, name='logits')()
    bias = None
    if cfg.logits_bias:
      bias = self.param('logits_bias', _param(nn.initializers.zeros, ('vocab',)), (cfg.vocab_size,),
                        cfg.weight_dtype).astype(jnp.float32)
    if return_hidden:
      return y, weights, bias
    logits = jnp.dot(y, weights.T).astype(jnp.float32)
    logits = logits if bias is None else logits + bias
    if cfg.first_output_id:  # PAD's row copies BOS's (`model.pad_is_bos`): its logit is not the model's
      logits = jnp.where(jnp.arange(cfg.vocab_size) < cfg.first_output_id, MASKED_LOGIT, logits)
    return _constrain(logits, ('batch', 'length', 'vocab'))


# --------------------------------------------------------------------------------------- the models


class Transformer(nn.Module):
  """The full encoder-decoder; `encode` and `decode` are separate so inference encodes once."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    if cfg.share_embeddings:
      self.shared_embedding = make_embedding(cfg)
      source_embedding = target_embedding = self.shared_embedding
    else:
      self.source_embedding = make_embedding(cfg)
      self.target_embedding = make_embedding(cfg)
      source_embedding, target_embedding = self.source_embedding, self.target_embedding
    self.encoder = Encoder(cfg, source_embedding)
    self.decoder = Decoder(cfg, target_embedding)

  def encode(self, inputs, inputs_positions=None, inputs_segment_ids=None, *, deterministic=True):
    return self.encoder(inputs, inputs_positions, inputs_segment_ids, deterministic=deterministic)

  def decode(self, encoded, inputs, decoder_inputs, targets_positions=None, inputs_segment_ids=None,
             targets_segment_ids=None, *, deterministic=True, decode=False, return_hidden=False):
    """Logits [batch, length, vocab] (float32) for `decoder_inputs` (targets shifted right); with return_hidden,
    (final states, pre-softmax weights, logits bias or None) instead (`Decoder`).

    With decode=True, keys/values come from and go to the 'cache' collection (see `init_cache`) and
    `decoder_inputs` holds the next token(s) of each row.
    """
    return self.decoder(encoded, inputs, decoder_inputs, targets_positions, inputs_segment_ids,
                        targets_segment_ids, deterministic=deterministic, decode=decode, return_hidden=return_hidden)

  def init_cache(self, encoded, inputs, max_decode_len: int):
    """Creates the decoding cache (apply with mutable=['cache']): empty self-attention slots for
    max_decode_len steps and the cross-attention keys/values of `encoded`."""
    placeholder = jnp.full((inputs.shape[0], max_decode_len), BOS_ID, jnp.int32)
    return self.decode(encoded, inputs, placeholder, decode=True)

  def __call__(self, inputs, targets, inputs_positions=None, targets_positions=None, inputs_segment_ids=None,
               targets_segment_ids=None, *, deterministic=True, return_hidden=False):
    """Teacher-forced logits for `targets` given `inputs` (token ids, 0 = padding); see `decode`."""
    encoded = self.encode(inputs, inputs_positions, inputs_segment_ids, deterministic=deterministic)
    decoder_inputs = shift_right(targets, targets_segment_ids)
    return self.decode(encoded, inputs, decoder_inputs, targets_positions, inputs_segment_ids,
                       targets_segment_ids, deterministic=deterministic, return_hidden=return_hidden)


class LanguageModel(nn.Module):
  """The decoder-only Transformer: the decoder stack without cross-attention, predicting each next token.

  Its own token embedding, tied with the pre-softmax layer (`share_embeddings`) or not; every decoder option of
  the encoder-decoder applies. A batch holds only the 'targets' side (packed documents with segment ids).
  """

  config: ModelConfig

  def setup(self):
    if self.config.share_embeddings:
      self.shared_embedding = make_embedding(self.config)
      embedding = self.shared_embedding
    else:
      self.target_embedding = make_embedding(self.config)
      embedding = self.target_embedding
    self.decoder = Decoder(self.config, embedding)

  def decode(self, decoder_inputs, targets_positions=None, targets_segment_ids=None, *, deterministic=True,
             decode=False, return_hidden=False):
    """Logits [batch, length, vocab] (float32) for `decoder_inputs` (targets shifted right); with decode=True
    through the 'cache' collection (see `init_cache`), as `Transformer.decode`."""
    return self.decoder(None, None, decoder_inputs, targets_positions, None, targets_segment_ids,
                        deterministic=deterministic, decode=decode, return_hidden=return_hidden)

  def init_cache(self, batch_size: int, max_decode_len: int):
    """Creates the decoding cache (apply with mutable=['cache']): empty slots for max_decode_len positions."""
    return self.decode(jnp.full((batch_size, max_decode_len), BOS_ID, jnp.int32), decode=True)

  def __call__(self, targets, targets_positions=None, targets_segment_ids=None, *, deterministic=True,
               return_hidden=False):
    """Teacher-forced next-token logits for `targets` (token ids, 0 = padding): position t sees targets[:t]."""
    return self.decode(shift_right(targets, targets_segment_ids), targets_positions, targets_segment_ids,
                       deterministic=deterministic, return_hidden=return_hidden)


def make_model(config: ModelConfig) -> nn.Module:
  """The model of `config.architecture`."""
  return LanguageModel(config) if config.decoder_only else Transformer(config)


def init_inputs(config: ModelConfig, batch_shape) -> dict:
  """Token arrays [batch_shape] for every input of the model's `__call__` (to initialise it): any shape will do."""
  tokens = jnp.ones(batch_shape, jnp.int32)
  return {'targets': tokens} if config.decoder_only else {'inputs': tokens, 'targets': tokens}


def shift_right(targets: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
  """Decoder inputs for teacher forcing: targets moved one step right, BOS first in every segment.

  Padding positions (target 0) stay 0, so decoder inputs > 0 exactly where there is a target to predict.
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  if segment_ids is None:
    starts = jnp.zeros_like(targets, dtype=bool).at[:, 0].set(True)
  else:
    starts = segment_ids != jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]
  return jnp.where(targets > 0, jnp.where(starts, BOS_ID, shifted), 0)


# --------------------------------------------------------------------------------------- building blocks


class Dropout(nn.Module):
  """Dropout (§5.4): each element kept with probability 1 − rate and scaled by 1 / (1 − rate), by the mask the
  model's kernels draw (`dropout_masks.keep_mask`) from this module's own 'dropout' random stream (its path in the
  model, as every Flax module's)."""

  config: ModelConfig
  rate: float

  def keep(self, deterministic: bool) -> float:
    """The probability this call keeps an element: 1.0 when deterministic or without dropout."""
    return 1.0 if deterministic else 1.0 - self.rate

  def rng(self, deterministic: bool) -> jax.Array | None:
    """This call's dropout key, for an op that drops inside; None when it keeps every element."""
    return None if self.keep(deterministic) == 1.0 else self.make_rng('dropout')

  def __call__(self, x, deterministic: bool):
    return dropout_masks.drop(x, self.rng(deterministic), self.keep(deterministic), self.config.kernels)


_xavier = nn.initializers.xavier_uniform()


def _param(init, names):
  return nn.with_logical_partitioning(init, names)


def _constrain(x, names):
  return nn.with_logical_constraint(x, names)


def dense(config: ModelConfig, features, names: tuple[str, ...], *, axis=-1, use_bias=False, name=None):
  """`nn.DenseGeneral` with a Xavier-uniform kernel over its [fan_in, fan_out] matrix view and logical names; its
  product is the kernels' (`ops.dot_general`)."""
  kernel_init = lambda *args: _KernelPartitioned(_xavier(*args), names)
  bias_names = names[-(len(features) if isinstance(features, tuple) else 1):]
  bias_init = lambda *args: _KernelPartitioned(nn.initializers.zeros(*args), bias_names)  # also initialised flat
  return nn.DenseGeneral(features, axis=axis, use_bias=use_bias, dtype=config.compute_dtype,
                         param_dtype=config.weight_dtype, kernel_init=kernel_init, bias_init=bias_init,
                         dot_general=ops.dot_general(config.kernels), name=name)


class _KernelPartitioned(nn.LogicallyPartitioned):
  """A kernel's (or bias's) logical names, not applied to the flat [fan_in, fan_out] matrix (flat vector)
  `nn.DenseGeneral` initialises and then reshapes: the names fit only the final shape (flax would constrain the
  flat one under a mesh)."""

  def unbox(self, apply_constraint=True):
    return super().unbox(apply_constraint and jnp.ndim(self.value) == len(self.names))


def _shaped_init(init, names, n_in: int):
  """`init` over the flat [fan_in, fan_out] view (a flat vector when n_in = 0) reshaped to the parameter's shape,
  with logical names: how nn.DenseGeneral initialises, so a projection's values do not depend on which makes it."""

  def wrapped(rng, shape, dtype):
    flat = (math.prod(shape[:n_in]), math.prod(shape[n_in:])) if n_in else (math.prod(shape),)
    boxed = _KernelPartitioned(init(rng, flat, dtype), names)
    return boxed.replace_boxed(jnp.reshape(boxed.value, shape))

  return wrapped


class ProjectionParams(nn.Module):
  """One attention projection's kernel [d_model, heads, head_dim] and bias [heads, head_dim] (or None), with the
  names, initialisers and random streams `dense` gives them; `ops.project_qkv` applies them."""

  config: ModelConfig
  features: tuple[int, int]
  use_bias: bool

  @nn.compact
  def __call__(self):
    cfg, names = self.config, ('embed', 'heads', 'kv')
    kernel = self.param('kernel', _shaped_init(_xavier, names, 1), (cfg.d_model, *self.features), cfg.weight_dtype)
    bias = (self.param('bias', _shaped_init(nn.initializers.zeros, names[1:], 0), self.features, cfg.weight_dtype)
            if self.use_bias else None)
    return kernel, bias


class NormParams(nn.Module):
  """A LayerNorm's scale and bias [d_model] (ones and zeros), named and initialised as `nn.LayerNorm` names them."""

  config: ModelConfig

  @nn.compact
  def __call__(self):
    make = lambda name, init: self.param(name, _param(init, ('embed',)), (self.config.d_model,),
                                         self.config.weight_dtype)
    return make('scale', nn.initializers.ones), make('bias', nn.initializers.zeros)


def layer_norm(config: ModelConfig, x, name: str):
  """LayerNorm(x) with the parameters `name` (`ops.layer_norm`)."""
  scale, bias = NormParams(config, name=name)()
  return ops.layer_norm(x, scale, bias, config.layer_norm_epsilon, config.compute_dtype)


class PreSoftmaxWeights(nn.Module):
  """The pre-softmax layer's own weights when not tied to the embedding: a [d_model, vocab] kernel (the
  parameters of an `nn.DenseGeneral` named 'logits'), returned as [vocab, d_model] in the compute dtype."""

  config: ModelConfig

  @nn.compact
  def __call__(self):
    cfg = self.config
    kernel = self.param('kernel', _param(_xavier, ('embed', 'vocab')), (cfg.d_model, cfg.vocab_size),
                        cfg.weight_dtype)
    return kernel.T.astype(cfg.compute_dtype)
