"""The main job: a ~2M-parameter Transformer on the built-in EN→DE corpus, minutes on a laptop CPU.

python train.py --config=configs/default.py --workdir=runs/default

Arguments: `smoke` (a smaller model trained for 300 steps: about a minute on 2 CPU cores, test BLEU far above 0, to
check an installation), a mesh preset and/or runlocal (see `presets`).
"""

from configs import presets
from transformer_jax.config import base_config


def smoke(config):
  """A check that everything works, end to end, in about a minute: a 2+2-layer model of width 64 on 20,000 pairs
  for 300 steps, its final model the average of its last two checkpoints, scored on 200 test sentences."""
  config.model.vocab_size = 1000  # also tokenizer.vocab_size
  config.model.update(d_model=64, d_ff=256, num_encoder_layers=2, num_decoder_layers=2)
  config.data.update(builtin_train_size=20_000, builtin_eval_size=200)
  config.tokenizer.sample_size = 10_000
  config.train.update(num_steps=300, warmup_steps=100, eval_every=100, eval_batches=2, checkpoint_every=100)
  config.eval.update(batch_size=200, average_last=2)
  config.decode.update(batch_size=200)


VARIANTS = {'smoke': smoke}
ARGS = presets.arg_names(VARIANTS)


def get_config(arg=None):
  config = base_config()
  config.model.vocab_size = 4000  # also tokenizer.vocab_size
  config.model.update(d_model=128, d_ff=512, num_heads=4, num_encoder_layers=3, num_decoder_layers=3,
                      dropout=0.1)
  config.model.max_len = 64  # also pipeline.max_length
  config.data.builtin_eval_size = 1000
  config.tokenizer.sample_size = 100_000
  config.pipeline.update(packed_length=64, batch_size=32, batch_multiple=8)
  config.train.update(num_steps=800, warmup_steps=300, learning_rate_scale=1.0, log_every=50, eval_every=200,
                      eval_batches=4, checkpoint_every=200, keep_checkpoints=3)
  config.eval.update(batch_size=128, average_last=3)
  config.decode.update(batch_size=128)
  return presets.apply_args(config, arg, VARIANTS)
