"""A 2 × 2 example: heads × dropout of the runlocal base model.

python sweep.py --sweep=configs/sweeps/heads_dropout_runlocal.py --workdir=/tmp/heads_dropout
"""

from transformer_jax import sweep

CONFIG = 'configs/wmt14_ende_base.py:runlocal'


def get_sweep():
  return sweep.product(('model.num_heads', [4, 8]), ('model.dropout', [0.0, 0.1]))
