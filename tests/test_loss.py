"""The chunked pre-softmax layer and loss (`loss.token_sums`) equal the whole-logits formula, values and gradients.

Tolerances: float32 throughout; each value is a sum of a few dozen per-token terms, each from a log-sum-exp over
the vocabulary, so rounding differs by a few ulps per term between the two orders of summation: rtol 1e-5
(~80 × float32's 2^-23) bounds it with room, and is far below any real difference (a wrong smoothing weight or
a dropped token changes the sums by >1e-2 relative).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from transformer_jax.compile import topologies
from transformer_jax.config.model import ModelConfig
from transformer_jax.model import loss
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime import pallas_mode

GPU = helpers.kernels('auto', 'gpu')  # a GPU's loss path, run here on the CPU

RTOL = 1e-5


def _reference_sums(logits, targets, smoothing):
  """Sums over non-pad tokens of the label-smoothed cross-entropy (minus the smoothed target's entropy), the NLL
  and argmax hits, written out plainly: an explicit smoothed distribution against log_softmax."""
  vocab = logits.shape[-1]
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  one_hot = jax.nn.one_hot(targets, vocab)
  q = one_hot * (1 - smoothing) + (1 - one_hot) * smoothing / (vocab - 1)
  entropy = -jnp.sum(jnp.where(q > 0, q * jnp.log(jnp.where(q > 0, q, 1.0)), 0.0), axis=-1)
  mask = (targets > 0).astype(jnp.float32)
  per_token = (-jnp.sum(q * log_probs, axis=-1) - entropy, -jnp.sum(one_hot * log_probs, axis=-1),
               (jnp.argmax(log_probs, axis=-1) == targets).astype(jnp.float32))
  return tuple(jnp.sum(x * mask) for x in per_token)


def _inputs(seed=0, batch=3, length=11, d=8, vocab=29):
  rng = np.random.default_rng(seed)
  hidden = jnp.asarray(rng.normal(size=(batch, length, d)), jnp.float32)
  weights = jnp.asarray(0.5 * rng.normal(size=(vocab, d)), jnp.float32)
  targets = rng.integers(1, vocab, (batch, length))
  targets[0, -4:] = 0  # padding at the end of one row and inside another
  targets[1, 3] = 0
  return hidden, weights, jnp.asarray(targets, jnp.int32)


@pytest.mark.parametrize('smoothing', [0.1, 0.0])
@pytest.mark.parametrize('chunk_length', [4, 11, 64])  # uneven chunks, one exact chunk, one chunk past the length
@pytest.mark.parametrize('with_bias', [False, True])  # a logits bias (imported MarianMT models)
# a GPU's gold logits come from the gold tokens' weights; its gradient pass from the loss kernel, or XLA's without it
@pytest.mark.parametrize('platform, loss_kernel', [('cpu', True), ('gpu', True), ('gpu', False)])
def test_sums_and_gradients_equal_the_whole_logits_formula(smoothing, chunk_length, with_bias, platform, loss_kernel):
  kernels = helpers.kernels(platform=platform, loss_kernel=loss_kernel)  # a GPU's computation runs on this CPU
  hidden, weights, targets = _inputs()
  bias = jnp.asarray(np.random.default_rng(5).normal(size=weights.shape[0]), jnp.float32)

  def objective(sums_fn, h, w, b):  # cotangents on the loss and on the NLL
    loss_sum, nll_sum, correct = sums_fn(h, w, b if with_bias else None)
    return loss_sum + 0.3 * nll_sum, (loss_sum, nll_sum, correct)

  chunked = lambda h, w, b: tuple(loss.token_sums(h, w, b, targets, smoothing, chunk_length, kernels)[k]
                                  for k in ('loss', 'nll', 'correct'))
  whole = lambda h, w, b: _reference_sums(jnp.einsum('bld,vd->blv', h, w) + (0 if b is None else b), targets,
                                          smoothing)
  grad = lambda fn: jax.jit(jax.grad(functools.partial(objective, fn), argnums=(0, 1, 2), has_aux=True))(
      hidden, weights, bias)
  with pallas_mode.interpret_kernels():  # a GPU's loss kernel (`loss_kernel`), without a bias
    ours_grads, ours = grad(chunked)
  ref_grads, ref = grad(whole)
  np.testing.assert_allclose(ours, ref, rtol=RTOL)
  for a, b in zip(ours_grads, ref_grads):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * float(jnp.max(jnp.abs(b))))
  assert (float(jnp.max(jnp.abs(ours_grads[2]))) > 0) == with_bias  # no bias: none gets a gradient
  ours_h, ref_h = ours_grads[0], ref_grads[0]
  assert float(jnp.max(jnp.abs(ref_h[0, -4:]))) == 0.0 and float(jnp.max(jnp.abs(ours_h[0, -4:]))) == 0.0  # pads
  assert float(loss.token_sums(hidden, weights, None, targets, smoothing, chunk_length, kernels)['tokens']) == int(
      jnp.sum(targets > 0))


@pytest.mark.parametrize('with_bias', [False, True])
def test_on_a_gpu_the_forward_pass_reads_the_logits_in_one_reduction_alone(with_bias):
  # The log-sum-exp's max and sum of exponentials in one reduction; the smoothing term's logit sums come from
  # h · Σ_v W_v and, on a GPU, the gold logits from h · W_gold, so no gather reads the logits.
  hidden, weights, targets = _inputs()
  bias = jnp.zeros((weights.shape[0],), jnp.float32) if with_bias else None
  with jax.set_mesh(helpers.data_mesh(topologies.topology_devices('h100-1'))):
    jaxpr = jax.jit(lambda h, w: loss.token_sums(h, w, bias, targets, 0.1, 64, GPU)['loss']).trace(hidden,
                                                                                                  weights).jaxpr
  vocab = weights.shape[0]
  over_logits = lambda eqn: len(eqn.invars[0].aval.shape) > 2 and eqn.invars[0].aval.shape[-1] == vocab
  eqns = list(helpers.equations(jaxpr.jaxpr))
  assert [eqn.primitive.name for eqn in eqns if eqn.primitive.name.startswith('reduce') and over_logits(eqn)] == [
      'reduce']
  assert not [eqn for eqn in eqns if eqn.primitive.name == 'gather' and over_logits(eqn)]


@pytest.mark.parametrize('with_bias, loss_kernel', [(False, True), (True, True), (False, False)])
def test_on_a_gpu_the_gradient_pass_reads_the_logits_in_one_kernel_alone(with_bias, loss_kernel):
  # Differentiated, the maximum, log-sum-exp and gradient come from `loss_kernel`, which overwrites the logits with
  # the gradient: no reduction of XLA's reads them. With a logits bias, or `model.loss_kernel` off, XLA's reduction
  # and gradient pass instead.
  hidden, weights, targets = _inputs()
  bias = jnp.zeros((weights.shape[0],), jnp.float32) if with_bias else None
  kernels = helpers.kernels(platform='gpu', loss_kernel=loss_kernel)
  train = jax.grad(lambda h, w: loss.token_sums(h, w, bias, targets, 0.1, 64, kernels)['loss'], argnums=(0, 1))
  with jax.set_mesh(helpers.data_mesh(topologies.topology_devices('h100-1'))):
    jaxpr = jax.jit(train).trace(hidden, weights).jaxpr
  vocab = weights.shape[0]
  over_logits = lambda eqn: len(eqn.invars[0].aval.shape) > 2 and eqn.invars[0].aval.shape[-1] == vocab
  eqns = list(helpers.equations(jaxpr.jaxpr))
  calls = [eqn for eqn in eqns if eqn.primitive.name == 'pallas_call']
  reductions = [eqn for eqn in eqns if eqn.primitive.name.startswith('reduce') and over_logits(eqn)]
  assert (len(calls), len(reductions) > 0) == ((1, False) if loss_kernel and not with_bias else (0, True))


def test_the_one_pass_log_sum_exp_is_the_two_pass_one():
  """A running maximum with the sum of exponentials rescaled to it: the two reductions' values at any scale, with no
  overflow or NaN where a row's logits are far apart or all equal."""
  rng = np.random.default_rng(3)
  logits = np.concatenate([rng.normal(size=(3, 1000)) * scale for scale in (1.0, 30.0, 3e3)])
  logits = np.concatenate([logits, np.full((1, 1000), -7e4), np.eye(2, 1000) * 8e4], axis=0).astype(np.float32)
  one, two = (jax.jit(functools.partial(loss._top_and_lse, one_pass=p))(logits) for p in (True, False))
  assert np.all(np.isfinite(one[1]))
  np.testing.assert_array_equal(one[0], logits.max(axis=-1))
  np.testing.assert_allclose(one[1], two[1], rtol=1e-6)
  # A GPU's reduction may combine two starting values (threads without a logit of their own): no NaN.
  assert np.all(np.isfinite(loss._lse_combine(loss._LSE_START, loss._LSE_START)))


def test_bfloat16_gold_logits_are_rounded_as_the_logits_are():
  """On a GPU the gold logit from the gold tokens' weights is rounded to the logits' dtype, so a gold token whose
  logit is the (rounded) maximum counts as correct, as with the logits' own."""
  hidden, weights, targets = (x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x for x in _inputs(seed=3))
  logits = jnp.einsum('bld,vd->blv', hidden, weights)  # bfloat16, as the chunks' are
  targets = jnp.where(targets > 0, jnp.argmax(logits, axis=-1), 0)  # every gold logit a maximum, most rounded
  got = loss.token_sums(hidden, weights, None, targets, 0.1, 4, GPU)['correct']  # a GPU's computation, here
  assert float(got) == float(jnp.sum(targets > 0))


def test_the_loss_alone_differentiates_as_the_formula():
  """Only the loss differentiated (as the train step does): the NLL's cotangent is a symbolic zero."""
  hidden, weights, targets = _inputs(seed=1)
  ours = jax.grad(lambda h, w: loss.token_sums(h, w, None, targets, 0.1, 5, helpers.kernels())['loss'],
                  argnums=(0, 1))(hidden, weights)
  ref = jax.grad(lambda h, w: _reference_sums(jnp.einsum('bld,vd->blv', h, w), targets, 0.1)[0],
                 argnums=(0, 1))(hidden, weights)
  for a, b in zip(ours, ref):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize('share_embeddings,logits_bias', helpers.fast_tier(
    [(True, False), (False, False), (True, True)], fast=[(False, False), (True, True)]))
def test_model_loss_and_parameter_gradients_equal_those_through_the_logits(share_embeddings, logits_bias):
  """Through the model: the hidden states and pre-softmax weights (`return_hidden`) give the loss and every
  parameter's gradient of the logits path; with shared embeddings the table's gradient sums the lookups' and
  the pre-softmax layer's."""
  cfg = ModelConfig(vocab_size=37, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                    dropout=0.0, max_len=16, share_embeddings=share_embeddings, cpu_kernels='off',
                    loss_chunk_length=3, logits_bias=logits_bias)
  model = Transformer(cfg)
  rng = np.random.default_rng(2)
  inputs = jnp.asarray(rng.integers(1, 37, (2, 7)), jnp.int32)
  targets = jnp.asarray(rng.integers(1, 37, (2, 8)), jnp.int32).at[1, 5:].set(0)
  params = nn.unbox(model.init(jax.random.key(0), inputs, targets))['params']
  if logits_bias:  # initialised to zeros: give it values that matter
    params['decoder']['logits_bias'] = jnp.asarray(rng.normal(size=37), jnp.float32)

  def chunked(p):
    hidden, weights, bias = model.apply({'params': p}, inputs, targets, return_hidden=True)
    return loss.token_sums(hidden, weights, bias, targets, 0.1, cfg.loss_chunk_length, cfg.kernels)['loss']

  def whole(p):
    return _reference_sums(model.apply({'params': p}, inputs, targets), targets, 0.1)[0]

  ours, ours_grads = jax.jit(jax.value_and_grad(chunked))(params)
  ref, ref_grads = jax.jit(jax.value_and_grad(whole))(params)
  np.testing.assert_allclose(ours, ref, rtol=RTOL)
  flat_ours, flat_ref = jax.tree_util.tree_flatten_with_path(ours_grads)[0], jax.tree.leaves(ref_grads)
  for (path, a), b in zip(flat_ours, flat_ref):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * float(jnp.max(jnp.abs(b))), err_msg=str(path))
  table = 'shared_embedding' if share_embeddings else 'target_embedding'
  assert float(jnp.max(jnp.abs(ref_grads[table]['embedding']))) > 1e-3  # a real gradient reaches the table
  if not share_embeddings:
    assert params['decoder']['logits']['kernel'].shape == (16, 37)  # the untied layer's parameters as before
