"""Every row of the paper's Table 3 (base, A–E, big) over the runlocal config: ~1 minute each on a CPU.

python sweep.py --sweep=configs/sweeps/table3_runlocal.py --workdir=/tmp/table3_runlocal

The rows come from `configs.table3.VARIANTS` through the config argument of
`configs/wmt14_ende_base.py` (e.g. `:A_h16,runlocal`), so each run changes only what the paper changes,
at runlocal's scale (width / 16, depth / 2, heads kept). Like Table 3, BLEU is on the validation split
without checkpoint averaging. Rerunning the command skips finished rows and resumes interrupted ones;
the table is in results.md and results.csv under --workdir.
"""

from transformer_jax import sweep
from configs.table3 import VARIANTS

CONFIG = 'configs/wmt14_ende_base.py:runlocal'


def get_sweep():
  return sweep.axis(sweep.CONFIG_ARG, list(VARIANTS))
