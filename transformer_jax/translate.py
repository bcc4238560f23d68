"""Translates text: python -m transformer_jax.translate --workdir=DIR [--workdir=DIR2 ... | --step=N ...]
< in.txt > out.txt, or with an export: python -m transformer_jax.translate --engine=ctranslate2 --model=DIR

One sentence per input line, one translation per output line, in order. An empty (or blank) line comes back empty:
there is nothing to translate (generate, by contrast, continues an empty prompt: a document from its start).
A line longer than the model's max length is an error unless --truncate is given. Several --workdir (or --step)
translate with an ensemble of those models.
"""

import sys

from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax.config.model import ModelConfig
from transformer_jax.data import text_input
from transformer_jax.inference import generation
from transformer_jax.inference import restoring

_CHECKPOINTS = cli.CheckpointFlags(workdir_required=False)
_ENGINE = flags.DEFINE_enum('engine', 'jax', ['jax', 'ctranslate2'],
                            'jax: the run\'s checkpoints (--workdir); ctranslate2: an export (--model).')
_MODEL = flags.DEFINE_string('model', None, 'With --engine=ctranslate2: the directory python -m '
                             'transformer_jax.export wrote.')
_BEAM = flags.DEFINE_integer('beam_size', None, 'Beam size (default: the config\'s decode.beam_size).',
                             lower_bound=1)
_METHOD = flags.DEFINE_enum('method', 'beam', ['beam', 'greedy'], 'Decoding method.')
_TRUNCATE = flags.DEFINE_bool('truncate', False, 'Cut inputs longer than the model\'s max length instead of failing.')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Sentences translated at once.', lower_bound=1)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; text comes on standard input.')
  if _METHOD.value == 'greedy' and _BEAM.value is not None:
    raise ValueError('--beam_size is for --method=beam; greedy search keeps one hypothesis: drop one of them.')
  translate = _ctranslate2_engine() if _ENGINE.value == 'ctranslate2' else _jax_engine()  # checks the flags
  lines = text_input.read_stdin()  # line i in, translation i out
  sys.stdout.write(''.join(t + '\n' for t in translate(lines)))


def _jax_engine():
  """Translation with the run's checkpoints (one model or an ensemble), restored once there is input."""
  if _MODEL.value or not _CHECKPOINTS.given:
    raise ValueError('--engine=jax translates with a run\'s checkpoints: pass --workdir=DIR (and no --model, which '
                     'is an export for --engine=ctranslate2).')
  runs = [(config_lib.of_run(workdir), workdir, step) for workdir, step in _CHECKPOINTS.runs()]
  for config, workdir, _ in runs:
    generation.check_translation_model(ModelConfig.from_dict(config.model), workdir)

  def translate(lines):
    restored = restoring.restore_ensemble(runs, average_last=_CHECKPOINTS.average_last)
    return generation.translate_lines(restored, lines, method=_METHOD.value, beam_size=_BEAM.value,
                                     batch_size=_BATCH.value, truncate=_TRUNCATE.value)

  return translate


def _ctranslate2_engine():
  """Translation with an export."""
  if not _MODEL.value or _CHECKPOINTS.given:
    raise ValueError('--engine=ctranslate2 translates with an export: pass --model=DIR written by python -m '
                     'transformer_jax.export (and no --workdir, --step or --average_last).')
  from transformer_jax.interop import serving  # pylint: disable=import-outside-toplevel  # loads CTranslate2
  beam_size = 1 if _METHOD.value == 'greedy' else _BEAM.value  # CTranslate2's greedy search
  return lambda lines: serving.translate_lines(_MODEL.value, lines, beam_size=beam_size, batch_size=_BATCH.value,
                                               truncate=_TRUNCATE.value)


if __name__ == '__main__':
  cli.run(main)
