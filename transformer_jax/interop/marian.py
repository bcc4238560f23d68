"""Our model as a `transformers` MarianMT model and back: the config, the weights and the vocabulary, both ways.

MarianMT is the paper's post-LN Transformer; what differs is carried by ordinary `ModelConfig` options:
- positions: Marian's sinusoids are all sines then all cosines (`model.sinusoids='split'`) in a table of
  `max_position_embeddings` rows (`model.max_positions`). A model with the paper's interleaved layout is exported
  with its features permuted (`feature_permutation`): every layer is equivariant to a permutation of the d_model
  features (LayerNorm statistics and residual sums do not depend on their order), so the permuted model computes
  the same logits, and its interleaved table becomes Marian's split one;
- the FFN activation (`activation_function` relu, gelu, swish/silu), `scale_embedding` (`model.scale_embeddings`),
  biases on the attention projections (`model.attention_bias`) and `final_logits_bias` (`model.logits_bias`): an
  import keeps a bias only if it is not all zeros (a zero bias computes nothing);
- token ids: ours reserve PAD 0, EOS 1, BOS 2 (the decoder's start token) and UNK 3, and our masks take id 0 for
  padding. An import orders the embedding rows (and the logits bias) as [pad, eos, decoder start, unk, the rest in
  Marian's order] (`import_order`). Marian starts decoding with its pad token, so that row is there twice, as our
  PAD and as our BOS: the import sets `model.pad_is_bos`, which leaves PAD out of the softmax, so that the token
  counts once (as BOS) and every distribution is Marian's. An export keeps our ids (pad 0, eos 1, decoder start
  2), or for such a model writes the row once (`export_ids`), Marian's pad and decoder start both;
- LayerNorm epsilon: Marian's is torch's 1e-5, which an import sets (`model.layer_norm_epsilon`); a model trained
  with another epsilon exports with Marian's (named in the model card).
What Marian cannot hold (pre-LN, learned positions, d_k or d_v ≠ d_model/h, a decoder-only model) is refused in
one line (`check_exportable`); so is a MarianMT config option (`model_config`) or tensor (`from_state_dict`) that
our model cannot hold: nothing of a checkpoint is dropped.
"""

import numpy as np

from transformer_jax.config.model import ModelConfig
from transformer_jax.core.tokens import BOS_ID, EOS_ID, PAD_ID
from transformer_jax.model.transformer import sinusoidal_encoding

MARIAN_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which Marian's layers use
# How far a checkpoint's stored sinusoid table may be from ours (float32 angles, up to ~1e-4 at position 1000); a
# table that is not the sinusoids differs by far more.
SINUSOID_TOLERANCE = 1e-3
SINUSOIDAL_POSITIONS = 1024  # positions of an export whose model has no limit (CTranslate2's default input length)
ACTIVATIONS = {'relu': 'relu', 'gelu': 'gelu', 'swish': 'swish', 'silu': 'swish'}  # Marian's name: ours
# Our sublayers and their Marian names within a layer.
_ATTENTIONS = {'self_attention': 'self_attn', 'cross_attention': 'encoder_attn'}
_NORMS = {'self_attention_block': 'self_attn_layer_norm', 'cross_attention_block': 'encoder_attn_layer_norm',
          'ffn_block': 'final_layer_norm'}
_PROJECTIONS = {'query': 'q_proj', 'key': 'k_proj', 'value': 'v_proj'}

# config.json's keys. Those our `model` section takes (`model_config`):
_MAPPED = frozenset({
    'model_type', 'vocab_size', 'decoder_vocab_size', 'd_model', 'encoder_layers', 'decoder_layers',
    'encoder_ffn_dim', 'decoder_ffn_dim', 'encoder_attention_heads', 'decoder_attention_heads',
    'max_position_embeddings', 'activation_function', 'scale_embedding', 'dropout', 'attention_dropout',
    'activation_dropout', 'share_encoder_decoder_embeddings', 'tie_word_embeddings', 'pad_token_id', 'eos_token_id',
    'decoder_start_token_id', 'unk_token_id'})
# transformers' other names of mapped keys (MarianConfig.attribute_map): alias -> key.
_ALIASES = {'num_hidden_layers': 'encoder_layers', 'hidden_size': 'd_model',
            'num_attention_heads': 'encoder_attention_heads'}
