"""Evaluates a trained model: python eval.py --config=… --workdir=DIR [--step=N | --average_last=K] [--split=test].

Restores onto however many devices this machine has, translates the split with beam search (settings from
--config.decode.*), prints BLEU (sacrebleu and the paper's tokenized BLEU) and writes results and translations
into the workdir.
"""

import os

from absl import app
from absl import flags

from transformer_jax import config_cli
from transformer_jax import distributed

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'default.py')
config_cli.define_config_flag(_DEFAULT_CONFIG, 'The config the model was trained with (+ overrides).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'The training run\'s workdir.', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step to evaluate (default: the latest).')
_AVERAGE_LAST = flags.DEFINE_integer('average_last', None, 'Average the params of the last K checkpoints (§6.1).')
_SAVE_AVERAGED = flags.DEFINE_bool('save_averaged', False, 'Also save the averaged params as a checkpoint.')
_SPLIT = flags.DEFINE_string('split', None, 'Split to evaluate (default: config.eval.test_split).')
distributed.define_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}.')
  if _STEP.value is not None and _AVERAGE_LAST.value:
    raise app.UsageError('pass either --step or --average_last, not both.')
  distributed.initialize_from_flags()
  from transformer_jax import config_defaults, evaluation, metric_writer, trainer  # after distributed init
  metric_writer.quiet_library_logs()
  config = flags.FLAGS.config
  with config_cli.exit_on_user_error(ValueError, OSError):
    config_defaults.validate(config)
    evaluation.check_same_model(config, trainer.load_saved_config(_WORKDIR.value))
    restored = evaluation.restore(config, _WORKDIR.value, step=_STEP.value, average_last=_AVERAGE_LAST.value)
    if _SAVE_AVERAGED.value:
      print(f'saved averaged params to {evaluation.save_averaged(restored, _WORKDIR.value)}')
    results = evaluation.evaluate_split(restored, _WORKDIR.value, _SPLIT.value or config.eval.test_split)
  print(evaluation.describe(results, config.eval.num_samples))


if __name__ == '__main__':
  app.run(main, flags_parser=config_cli.parse_flags)
