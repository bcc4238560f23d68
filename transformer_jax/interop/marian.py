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
  Marian's order] (`import_order`): Marian starts decoding with its pad token, so that row is there twice, as our
  PAD and as our BOS. An export keeps our ids: pad 0, eos 1, decoder start 2;
- LayerNorm epsilon: Marian's is torch's 1e-5, which an import sets (`model.layer_norm_epsilon`); a model trained
  with another epsilon exports with Marian's (named in the model card).
What Marian cannot hold (pre-LN, learned positions, d_k or d_v ≠ d_model/h, a decoder-only model) is refused in
one line (`check_exportable`).
"""

import numpy as np

from transformer_jax.config.model import ModelConfig
from transformer_jax.core.tokens import BOS_ID, EOS_ID, PAD_ID

MARIAN_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which Marian's layers use
SINUSOIDAL_POSITIONS = 1024  # positions of an export whose model has no limit (CTranslate2's default input length)
ACTIVATIONS = {'relu': 'relu', 'gelu': 'gelu', 'swish': 'swish', 'silu': 'swish'}  # Marian's name: ours
# Our sublayers and their Marian names within a layer.
_ATTENTIONS = {'self_attention': 'self_attn', 'cross_attention': 'encoder_attn'}
_NORMS = {'self_attention_block': 'self_attn_layer_norm', 'cross_attention_block': 'encoder_attn_layer_norm',
          'ffn_block': 'final_layer_norm'}
_PROJECTIONS = {'query': 'q_proj', 'key': 'k_proj', 'value': 'v_proj'}


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


def marian_config(cfg: ModelConfig) -> dict:
  """The MarianConfig keywords of `cfg` (token ids are ours: pad 0, eos 1, decoder start = BOS 2)."""
  return dict(
      vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.vocab_size, d_model=cfg.d_model,
      encoder_layers=cfg.num_encoder_layers, decoder_layers=cfg.num_decoder_layers,
      encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, encoder_attention_heads=cfg.num_heads,
      decoder_attention_heads=cfg.num_heads, max_position_embeddings=max_positions(cfg),
      activation_function=cfg.activation, scale_embedding=cfg.scale_embeddings, dropout=cfg.dropout,
      attention_dropout=cfg.attention_dropout, activation_dropout=cfg.relu_dropout,
      share_encoder_decoder_embeddings=cfg.share_embeddings, tie_word_embeddings=cfg.share_embeddings,
      pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID, forced_eos_token_id=None,
      bos_token_id=None, architectures=['MarianMTModel'], model_type='marian')


def model_config(marian: dict, path: str, *, attention_bias: bool, logits_bias: bool, vocab_size: int) -> dict:
  """Our `model` section for a Marian config.json (`marian`, read from `path`); one line for what we cannot hold."""

  def get(key, default=None):
    return marian.get(key, default)

  problems = []
  if get('model_type') != 'marian':
    raise ValueError(f'{path} describes a {get("model_type")!r} model, not a MarianMT one: pass the directory of a '
                     'transformers MarianMT checkpoint (model_type "marian").')
  activation = ACTIVATIONS.get(get('activation_function', 'gelu'))
  if activation is None:
    problems.append(f'activation_function={get("activation_function")!r} (supported: {sorted(ACTIVATIONS)})')
  for ours, theirs in (('d_ff', ('encoder_ffn_dim', 'decoder_ffn_dim')),
                       ('num_heads', ('encoder_attention_heads', 'decoder_attention_heads'))):
    if get(theirs[0]) != get(theirs[1]):
      problems.append(f'{theirs[0]}={get(theirs[0])} != {theirs[1]}={get(theirs[1])} (our model.{ours} serves both)')
  if get('decoder_vocab_size') not in (None, get('vocab_size')):
    problems.append(f'decoder_vocab_size={get("decoder_vocab_size")} != vocab_size={get("vocab_size")}')
  shared = get('share_encoder_decoder_embeddings', True)
  if shared != get('tie_word_embeddings', True):
    problems.append(f'share_encoder_decoder_embeddings={shared} with tie_word_embeddings='
                    f'{get("tie_word_embeddings", True)} (we tie all three or none)')
  for key in ('encoder_layerdrop', 'decoder_layerdrop'):
    if get(key, 0):
      problems.append(f'{key}={get(key)}')
  if get('d_model', 0) % max(get('encoder_attention_heads', 1), 1):
    problems.append(f'd_model={get("d_model")} not divisible by encoder_attention_heads')
  if problems:
    raise ValueError(f'{path}: our model cannot hold {"; ".join(problems)}: convert a MarianMT checkpoint without '
                     'these options.')
  return dict(
      vocab_size=vocab_size, d_model=get('d_model'), d_ff=get('encoder_ffn_dim'),
      num_heads=get('encoder_attention_heads'),
      num_encoder_layers=get('encoder_layers'), num_decoder_layers=get('decoder_layers'),
      dropout=float(get('dropout', 0.1)), attention_dropout=float(get('attention_dropout', 0.0)),
      relu_dropout=float(get('activation_dropout', 0.0)), positional='sinusoidal', sinusoids='split',
      max_positions=get('max_position_embeddings'), activation=activation,
      scale_embeddings=bool(get('scale_embedding', False)), attention_bias=attention_bias, logits_bias=logits_bias,
      share_embeddings=bool(shared), norm='post', layer_norm_epsilon=MARIAN_EPSILON)


def import_order(pad: int, eos: int, start: int, unk: int, size: int) -> list[int]:
  """Marian's id for each of our ids: our PAD, EOS, BOS, UNK rows are its pad, eos, decoder start and unk, then its
  other ids in order (the decoder start twice when it is the pad token, as in Marian)."""
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
  d = cfg.d_model
  out = {}
  if cfg.share_embeddings:
    out['model.shared.weight'] = p(params['shared_embedding']['embedding'], 1)
  else:
    out['model.encoder.embed_tokens.weight'] = p(params['source_embedding']['embedding'], 1)
    out['model.decoder.embed_tokens.weight'] = p(params['target_embedding']['embedding'], 1)
    out['lm_head.weight'] = p(params['decoder']['logits']['kernel'], 0).T
  out['final_logits_bias'] = (params['decoder']['logits_bias'] if cfg.logits_bias
                              else np.zeros(cfg.vocab_size, np.float32))[None]
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
  """A Marian state dict read by name; a missing tensor is one line naming the file."""

  def __init__(self, tensors: dict, path: str):
    self._tensors, self._path = tensors, path

  def __call__(self, *names: str) -> np.ndarray:
    for name in names:
      if name in self._tensors:
        return np.asarray(self._tensors[name], np.float32)
    raise ValueError(f'{self._path} has no tensor {names[0]}: it is not a MarianMT checkpoint of its config.json '
                     '(or it is incomplete); download it again.')


def has_attention_bias(tensors: dict) -> bool:
  """Whether any attention projection of a Marian state dict has a bias other than zero."""
  return any(np.any(np.asarray(v) != 0) for k, v in tensors.items()
             if k.endswith('_proj.bias') and ('self_attn.' in k or 'encoder_attn.' in k))


def has_logits_bias(tensors: dict) -> bool:
  return 'final_logits_bias' in tensors and bool(np.any(np.asarray(tensors['final_logits_bias']) != 0))


def from_state_dict(cfg: ModelConfig, tensors: dict, order: list[int], path: str) -> dict:
  """Our params (unrolled, numpy float32) of model `cfg` from a Marian state dict `tensors` (read from `path`),
  the vocabulary in `import_order`'s `order`."""
  w = _Weights(tensors, path)
  d = cfg.d_model
  heads, head_dim = cfg.num_heads, cfg.head_dim_k
  params = {}
  shared_names = ('model.shared.weight', 'model.encoder.embed_tokens.weight', 'model.decoder.embed_tokens.weight')
  if cfg.share_embeddings:
    params['shared_embedding'] = {'embedding': w(*shared_names)[order]}
  else:
    params['source_embedding'] = {'embedding': w('model.encoder.embed_tokens.weight')[order]}
    params['target_embedding'] = {'embedding': w('model.decoder.embed_tokens.weight')[order]}
  decoder = {}
  if not cfg.share_embeddings:
    decoder['logits'] = {'kernel': w('lm_head.weight')[order].T}
  if cfg.logits_bias:
    decoder['logits_bias'] = w('final_logits_bias').reshape(-1)[order]
  params['encoder'], params['decoder'] = {}, decoder
  for side, count in (('encoder', cfg.num_encoder_layers), ('decoder', cfg.num_decoder_layers)):
    for i in range(count):
      theirs, layer = f'model.{side}.layers.{i}', {}
      for name, marian_name in _ATTENTIONS.items():
        if side == 'encoder' and name == 'cross_attention':
          continue
        prefix, attn = f'{theirs}.{marian_name}', {}
        for part, proj in _PROJECTIONS.items():
          attn[part] = {'kernel': w(f'{prefix}.{proj}.weight').T.reshape(d, heads, head_dim)}
          if cfg.attention_bias:
            attn[part]['bias'] = w(f'{prefix}.{proj}.bias').reshape(heads, head_dim)
        attn['out'] = {'kernel': w(f'{prefix}.out_proj.weight').T.reshape(heads, head_dim, d)}
        if cfg.attention_bias:
          attn['out']['bias'] = w(f'{prefix}.out_proj.bias')
        layer[name] = attn
      for name, marian_name in _NORMS.items():
        if side == 'encoder' and name == 'cross_attention_block':
          continue
        norm = f'{theirs}.{marian_name}'
        layer[name] = {'norm': {'scale': w(f'{norm}.weight'), 'bias': w(f'{norm}.bias')}}
      layer['ffn'] = {'wi': {'kernel': w(f'{theirs}.fc1.weight').T, 'bias': w(f'{theirs}.fc1.bias')},
                      'wo': {'kernel': w(f'{theirs}.fc2.weight').T, 'bias': w(f'{theirs}.fc2.bias')}}
      params[side][f'layer_{i}'] = layer
  return params
