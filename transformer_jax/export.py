"""Exports a trained model: python -m transformer_jax.export --workdir=DIR [--step=N | --average_last=K]
--format=ctranslate2|transformers --out=DIR [--quantization=int8|int8_float16|float16]

ctranslate2: a CTranslate2 model directory (`export_ctranslate2`) holding the SentencePiece model and the run's
decode settings, for `python -m transformer_jax.translate --engine=ctranslate2 --model=DIR` or
`ctranslate2.Translator`. transformers: a MarianMT directory (`hf.write`) with its tokenizer and a model card, for
`MarianMTModel.from_pretrained(DIR)` and `MarianTokenizer.from_pretrained(DIR)` (translate with `model.generate`).
What the format cannot represent is refused in one line before anything is restored.
"""

import flax.linen as nn
import jax
import numpy as np
from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax.config.model import ModelConfig
from transformer_jax.core import files
from transformer_jax.inference import restoring
from transformer_jax.interop import card
from transformer_jax.interop import ctranslate2 as export
from transformer_jax.interop import hf
from transformer_jax.interop import marian

_CHECKPOINTS = cli.CheckpointFlags()
_FORMAT = flags.DEFINE_enum('format', 'ctranslate2', ['ctranslate2', 'transformers'],
                            'ctranslate2 (serving) or transformers (a MarianMT directory for MarianMTModel and '
                            'MarianTokenizer.from_pretrained, and the Hub).')
_OUT = flags.DEFINE_string('out', None, 'The model directory to write (new or empty).', required=True)
_QUANTIZATION = flags.DEFINE_enum('quantization', None, [q for q in export.QUANTIZATIONS if q],
                                  'Weight type (default: float32, as trained).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}.')
  runs = _CHECKPOINTS.runs()
  if len(runs) > 1:
    raise ValueError('an export holds one model, not an ensemble: pass one --workdir and at most one --step.')
  (workdir, step), = runs
  config = config_lib.of_run(workdir)
  config.model.scan_layers = False  # the export reads layer by layer: a scanned run's params are converted
  model_config = ModelConfig.from_dict(config.model)
  if _FORMAT.value == 'transformers':
    if _QUANTIZATION.value:
      raise ValueError('--quantization applies to --format=ctranslate2; a transformers export holds float32 weights.')
    marian.check_exportable(model_config)
    files.check_new_directory(_OUT.value)
  else:
    export.check_exportable(model_config, _QUANTIZATION.value, _OUT.value)
  restored = restoring.restore(config, workdir, step=step, average_last=_CHECKPOINTS.average_last)
  if _FORMAT.value == 'transformers':
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(nn.unbox(restored.params)))
    out = hf.write(restored.model.config, params, restored.tokenizer, _OUT.value, decode=config.decode,
                   card=card.model_card(config, workdir, restored.steps,
                                         restoring.final_model_steps(config, workdir)))
  else:
    out = export.export_ctranslate2(restored.model.config, restored.params, restored.tokenizer, _OUT.value,
                                    _QUANTIZATION.value, decode=config.decode)
  print(f'wrote the {_FORMAT.value} model to {out}: {restored.description}')


if __name__ == '__main__':
  cli.run(main)
