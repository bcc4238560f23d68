"""The `train` section: the training loop's settings (`transformer_jax.jobs.trainer`) and the optimizer's and
schedule's (`transformer_jax.training.optim`)."""

import ml_collections

SCHEDULES = ('paper', 'linear_warmup_rsqrt', 'linear_warmup_cosine', 'constant')
NONFINITE_MODES = ('stop', 'skip')
# Keys only some schedules read: key -> its conditions, each (the dotted key that chooses, the choices that read it);
# `config.MODE_KEYS`.
WARMUP_SCHEDULES = tuple(s for s in SCHEDULES if s != 'constant')
MODE_KEYS = {
    'learning_rate_scale': (('train.schedule', ('paper',)),),
    'learning_rate': (('train.schedule', tuple(s for s in SCHEDULES if s != 'paper')),),  # the others' peak
    'warmup_steps': (('train.schedule', WARMUP_SCHEDULES),),
}


def default_config() -> ml_collections.ConfigDict:
  """The paper's Adam and schedule (§5.3) and label smoothing (§5.4); how often the loop logs, evaluates and
  saves."""
  return ml_collections.ConfigDict({
      'seed': 0,
      'num_steps': 100_000,
      'schedule': 'paper',  # see SCHEDULES
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
      'max_steps_ahead': 2,  # dispatched steps the host may run ahead of the device: how soon a stop is honoured
      # Compiled programs persist here across runs (train.py; None: jax_compilation_cache beside the workdir).
      'compilation_cache_dir': ml_collections.config_dict.placeholder(str),
      # The converted workdir whose imported params (step 0) a fine-tune starts from (configs/fine_tune.py); the
      # run trains in it.
      'fine_tune_workdir': ml_collections.config_dict.placeholder(str),
  })


def validate(train: ml_collections.ConfigDict) -> None:
  check_schedule(train)
  for key in ('log_every', 'eval_every', 'checkpoint_every', 'grad_accum_steps', 'num_steps', 'eval_batches',
              'max_steps_ahead'):
    if train[key] < 1:
      raise ValueError(f'train.{key} must be >= 1, got {train[key]}.')
  if train.schedule in WARMUP_SCHEDULES:
    lowest = 1 if train.schedule == 'paper' else 0  # the paper's rate is step · warmup_steps^-1.5 while warming up
    if train.warmup_steps < lowest:
      raise ValueError(f'train.warmup_steps must be >= {lowest} with train.schedule={train.schedule!r}, got '
                       f'{train.warmup_steps}.')
    if train.warmup_steps > train.num_steps:  # both checked on their own first
      raise ValueError(f'train.warmup_steps={train.warmup_steps} > train.num_steps={train.num_steps}: '
                       'lower the warmup or train longer.')
  if train.on_nonfinite not in NONFINITE_MODES:
    raise ValueError(f'train.on_nonfinite={train.on_nonfinite!r}: use one of {NONFINITE_MODES}.')
  if not train.adam_eps > 0.0:
    raise ValueError(f'train.adam_eps must be > 0, got {train.adam_eps}: Adam divides by sqrt(v) + eps, which is 0/0 '
                     'for a parameter whose gradients have all been 0 (the paper: 1e-9).')
  if not 0.0 <= train.label_smoothing < 1.0:
    raise ValueError(f'train.label_smoothing must be in [0, 1), got {train.label_smoothing}.')


def check_schedule(train: ml_collections.ConfigDict) -> None:
  if train.schedule not in SCHEDULES:
    raise ValueError(f'train.schedule={train.schedule!r} is not one of {SCHEDULES}.')
