"""The paper's big model on WMT 2014 English→French (§5.1, §6.1, Table 2: 41.8 BLEU on newstest2014).

python train.py --config=configs/wmt14_enfr_big.py:tpu_v4_32 --workdir=DIR

As `wmt14_ende_big.py` (the big model, 300k steps, last 20 checkpoints averaged) on tfds
`wmt14_translate/fr-en` (English source, French target; prepare it with
`python -m transformer_jax.prepare_tfds --name=wmt14_translate/fr-en`), with a shared vocabulary of
32000 pieces (§5.1; the paper's word-pieces are approximated by SentencePiece BPE) and, as §6.1 says for
this model, P_drop = 0.1 instead of 0.3.

Arguments: a mesh preset and/or runlocal (see `presets`).
"""

from configs import presets
from configs import wmt14_ende_big

ARGS = presets.arg_names()


def get_config(arg=None):
  config = wmt14_ende_big.big('fr-en', vocab_size=32000)
  config.model.dropout = 0.1
  return presets.apply_args(config, arg)
