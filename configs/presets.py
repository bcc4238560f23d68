"""What the paper configs share: the WMT 2014 setup (§5–6), mesh presets, `runlocal`, and argument parsing.

A config file's argument (after the colon) is a comma-separated list of names, applied in a fixed order
whatever the order written: the file's own variant (e.g. a Table 3 row), then a mesh preset, then
`runlocal`. So `configs/wmt14_ende_base.py:A_h16,runlocal` is row (A) with 16 heads, shrunk to run on a CPU.

Mesh presets (pure data parallel, FSDP, FSDP × tensor parallel) fix the device count, so a preset run on
the wrong machine fails at start-up naming the mesh; they also set `pipeline.batch_multiple` to the
data-parallel size. The paper's batch (~25000 source + ~25000 target tokens) is the *global* batch:
it does not change with the preset.

| preset | devices | mesh (data, fsdp, tensor) |
|---|---|---|
| `gpu8` | one 8-GPU machine (the paper's 8 P100s) | 8, 1, 1 |
| `gpu8_fsdp` | " | 1, 8, 1 |
| `gpu8_fsdp_tp` | " | 1, 4, 2 |
| `tpu_v4_32` | a TPU v4-32 slice: 16 chips on 4 hosts | 16, 1, 1 |
| `tpu_v4_32_fsdp` | " | 1, 16, 1 |
| `tpu_v4_32_fsdp_tp` | " | 1, 4, 4 |

Mixed precision is not part of a preset; add `--config.model.dtype=bfloat16` on GPUs and TPUs that have it.
"""

import math

import ml_collections

from transformer_jax import config as config_lib
from transformer_jax.config import mesh as mesh_section

RUNLOCAL = 'runlocal'

MESH_PRESETS = {
    'gpu8': {'data': 8, 'fsdp': 1, 'tensor': 1},
    'gpu8_fsdp': {'data': 1, 'fsdp': 8, 'tensor': 1},
    'gpu8_fsdp_tp': {'data': 1, 'fsdp': 4, 'tensor': 2},
    'tpu_v4_32': {'data': 16, 'fsdp': 1, 'tensor': 1},
    'tpu_v4_32_fsdp': {'data': 1, 'fsdp': 16, 'tensor': 1},
    'tpu_v4_32_fsdp_tp': {'data': 1, 'fsdp': 4, 'tensor': 4},
}

# runlocal: width (d_model, d_ff, d_k, d_v) is divided by this and depth halved (rounded up), so a
# variant keeps its ratios to the base model (e.g. A_h16 keeps 16 heads with d_k = d_model / 16).
RUNLOCAL_WIDTH_DIVISOR = 16


def wmt14(language_pair: str, vocab_size: int) -> ml_collections.ConfigDict:
  """The paper's WMT 2014 English→X setup for the base model (§5, §6.1); big configs change it.

  language_pair: the tfds config, 'de-en' or 'fr-en'; the source is English, the target the other side.
  """
  config = config_lib.base_config()
  target = language_pair.split('-')[0]

  # §5.1: WMT 2014 from tfds (prepare it once with transformer_jax.prepare_tfds); newstest2013 is
  # the validation split, newstest2014 the test split. One vocabulary shared by source and target.
  config.data.update(source='tfds', tfds_name=f'wmt14_translate/{language_pair}', source_lang='en',
                     target_lang=target)
  config.model.vocab_size = vocab_size  # also tokenizer.vocab_size (a shared FieldReference)
  config.tokenizer.update(model_type='bpe', sample_size=1_000_000)

  # §5.1: "Each training batch contained a set of sentence pairs containing approximately 25000 source
  # tokens and 25000 target tokens", batched "by approximate sequence length". Token-budget batching does
  # exactly that: each batch holds sentences of one length bucket, rows × bucket length <= 25000 per side
  # (padding included, so slightly fewer real tokens). Packing would fill rows better but mixes sentences of
  # all lengths in a batch, which the paper does not do.
  config.pipeline.update(batching='token_budget', tokens_per_batch=25_000)

  # §5.3, §5.4: Adam(0.9, 0.98, 1e-9), the rsqrt schedule with 4000 warmup steps, P_drop 0.1, ε_ls 0.1.
  config.model.dropout = 0.1
  config.train.update(num_steps=100_000, schedule='paper', learning_rate_scale=1.0, warmup_steps=4000,
                      adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9, label_smoothing=0.1)

  # §6.1: the base model is the average of the last 5 checkpoints "written at 10-minute intervals". At the
  # paper's 0.4 s per base step that is 1500 steps; 1250 divides 100k, so the last 5 are evenly spaced.
  config.train.update(checkpoint_every=1250, keep_checkpoints=5, eval_every=2500, log_every=100)
  config.eval.update(split='validation', test_split='test', average_last=5)

  # §6.1: beam size 4, length penalty α = 0.6, maximum output length input length + 50.
  config.decode.update(beam_size=4, alpha=0.6, max_len_offset=50)
  return config


