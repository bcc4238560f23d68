"""A decoder-only language model on the One Billion Word benchmark (tfds 'lm1b'), with the setup of Flax's lm1b
example (google/flax examples/lm1b: configs/default.py, models.py, train.py, tokenizer.py) as the anchor.

python -m transformer_jax.prepare_tfds --name=lm1b --data_dir=DIR    # once, on a machine with internet
python train.py --config=configs/lm1b.py:tpu_v4_32 --workdir=DIR --config.data.tfds_data_dir=DIR

From Flax's example, each where it is set there:
- model (models.py `TransformerLM`, configs/default.py): 6 layers, emb_dim 512, qkv_dim 512 over 8 heads,
  mlp_dim 2048; pre-LN blocks with a final LayerNorm, fixed sinusoidal positions, an output layer not tied to the
  embedding (`logits_via_embedding=False`); dropout 0.1 on residuals and after the ReLU, attention dropout 0.1.
- data (configs/default.py, input_pipeline.py): lm1b's 'text', packed rows of 128 tokens (`max_target_length`),
  32 rows per device on a TPU v3-8, i.e. 256 rows per global batch; evaluation on the 'test' split.
- tokenizer (tokenizer.py): a 30000-piece unigram SentencePiece model on 1e7 characters of training text; lm1b's
  sentences average ~130 characters, so ~80000 sentences (our sample is counted in sentences).
- optimisation (train.py): AdamW(0.9, 0.98, 1e-9) with weight decay 0.1, linear warmup over 1000 steps to 0.0016
  then rsqrt decay (`create_learning_rate_schedule`: our 'linear_warmup_rsqrt'), no label smoothing, 500k
  steps, bfloat16 compute, eval every 1000 steps, checkpoints every 10000.
- sampling (configs/default.py): temperature 0.6, top-k 20, up to 50 new tokens.

Arguments: a mesh preset (e.g. tpu_v4_32) and/or runlocal (see `presets`).
"""

from configs import presets
from transformer_jax.config import base_config

ARGS = presets.arg_names()


def get_config(arg=None):
  config = base_config()
  config.model.architecture = 'decoder_only'
  config.model.vocab_size = 30_000  # also tokenizer.vocab_size
  config.model.update(d_model=512, d_ff=2048, num_heads=8, num_encoder_layers=0, num_decoder_layers=6, norm='pre',
                      positional='sinusoidal', share_embeddings=False, dropout=0.1, attention_dropout=0.1,
                      relu_dropout=0.1, dtype='bfloat16')
  config.model.max_len = 128  # also pipeline.max_length
  config.data.update(source='tfds', tfds_name='lm1b', text_key='text')
  config.tokenizer.update(model_type='unigram', sample_size=80_000)
  config.pipeline.update(batching='packed', packed_length=128, batch_size=256, batch_multiple=8)
  config.train.update(num_steps=500_000, schedule='linear_warmup_rsqrt', learning_rate=0.0016, warmup_steps=1000,
                      adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9, weight_decay=0.1, label_smoothing=0.0,
                      log_every=100, eval_every=1000, eval_batches=20, checkpoint_every=10_000, keep_checkpoints=3)
  config.eval.update(split='test', test_split='test', batch_size=256, average_last=1)
  config.decode.update(batch_size=256, max_new_tokens=50, temperature=0.6, top_k=20)
  return presets.apply_args(config, arg)
