"""The `decode` section: how translations and a language model's continuations are generated
(`transformer_jax.inference.generation`)."""

import ml_collections

# Keys only one kind of model reads: translation's beam search, a language model's sampling; key -> its conditions,
# each (the dotted key that chooses, the choices that read it); `config.MODE_KEYS`.
MODE_KEYS = {
    **{key: (('model.architecture', ('encoder_decoder',)),) for key in ('beam_size', 'alpha', 'max_len_offset')},
    **{key: (('model.architecture', ('decoder_only',)),)
       for key in ('max_new_tokens', 'temperature', 'top_k', 'top_p')},
}


def default_config() -> ml_collections.ConfigDict:
  """The paper's beam search (§6.1); sampling settings of a language model's samples."""
  return ml_collections.ConfigDict({
      'beam_size': 4,
      'alpha': 0.6,  # length penalty ((5 + length) / 6) ** alpha
      'max_len_offset': 50,  # max output length = input length + this (§6.1)
      'batch_size': 64,  # sentences decoded at once (global)
      'max_new_tokens': 40,  # decoder-only: tokens generated after a prompt
      'temperature': 1.0,  # decoder-only sampling; 0 = greedy
      'top_k': 0,  # decoder-only sampling from the k most likely tokens (0 = all)
      'top_p': 1.0,  # decoder-only nucleus sampling (1.0 = off)
  })


def validate(decode: ml_collections.ConfigDict) -> None:
  for key, low in (('beam_size', 1), ('max_len_offset', 0), ('batch_size', 1), ('max_new_tokens', 1),
                   ('temperature', 0), ('top_k', 0)):
    if decode[key] < low:
      raise ValueError(f'decode.{key} must be >= {low}, got {decode[key]}.')
  if decode.alpha < 0:
    raise ValueError(f'decode.alpha must be >= 0 (beam search stops early only then), got {decode.alpha}.')
  if not 0.0 < decode.top_p <= 1.0:
    raise ValueError(f'decode.top_p must be in (0, 1] (1.0 = off), got {decode.top_p}.')
