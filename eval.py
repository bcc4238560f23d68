"""Evaluates a trained model: python eval.py --workdir=DIR [--step=N | --average_last=K] [--split=test]
[--config.decode.beam_size=8 ...].

The run's config comes from WORKDIR/config.json; --config.KEY=VALUE overrides only what evaluation may change
(decoding, evaluation and data settings, the model's runtime choices: `config.EVALUATION_KEYS`). Restores onto
however many devices this machine has, translates the split, prints BLEU (sacrebleu and the paper's tokenized
BLEU) and writes results and translations into the workdir.
"""

import sys

from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax import distributed

_CONFIG = cli.define_config_overrides_flag(config_lib.base_config(),
                                           'Overrides of the run\'s saved config: --config.KEY=VALUE.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'The training run\'s workdir.', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step to evaluate (default: the latest).', lower_bound=0)
_AVERAGE_LAST = flags.DEFINE_integer('average_last', None, 'Average the params of the last K checkpoints (§6.1).',
                                     lower_bound=1)
_SAVE_AVERAGED = flags.DEFINE_bool('save_averaged', False, 'Also save the averaged params as a checkpoint.')
_SPLIT = flags.DEFINE_string('split', None, 'Split to evaluate (default: the config\'s eval.test_split).')
distributed.define_flags()
flags.register_validator('step', lambda step: step is None or _AVERAGE_LAST.value is None,
                         message='pass either --step or --average_last, not both.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}.')
  distributed.initialize_from_flags()
  from transformer_jax import inference, scoring  # pylint: disable=import-outside-toplevel
  overrides = cli.overrides()
  split = _SPLIT.value or overrides.get('eval.test_split') or config_lib.of_run(_WORKDIR.value).eval.test_split
  config = config_lib.for_evaluation(_WORKDIR.value, overrides, split)
  restored = inference.restore(config, _WORKDIR.value, step=_STEP.value, average_last=_AVERAGE_LAST.value)
  if _SAVE_AVERAGED.value:
    print(f'saved averaged params to {inference.save_averaged(restored, _WORKDIR.value)}')
  results = scoring.evaluate_split(restored, _WORKDIR.value, split)
  print(scoring.describe(results, config.eval.num_samples))


def _refuse_config_file(argv):
  """eval.py takes no config file any more: the run's own config.json is the config."""
  if any(arg == '--config' or arg.startswith('--config=') for arg in argv[1:]):
    sys.exit('FATAL Flags parsing error: eval.py reads the run\'s config from WORKDIR/config.json: drop --config=FILE '
             'and pass only --config.KEY=VALUE overrides.')


if __name__ == '__main__':
  _refuse_config_file(sys.argv)
  cli.run(main)