# MarianConfig's defaults of the mapped keys: what transformers reads where config.json has no value.
_DEFAULTS = {
    'vocab_size': 58101, 'max_position_embeddings': 1024, 'encoder_layers': 12, 'encoder_ffn_dim': 4096,
    'encoder_attention_heads': 16, 'decoder_layers': 12, 'decoder_ffn_dim': 4096, 'decoder_attention_heads': 16,
    'activation_function': 'gelu', 'd_model': 1024, 'dropout': 0.1, 'attention_dropout': 0.0,
    'activation_dropout': 0.0, 'decoder_start_token_id': 58100, 'scale_embedding': False, 'pad_token_id': 58100,
    'eos_token_id': 0, 'share_encoder_decoder_embeddings': True, 'tie_word_embeddings': True}
# Options of earlier MarianMT (and BART-derived) configs with the one value transformers' MarianMT and our model
# compute; any other value is something else: key -> (that value, what another value would be).
_FIXED = {
    'normalize_before': (False, 'pre-LN layers'),
    'add_final_layer_norm': (False, 'a LayerNorm after each stack'),
    'normalize_embedding': (False, 'a LayerNorm on the embeddings'),
    'static_position_embeddings': (True, 'learned positions'),
    'add_bias_logits': (False, 'a logits bias option MarianMT does not define'),
    'do_blenderbot_90_layernorm': (False, "Blenderbot's LayerNorm placement"),
    'is_encoder_decoder': (True, 'not an encoder-decoder'),
    'is_decoder': (False, 'a decoder alone'),
    'tie_encoder_decoder': (False, 'encoder and decoder layers sharing weights'),
    'add_cross_attention': (False, 'a cross-attention option MarianMT does not define'),
    'encoder_layerdrop': (0, 'LayerDrop, which our training does not do'),
    'decoder_layerdrop': (0, 'LayerDrop, which our training does not do'),
    'pruned_heads': ({}, 'pruned attention heads'),
}
# Keys that describe the file or a head MarianMTModel has not, never what the model computes.
_BOOKKEEPING = frozenset({
    '_name_or_path', '_num_labels', '_commit_hash', 'architectures', 'transformers_version', 'torch_dtype', 'dtype',
    'id2label', 'label2id', 'num_labels', 'problem_type', 'finetuning_task', 'init_std', 'gradient_checkpointing',
    'use_cache', 'classif_dropout', 'classifier_dropout', 'output_attentions', 'output_hidden_states', 'return_dict',
    'torchscript', 'use_bfloat16', 'tf_legacy_loss', 'chunk_size_feed_forward', 'tokenizer_class', 'prefix',
    'task_specific_params', 'sep_token_id', 'bos_token_id', 'extra_pos_embeddings', 'cross_attention_hidden_size'})
# transformers' `generate` settings (config.json holds them in older checkpoints): how transformers decodes by
# default, not the model. Ours decode with the `decode` section; an import names the ones it does not carry.
GENERATION_KEYS = frozenset({
    'bad_words_ids', 'num_beams', 'num_beam_groups', 'max_length', 'min_length', 'max_new_tokens', 'min_new_tokens',
    'forced_eos_token_id', 'forced_bos_token_id', 'force_bos_token_to_be_generated', 'forced_decoder_ids',
    'length_penalty', 'early_stopping', 'no_repeat_ngram_size', 'encoder_no_repeat_ngram_size',
    'num_return_sequences', 'do_sample', 'temperature', 'top_k', 'top_p', 'typical_p', 'repetition_penalty',
    'diversity_penalty', 'remove_invalid_values', 'exponential_decay_length_penalty', 'suppress_tokens',
    'begin_suppress_tokens', 'output_scores', 'return_dict_in_generate', 'renormalize_logits', 'max_time'})


