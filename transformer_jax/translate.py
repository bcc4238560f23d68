"""Translates text: python -m transformer_jax.translate --workdir=DIR [--workdir=DIR2 ... | --step=N ...]
< in.txt > out.txt

One sentence per input line, one translation per output line, in order. Empty lines come back empty.
A line longer than the model's max length is an error unless --truncate is given. Several --workdir (or --step)
translate with an ensemble of those models.
"""

import sys

from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax import files
from transformer_jax import inference
from transformer_jax import reporting

_CHECKPOINTS = cli.CheckpointFlags()
_BEAM = flags.DEFINE_integer('beam_size', None, 'Beam size (default: the config\'s decode.beam_size).',
                             lower_bound=1)
_METHOD = flags.DEFINE_enum('method', 'beam', ['beam', 'greedy'], 'Decoding method.')
_TRUNCATE = flags.DEFINE_bool('truncate', False, 'Cut inputs longer than the model\'s max length instead of failing.')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Sentences translated at once.', lower_bound=1)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; text comes on standard input.')
  reporting.quiet_library_logs()
  lines = files.text_lines(sys.stdin.buffer.read(), 'standard input')  # line i in, translation i out
  restored = inference.restore_ensemble([(config_lib.of_run(workdir), workdir, step)
                                         for workdir, step in _CHECKPOINTS.runs()],
                                        average_last=_CHECKPOINTS.average_last)
  translations = inference.translate_lines(restored, lines, method=_METHOD.value, beam_size=_BEAM.value,
                                           batch_size=_BATCH.value, truncate=_TRUNCATE.value)
  sys.stdout.write(''.join(t + '\n' for t in translations))


if __name__ == '__main__':
  cli.run(main)
