"""Translating with an exported model (`translate --engine=ctranslate2`): CTranslate2's Translator over the export
alone (its spm.model and the run's settings in transformer_jax.json), lines handled as the jax engine handles them.
"""

import collections
import os

import ctranslate2

from transformer_jax.config.model import ModelConfig
from transformer_jax.core import files
from transformer_jax.core.errors import one_line
from transformer_jax.data import text_input
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.interop import ctranslate2 as export


def translate_lines(model_dir: str, lines: list[str], *, beam_size: int | None = None, batch_size: int = 32,
                    truncate: bool = False) -> list[str]:
  """Translations of `lines` in order (empty lines give empty outputs) by the export in `model_dir`, with the run's
  beam size (unless `beam_size`), alpha as CT2's length_penalty, and the same input and output length limits as
  `generation.translate_lines` (output: each line's input tokens + max_len_offset: CT2 takes one limit a call, so
  the lines go in batches of one input length)."""
  settings_file = os.path.join(model_dir, export.SETTINGS_FILE)
  if not os.path.isfile(settings_file):
    raise FileNotFoundError(f'{model_dir} holds no {export.SETTINGS_FILE}: pass --model=DIR written by '
                            'python -m transformer_jax.export.')
  settings = files.read_json(settings_file, 'export\'s settings file')
  model, decode = ModelConfig.from_dict(settings['model']), settings['decode']
  tok = tokenizer_lib.load_tokenizer(os.path.join(model_dir, export.SPM_FILE))
  try:
    translator = ctranslate2.Translator(model_dir, device='auto')
  except (RuntimeError, ValueError) as e:  # CTranslate2 reports a truncated or damaged file of the export so
    raise ValueError(f'{model_dir} does not load as a CTranslate2 model ({one_line(e)}): a file of the export is '
                     'damaged; export it again with python -m transformer_jax.export.') from None

  def translate(kept: list[str], numbers: list[int]) -> list[str]:
    encoded = text_input.encode_lines(kept, tok, model.max_len, truncate, numbers=numbers)
    by_length = collections.defaultdict(list)
    for index, ids in enumerate(encoded):
      by_length[len(ids)].append(index)
    out = [''] * len(encoded)
    for length, indices in by_length.items():
      for start in range(0, len(indices), batch_size):
        batch = indices[start:start + batch_size]
        results = translator.translate_batch(
            [[tok.id_to_piece(i) for i in encoded[index][:-1]] for index in batch],  # CT2 appends the EOS itself
            beam_size=beam_size or decode['beam_size'], length_penalty=decode['alpha'], min_decoding_length=0,
            max_decoding_length=model.decode_length(length, decode['max_len_offset']), max_input_length=0)
        for index, result in zip(batch, results):
          out[index] = tok.decode([tok.piece_to_id(piece) for piece in result.hypotheses[0]])
    return out

  return text_input.translate_nonblank(lines, translate)