def check_exportable(cfg: ModelConfig) -> None:
  """Refuses, in one line that says what to do, a model MarianMT cannot hold."""
  if cfg.decoder_only:
    raise ValueError('MarianMT is an encoder-decoder, and this is a decoder-only language model; neither export '
                     'format holds one: export a translation model.')
  problems = []
  if cfg.norm != 'post':
    problems.append("pre-LN layers (model.norm='pre'; Marian's are post-LN)")
  if cfg.positional != 'sinusoidal':
    problems.append("learned positions (model.positional='learned'; Marian's are sinusoidal)")
  if cfg.head_dim_k * cfg.num_heads != cfg.d_model or cfg.head_dim_v * cfg.num_heads != cfg.d_model:
    problems.append(f'd_k={cfg.head_dim_k}, d_v={cfg.head_dim_v} (Marian\'s heads are d_model/h = '
                    f'{cfg.d_model / cfg.num_heads:g} wide)')
  if problems:
    raise ValueError(f'MarianMT cannot hold {"; ".join(problems)}: export a model trained without them, or use '
                     '--format=ctranslate2.')


def max_positions(cfg: ModelConfig) -> int:
  """Marian's `max_position_embeddings` for `cfg`: its own limit, else as many as CTranslate2 exports."""
  return cfg.max_positions or max(cfg.max_len, SINUSOIDAL_POSITIONS)


def export_ids(cfg: ModelConfig) -> list[int]:
  """Our id of each Marian id of an export: ours, less the PAD row of a `pad_is_bos` model (a copy of its BOS row,
  which is Marian's pad and decoder start token both)."""
  return list(range(cfg.first_output_id, cfg.vocab_size))


def export_special_ids(cfg: ModelConfig) -> dict[str, int]:
  """Marian's pad, eos and decoder start ids of an export (`export_ids`)."""
  first = cfg.first_output_id
  return {'pad': BOS_ID - first if cfg.pad_is_bos else PAD_ID, 'eos': EOS_ID - first, 'start': BOS_ID - first}


def export_pieces(cfg: ModelConfig, pieces: list[str]) -> list[str]:
  """The pieces of an export's Marian ids (`export_ids`): ours, the row that is Marian's pad named as our PAD."""
  out = [pieces[i] for i in export_ids(cfg)]
  out[export_special_ids(cfg)['pad']] = pieces[PAD_ID]
  return out


def marian_config(cfg: ModelConfig) -> dict:
  """The MarianConfig keywords of `cfg` (token ids: `export_special_ids`)."""
  ids, vocab_size = export_special_ids(cfg), len(export_ids(cfg))
  return dict(
      vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=cfg.d_model,
      encoder_layers=cfg.num_encoder_layers, decoder_layers=cfg.num_decoder_layers,
      encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, encoder_attention_heads=cfg.num_heads,
      decoder_attention_heads=cfg.num_heads, max_position_embeddings=max_positions(cfg),
      activation_function=cfg.activation, scale_embedding=cfg.scale_embeddings, dropout=cfg.dropout,
      attention_dropout=cfg.attention_dropout, activation_dropout=cfg.relu_dropout,
      share_encoder_decoder_embeddings=cfg.share_embeddings, tie_word_embeddings=cfg.share_embeddings,
      pad_token_id=ids['pad'], eos_token_id=ids['eos'], decoder_start_token_id=ids['start'],
      forced_eos_token_id=None, bos_token_id=None, architectures=['MarianMTModel'], model_type='marian')


