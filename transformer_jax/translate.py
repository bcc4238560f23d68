"""Translates text with a trained model: python -m transformer_jax.translate --workdir=DIR < in.txt > out.txt

One sentence per input line, one translation per output line, in order. Empty lines come back empty.
A line longer than the model's max length is an error unless --truncate is given.
"""

import sys

from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax import files
from transformer_jax import inference

_WORKDIR = flags.DEFINE_string('workdir', None, 'The training run\'s workdir.', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).', lower_bound=0)
_AVERAGE_LAST = flags.DEFINE_integer('average_last', None, 'Average the last K checkpoints.', lower_bound=1)
_BEAM = flags.DEFINE_integer('beam_size', None, 'Beam size (default: the config\'s decode.beam_size).',
                             lower_bound=1)
_METHOD = flags.DEFINE_enum('method', 'beam', ['beam', 'greedy'], 'Decoding method.')
_TRUNCATE = flags.DEFINE_bool('truncate', False, 'Cut inputs longer than the model\'s max length instead of failing.')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Sentences translated at once.', lower_bound=1)
flags.register_validator('step', lambda step: step is None or _AVERAGE_LAST.value is None,
                         message='pass either --step or --average_last, not both.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; text comes on standard input.')
  config = config_lib.of_run(_WORKDIR.value)
  restored = inference.restore(config, _WORKDIR.value, step=_STEP.value, average_last=_AVERAGE_LAST.value)
  lines = files.text_lines(sys.stdin.buffer.read(), 'standard input')  # line i in, translation i out
  translations = inference.translate_lines(restored, lines, method=_METHOD.value, beam_size=_BEAM.value,
                                           batch_size=_BATCH.value, truncate=_TRUNCATE.value)
  sys.stdout.write(''.join(t + '\n' for t in translations))


if __name__ == '__main__':
  cli.run(main)
