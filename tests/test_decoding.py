"""Decoding on toy logits functions: a Markov chain (logits = table[previous token]) and a history
model whose cache stores every input so far. Both have an uncached NumPy twin that recomputes the
logits from the full prefix: the references (brute force, greedy, rescoring) use it, so agreement
checks the cache expansion and the reordering of beams."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.inference.decoding import (
  beam_search,
  expand_to_beams,
  greedy_search,
  length_penalty,
  sample,
)
from transformer_jax.core.tokens import BOS_ID, EOS_ID, PAD_ID

BANNED = (PAD_ID, BOS_ID)  # toys that never emit these make "PAD only after EOS" checkable


def np_log_softmax(logits):
  logits = np.asarray(logits, np.float64)
  top = logits.max()
  return logits - top - np.log(np.sum(np.exp(logits - top)))


def eos_shift(xp, vocab, step, bias, ramp):
  """Added to the logits at `step`: EOS gets bias + ramp * step (a ramp makes longer outputs likely)."""
  return xp.where(xp.arange(vocab) == EOS_ID, bias + ramp * step, 0.0)


class MarkovToy:
  """logits = table[previous token] (+ eos_shift); the cache is just a shared step counter."""

  def __init__(self, seed, vocab, *, eos_bias=0.0, eos_ramp=0.0, banned=BANNED, batch_size=1):
    self.table = np.random.default_rng(seed).normal(size=(vocab, vocab)) * 1.5
    self.table[:, list(banned)] = -np.inf
    self.eos, self.batch_size = (eos_bias, eos_ramp), batch_size

  def cache(self):
    return {"step": jnp.array(0, jnp.int32)}

  def logits_fn(self, tokens, cache):
    step = cache["step"]
    table = jnp.asarray(self.table, jnp.float32)
    return table[tokens[:, 0]] + eos_shift(jnp, len(self.table), step, *self.eos), {"step": step + 1}

  def prefix_logits(self, row, prefix):
    return self.table[prefix[-1]] + eos_shift(np, len(self.table), len(prefix) - 1, *self.eos)


class HistoryToy:
  """logits = source[row] + sum_t W[t, input_t] over all inputs so far (+ eos_shift); the cache
  keeps the inputs. Per-row history and source (like an encoder output), shared step counter."""

  def __init__(self, seed, vocab, max_len, *, eos_bias=0.0, eos_ramp=0.0, banned=BANNED, batch_size=1):
    rng = np.random.default_rng(seed)
    self.weights = rng.normal(size=(max_len, vocab, vocab)) * 0.4
    self.source = rng.normal(size=(batch_size, vocab)) * 1.5
    self.source[:, list(banned)] = -np.inf
    self.eos, self.max_len, self.batch_size = (eos_bias, eos_ramp), max_len, batch_size

  def cache(self):
    return {
      "inputs": jnp.zeros((self.batch_size, self.max_len), jnp.int32),
      "source": jnp.asarray(self.source, jnp.float32),
      "step": jnp.array(0, jnp.int32),
    }

  def logits_fn(self, tokens, cache):
    step = cache["step"]
    inputs = cache["inputs"].at[:, step].set(tokens[:, 0])
    positions = jnp.arange(self.max_len)
    per_position = jnp.asarray(self.weights, jnp.float32)[positions, inputs]  # [rows, len, vocab]
    seen = (positions <= step)[None, :, None]
    logits = cache["source"] + jnp.sum(jnp.where(seen, per_position, 0.0), axis=1)
    logits += eos_shift(jnp, logits.shape[-1], step, *self.eos)
    return logits, {**cache, "inputs": inputs, "step": step + 1}

  def prefix_logits(self, row, prefix):
    """Uncached: recomputed from the full prefix (BOS first)."""
    logits = self.source[row] + sum(self.weights[t, token] for t, token in enumerate(prefix))
    return logits + eos_shift(np, len(logits), len(prefix) - 1, *self.eos)


def log_prob(toy, row, seq):
  """Uncached log-probability of seq (up to and including its EOS, if any)."""
  prefix, total = [BOS_ID], 0.0
  for token in seq:
    total += np_log_softmax(toy.prefix_logits(row, prefix))[token]
    if token == EOS_ID:
      break
    prefix.append(token)
  return total


def strip(seq):
  """The tokens up to and including EOS; checks everything after EOS is PAD."""
  seq = [int(t) for t in seq]
  if EOS_ID not in seq:
    return seq
  end = seq.index(EOS_ID) + 1
  assert all(t == PAD_ID for t in seq[end:]), f"non-PAD token after EOS in {seq}"
  return seq[:end]


def pad(seq, length):
  return list(seq) + [PAD_ID] * (length - len(seq))


def make_toy(kind, seed, vocab, max_len, **kwargs):
  return MarkovToy(seed, vocab, **kwargs) if kind == "markov" else HistoryToy(seed, vocab, max_len, **kwargs)


def run_beam(toy, **kwargs):
  tokens, scores = beam_search(toy.logits_fn, toy.cache(), toy.batch_size, **kwargs)
  return np.asarray(tokens), np.asarray(scores)


def test_expand_to_beams_repeats_rows_and_keeps_shared_leaves():
  tree = {"rows": jnp.arange(6).reshape(2, 3), "step": jnp.array(7)}
  expanded = expand_to_beams(tree, 3)
  np.testing.assert_array_equal(expanded["rows"], np.repeat(np.arange(6).reshape(2, 3), 3, axis=0))
  assert expanded["step"].shape == () and int(expanded["step"]) == 7


def test_beam_size_one_with_alpha_zero_equals_greedy():
  toy = HistoryToy(1, 7, 10, eos_bias=-3.0, eos_ramp=0.5, batch_size=8)
  greedy = np.asarray(greedy_search(toy.logits_fn, toy.cache(), 8, max_decode_len=10))
  tokens, _ = run_beam(toy, beam_size=1, alpha=0.0, max_decode_len=10)  # alpha > 0 may beat greedy
  np.testing.assert_array_equal(tokens[:, 0], greedy)
  assert 0 < sum(EOS_ID in row for row in greedy) < 8  # both finished and unfinished rows


@pytest.mark.parametrize("kind, alpha", [("markov", 2.0), ("history", 0.0), ("history", 0.6), ("history", 2.0)])
def test_wide_beam_finds_brute_force_best(kind, alpha):
  vocab, max_len, n_best = 4, 4, 3
  toy = make_toy(kind, 3, vocab, max_len, banned=())
  others = [t for t in range(vocab) if t != EOS_ID]
  finished = [list(mid) + [EOS_ID] for n in range(max_len) for mid in itertools.product(others, repeat=n)]
  scored = sorted(((log_prob(toy, 0, s) / length_penalty(len(s), alpha), s) for s in finished), reverse=True)
  # At most 3**3 live prefixes * 4 tokens = 108 <= 128 expansions per step: the search is exhaustive.
  tokens, scores = run_beam(toy, beam_size=128, alpha=alpha, max_decode_len=max_len, n_best=n_best)
  assert [strip(t) for t in tokens[0]] == [s for _, s in scored[:n_best]]
  np.testing.assert_allclose(scores[0], [score for score, _ in scored[:n_best]], rtol=1e-5)


def test_finished_hypotheses_end_at_eos_are_padded_sorted_distinct_and_rescore():
  toy = HistoryToy(6, 8, 10, eos_bias=-3.0, eos_ramp=1.0, batch_size=3)
  tokens, scores = run_beam(toy, beam_size=4, alpha=0.6, max_decode_len=10, n_best=4)
  for row in range(3):
    hyps = [strip(t) for t in tokens[row]]
    assert all(h[-1] == EOS_ID and EOS_ID not in h[:-1] for h in hyps)
    assert all(PAD_ID not in h and BOS_ID not in h for h in hyps)
    assert len({tuple(h) for h in hyps}) == 4
    assert np.all(np.diff(scores[row]) <= 0)
    rescored = [log_prob(toy, row, h) / length_penalty(len(h), 0.6) for h in hyps]
    np.testing.assert_allclose(scores[row], rescored, rtol=1e-5)


def test_rows_without_eos_fall_back_to_live_beams():
  vocab, max_len = 4, 4
  toy = MarkovToy(2, vocab, banned=(EOS_ID,))
  others = [t for t in range(vocab) if t != EOS_ID]
  unfinished = [list(s) for s in itertools.product(others, repeat=max_len)]
  scored = sorted(((log_prob(toy, 0, s) / length_penalty(max_len, 0.6), s) for s in unfinished), reverse=True)
  tokens, scores = run_beam(toy, beam_size=81, alpha=0.6, max_decode_len=max_len, n_best=3)  # 3**4 beams
  assert [list(t) for t in tokens[0]] == [s for _, s in scored[:3]]
  np.testing.assert_allclose(scores[0], [score for score, _ in scored[:3]], rtol=1e-5)


def test_missing_finished_hypotheses_are_filled_with_live_beams_after_the_finished_ones():
  toy = MarkovToy(4, 6, banned=(PAD_ID, BOS_ID, EOS_ID))
  toy.table[BOS_ID, EOS_ID] = 0.0  # EOS is possible only as the first token
  tokens, scores = run_beam(toy, beam_size=4, alpha=0.6, max_decode_len=5, n_best=3)
  assert list(tokens[0, 0]) == pad([EOS_ID], 5)
  assert scores[0, 0] == pytest.approx(log_prob(toy, 0, [EOS_ID]) / length_penalty(1, 0.6), rel=1e-5)
  for seq, score in zip(tokens[0, 1:], scores[0, 1:]):
    assert EOS_ID not in seq and PAD_ID not in seq
    assert score == pytest.approx(log_prob(toy, 0, seq) / length_penalty(5, 0.6), rel=1e-5)


class CountingToy:
  """Wraps a toy and counts logits_fn calls on the host (once per decoding step)."""

  def __init__(self, toy):
    self.toy, self.calls, self.batch_size = toy, [], toy.batch_size

  def cache(self):
    return self.toy.cache()

  def logits_fn(self, tokens, cache):
    jax.debug.callback(lambda: self.calls.append(1))
    return self.toy.logits_fn(tokens, cache)


@pytest.mark.parametrize("kind, n_best", [("markov", 1), ("history", 1), ("history", 3)])
def test_early_stopping_changes_nothing(kind, n_best):
  max_len, counted, results = 12, {}, {}
  for early in (True, False):
    toy = CountingToy(make_toy(kind, 6, 9, max_len, eos_bias=-4.0, eos_ramp=1.0, batch_size=3))
    results[early] = run_beam(toy, max_decode_len=max_len, n_best=n_best, early_stopping=early)
    jax.effects_barrier()
    counted[early] = len(toy.calls)
  np.testing.assert_array_equal(results[True][0], results[False][0])
  np.testing.assert_allclose(results[True][1], results[False][1], rtol=1e-6)
  assert counted[True] < counted[False] == max_len


def test_batch_rows_decode_independently():
  toy = HistoryToy(7, 9, 7, eos_bias=-3.0, eos_ramp=1.0, batch_size=2)
  tokens, scores = run_beam(toy, beam_size=3, max_decode_len=7, n_best=2)
  decode_one_row = jax.jit(
    lambda cache: beam_search(toy.logits_fn, cache, 1, beam_size=3, max_decode_len=7, n_best=2)
  )
  for row in range(2):
    one_row_cache = jax.tree.map(lambda x: x if x.ndim == 0 else x[row : row + 1], toy.cache())
    one_tokens, one_scores = decode_one_row(one_row_cache)
    np.testing.assert_array_equal(tokens[row], one_tokens[0])
    np.testing.assert_allclose(scores[row], one_scores[0], rtol=1e-6)


def uncached_greedy(toy, row, max_len):
  seq = []
  while len(seq) < max_len and EOS_ID not in seq:
    seq.append(int(np.argmax(toy.prefix_logits(row, [BOS_ID] + seq))))
  return pad(seq, max_len)


def test_greedy_cached_equals_uncached_and_pads_after_eos():
  toy = HistoryToy(8, 7, 10, eos_bias=-3.0, eos_ramp=0.5, batch_size=6)
  tokens = np.asarray(greedy_search(toy.logits_fn, toy.cache(), 6, max_decode_len=10))
  assert [list(t) for t in tokens] == [uncached_greedy(toy, row, 10) for row in range(6)]
  assert any(EOS_ID in t and t[-1] == PAD_ID for t in tokens)


def test_each_row_stops_at_its_own_limit_and_is_otherwise_the_same():
  toy = HistoryToy(8, 7, 10, eos_bias=-3.0, eos_ramp=0.5, batch_size=6)
  unlimited = [strip(t) for t in np.asarray(greedy_search(toy.logits_fn, toy.cache(), 6, max_decode_len=10))]
  limits = [0, 1, 2, 3, 10, 10]
  for limited in (greedy_search(toy.logits_fn, toy.cache(), 6, max_decode_len=10, row_limits=jnp.asarray(limits)),
                  sample(toy.logits_fn, toy.cache(), 6, jax.random.key(0), max_decode_len=10, top_k=1,
                         row_limits=jnp.asarray(limits))):
    assert [list(t) for t in np.asarray(limited)] == [pad(seq[:limit], 10) for seq, limit in zip(unlimited, limits)]
  assert any(len(seq) > limit for seq, limit in zip(unlimited, limits))  # the limits cut something


@pytest.mark.parametrize("early_stopping", [True, False])
def test_each_row_of_a_beam_search_stops_at_its_own_limit_as_if_searched_alone(early_stopping):
  """Beam search with row limits: each row's hypotheses and scores are those of the same row searched with its limit
  as max_decode_len (and PAD beyond it)."""
  toy = HistoryToy(8, 7, 10, eos_bias=-3.0, eos_ramp=0.5, batch_size=6)
  limits = [1, 2, 3, 5, 10, 10]
  tokens, scores = run_beam(toy, beam_size=3, alpha=0.6, max_decode_len=10, n_best=2,
                            row_limits=jnp.asarray(limits), early_stopping=early_stopping)
  cut = 0
  for row, limit in enumerate(limits):
    alone_tokens, alone_scores = run_beam(toy, beam_size=3, alpha=0.6, max_decode_len=limit, n_best=2)
    assert [list(t) for t in tokens[row]] == [pad(t, 10) for t in alone_tokens[row].tolist()]
    np.testing.assert_allclose(scores[row], alone_scores[row], rtol=1e-6)
    unlimited = strip(run_beam(toy, beam_size=3, alpha=0.6, max_decode_len=10)[0][row, 0])
    cut += len(unlimited) > limit
  assert cut  # the limits changed some rows' results


@pytest.mark.parametrize("temperature, top_k, top_p", [(2.0, 1, 1.0), (1.0, 0, 1e-6), (0.5, 3, 1e-6)])
def test_sampling_with_top_k_one_or_tiny_top_p_is_greedy(temperature, top_k, top_p):
  toy = HistoryToy(9, 7, 10, eos_bias=-3.0, eos_ramp=0.5, batch_size=6)
  sampled = sample(
    toy.logits_fn, toy.cache(), 6, jax.random.key(0), max_decode_len=10,
    temperature=temperature, top_k=top_k, top_p=top_p,
  )
  assert [list(t) for t in np.asarray(sampled)] == [uncached_greedy(toy, row, 10) for row in range(6)]


def expected_distribution(logits, temperature, top_k, top_p):
  """softmax(logits / T) restricted to the top_k tokens, then to the smallest most-likely set
  with mass >= top_p, renormalised; computed independently in NumPy."""
  probs = np.exp(np_log_softmax(np.asarray(logits) / temperature))
  order = np.argsort(-probs)
  keep = np.zeros_like(probs, bool)
  keep[order[: top_k or len(probs)]] = True
  probs = np.where(keep, probs, 0.0) / probs[keep].sum()
  mass_before = np.cumsum(probs[order]) - probs[order]
  keep[order[mass_before >= top_p]] = False
  probs = np.where(keep, probs, 0.0)
  return probs / probs.sum()


@pytest.mark.parametrize(
  "temperature, top_k, top_p",
  [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 0, 1.0), (1.0, 2, 1.0), (1.0, 0, 0.7), (1.5, 3, 0.8)],
)
def test_sampled_one_step_distribution_matches_filtered_softmax(temperature, top_k, top_p):
  logits = np.array([0.0, 1.0, 2.0, -1.0, 0.5])
  n = 20_000
  fixed = lambda tokens, cache: (jnp.tile(jnp.asarray(logits, jnp.float32), (n, 1)), cache)
  tokens = sample(
    fixed, (), n, jax.random.key(42), max_decode_len=1, temperature=temperature, top_k=top_k, top_p=top_p
  )
  frequencies = np.bincount(np.asarray(tokens[:, 0]), minlength=len(logits)) / n
  expected = expected_distribution(logits, temperature, top_k, top_p)
  np.testing.assert_allclose(frequencies, expected, atol=0.02)  # ~6 standard deviations
  if (temperature, top_k, top_p) != (1.0, 0, 1.0):  # the check can tell the settings apart
    assert np.abs(expected - expected_distribution(logits, 1.0, 0, 1.0)).max() > 0.05


def test_everything_works_under_jit():
  toy = HistoryToy(10, 7, 8, eos_bias=-3.0, eos_ramp=1.0, batch_size=2)

  @jax.jit
  def decode_all(cache, rng):
    return (
      beam_search(toy.logits_fn, cache, 2, beam_size=3, max_decode_len=8, n_best=2),
      greedy_search(toy.logits_fn, cache, 2, max_decode_len=8),
      sample(toy.logits_fn, cache, 2, rng, max_decode_len=8, top_k=1),
    )

  (beam_tokens, beam_scores), greedy, sampled = decode_all(toy.cache(), jax.random.key(1))
  expected_greedy = [uncached_greedy(toy, row, 8) for row in range(2)]
  assert [list(t) for t in np.asarray(greedy)] == expected_greedy
  assert [list(t) for t in np.asarray(sampled)] == expected_greedy
  for row in range(2):
    hyps = [strip(t) for t in np.asarray(beam_tokens[row])]
    rescored = [log_prob(toy, row, h) / length_penalty(len(h), 0.6) for h in hyps]
    np.testing.assert_allclose(beam_scores[row], rescored, rtol=1e-5)


def test_bad_arguments_raise_clear_errors():
  toy = HistoryToy(11, 5, 4, batch_size=2)
  bad_cache = {**toy.cache(), "odd": jnp.zeros((5,))}
  with pytest.raises(ValueError, match=r"\['odd'\] has shape \(5,\)"):
    beam_search(toy.logits_fn, bad_cache, 2, max_decode_len=4)
  with pytest.raises(ValueError, match="n_best"):
    beam_search(toy.logits_fn, toy.cache(), 2, beam_size=2, n_best=3, max_decode_len=4)
  with pytest.raises(ValueError, match="max_decode_len"):
    greedy_search(toy.logits_fn, toy.cache(), 2, max_decode_len=0)