def model_config(marian: dict, path: str, *, attention_bias: bool, logits_bias: bool, vocab_size: int,
                 pad_is_bos: bool) -> dict:
  """Our `model` section for a Marian config.json (`marian`, read from `path`); one line naming every option we
  cannot hold: an unknown key, a value of `_FIXED` other than the one we compute, an option we have not."""
  get = lambda key: setting(marian, key)
  problems = []
  if get('model_type') != 'marian':
    raise ValueError(f'{path} describes a {get("model_type")!r} model, not a MarianMT one: pass the directory of a '
                     'transformers MarianMT checkpoint (model_type "marian").')
  known = _MAPPED | set(_ALIASES) | set(_FIXED) | _BOOKKEEPING | GENERATION_KEYS
  problems += [f'{key}={get(key)!r} (an option our import does not know)' for key in sorted(set(marian) - known)]
  problems += [f'{key}={get(key)!r} ({what})' for key, (value, what) in _FIXED.items()
               if key in marian and get(key) != value]
  problems += [f'{alias}={get(alias)!r} != {key}={get(key)!r}' for alias, key in _ALIASES.items()
               if alias in marian and get(alias) != get(key)]
  for key in ('scale_embedding', 'share_encoder_decoder_embeddings', 'tie_word_embeddings'):
    if not isinstance(get(key), bool):
      problems.append(f'{key}={get(key)!r} (true or false)')
  activation = ACTIVATIONS.get(get('activation_function'))
  if activation is None:
    problems.append(f'activation_function={get("activation_function")!r} (supported: {sorted(ACTIVATIONS)})')
  for ours, theirs in (('d_ff', ('encoder_ffn_dim', 'decoder_ffn_dim')),
                       ('num_heads', ('encoder_attention_heads', 'decoder_attention_heads'))):
    if get(theirs[0]) != get(theirs[1]):
      problems.append(f'{theirs[0]}={get(theirs[0])} != {theirs[1]}={get(theirs[1])} (our model.{ours} serves both)')
  if get('decoder_vocab_size') not in (None, get('vocab_size')):
    problems.append(f'decoder_vocab_size={get("decoder_vocab_size")} != vocab_size={get("vocab_size")}')
  shared = get('share_encoder_decoder_embeddings')
  if shared != get('tie_word_embeddings'):
    problems.append(f'share_encoder_decoder_embeddings={shared} with tie_word_embeddings='
                    f'{get("tie_word_embeddings")} (we tie all three or none)')
  if get('d_model') % max(get('encoder_attention_heads'), 1):
    problems.append(f'd_model={get("d_model")} not divisible by encoder_attention_heads')
  if problems:
    raise ValueError(f'{path}: our model cannot hold {"; ".join(problems)}: convert a MarianMT checkpoint without '
                     'these options.')
  return dict(
      vocab_size=vocab_size, d_model=get('d_model'), d_ff=get('encoder_ffn_dim'),
      num_heads=get('encoder_attention_heads'),
      num_encoder_layers=get('encoder_layers'), num_decoder_layers=get('decoder_layers'),
      dropout=float(get('dropout')), attention_dropout=float(get('attention_dropout')),
      relu_dropout=float(get('activation_dropout')), positional='sinusoidal', sinusoids='split',
      max_positions=get('max_position_embeddings'), activation=activation, scale_embeddings=get('scale_embedding'),
      attention_bias=attention_bias, logits_bias=logits_bias,
      share_embeddings=shared, norm='post', layer_norm_epsilon=MARIAN_EPSILON, pad_is_bos=pad_is_bos)


def setting(marian: dict, key: str):
  """A Marian config.json's value of `key` (or of another name of it, `_ALIASES`), or MarianConfig's default (what
  transformers reads) where it has none."""
  if key in marian:
    return marian[key]
  aliases = [alias for alias, name in _ALIASES.items() if name == key and alias in marian]
  return marian[aliases[0]] if aliases else _DEFAULTS.get(key)


def generation_settings(marian: dict) -> dict:
  """The `generate` settings of a Marian config.json (`GENERATION_KEYS`) that are set."""
  return {key: value for key, value in sorted(marian.items()) if key in GENERATION_KEYS and value is not None}


def import_order(pad: int, eos: int, start: int, unk: int, size: int) -> list[int]:
  """Marian's id for each of our ids: our PAD, EOS, BOS, UNK rows are its pad, eos, decoder start and unk, then its
  other ids in order (the decoder start twice when it is the pad token, as in Marian: `model.pad_is_bos`)."""
  reserved = [pad, eos, start, unk]
  return reserved + [i for i in range(size) if i not in reserved]


def feature_permutation(cfg: ModelConfig) -> np.ndarray | None:
  """The order of d_model features that turns our interleaved sinusoids into Marian's split layout (even features,
  then odd ones); None when the model already has the split layout."""
  if cfg.sinusoids == 'split':
    return None
  return np.concatenate([np.arange(0, cfg.d_model, 2), np.arange(1, cfg.d_model, 2)])


