"""The main job: a ~2M-parameter Transformer on the built-in EN→DE corpus, minutes on a laptop CPU.

python train.py --config=configs/default.py --workdir=runs/default

Arguments: a mesh preset and/or runlocal (see `presets`).
"""

from configs import presets
from transformer_jax.config import base_config

ARGS = presets.arg_names()


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
  return presets.apply_args(config, arg)
