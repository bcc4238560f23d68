"""Export for serving: a trained model as a CTranslate2 model directory (the same network, CT2's weight layout).

How our model maps onto CTranslate2's Transformer (checked against its C++ layers, version 4.8):
- token embeddings ×√d_model: CT2's `scale_embeddings` multiplies by √(embedding width) = √d_model (off when
  `model.scale_embeddings` is);
- positions: CT2's built-in sinusoids are OpenNMT-tf's (all sines then all cosines, positions counted from 1),
  ours start from position 0 (§3.5), so the table is written out as `position_encodings`
  (sinusoidal, in the model's layout: `model.max_positions` rows, else max(max_len, 1024), 1024 being CT2's
  default max_input_length; learned: the trained table);
- the FFN activation (ReLU, GELU, swish), attention biases and the logits bias where the model has them; an
  imported MarianMT's PAD logit (`model.pad_is_bos`) masked by the logits bias, as our model masks it;
- shared source/target/pre-softmax weights: one matrix, stored once (CT2 aliases equal variables);
- post-LN or pre-LN (`pre_norm`, with the final LayerNorm of pre-LN stacks); our LayerNorm epsilon goes into
  config.json, which CT2 reads;
- attention projections without bias (optional in CT2), query/key/value fused in CT2's order; a head size
  d_k ≠ d_model/h is CT2's `head_dim`, which also sets its 1/√d_k query scale;
- vocabulary: the tokenizer's pieces in id order (<pad> 0, </s> 1 = EOS, <s> 2 = BOS, the decoder's start
  token, <unk> 3); CT2 appends </s> to the source itself, so clients pass SentencePiece pieces unchanged.
  The tokenizer's files are copied into the directory: spm.model, or an imported checkpoint's source.spm,
  target.spm and pieces.json.
- int8 weights (`int8`, `int8_float16`): CT2's per-row scales, to ±63 instead of its ±127 (INT8_WEIGHT_LIMIT), so
  that the 16-bit pair sums of CT2's int8 products on an x86 CPU without VNNI cannot overflow;
- what CT2's files cannot say goes into transformer_jax.json: the run's `model` and `decode` config sections, for
  `translate --engine=ctranslate2` (`serving.py`): beam size, max output length (input + max_len_offset, within
  learned positions) and max input length as ours. The length penalty is not the same: ours divides by
  ((5 + len) / 6)^alpha (GNMT), CT2's `length_penalty` divides by len^alpha; translate passes alpha to it.

`python -m transformer_jax.export` writes one from a workdir (`transformer_jax/export.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

from transformer_jax.config import decode as decode_section
from transformer_jax.config.model import ModelConfig
from transformer_jax.core import files
from transformer_jax.core.tokens import BOS_ID, EOS_ID, UNK_ID
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.interop import marian
from transformer_jax.model.transformer import MASKED_LOGIT, sinusoidal_encoding

if TYPE_CHECKING:  # ctranslate2.specs imports torch where it is installed (seconds): the functions that build a spec
  # import it, so that translate and a refused export start without it.
  from ctranslate2.specs import model_spec, transformer_spec

# Weight types of the exported model. CT2 computes in a type the device supports: on a CPU without float16
# arithmetic, 'float16' runs as float32 and 'int8_float16' as int8 with float32 (the GPU types).
QUANTIZATIONS = (None, 'float32', 'int8', 'int8_float16', 'float16')
SPECIAL_PIECES = tokenizer_lib.SPECIAL_PIECES
SPM_FILE = 'spm.model'
SETTINGS_FILE = 'transformer_jax.json'  # {'model': the model section, 'decode': the decode section}
# int8 weights keep 7 bits of magnitude (±63, CT2 writes ±127): on an x86 CPU without VNNI, CT2's int8 products
# (unsigned 8-bit activations times the weights) add pairs in 16 bits, which 2·255·127 overflows and 2·255·63 cannot.
INT8_WEIGHT_LIMIT = 63


def export_ctranslate2(model_config: ModelConfig, params, tokenizer, out_dir: str | os.PathLike,
                       quantization: str | None = None, decode=None) -> Path:
  """Writes `params` of a model built from `model_config` (a ModelConfig or the config's `model` section) as a
  CTranslate2 model directory `out_dir` (new or empty; written whole or not at all), for
  `ctranslate2.Translator(out_dir)`, with the run's `decode` section (default: the section's defaults) in
  SETTINGS_FILE. `tokenizer`: the run's tokenizer, or the path of its SentencePiece model. Returns out_dir."""
  if not isinstance(model_config, ModelConfig):
    model_config = ModelConfig.from_dict(model_config)
  check_exportable(model_config, quantization, out_dir)
  out_dir = Path(out_dir)
  decode = decode_section.default_config() if decode is None else decode
  settings = {'model': model_config.section(), 'decode': dict(decode.items())}
  if isinstance(tokenizer, (str, os.PathLike)):
    vocabulary, tokenizer_files = spm_vocabulary(tokenizer, model_config.vocab_size), {SPM_FILE: str(tokenizer)}
  else:
    vocabulary, tokenizer_files = tokenizer.pieces, tokenizer.files
    tokenizer_lib.check_vocab_size(tokenizer, model_config.vocab_size)
  # Writable float32 copies: CT2 quantizes the arrays it is given in place.
  weights = jax.tree.map(lambda x: np.array(x, np.float32), jax.device_get(nn.unbox(params)))
  spec = transformer_model_spec(model_config, weights)
  spec.register_source_vocabulary(vocabulary)
  spec.register_target_vocabulary(vocabulary)
  for name, path in tokenizer_files.items():
    spec.register_file(path, name)
  spec.validate()
  optimize_spec(spec, quantization)
  with files.staged_directory(out_dir) as staging:
    spec.save(staging)
    with open(os.path.join(staging, SETTINGS_FILE), 'w', encoding='utf-8') as f:
      json.dump(settings, f, indent=2)
  return out_dir


