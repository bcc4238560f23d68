"""Runs a sweep: python sweep.py --sweep=configs/sweeps/FILE.py [--config=configs/FILE.py[:args]] --workdir=ROOT.

Each variant trains with train.py in ROOT/<variant>, one after another; finished variants are skipped and
interrupted ones resume from their checkpoints, so rerunning the same command completes a sweep. The table
of results goes to ROOT/results.md and ROOT/results.csv. --print_commands prints one train.py command per
unfinished variant instead (for a cluster scheduler); --collect only rewrites the table.
"""

import os
import sys

from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax import sweep
from transformer_jax.core.workdir import Workdir

_SWEEP = flags.DEFINE_string('sweep', None, 'Sweep file defining get_sweep() (configs/sweeps/*.py).', required=True)
_CONFIG = flags.DEFINE_string('config', None, 'Base config, path[:args]; default: the sweep file\'s CONFIG.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Root directory; each variant trains in <workdir>/<variant>.',
                               required=True)
_PRINT = flags.DEFINE_bool('print_commands', False, 'Print the train.py command of each unfinished variant.')
_COLLECT = flags.DEFINE_bool('collect', False, 'Only write the results table from the variants\' workdirs.')
_PYTHON = flags.DEFINE_string('python', sys.executable, 'Python interpreter that runs train.py.')
_TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py')  # this script's sibling


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}.')
  Workdir(_WORKDIR.value).ensure_writable()
  module = sweep.load_sweep_file(_SWEEP.value)
  base = _CONFIG.value or getattr(module, 'CONFIG', None)
  if not base:
    raise ValueError(f'pass --config: {_SWEEP.value} sets no CONFIG.')
  try:
    variants = sweep.variants(module.get_sweep())
  except TypeError as e:
    raise ValueError(f'{_SWEEP.value}: {e}') from None
  for variant in variants:
    sweep.variant_config(base, variant)  # every variant loads and validates before anything runs
  if _PRINT.value:
    print('\n'.join(sweep.commands(base, variants, _WORKDIR.value, _PYTHON.value, train_py=_TRAIN_PY)))
    return
  outcome = {} if _COLLECT.value else sweep.run(base, variants, _WORKDIR.value, _PYTHON.value, train_py=_TRAIN_PY)
  sweep.write_results(base, variants, _WORKDIR.value, outcome)
  print(f'results: {_WORKDIR.value}/results.md, {_WORKDIR.value}/results.csv')
  failed = sorted(name for name, result in outcome.items() if result.startswith('failed'))
  if failed:
    sys.exit(f'error: {len(failed)} variant(s) failed: {", ".join(failed)}')


if __name__ == '__main__':
  cli.run(main)
