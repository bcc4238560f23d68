"""Every config section with its defaults (the paper's where it has one), and validation of a whole config.

Config files in `configs/` start from `base_config()` and change what their experiment changes. Values that
must agree are tied with `FieldReference`s, so overriding one key keeps them consistent: the model's and
the tokenizer's vocabulary size, and the model's max length and the pipeline's length filter.
"""

import dataclasses
import math

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


def validate(config: ml_collections.ConfigDict, *, data_paths: bool = True) -> None:
  """Checks values that can be wrong together; each problem is a one-line error naming the keys.

  data_paths: also require the files of a `data.source='files'` config (config files skip this: their
  paths come from the command line).
  """
  model = ModelConfig.from_dict(config.model)
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
  if config.eval.average_last < 1:
    raise ValueError(f'eval.average_last must be >= 1, got {config.eval.average_last}.')
  if train.keep_checkpoints is not None and train.keep_checkpoints < config.eval.average_last:
    raise ValueError(f'train.keep_checkpoints={train.keep_checkpoints} < eval.average_last='
                     f'{config.eval.average_last}: the final evaluation averages more checkpoints than are kept.')
  _validate_data(config, data_paths)
  if config.tokenizer.model_type not in tokenizer.MODEL_TYPES:
    raise ValueError(f'tokenizer.model_type={config.tokenizer.model_type!r} is not one of {tokenizer.MODEL_TYPES}.')
  _validate_pipeline(config.pipeline)
  _validate_mesh(config.mesh, model)
  if config.decode.beam_size < 1:
    raise ValueError(f'decode.beam_size must be >= 1, got {config.decode.beam_size}.')
  if config.decode.max_len_offset < 0:
    raise ValueError(f'decode.max_len_offset must be >= 0, got {config.decode.max_len_offset}.')


def _validate_data(config, data_paths: bool):
  data = config.data
  if data.source not in sources.SOURCES:
    raise ValueError(f'data.source={data.source!r} is not one of {sources.SOURCES}.')
  if data.source != 'files' or not data_paths:
    return
  for split in dict.fromkeys(('train', config.eval.split, config.eval.test_split)):
    entry = data.files.get(split)
    given = sorted(k for k, v in (entry or {}).items() if v is not None)
    if given not in (['source', 'target'], ['tsv']):
      raise ValueError(f"data.source='files' needs data.files.{split}.source and .target (or .tsv), got "
                       f'{given or "none"}: pass e.g. --config.data.files.{split}.source=PATH '
                       f'--config.data.files.{split}.target=PATH.')


def _validate_pipeline(pipe):
  if pipe.batching not in pipeline.BATCHINGS:
    raise ValueError(f'pipeline.batching={pipe.batching!r} is not one of {pipeline.BATCHINGS}.')
  if pipe.batch_multiple < 1:
    raise ValueError(f'pipeline.batch_multiple must be >= 1, got {pipe.batch_multiple}.')
  if pipe.batching == 'token_budget':
    pipeline.bucket_batch_sizes(pipe)  # boundaries cover max_length, the budget holds a row multiple
  else:
    if pipe.batch_size < 1 or pipe.batch_size % pipe.batch_multiple:
      raise ValueError(f'pipeline.batch_size={pipe.batch_size} must be a positive multiple of '
                       f'pipeline.batch_multiple={pipe.batch_multiple}.')
    if pipe.packed_length < pipe.max_length:
      raise ValueError(f'pipeline.packed_length={pipe.packed_length} < pipeline.max_length={pipe.max_length}.')


def _validate_mesh(mesh, model: ModelConfig):
  """Axis names, -1s and rules; with fixed sizes, that the sharded parameter dimensions divide."""
  sharding.resolve_shape(mesh.shape, _any_count(mesh.shape))
  sharding.resolve_shape(mesh.dcn_shape, _any_count(mesh.dcn_shape), 'mesh.dcn_shape')
  rules = sharding.rules_from_config(mesh)
  sizes = {axis: mesh.shape.get(axis, 1) * mesh.dcn_shape.get(axis, 1)
           if mesh.shape.get(axis, 1) > 0 and mesh.dcn_shape.get(axis, 1) > 0 else None
           for axis in sharding.MESH_AXES}
  dims = {'embed': ('model.d_model', model.d_model), 'heads': ('model.num_heads', model.num_heads),
          'mlp': ('model.d_ff', model.d_ff), 'vocab': ('model.vocab_size', model.vocab_size),
          'kv': ('model.d_k', model.head_dim_k)}
  for logical, mesh_axes in rules:
    if logical not in dims or mesh_axes is None:
      continue
    axes = mesh_axes if isinstance(mesh_axes, tuple) else (mesh_axes,)
    if any(sizes[axis] is None for axis in axes):
      continue  # a -1 axis: its size is known only on the machine
    shards = math.prod(sizes[axis] for axis in axes)
    key, size = dims[logical]
    if size % shards:
      raise ValueError(f'{key}={size} does not divide over the {shards} devices of mesh axes {list(axes)} '
                       f"(mesh.rules shard '{logical}' over them): change {key} or the mesh.")


def _any_count(shape) -> int:
  """A device count that a mesh shape can fill (checks the axis names and -1s, not the machine)."""
  fixed = 1
  for size in shape.values():
    fixed *= size if size > 0 else 1
  return fixed
