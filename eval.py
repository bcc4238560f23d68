"""Evaluates a trained model or an ensemble: python eval.py --workdir=DIR [--workdir=DIR2 ...]
[--step=N ... | --average_last=K] [--split=test] [--compare_to=BASELINE] [--config.decode.beam_size=8 ...].

The run's config comes from WORKDIR/config.json; --config.KEY=VALUE overrides only what evaluation may change
(decoding, evaluation and data settings, the model's runtime choices: `config.EVALUATION_KEYS`). Restores onto
however many devices this machine has, translates the split, prints BLEU (sacrebleu and the paper's tokenized
BLEU), chrF and chrF++, and with --compare_to the paired test against a baseline, and writes results and
translations into the (first) workdir.
"""

import sys

from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax.evaluation import significance
from transformer_jax.runtime import distributed

_CONFIG = cli.define_config_overrides_flag(config_lib.base_config(),
                                           'Overrides of the run\'s saved config: --config.KEY=VALUE.')
_CHECKPOINTS = cli.CheckpointFlags()
_SAVE_AVERAGED = flags.DEFINE_bool('save_averaged', False, 'Also save the (averaged) params as a workdir of their '
                                   'own, WORKDIR/averaged/average<K>_step<N>, which every tool reads as a run.')
_SPLIT = flags.DEFINE_string('split', None, 'Split to evaluate (default: the config\'s eval.test_split).')
_COMPARE_TO = flags.DEFINE_string('compare_to', None, 'A baseline on the same split: its results.json (written by '
                                  'eval.py) or hypotheses file; prints the paired test against it.')
_COMPARE_METHOD = flags.DEFINE_enum('compare_method', 'bs', list(significance.METHODS),
                                    'bs: paired bootstrap resampling; ar: paired approximate randomisation.')
_COMPARE_SAMPLES = flags.DEFINE_integer('compare_samples', None, 'Resamples (bs) or trials (ar); default '
                                        f'sacrebleu\'s: {significance.DEFAULT_SAMPLES}.', lower_bound=1)
_COMPARE_SEED = flags.DEFINE_integer('compare_seed', significance.DEFAULT_SEED, 'Seed of the paired test.',
                                     lower_bound=1)
distributed.define_flags()
flags.register_multi_flags_validator(
    ['compare_to', 'compare_method', 'compare_samples', 'compare_seed'],
    lambda values: values['compare_to'] is not None or not any(
        flags.FLAGS[name].present for name in ('compare_method', 'compare_samples', 'compare_seed')),
    message='--compare_method, --compare_samples and --compare_seed set up --compare_to: pass --compare_to too.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}.')
  runs = _CHECKPOINTS.runs()
  if _SAVE_AVERAGED.value and len(runs) > 1:
    raise ValueError('--save_averaged saves one run\'s averaged params: pass one --workdir and at most one --step.')
  compare_to = None
  if _COMPARE_TO.value:
    compare_to = significance.Comparison(_COMPARE_TO.value, _COMPARE_METHOD.value, _COMPARE_SAMPLES.value,
                                         _COMPARE_SEED.value)
  distributed.initialize_from_flags()
  from transformer_jax.inference import restoring  # pylint: disable=import-outside-toplevel
  from transformer_jax.jobs import scoring  # pylint: disable=import-outside-toplevel
  overrides = cli.overrides()
  workdir = runs[0][0]
  run_config = config_lib.of_run(workdir)
  split = _SPLIT.value or overrides.get('eval.test_split') or run_config.eval.test_split
  restored = restoring.restore_ensemble([(config_lib.for_evaluation(member, overrides, split), member, step)
                                         for member, step in runs], average_last=_CHECKPOINTS.average_last)
  if _SAVE_AVERAGED.value:
    path, written = restoring.save_averaged(restored, workdir)
    print(f'{"saved" if written else "already saved:"} the params of steps {restored.steps} as the workdir {path} '
          f'(eval.py, translate and export read it: --workdir={path})')
  final_steps = restoring.final_model_steps(run_config, workdir)
  results = scoring.evaluate_split(restored, workdir, split, compare_to, final_steps)
  print(scoring.describe(results, restored.config.eval.num_samples))


def _refuse_config_file(argv):
  """eval.py takes no config file any more: the run's own config.json is the config."""
  if any(arg == '--config' or arg.startswith('--config=') for arg in argv[1:]):
    sys.exit('FATAL Flags parsing error: eval.py reads the run\'s config from WORKDIR/config.json: drop --config=FILE '
             'and pass only --config.KEY=VALUE overrides.')


if __name__ == '__main__':
  _refuse_config_file(sys.argv)
  cli.run(main)
