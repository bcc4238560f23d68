"""The paper's base model on WMT 2014 English→German (§5, §6.1, Table 2), and Table 3's rows as variants.

python train.py --config=configs/wmt14_ende_base.py --workdir=DIR          # Table 2: base, newstest2014
python train.py --config=configs/wmt14_ende_base.py:A_h16 --workdir=DIR    # a Table 3 row
python train.py --config=configs/wmt14_ende_base.py:runlocal --workdir=DIR # smoke test on a CPU, ~1 minute

Data: tfds `wmt14_translate/de-en`, English source, German target, prepared once with
`python -m transformer_jax.prepare_tfds --name=wmt14_translate/de-en`. Shared BPE vocabulary of 37000
pieces, token-budget batches of ~25000 source + 25000 target tokens, 100k steps, warmup 4000, P_drop 0.1,
ε_ls 0.1; the final model averages the last 5 checkpoints; beam 4, α 0.6, max length input + 50
(see `presets.wmt14` for each choice and the paper section it comes from).

Arguments (comma-separated, any order; see `presets`):
- a Table 3 row, named as in `configs.table3.VARIANTS` (the one place that says what each row
  changes): base, A_h1, A_h4, A_h16, A_h32, B_dk16, B_dk32, C_N2, C_N4, C_N8, C_dmodel256, C_dmodel1024,
  C_dff1024, C_dff4096, D_drop0, D_drop02, D_ls0, D_ls02, E_learned, big. Table 3 measures every row,
  base included, on newstest2013 without checkpoint averaging (its caption and §6.2), so a row also sets
  eval.test_split='validation' and eval.average_last=1; `:base` is Table 3's base row, while no argument
  is Table 2's base setup.
- a mesh preset: gpu8, gpu8_fsdp, gpu8_fsdp_tp, tpu_v4_32, tpu_v4_32_fsdp, tpu_v4_32_fsdp_tp.
- runlocal: the built-in corpus and a model shrunk with the row's ratios kept.
"""

import functools

from configs import presets
from configs.table3 import VARIANTS


def table3_row(config, name: str) -> None:
  config.eval.update(test_split='validation', average_last=1)  # newstest2013, no checkpoint averaging
  config.update_from_flattened_dict(VARIANTS[name].overrides)


ROWS = {name: functools.partial(table3_row, name=name) for name in VARIANTS}
ARGS = presets.arg_names(ROWS)


def get_config(arg=None):
  return presets.apply_args(presets.wmt14('de-en', vocab_size=37000), arg, ROWS)
