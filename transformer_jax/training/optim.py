"""Learning-rate schedules (the paper's rsqrt warmup and others) and the optax optimizer factory."""

import jax.numpy as jnp
import ml_collections
import optax

from transformer_jax.config import train as train_section


def paper_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  """lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5) (§5.3), with step counted from 1."""

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)

  return schedule


def make_schedule(train: ml_collections.ConfigDict, d_model: int) -> optax.Schedule:
  """The schedule named by `train.schedule`; `train.learning_rate` is the peak of the non-paper ones."""
  train_section.check_schedule(train)
  peak, warmup = train.learning_rate, train.warmup_steps
  if train.schedule == 'paper':
    return paper_schedule(d_model, warmup, train.learning_rate_scale)
  if train.schedule == 'constant':
    return optax.constant_schedule(peak)
  warm = optax.linear_schedule(0.0, peak, max(warmup, 1))
  if train.schedule == 'linear_warmup_rsqrt':
    decay = lambda count: peak * jnp.sqrt(max(warmup, 1) / (count + max(warmup, 1)))
  else:  # 'linear_warmup_cosine'
    decay = optax.cosine_decay_schedule(peak, max(train.num_steps - warmup, 1))
  return optax.join_schedules([warm, decay], [warmup])


def make_optimizer(train: ml_collections.ConfigDict, d_model: int) -> optax.GradientTransformation:
  """Adam(β1, β2, ε) (paper: 0.9, 0.98, 1e-9), or AdamW when weight_decay > 0, after optional clipping."""
  schedule = make_schedule(train, d_model)
  parts = []
  if train.grad_clip_norm:
    parts.append(optax.clip_by_global_norm(train.grad_clip_norm))
  if train.weight_decay:
    parts.append(optax.adamw(schedule, b1=train.adam_b1, b2=train.adam_b2, eps=train.adam_eps,
                             weight_decay=train.weight_decay))
  else:
    parts.append(optax.adam(schedule, b1=train.adam_b1, b2=train.adam_b2, eps=train.adam_eps))
  return optax.chain(*parts)
