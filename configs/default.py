"""The main job: a ~3M-parameter Transformer on the built-in EN→DE corpus, minutes on a laptop CPU.

python train.py --config=configs/default.py --workdir=/tmp/tj_default
"""

from transformer_jax.config_defaults import base_config


def get_config():
  config = base_config()
  config.model.vocab_size = 4000
  config.model.update(d_model=128, d_ff=512, num_heads=4, num_encoder_layers=3, num_decoder_layers=3,
                      dropout=0.1)
  config.model.max_len = 64
  config.tokenizer.sample_size = 100_000
  config.pipeline.update(packed_length=64, batch_size=64, batch_multiple=8)
  config.train.update(num_steps=2500, warmup_steps=500, learning_rate_scale=2.0, log_every=100, eval_every=500,
                      eval_batches=8, checkpoint_every=500, keep_checkpoints=5)
  config.eval.update(batch_size=128, average_last=3)
  config.decode.update(batch_size=128)
  return config
