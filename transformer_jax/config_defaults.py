"""Every config section with its defaults (the paper's where it has one), and validation of a whole config.

Config files in `configs/` start from `base_config()` and change what their experiment changes. Values that
must agree are tied with `FieldReference`s, so overriding one key keeps them consistent: the model's and
the tokenizer's vocabulary size, and the model's max length and the pipeline's length filter.
"""

import dataclasses

import ml_collections

from transformer_jax import optim
from transformer_jax import sharding
from transformer_jax.data import pipeline
from transformer_jax.data import sources
from transformer_jax.data import tokenizer
from transformer_jax.model_config import ModelConfig


def base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  vocab_size = ml_collections.FieldReference(37000)
  max_length = ml_collections.FieldReference(256)

  config.model = ml_collections.ConfigDict(dataclasses.asdict(ModelConfig()))
  config.model.vocab_size = vocab_size
  config.model.max_len = max_length
  config.model.d_k = ml_collections.config_dict.placeholder(int)
  config.model.d_v = ml_collections.config_dict.placeholder(int)

  config.data = sources.default_data_config()
  config.tokenizer = tokenizer.default_tokenizer_config()
  config.tokenizer.vocab_size = vocab_size
  config.pipeline = pipeline.default_pipeline_config()
  config.pipeline.max_length = max_length
  config.mesh = sharding.default_mesh_config()

  config.train = ml_collections.ConfigDict({
      'seed': 0,
      'num_steps': 100_000,
      'schedule': 'paper',  # see optim.SCHEDULES
      'learning_rate_scale': 1.0,  # multiplies the paper's schedule
      'learning_rate': 1e-3,  # peak of the linear-warmup schedules
      'warmup_steps': 4000,
      'adam_b1': 0.9,
      'adam_b2': 0.98,
      'adam_eps': 1e-9,
      'grad_clip_norm': 0.0,  # 0: off
      'weight_decay': 0.0,  # > 0: AdamW
      'label_smoothing': 0.1,
      'grad_accum_steps': 1,
      'on_nonfinite': 'stop',  # 'stop' or 'skip' (the update is never applied either way)
      'log_every': 100,
      'eval_every': 1000,
      'eval_batches': 20,  # validation batches per in-training eval
      'checkpoint_every': 1000,
      'keep_checkpoints': 5,  # at least the number averaged at the end (eval.average_last)
      'async_checkpoints': True,
  })
  config.eval = ml_collections.ConfigDict({
      'split': 'validation',  # teacher-forced loss during training
      'test_split': 'test',  # BLEU at the end of training and the default of eval.py
      'batch_size': 64,
      'average_last': 5,  # checkpoints averaged for the final evaluation (§6.1: 5 base, 20 big)
      'num_samples': 5,  # sample translations printed
  })
  config.decode = ml_collections.ConfigDict({
      'beam_size': 4,
      'alpha': 0.6,
      'max_len_offset': 50,  # max output length = input length + this (§6.1)
      'batch_size': 64,
  })
  return config


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks values that can be wrong together; each problem is a one-line error naming the keys."""
  ModelConfig.from_dict(config.model)
  train = config.train
  if train.schedule not in optim.SCHEDULES:
    raise ValueError(f'train.schedule={train.schedule!r} is not one of {optim.SCHEDULES}.')
  if train.warmup_steps > train.num_steps:
    raise ValueError(f'train.warmup_steps={train.warmup_steps} > train.num_steps={train.num_steps}: '
                     'lower the warmup or train longer.')
  if train.on_nonfinite not in ('stop', 'skip'):
    raise ValueError(f"train.on_nonfinite={train.on_nonfinite!r}: use 'stop' or 'skip'.")
  for key in ('log_every', 'eval_every', 'checkpoint_every', 'grad_accum_steps', 'num_steps'):
    if train[key] < 1:
      raise ValueError(f'train.{key} must be >= 1, got {train[key]}.')
  if not 0.0 <= train.label_smoothing < 1.0:
    raise ValueError(f'train.label_smoothing must be in [0, 1), got {train.label_smoothing}.')
  if config.data.source not in sources.SOURCES:
    raise ValueError(f'data.source={config.data.source!r} is not one of {sources.SOURCES}.')
  sharding.resolve_shape(config.mesh.shape, _any_count(config.mesh.shape))
  sharding.rules_from_config(config.mesh)
  if config.decode.beam_size < 1:
    raise ValueError(f'decode.beam_size must be >= 1, got {config.decode.beam_size}.')


def _any_count(shape) -> int:
  """A device count that a mesh shape can fill (checks the axis names and -1s, not the machine)."""
  fixed = 1
  for size in shape.values():
    fixed *= size if size > 0 else 1
  return fixed
