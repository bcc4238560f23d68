"""Trains a Transformer: python train.py --config=configs/default.py --workdir=DIR [--config.key=value ...]."""

import os
import sys

from absl import app
from absl import flags

from transformer_jax import distributed
from transformer_jax.config_defaults import define_config_flag, parse_flags  # one-line errors for bad configs

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'default.py')
define_config_flag(_DEFAULT_CONFIG, 'Experiment config file (configs/*.py[:variant]).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints, logs and the tokenizer go.', required=True)
distributed.define_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; settings go in --config.key=value.')
  distributed.initialize_from_flags()
  from transformer_jax import config_defaults, evaluation, metric_writer, trainer  # after distributed init
  metric_writer.quiet_library_logs()
  config = flags.FLAGS.config
  try:
    config_defaults.validate(config)
  except (ValueError, OSError) as e:  # one line naming the keys (or the missing file), not a traceback
    sys.exit(f'train.py: invalid config: {" ".join(str(e).split())}')
  result = trainer.train_and_evaluate(config, _WORKDIR.value)
  if result['metrics'].get('step') == config.train.num_steps:
    evaluation.final_report(config, _WORKDIR.value)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
