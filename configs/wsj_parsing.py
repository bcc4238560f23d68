"""English constituency parsing on the WSJ part of the Penn Treebank (§6.3, Table 4: 91.3 F1, WSJ only).

The treebank is licensed by the LDC (LDC99T42) and cannot be downloaded here: you supply it as local
files. Linearise each tree as in Vinyals et al. 2015 ("Grammar as a Foreign Language"), one sentence per
line, and give the paths on the command line:

  source: the sentence's tokens, e.g.  `The cat sat .`
  target: its linearised tree, e.g.    `(S (NP DT NN )NP (VP VBD )VP . )S`

python train.py --config=configs/wsj_parsing.py --workdir=DIR \
  --config.data.files.train.source=wsj_02-21.sent --config.data.files.train.target=wsj_02-21.tree \
  --config.data.files.validation.source=wsj_22.sent --config.data.files.validation.target=wsj_22.tree \
  --config.data.files.test.source=wsj_23.sent --config.data.files.test.target=wsj_23.tree

(or one `source<TAB>target` file per split: `--config.data.files.train.tsv=wsj_02-21.tsv`). Sections
02–21 train (~40K sentences), 22 is the development set, 23 the test set.

The setup, from §6.3: a 4-layer Transformer with d_model = 1024, a 16K-token vocabulary from WSJ only,
everything else as the English→German base model (d_ff 2048, 8 heads, shared embeddings, 25000-token
batches, 100k steps, averaging the last 5 checkpoints); decoding with beam 21, α = 0.3 and a maximum
output length of input length + 300. The paper chose dropout (attention and residual) and the learning rate
on Section 22 without reporting them; the values here are those of the authors' released tensor2tensor
hparams `transformer_parsing_base`: attention and residual dropout 0.2, half the base learning rate
(0.05 vs 0.1, i.e. learning_rate_scale 0.5) with 16000 warmup steps, and max length 512 (linearised trees
are ~3× longer than their sentences).

Not reproduced here: the paper scores parses with EVALB F1; the evaluation of this repository reports
BLEU and loss, so run EVALB on the decoded trees yourself.

Arguments: a mesh preset and/or runlocal (see `presets`; runlocal switches to the built-in EN→DE corpus,
so it checks the setup runs, not parsing).
"""

from configs import presets
from transformer_jax import config as config_lib

ARGS = presets.arg_names()


def get_config(arg=None):
  config = config_lib.base_config()
  config.model.update(d_model=1024, d_ff=2048, num_heads=8, num_encoder_layers=4, num_decoder_layers=4,
                      dropout=0.2, attention_dropout=0.2, share_embeddings=True)
  config.model.vocab_size = 16_000  # also tokenizer.vocab_size
  config.model.max_len = 512  # also pipeline.max_length, the training length filter

  config.data.source = 'files'  # data.files.{train,validation,test} come from the command line
  config.tokenizer.model_type = 'bpe'
  config.pipeline.update(batching='token_budget', tokens_per_batch=25_000,
                         bucket_boundaries=(8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512))

  config.train.update(num_steps=100_000, schedule='paper', learning_rate_scale=0.5, warmup_steps=16_000,
                      label_smoothing=0.1, checkpoint_every=1250, keep_checkpoints=5, eval_every=2500)
  config.eval.update(split='validation', test_split='test', average_last=5)
  config.decode.update(beam_size=21, alpha=0.3, max_len_offset=300)
  return presets.apply_args(config, arg)