def optimize_spec(spec: model_spec.LayerSpec, quantization: str | None) -> None:
  """CT2's `optimize` (aliases, weight types), then int8 weights requantized from the float32 originals with
  per-row scales to ±INT8_WEIGHT_LIMIT."""
  from ctranslate2.specs import model_spec  # pylint: disable=import-outside-toplevel  (see TYPE_CHECKING above)
  originals = {}
  if quantization and quantization.startswith('int8'):
    def keep(layer, name, value):
      if isinstance(value, model_spec.Variable) and hasattr(layer, f'{name.rsplit("/", 1)[-1]}_scale'):
        originals[name] = np.array(value.numpy(), np.float32)  # optimize quantizes this array in place
    model_spec.visit_spec(spec, keep)
  spec.optimize(quantization=quantization)

  def requantize(layer, name, value):
    if name in originals and isinstance(value, model_spec.Variable) and value.dtype == 'int8':
      rows = originals[name].reshape(value.shape[0], -1)
      amax = np.abs(rows).max(axis=1)
      scale = np.float32(INT8_WEIGHT_LIMIT) / np.where(amax > 0, amax, np.float32(INT8_WEIGHT_LIMIT))
      weight = np.rint(rows * scale[:, None]).astype(np.int8).reshape(value.shape)
      key = name.rsplit('/', 1)[-1]
      setattr(layer, key, model_spec.NumpyVariable(weight))
      setattr(layer, f'{key}_scale', model_spec.NumpyVariable(scale.astype(np.float32)))
  model_spec.visit_spec(spec, requantize)


