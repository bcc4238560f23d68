"""The optimizer side of training: the paper's schedule and the others, Adam's hyperparameters as they
reach optax, gradient clipping, weight decay, and gradient accumulation (k micro-batches = one big batch)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import helpers
from transformer_jax import config as config_lib
from transformer_jax.runtime import sharding
from transformer_jax.training import optim, steps


def _train_cfg(**changes) -> ml_collections.ConfigDict:
  train = config_lib.base_config().train
  train.update(changes)
  return train


def _lr(schedule, count) -> float:
  return float(schedule(jnp.asarray(count)))


# --- schedules


def test_paper_schedule_formula_and_peak():
  d_model, warmup = 512, 4000
  schedule = optim.make_schedule(_train_cfg(schedule='paper', warmup_steps=warmup), d_model)
  # optax counts updates from 0; the paper's step_num is count + 1.
  for count in (0, 1, 99, 1999, 3998, 3999, 4000, 9999, 99_999):
    step = count + 1
    expected = d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    np.testing.assert_allclose(_lr(schedule, count), expected, rtol=1e-5)
  peak = d_model ** -0.5 * warmup ** -0.5  # ≈ 7.0e-4 for the base model
  np.testing.assert_allclose(_lr(schedule, warmup - 1), peak, rtol=1e-5)
  values = [_lr(schedule, c) for c in range(0, 3 * warmup, 50)]
  assert max(values) <= peak * (1 + 1e-6)
  assert _lr(schedule, warmup // 2) < peak and _lr(schedule, 2 * warmup) < peak
  np.testing.assert_allclose(_lr(schedule, 4 * warmup - 1), peak / 2, rtol=1e-5)  # rsqrt decay


def test_paper_schedule_scale():
  base = optim.make_schedule(_train_cfg(schedule='paper', warmup_steps=10), 64)
  scaled = optim.make_schedule(_train_cfg(schedule='paper', warmup_steps=10, learning_rate_scale=2.5), 64)
  for count in (0, 9, 50):
    np.testing.assert_allclose(_lr(scaled, count), 2.5 * _lr(base, count), rtol=1e-6)


def test_other_schedules():
  peak, warmup, total = 1e-3, 100, 1100
  constant = optim.make_schedule(_train_cfg(schedule='constant', learning_rate=peak), 512)
  assert _lr(constant, 0) == pytest.approx(peak) and _lr(constant, 10_000) == pytest.approx(peak)

  rsqrt = optim.make_schedule(_train_cfg(schedule='linear_warmup_rsqrt', learning_rate=peak,
                                         warmup_steps=warmup), 512)
  assert _lr(rsqrt, 0) == pytest.approx(0.0)
  assert _lr(rsqrt, warmup // 2) == pytest.approx(peak / 2, rel=1e-5)
  assert _lr(rsqrt, warmup) == pytest.approx(peak, rel=1e-5)
  assert _lr(rsqrt, 4 * warmup) == pytest.approx(peak / 2, rel=1e-5)  # peak · sqrt(warmup / count)

  cosine = optim.make_schedule(_train_cfg(schedule='linear_warmup_cosine', learning_rate=peak,
                                          warmup_steps=warmup, num_steps=total), 512)
  assert _lr(cosine, warmup // 2) == pytest.approx(peak / 2, rel=1e-5)
  assert _lr(cosine, warmup) == pytest.approx(peak, rel=1e-5)
  assert _lr(cosine, (warmup + total) // 2) == pytest.approx(peak / 2, rel=1e-4)
  assert _lr(cosine, total) == pytest.approx(0.0, abs=1e-9)

  with pytest.raises(ValueError, match='train.schedule'):
    optim.make_schedule(_train_cfg(schedule='exponential'), 512)


# --- Adam, clipping, weight decay (checked against the update rule written out by hand)


def _updates(tx, grads_sequence, params):
  state = tx.init(params)
  out = []
  for grads in grads_sequence:
    updates, state = tx.update(grads, state, params)
    out.append(np.asarray(updates['w']))
  return out


def _manual_adam(grads_sequence, lrs, b1, b2, eps):
  m = v = 0.0
  out = []
  for t, (g, lr) in enumerate(zip(grads_sequence, lrs), 1):
    g = np.asarray(g['w'], np.float64)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    out.append(-lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps))
  return out


# Gradients of very different sizes (1e-9 makes eps matter, the changing sign and size make b1 and b2 matter).
GRADS = [{'w': jnp.array([1e-9, 0.5, -2.0, 3.0])}, {'w': jnp.array([-3e-9, 0.1, 1.0, -0.2])},
         {'w': jnp.array([2e-9, -1.5, 0.5, 0.7])}]
PARAMS = {'w': jnp.array([0.3, -0.2, 1.0, 2.0])}


def test_paper_adam_hyperparameters_reach_optax():
  train = _train_cfg(schedule='paper', warmup_steps=4)
  assert (train.adam_b1, train.adam_b2, train.adam_eps) == (0.9, 0.98, 1e-9)  # §5.3
  d_model = 16
  schedule = optim.make_schedule(train, d_model)
  got = _updates(optim.make_optimizer(train, d_model), GRADS, PARAMS)
  lrs = [_lr(schedule, c) for c in range(len(GRADS))]
  expected = _manual_adam(GRADS, lrs, 0.9, 0.98, 1e-9)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=2e-5)
  # The test can tell the paper's values from optax's defaults (0.999, 1e-8).
  for b2, eps in ((0.999, 1e-9), (0.98, 1e-8)):
    other = _manual_adam(GRADS, lrs, 0.9, b2, eps)
    assert not all(np.allclose(g, o, rtol=1e-3) for g, o in zip(got, other))


def test_config_adam_values_are_used():
  train = _train_cfg(schedule='constant', learning_rate=0.01, adam_b1=0.5, adam_b2=0.9, adam_eps=1e-3)
  got = _updates(optim.make_optimizer(train, 16), GRADS, PARAMS)
  expected = _manual_adam(GRADS, [0.01] * len(GRADS), 0.5, 0.9, 1e-3)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=2e-5)


def test_gradient_clipping():
  big = {'w': jnp.array([0.0, 6.0, 8.0, 0.0])}  # norm 10
  small = {'w': jnp.array([0.3, 0.0, -0.4, 0.0])}  # norm 0.5: not clipped
  clipped = optim.make_optimizer(_train_cfg(schedule='constant', learning_rate=0.1, grad_clip_norm=1.0), 16)
  plain = optim.make_optimizer(_train_cfg(schedule='constant', learning_rate=0.1, grad_clip_norm=0.0), 16)
  got = _updates(clipped, [big, small], PARAMS)
  by_hand = _updates(plain, [{'w': big['w'] / 10.0}, small], PARAMS)  # big rescaled to norm 1
  unclipped = _updates(plain, [big, small], PARAMS)
  for g, e in zip(got, by_hand):
    np.testing.assert_allclose(g, e, rtol=1e-5)
  assert not np.allclose(got[1], unclipped[1], rtol=1e-3)  # clipping changed Adam's second update


def test_weight_decay_is_decoupled():
  lr, decay = 0.1, 0.01
  zeros = {'w': jnp.zeros(4)}
  decayed = optim.make_optimizer(_train_cfg(schedule='constant', learning_rate=lr, weight_decay=decay), 16)
  (update,) = _updates(decayed, [zeros], PARAMS)
  np.testing.assert_allclose(update, -lr * decay * np.asarray(PARAMS['w']), rtol=1e-6)  # AdamW: -lr·λ·θ
  (update,) = _updates(optim.make_optimizer(_train_cfg(schedule='constant', learning_rate=lr), 16), [zeros], PARAMS)
  np.testing.assert_array_equal(update, 0.0)
  # With gradients: the Adam update plus the decay term.
  (with_grads,) = _updates(decayed, GRADS[:1], PARAMS)
  adam = _manual_adam(GRADS[:1], [lr], 0.9, 0.98, 1e-9)[0]
  np.testing.assert_allclose(with_grads, adam - lr * decay * np.asarray(PARAMS['w']), rtol=1e-5)


# --- gradient accumulation through the real train step


@pytest.mark.slow
def test_gradient_accumulation_matches_the_large_batch():
  """k micro-batches of B/k rows give the update of one batch of B rows (dropout off: same function)."""
  config = helpers.tiny_config(**helpers.NO_DROPOUT_STEP)
  model, tx, schedule = helpers.train_objects(config)
  mesh, rules = helpers.one_device_mesh(config)
  batches = helpers.synthetic_batches(2, helpers.STEP_ROWS, helpers.STEP_LENGTH, seed=3)
  results = {}
  for k in (1, 4):
    config.train.grad_accum_steps = k
    state, shardings = steps.create_sharded_state(model, tx, 0, (helpers.STEP_ROWS, 8), mesh, rules,
                                                  shard_optimizer=True)
    step_fn = helpers.jitted_train_step(config, model, tx, schedule, shardings, mesh)
    losses = []
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      for batch in batches:  # two updates: the second also checks the optimizer state agrees
        state, metrics = step_fn(state, sharding.place_batch(batch, mesh))
        losses.append({key: float(metrics[key]) for key in ('loss', 'nll', 'tokens', 'correct', 'grad_norm')})
    results[k] = (jax.device_get(state.params), losses)
  (params_1, losses_1), (params_4, losses_4) = results[1], results[4]
  for a, b in zip(losses_1, losses_4):
    assert a['tokens'] == b['tokens']
    for key in ('loss', 'nll', 'correct', 'grad_norm'):
      np.testing.assert_allclose(b[key], a[key], rtol=1e-5)
  moved = jax.tree.leaves(jax.tree.map(lambda p, q: np.max(np.abs(p - q)), params_1, params_4))
  assert max(moved) < 1e-5, max(moved)
  # The updates are not trivially zero: params moved from their initial values.
  initial, _ = steps.create_sharded_state(model, tx, 0, (helpers.STEP_ROWS, 8), mesh, rules, shard_optimizer=True)
  change = jax.tree.leaves(jax.tree.map(lambda p, q: np.max(np.abs(p - q)), jax.device_get(initial.params), params_1))
  assert max(change) > 1e-3


def test_micro_batches_that_do_not_divide_are_an_error():
  with pytest.raises(ValueError, match='grad_accum_steps=3'):
    steps._micro_batches({'inputs': jnp.zeros((8, 4))}, 3)