def to_state_dict(cfg: ModelConfig, params) -> dict[str, np.ndarray]:
  """MarianMTModel's state dict (float32 numpy, Marian's names; tied weights once, as `model.shared.weight`) holding
  `params` (unrolled layers, numpy) of a model `cfg` that `check_exportable` accepts."""
  perm = feature_permutation(cfg)
  p = (lambda x, axis: x) if perm is None else (lambda x, axis: np.take(x, perm, axis=axis))
  d, rows = cfg.d_model, export_ids(cfg)
  out = {}
  if cfg.share_embeddings:
    out['model.shared.weight'] = p(params['shared_embedding']['embedding'][rows], 1)
  else:
    out['model.encoder.embed_tokens.weight'] = p(params['source_embedding']['embedding'][rows], 1)
    out['model.decoder.embed_tokens.weight'] = p(params['target_embedding']['embedding'][rows], 1)
    out['lm_head.weight'] = p(params['decoder']['logits']['kernel'][:, rows], 0).T
  out['final_logits_bias'] = (params['decoder']['logits_bias'] if cfg.logits_bias
                              else np.zeros(cfg.vocab_size, np.float32))[None, rows]
  for side, count in (('encoder', cfg.num_encoder_layers), ('decoder', cfg.num_decoder_layers)):
    for i in range(count):
      ours, theirs = params[side][f'layer_{i}'], f'model.{side}.layers.{i}'
      for name, marian_name in _ATTENTIONS.items():
        if name not in ours:
          continue
        attn, prefix = ours[name], f'{theirs}.{marian_name}'
        for part, proj in _PROJECTIONS.items():
          out[f'{prefix}.{proj}.weight'] = p(attn[part]['kernel'].reshape(d, d), 0).T
          out[f'{prefix}.{proj}.bias'] = (attn[part]['bias'].reshape(d) if cfg.attention_bias
                                          else np.zeros(d, np.float32))
        out[f'{prefix}.out_proj.weight'] = p(attn['out']['kernel'].reshape(d, d), 1).T
        out[f'{prefix}.out_proj.bias'] = p(attn['out']['bias'], 0) if cfg.attention_bias else np.zeros(d, np.float32)
      for name, marian_name in _NORMS.items():
        if name in ours:
          out[f'{theirs}.{marian_name}.weight'] = p(ours[name]['norm']['scale'], 0)
          out[f'{theirs}.{marian_name}.bias'] = p(ours[name]['norm']['bias'], 0)
      out[f'{theirs}.fc1.weight'] = p(ours['ffn']['wi']['kernel'], 0).T
      out[f'{theirs}.fc1.bias'] = ours['ffn']['wi']['bias']
      out[f'{theirs}.fc2.weight'] = p(ours['ffn']['wo']['kernel'], 1).T
      out[f'{theirs}.fc2.bias'] = p(ours['ffn']['wo']['bias'], 0)
  return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


class _Weights:
  """A Marian state dict read by name, each name read marked as used; a missing tensor is one line naming the
  file."""

  def __init__(self, tensors: dict, path: str):
    self._tensors, self._path, self.used = tensors, path, set()

  def __call__(self, *names: str) -> np.ndarray:
    for name in names:
      if name in self._tensors:
        self.used.add(name)
        return np.asarray(self._tensors[name], np.float32)
    raise ValueError(f'{self._path} has no tensor {names[0]}: it is not a MarianMT checkpoint of its config.json '
                     '(or it is incomplete); download it again.')

  def copies(self, names, original: np.ndarray, what: str, atol: float = 0.0) -> None:
    """The tensors of `names` that the checkpoint holds are `original` (within `atol`): what our model holds once
    or computes (tied embeddings, zero biases, Marian's sinusoid tables); one line naming the first that is not."""
    for name in names:
      if name in self._tensors:
        value = self(name)
        if value.shape != original.shape or not np.allclose(value, original, rtol=0, atol=atol):
          raise ValueError(f'{self._path}: {name} is not {what}, which is what our model of its config.json holds '
                           'or computes there: convert a checkpoint whose tensors match its config.json.')

  def check_all_used(self) -> None:
    """Every tensor of the checkpoint went into the params (or was a copy of one): one line naming the others."""
    unused = sorted(set(self._tensors) - self.used)
    if unused:
      more = f' and {len(unused) - 3} more' if len(unused) > 3 else ''
      raise ValueError(f'{self._path} holds tensors our model of its config.json has no place for: '
                       f'{", ".join(unused[:3])}{more}; convert a MarianMT checkpoint without them (they compute '
                       'something our model cannot).')