def check_exportable(model_config: ModelConfig, quantization: str | None = None,
                     out_dir: str | os.PathLike | None = None) -> None:
  """Refuses what CTranslate2 cannot represent (and an `out_dir` that holds files), in one line that says what to
  do."""
  if out_dir is not None:
    files.check_new_directory(out_dir)
  if quantization not in QUANTIZATIONS:
    raise ValueError(f'quantization={quantization!r}: use one of {QUANTIZATIONS}.')
  if model_config.decoder_only:
    raise ValueError('the export writes CTranslate2\'s encoder-decoder Transformer, and this is a decoder-only '
                     'language model: export a translation model.')
  if model_config.head_dim_k != model_config.head_dim_v:
    raise ValueError(
        f'CTranslate2 splits one fused key/value projection into equal halves, so it needs d_k == d_v (got '
        f'{model_config.head_dim_k} and {model_config.head_dim_v}): export a model trained with equal d_k and d_v.')


def spm_vocabulary(spm_model_path: str | os.PathLike, vocab_size: int) -> list[str]:
  """The SentencePiece pieces in id order, checked against the model's vocabulary and our reserved ids."""
  if not Path(spm_model_path).is_file():
    raise ValueError(f'no SentencePiece model at {spm_model_path}: pass the run\'s WORKDIR/tokenizer/spm.model.')
  processor = spm.SentencePieceProcessor(model_file=str(spm_model_path))
  pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
  if len(pieces) != vocab_size:
    raise ValueError(f'{spm_model_path} has {len(pieces)} pieces but the model has vocab_size={vocab_size}: pass '
                     'the SentencePiece model the model was trained with.')
  special = {i: pieces[i] for i in SPECIAL_PIECES}
  if special != SPECIAL_PIECES:
    raise ValueError(f'{spm_model_path} has the reserved pieces {special}, expected {SPECIAL_PIECES}: pass the '
                     'SentencePiece model the model was trained with.')
  return pieces


def transformer_model_spec(cfg: ModelConfig, weights) -> transformer_spec.TransformerSpec:
  """CT2's TransformerSpec of `cfg` holding `weights` (our params as float32 numpy arrays)."""
  # pylint: disable-next=import-outside-toplevel  (see TYPE_CHECKING above)
  from ctranslate2.specs import common_spec, transformer_spec
  pre = cfg.norm == 'pre'
  head_dim = cfg.head_dim_k if cfg.head_dim_k * cfg.num_heads != cfg.d_model else None
  activation = {'relu': common_spec.Activation.RELU, 'gelu': common_spec.Activation.GELU,
                'swish': common_spec.Activation.SWISH}[cfg.activation]
  common = dict(pre_norm=pre, no_final_norm=not pre, activation=activation, head_dim=head_dim)
  spec = transformer_spec.TransformerSpec(
      transformer_spec.TransformerEncoderSpec(cfg.num_encoder_layers, cfg.num_heads, **common),
      transformer_spec.TransformerDecoderSpec(cfg.num_decoder_layers, cfg.num_heads, **common))
  spec.encoder.scale_embeddings = spec.decoder.scale_embeddings = cfg.scale_embeddings
  spec.config.layer_norm_epsilon = cfg.layer_norm_epsilon
  spec.config.unk_token, spec.config.bos_token = SPECIAL_PIECES[UNK_ID], SPECIAL_PIECES[BOS_ID]
  spec.config.eos_token, spec.config.decoder_start_token = SPECIAL_PIECES[EOS_ID], SPECIAL_PIECES[BOS_ID]
  spec.config.add_source_eos = True  # our sources end with EOS

  if cfg.share_embeddings:
    source = target = _get(weights, 'shared_embedding', 'embedding')
    output = target
  else:
    source = _get(weights, 'source_embedding', 'embedding')
    target = _get(weights, 'target_embedding', 'embedding')
    output = _get(weights, 'decoder', 'logits', 'kernel').T
  spec.encoder.embeddings[0].weight = source
  spec.decoder.embeddings.weight = target
  spec.decoder.projection.weight = np.ascontiguousarray(output)
  if cfg.logits_bias or cfg.first_output_id:  # the ids below first_output_id are masked as our logits mask them
    bias = _get(weights, 'decoder', 'logits_bias') if cfg.logits_bias else np.zeros(cfg.vocab_size, np.float32)
    spec.decoder.projection.bias = np.where(np.arange(cfg.vocab_size) < cfg.first_output_id, MASKED_LOGIT, bias
                                            ).astype(np.float32)

  for side, stack in (('encoder', spec.encoder), ('decoder', spec.decoder)):
    stack.position_encodings.encodings = _positions(cfg, weights, side)
    if pre:
      _set_norm(stack.layer_norm, _get(weights, side, 'final_norm'))
  for i, layer in enumerate(spec.encoder.layer):
    w = _get(weights, 'encoder', f'layer_{i}')
    _set_attention(layer.self_attention, w, 'self_attention', fused_qkv=True)
    _set_ffn(layer.ffn, w)
  for i, layer in enumerate(spec.decoder.layer):
    w = _get(weights, 'decoder', f'layer_{i}')
    _set_attention(layer.self_attention, w, 'self_attention', fused_qkv=True)
    _set_attention(layer.attention, w, 'cross_attention', fused_qkv=False)
    _set_ffn(layer.ffn, w)
  return spec


