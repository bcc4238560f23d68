"""The paper's big model on WMT 2014 English→German (§6.1, Table 2: 28.4 BLEU on newstest2014).

python train.py --config=configs/wmt14_ende_big.py:gpu8 --workdir=DIR

The base setup (`presets.wmt14`) with Table 3's "big" row (`configs.table3.VARIANTS['big']`:
d_model 1024, d_ff 4096, 16 heads, P_drop 0.3, 300k steps). §6.1: the big models average the last 20
checkpoints. The paper writes checkpoints every 10 minutes; at its 1.0 s per big step that is every 600
steps (which divides 300k), so 20 checkpoints are kept.

Arguments: a mesh preset (gpu8, gpu8_fsdp, gpu8_fsdp_tp, tpu_v4_32, tpu_v4_32_fsdp, tpu_v4_32_fsdp_tp)
and/or runlocal (see `presets`).
"""

from configs import presets
from configs.table3 import VARIANTS

ARGS = presets.arg_names()


def big(language_pair: str, vocab_size: int):
  config = presets.wmt14(language_pair, vocab_size)
  config.update_from_flattened_dict(VARIANTS['big'].overrides)
  config.train.update(checkpoint_every=600, keep_checkpoints=20, eval_every=3000)
  config.eval.average_last = 20
  return config


def get_config(arg=None):
  return presets.apply_args(big('de-en', vocab_size=37000), arg)