def has_attention_bias(tensors: dict) -> bool:
  """Whether any attention projection of a Marian state dict has a bias other than zero."""
  return any(np.any(np.asarray(v) != 0) for k, v in tensors.items()
             if k.endswith('_proj.bias') and ('self_attn.' in k or 'encoder_attn.' in k))


def has_logits_bias(tensors: dict) -> bool:
  return 'final_logits_bias' in tensors and bool(np.any(np.asarray(tensors['final_logits_bias']) != 0))


def from_state_dict(cfg: ModelConfig, tensors: dict, order: list[int], path: str) -> dict:
  """Our params (unrolled, numpy float32) of model `cfg` from a Marian state dict `tensors` (read from `path`),
  the vocabulary in `import_order`'s `order`. Every tensor goes into the params or is what they hold or compute
  (a tied copy, a zero bias of a model without biases, the sinusoid tables); any other is refused by name."""
  w = _Weights(tensors, path)
  d = cfg.d_model
  heads, head_dim = cfg.num_heads, cfg.head_dim_k
  params = {}
  tied = ('model.shared.weight', 'model.encoder.embed_tokens.weight', 'model.decoder.embed_tokens.weight',
          'lm_head.weight')
  if cfg.share_embeddings:
    embedding = w(*tied)
    w.copies(tied, embedding, 'model.shared.weight (the embeddings and output layer are tied)')
    params['shared_embedding'] = {'embedding': embedding[order]}
  else:
    params['source_embedding'] = {'embedding': w('model.encoder.embed_tokens.weight')[order]}
    params['target_embedding'] = {'embedding': w('model.decoder.embed_tokens.weight')[order]}
  decoder = {}
  if not cfg.share_embeddings:
    decoder['logits'] = {'kernel': w('lm_head.weight')[order].T}
  if cfg.logits_bias:
    decoder['logits_bias'] = w('final_logits_bias').reshape(-1)[order]
  else:
    w.copies(['final_logits_bias'], np.zeros((1, max(order) + 1), np.float32), 'zero')
  table = np.asarray(sinusoidal_encoding(np.arange(cfg.max_positions), d, 'split'))
  w.copies([f'model.{side}.embed_positions.weight' for side in ('encoder', 'decoder')], table,
           "Marian's sinusoid table", atol=SINUSOID_TOLERANCE)
  params['encoder'], params['decoder'] = {}, decoder
  for side, count in (('encoder', cfg.num_encoder_layers), ('decoder', cfg.num_decoder_layers)):
    for i in range(count):
      theirs, layer = f'model.{side}.layers.{i}', {}
      for name, marian_name in _ATTENTIONS.items():
        if side == 'encoder' and name == 'cross_attention':
          continue
        prefix, attn = f'{theirs}.{marian_name}', {}
        for part, proj in {**_PROJECTIONS, 'out': 'out_proj'}.items():
          kernel = w(f'{prefix}.{proj}.weight').T
          attn[part] = {'kernel': kernel.reshape(heads, head_dim, d) if part == 'out'
                        else kernel.reshape(d, heads, head_dim)}
          if cfg.attention_bias:
            bias = w(f'{prefix}.{proj}.bias')
            attn[part]['bias'] = bias if part == 'out' else bias.reshape(heads, head_dim)
          else:
            w.copies([f'{prefix}.{proj}.bias'], np.zeros(d, np.float32), 'zero')
        layer[name] = attn
      for name, marian_name in _NORMS.items():
        if side == 'encoder' and name == 'cross_attention_block':
          continue
        norm = f'{theirs}.{marian_name}'
        layer[name] = {'norm': {'scale': w(f'{norm}.weight'), 'bias': w(f'{norm}.bias')}}
      layer['ffn'] = {'wi': {'kernel': w(f'{theirs}.fc1.weight').T, 'bias': w(f'{theirs}.fc1.bias')},
                      'wo': {'kernel': w(f'{theirs}.fc2.weight').T, 'bias': w(f'{theirs}.fc2.bias')}}
      params[side][f'layer_{i}'] = layer
  w.check_all_used()
  return params
