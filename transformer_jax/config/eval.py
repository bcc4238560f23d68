"""The `eval` section: what a run evaluates on, in training and at its end (`transformer_jax.jobs.scoring`)."""

import ml_collections


def default_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({
      'split': 'validation',  # teacher-forced loss during training
      'test_split': 'test',  # BLEU at the end of training and the default of eval.py
      'batch_size': 64,  # sentences per teacher-forced batch (global)
      'average_last': 5,  # checkpoints averaged for the final evaluation (§6.1: 5 base, 20 big)
      'num_samples': 5,  # sample translations (language model: continuations of held-out prompts) printed
  })


def validate(eval_config: ml_collections.ConfigDict) -> None:
  for key, low in (('batch_size', 1), ('average_last', 1), ('num_samples', 0)):
    if eval_config[key] < low:
      raise ValueError(f'eval.{key} must be >= {low}, got {eval_config[key]}.')
