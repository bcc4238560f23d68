"""The language model's main job: a ~1M-parameter decoder-only Transformer on the English side of the built-in
corpus (one sentence per document, no download), minutes on a laptop CPU.

python train.py --config=configs/lm_default.py --workdir=runs/lm
python -m transformer_jax.generate --workdir=runs/lm --prompt="The old dog"

Arguments: a mesh preset and/or runlocal (see `presets`).
"""

from configs import presets
from transformer_jax.config import base_config

ARGS = presets.arg_names()


def get_config(arg=None):
  config = base_config()
  config.model.architecture = 'decoder_only'
  config.model.vocab_size = 2000  # also tokenizer.vocab_size
  config.model.update(d_model=128, d_ff=512, num_heads=4, num_encoder_layers=0, num_decoder_layers=4, dropout=0.1)
  config.model.max_len = 64  # also pipeline.max_length: the longest document
  config.data.builtin_eval_size = 1000
  config.tokenizer.sample_size = 100_000
  config.pipeline.update(packed_length=128, batch_size=32, batch_multiple=8)  # ~9 documents per row
  config.train.update(num_steps=600, warmup_steps=200, learning_rate_scale=1.0, label_smoothing=0.0, log_every=50,
                      eval_every=200, eval_batches=4, checkpoint_every=200, keep_checkpoints=3)
  config.eval.update(batch_size=128, average_last=1)
  config.decode.update(batch_size=128, max_new_tokens=32, temperature=0.6, top_k=20)  # Flax lm1b's sampling
  return presets.apply_args(config, arg)