def _get(tree, *path):
  for i, key in enumerate(path):
    if key not in tree:
      raise ValueError(f'the params have no {"/".join(path[:i + 1])}: pass the params of a model built from this '
                       'model config.')
    tree = tree[key]
  return tree


def _positions(cfg: ModelConfig, weights, side: str) -> np.ndarray:
  if cfg.positional == 'learned':
    return _get(weights, side, 'embedder', 'position_embedding', 'embedding')
  rows = marian.max_positions(cfg)
  return np.asarray(sinusoidal_encoding(jnp.arange(rows), cfg.d_model, cfg.sinusoids), np.float32)


def _set_norm(spec, w) -> None:
  spec.gamma, spec.beta = _get(w, 'scale'), _get(w, 'bias')


def _input_projection(w) -> tuple[np.ndarray, np.ndarray | None]:
  """A [d_model, heads, d] kernel as CT2's [heads·d, d_model] weight (head-major rows, as CT2 splits them), and its
  [heads, d] bias flat (None without one)."""
  kernel = _get(w, 'kernel')
  return kernel.reshape(kernel.shape[0], -1).T, (w['bias'].reshape(-1) if 'bias' in w else None)


def _set_linear(spec, weight: np.ndarray, bias: np.ndarray | None) -> None:
  spec.weight = np.ascontiguousarray(weight)
  if bias is not None:
    spec.bias = np.ascontiguousarray(bias)


def _set_attention(spec, layer_weights, name: str, *, fused_qkv: bool) -> None:
  """CT2's attention: linear_0 = [q; k; v] (self) or q with linear_1 = [k; v] (cross); the last = output."""
  w = _get(layer_weights, name)
  (query, q_bias), (key, k_bias), (value, v_bias) = (_input_projection(_get(w, part))
                                                     for part in ('query', 'key', 'value'))
  joined = lambda *biases: None if biases[0] is None else np.concatenate(biases)
  if fused_qkv:
    _set_linear(spec.linear[0], np.concatenate([query, key, value]), joined(q_bias, k_bias, v_bias))
  else:
    _set_linear(spec.linear[0], query, q_bias)
    _set_linear(spec.linear[1], np.concatenate([key, value]), joined(k_bias, v_bias))
  out = _get(w, 'out', 'kernel')  # [heads, d_v, d_model]
  _set_linear(spec.linear[-1], out.reshape(-1, out.shape[-1]).T, _get(w, 'out').get('bias'))
  _set_norm(spec.layer_norm, _get(layer_weights, f'{name}_block', 'norm'))


def _set_ffn(spec, layer_weights) -> None:
  for linear, name in ((spec.linear_0, 'wi'), (spec.linear_1, 'wo')):
    linear.weight = np.ascontiguousarray(_get(layer_weights, 'ffn', name, 'kernel').T)
    linear.bias = _get(layer_weights, 'ffn', name, 'bias')
  _set_norm(spec.layer_norm, _get(layer_weights, 'ffn_block', 'norm'))