def set_mesh(config: ml_collections.ConfigDict, preset: str) -> None:
  shape = MESH_PRESETS[preset]
  config.mesh.shape.update(shape)
  config.mesh.dcn_shape.update({axis: 1 for axis in mesh_section.MESH_AXES})
  config.pipeline.batch_multiple = shape['data'] * shape['fsdp']


def runlocal(config: ml_collections.ConfigDict) -> None:
  """Shrinks a paper config to a smoke test that runs on a CPU in a minute or so.

  The built-in EN→DE corpus replaces the real data (nothing is downloaded); the model keeps its number of
  heads and its width and depth *ratios* (see RUNLOCAL_WIDTH_DIVISOR); the batching mode, schedule,
  regularisation, beam and α stay, at sizes a CPU handles (200 steps of 2048 tokens, one compiled batch
  shape, the decoding length capped at input + 50). The base model takes ~105 s of CPU time in all
  (start-up, compilation, training, final beam-search evaluation of 128 sentences) on 2 cores.
  """
  model = config.model
  div = RUNLOCAL_WIDTH_DIVISOR
  d_model = max(2, model.d_model // div)
  model.d_model = d_model + d_model % 2  # sinusoidal positions need an even width
  model.d_ff = max(1, model.d_ff // div)
  for key in ('d_k', 'd_v'):
    if model[key] is not None:
      model[key] = max(1, model[key] // div)
  model.num_encoder_layers = math.ceil(model.num_encoder_layers / 2)
  model.num_decoder_layers = math.ceil(model.num_decoder_layers / 2)
  model.vocab_size = 500  # also tokenizer.vocab_size
  model.max_len = 64  # also pipeline.max_length
  model.attention_chunk_size = min(model.attention_chunk_size, 64)

  config.data.update(source='builtin', builtin_train_size=20_000, builtin_eval_size=128)
  config.tokenizer.sample_size = 20_000
  # One batch shape in either batching mode (token_budget: a single bucket), so the train step compiles once.
  config.pipeline.update(tokens_per_batch=2048, bucket_boundaries=(64,), packed_length=64, batch_size=32,
                         batch_multiple=8, num_workers=0)
  config.mesh.shape.update({'data': -1, 'fsdp': 1, 'tensor': 1})
  config.mesh.dcn_shape.update({axis: 1 for axis in mesh_section.MESH_AXES})

  config.train.update(num_steps=200, warmup_steps=100, log_every=50, eval_every=100, eval_batches=2,
                      checkpoint_every=50)
  config.eval.update(batch_size=64, average_last=min(config.eval.average_last, 3))
  config.train.keep_checkpoints = max(3, config.eval.average_last)
  config.decode.update(batch_size=64, max_len_offset=min(config.decode.max_len_offset, 50))


def arg_names(variants=()) -> list[str]:
  """Every name a config file built with `apply_args(..., variants)` accepts."""
  return [*variants, *MESH_PRESETS, RUNLOCAL]


def apply_args(config: ml_collections.ConfigDict, arg: str | None, variants=None) -> ml_collections.ConfigDict:
  """Applies a config file's argument (see the module docstring), validates, and returns the config.

  variants: the file's own named variants, name -> function(config) that changes the config in place.
  """
  variants = variants or {}
  names = [name.strip() for name in (arg or '').split(',') if name.strip()]
  known = arg_names(variants)
  unknown = [name for name in names if name not in known]
  if unknown:
    raise ValueError(f'unknown config argument(s) {unknown}; use comma-separated names from {known}.')
  if len(set(names)) != len(names):
    raise ValueError(f'config argument {arg!r} repeats a name.')
  chosen_variants = [name for name in names if name in variants]
  chosen_meshes = [name for name in names if name in MESH_PRESETS]
  for kind, chosen in (('variant', chosen_variants), ('mesh preset', chosen_meshes)):
    if len(chosen) > 1:
      raise ValueError(f'config argument {arg!r} names more than one {kind}: {chosen}.')
  for name in chosen_variants:
    variants[name](config)
  for name in chosen_meshes:
    set_mesh(config, name)
  if RUNLOCAL in names:
    runlocal(config)
  config_lib.validate(config, data_splits=())
  return config
