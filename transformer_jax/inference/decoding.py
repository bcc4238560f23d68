"""Autoregressive decoding: beam search (paper §6.1), greedy search and sampling.

Every function drives a `logits_fn(tokens [rows, 1], cache) -> (logits [rows, vocab], cache)`
inside one `jax.lax.while_loop`, so the whole decode jits with `logits_fn` closed over.
The first input token of every row is BOS_ID, or the row's `first_tokens` entry (a language model
continuing a prompt starts from the prompt's last token). Outputs are int32 token ids; the EOS that
ends a sequence is kept and every position after it is PAD_ID.

The cache is any pytree. Every leaf with ndim >= 1 is per-row: its leading dimension is the number
of rows logits_fn is called with, and decoding reorders it when beams are reordered. Leaves with
ndim 0 (e.g. a step counter) are shared by all rows and left alone. All three functions take the
cache for `batch_size` rows; `beam_search` expands it to batch*beam rows itself. An ensemble is one
logits_fn too (`generation.ensemble_logits_fn`: a tuple of the members' caches).
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from transformer_jax.core.tokens import BOS_ID, EOS_ID, PAD_ID
from transformer_jax.model.transformer import MASKED_LOGIT

PyTree = Any
LogitsFn = Callable[[jax.Array, PyTree], tuple[jax.Array, PyTree]]


def expand_to_beams(tree: PyTree, beam_size: int) -> PyTree:
  """Repeats every per-row leaf beam_size times along axis 0: row b*beam_size + k is a copy of row b.

  Use it for anything logits_fn closes over per batch row (e.g. encoder output and its mask),
  since beam_search calls logits_fn with batch*beam rows in that order.
  """
  return jax.tree.map(lambda x: x if jnp.ndim(x) == 0 else jnp.repeat(x, beam_size, axis=0), tree)


def _check_cache(cache: PyTree, rows: int) -> None:
  """Fails early, with the offending shape, on a leaf that is neither shared nor per-row."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
    shape = jnp.shape(leaf)
    if shape and shape[0] != rows:
      raise ValueError(
        f"cache leaf {jax.tree_util.keystr(path)} has shape {shape}: per-row leaves need "
        f"leading dimension {rows} (the batch size), shared leaves must have ndim 0"
      )


def _check_lengths(batch_size: int, max_decode_len: int) -> None:
  if batch_size < 1 or max_decode_len < 1:
    raise ValueError(f"need batch_size >= 1 and max_decode_len >= 1, got {batch_size}, {max_decode_len}")


def _first_tokens(first_tokens, batch_size: int) -> jax.Array:
  """Each row's first input, [batch]: BOS_ID unless given."""
  if first_tokens is None:
    return jnp.full((batch_size,), BOS_ID, jnp.int32)
  first_tokens = jnp.asarray(first_tokens, jnp.int32)
  if first_tokens.shape != (batch_size,):
    raise ValueError(f"first_tokens has shape {first_tokens.shape}; it needs one token per row, ({batch_size},)")
  return first_tokens


def _row_limits(row_limits, batch_size: int, max_decode_len: int) -> jax.Array:
  """Each row's most tokens, [batch]: max_decode_len unless given (and never more)."""
  if row_limits is None:
    return jnp.full((batch_size,), max_decode_len, jnp.int32)
  return jnp.minimum(jnp.asarray(row_limits, jnp.int32), max_decode_len)


def _previous_tokens(seqs: jax.Array, step: jax.Array, first_tokens: jax.Array) -> jax.Array:
  """The decoder input at `step`: first_tokens (broadcast to seqs' rows) at step 0, else the token
  generated at step - 1."""
  last = jax.lax.dynamic_index_in_dim(seqs, jnp.maximum(step - 1, 0), axis=-1, keepdims=False)
  return jnp.where(step == 0, first_tokens, last)


def _log_probs(logits_fn: LogitsFn, tokens: jax.Array, cache: PyTree) -> tuple[jax.Array, PyTree]:
  """One decoder step: float32 log-softmax of the next-token logits, and the updated cache."""
  logits, cache = logits_fn(tokens[:, None], cache)
  return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), cache


# ----------------------------------------------------------------------------------------------
# Beam search


def length_penalty(length, alpha):
  """GNMT length penalty lp = ((5 + length) / 6) ** alpha; a hypothesis scores log_prob / lp."""
  return ((5.0 + length) / 6.0) ** alpha


class _BeamState(NamedTuple):
  step: jax.Array  # tokens generated so far
  live_seqs: jax.Array  # [batch, beam, max_len] hypotheses without EOS
  live_logprobs: jax.Array  # [batch, beam]; -inf marks an empty beam
  finished_seqs: jax.Array  # [batch, n_best, max_len] hypotheses ending with EOS, best first
  finished_scores: jax.Array  # [batch, n_best] length-penalised; -inf marks an empty slot
  cache: PyTree  # batch*beam rows


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
  """Per batch row, picks entries idx [batch, n] along axis 1 of x [batch, m, ...]."""
  return x[jnp.arange(x.shape[0])[:, None], idx]


def _reorder_cache(cache: PyTree, beam_idx: jax.Array) -> PyTree:
  """Beam k of batch row b takes the per-row cache of beam beam_idx[b, k] of the same row."""
  batch_size, beam_size = beam_idx.shape
  rows = (jnp.arange(batch_size)[:, None] * beam_size + beam_idx).reshape(-1)
  return jax.tree.map(lambda x: x if jnp.ndim(x) == 0 else x[rows], cache)


def _top_by_score(scores: jax.Array, seqs: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """The k best (scores [batch, m], seqs [batch, m, len]) per batch row, best first."""
  top_scores, idx = jax.lax.top_k(scores, k)
  return top_scores, _take(seqs, idx)


def _beam_step(state: _BeamState, logits_fn: LogitsFn, alpha, eos_id, first_tokens, limits) -> _BeamState:
  """Expands every live beam by every token and keeps the best live and finished hypotheses; a batch row that has
  its `limits` tokens ([batch]) is left as it is.

  As in fairseq, an EOS expansion finishes a hypothesis only if it ranks within the top
  beam_size expansions of its batch row, so beam_size=1 with alpha=0 is exactly greedy search.
  """
  batch_size, beam_size, _ = state.live_seqs.shape
  n_best = state.finished_scores.shape[1]
  prev = _previous_tokens(state.live_seqs, state.step, first_tokens[:, None]).reshape(-1)
  log_probs, cache = _log_probs(logits_fn, prev, state.cache)
  vocab = log_probs.shape[-1]
  expansions = state.live_logprobs[..., None] + log_probs.reshape(batch_size, beam_size, vocab)
  # At most beam_size of the best 2*beam_size expansions end in EOS (one per beam), so at
  # least beam_size of them can stay live.
  cand_logprobs, flat_idx = jax.lax.top_k(expansions.reshape(batch_size, -1), 2 * beam_size)
  cand_beams, cand_tokens = flat_idx // vocab, flat_idx % vocab
  cand_seqs = _take(state.live_seqs, cand_beams).at[:, :, state.step].set(cand_tokens)
  is_eos = cand_tokens == eos_id

  finishing = is_eos & (jnp.arange(2 * beam_size) < beam_size)
  cand_scores = jnp.where(finishing, cand_logprobs / length_penalty(state.step + 1, alpha), -jnp.inf)
  finished_scores, finished_seqs = _top_by_score(
    jnp.concatenate([state.finished_scores, cand_scores], axis=1),
    jnp.concatenate([state.finished_seqs, cand_seqs], axis=1),
    n_best,
  )

  live_logprobs, live_idx = jax.lax.top_k(jnp.where(is_eos, -jnp.inf, cand_logprobs), beam_size)
  growing = state.step < limits  # [batch]
  keep = lambda new, old: jnp.where(growing.reshape(-1, *[1] * (new.ndim - 1)), new, old)
  beam_idx = keep(_take(cand_beams, live_idx), jnp.arange(beam_size)[None])
  return _BeamState(
    step=state.step + 1,
    live_seqs=keep(_take(cand_seqs, live_idx), state.live_seqs),
    live_logprobs=keep(live_logprobs, state.live_logprobs),
    finished_seqs=keep(finished_seqs, state.finished_seqs),
    finished_scores=keep(finished_scores, state.finished_scores),
    cache=_reorder_cache(cache, beam_idx),
  )


def _beam_can_improve(state: _BeamState, alpha, limits: jax.Array) -> jax.Array:
  """False once, in every batch row short of its `limits` tokens, no live beam can beat the worst of the n best
  finished.

  Log-probs only decrease as a beam grows and lp grows with length, so a live beam's best
  possible score is live_logprob / lp(its row's limit).
  """
  best_live = state.live_logprobs.max(axis=1) / length_penalty(limits, alpha)
  return jnp.any((state.step < limits) & (best_live >= state.finished_scores[:, -1]))


def _beam_results(state: _BeamState, alpha, limits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The finished hypotheses of each batch row, best first, then, in slots no finished one
  filled, the best live beams (scored with the length penalty at their current length)."""
  n_best = state.finished_scores.shape[1]
  lengths = jnp.minimum(state.step, limits)[:, None]
  live_scores = state.live_logprobs[:, :n_best] / length_penalty(lengths, alpha)
  n_finished = jnp.sum(state.finished_scores > -jnp.inf, axis=1, keepdims=True)
  slot = jnp.arange(n_best)[None, :]
  idx = jnp.where(slot < n_finished, slot, n_best + slot - n_finished)
  seqs = jnp.concatenate([state.finished_seqs, state.live_seqs[:, :n_best]], axis=1)
  scores = jnp.concatenate([state.finished_scores, live_scores], axis=1)
  return _take(seqs, idx), _take(scores, idx)


def beam_search(
  logits_fn: LogitsFn,
  cache: PyTree,
  batch_size: int,
  *,
  beam_size: int = 4,
  alpha: float = 0.6,
  max_decode_len: int,
  eos_id: int = EOS_ID,
  n_best: int = 1,
  early_stopping: bool = True,
  first_tokens: jax.Array | None = None,
  row_limits: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Beam search with the GNMT length penalty; returns tokens [batch, n_best, max_decode_len]
  and scores [batch, n_best] (log_prob / lp(length incl. EOS)), best first.

  `cache` holds batch_size rows and is expanded here; logits_fn is called with batch*beam rows
  (row b*beam_size + k is beam k of batch row b, see expand_to_beams). A batch row with fewer
  than n_best finished hypotheses at max_decode_len fills the rest with live beams (no EOS).
  Slots scored -inf are empty (fewer distinct hypotheses exist than n_best). Stops early once no
  live beam can change the n best; early_stopping=False runs all max_decode_len steps (for
  checking that this changes nothing). alpha must be >= 0 for the early stop to be exact.
  first_tokens: [batch] each row's first input (default BOS_ID), shared by its beams; row_limits: [batch] each
  row's most tokens (at most max_decode_len; default max_decode_len), where its search ends as at max_decode_len.
  """
  _check_lengths(batch_size, max_decode_len)
  if not 1 <= n_best <= beam_size:
    raise ValueError(f"need 1 <= n_best <= beam_size, got n_best={n_best}, beam_size={beam_size}")
  _check_cache(cache, batch_size)
  first_tokens = _first_tokens(first_tokens, batch_size)
  first_beam_only = jnp.where(jnp.arange(beam_size) == 0, 0.0, -jnp.inf)  # all beams start equal
  init = _BeamState(
    step=jnp.array(0, jnp.int32),
    live_seqs=jnp.full((batch_size, beam_size, max_decode_len), PAD_ID, jnp.int32),
    live_logprobs=jnp.tile(first_beam_only, (batch_size, 1)),
    finished_seqs=jnp.full((batch_size, n_best, max_decode_len), PAD_ID, jnp.int32),
    finished_scores=jnp.full((batch_size, n_best), -jnp.inf, jnp.float32),
    cache=expand_to_beams(cache, beam_size),
  )

  limits = _row_limits(row_limits, batch_size, max_decode_len)

  def cond(state):
    running = state.step < max_decode_len
    return running & _beam_can_improve(state, alpha, limits) if early_stopping else running

  final = jax.lax.while_loop(cond, lambda state: _beam_step(state, logits_fn, alpha, eos_id, first_tokens, limits),
                             init)
  return _beam_results(final, alpha, limits)


# ----------------------------------------------------------------------------------------------
# Greedy search and sampling: one token per row and step


class _SampleState(NamedTuple):
  step: jax.Array  # tokens generated so far
  seqs: jax.Array  # [batch, max_len]
  done: jax.Array  # [batch] bool: the row has produced EOS or its most tokens
  cache: PyTree


def _decode_token_by_token(
  logits_fn: LogitsFn,
  cache: PyTree,
  batch_size: int,
  max_decode_len: int,
  eos_id,
  choose: Callable[[jax.Array, jax.Array], jax.Array],
  first_tokens: jax.Array | None,
  row_limits: jax.Array | None,
) -> jax.Array:
  """Appends choose(log_probs [batch, vocab], step) -> tokens [batch] to every unfinished row until each row
  produced EOS or its `row_limits` tokens ([batch], at most max_decode_len; default max_decode_len); returns tokens
  [batch, max_decode_len] (PAD after a row's end)."""
  _check_lengths(batch_size, max_decode_len)
  _check_cache(cache, batch_size)
  first_tokens = _first_tokens(first_tokens, batch_size)
  limits = _row_limits(row_limits, batch_size, max_decode_len)

  def body(state):
    tokens = _previous_tokens(state.seqs, state.step, first_tokens)
    log_probs, cache = _log_probs(logits_fn, tokens, state.cache)
    tokens = jnp.where(state.done, PAD_ID, choose(log_probs, state.step).astype(jnp.int32))
    return _SampleState(
      step=state.step + 1,
      seqs=state.seqs.at[:, state.step].set(tokens),
      done=state.done | (tokens == eos_id) | (state.step + 1 >= limits),
      cache=cache,
    )

  init = _SampleState(
    step=jnp.array(0, jnp.int32),
    seqs=jnp.full((batch_size, max_decode_len), PAD_ID, jnp.int32),
    done=limits <= 0,
    cache=cache,
  )
  cond = lambda state: (state.step < max_decode_len) & ~jnp.all(state.done)
  return jax.lax.while_loop(cond, body, init).seqs


def greedy_search(
  logits_fn: LogitsFn,
  cache: PyTree,
  batch_size: int,
  *,
  max_decode_len: int,
  eos_id: int = EOS_ID,
  first_tokens: jax.Array | None = None,
  row_limits: jax.Array | None = None,
) -> jax.Array:
  """Picks the most likely next token at every step; returns tokens [batch, max_decode_len].

  first_tokens: [batch] each row's first input (default BOS_ID); row_limits: [batch] each row's most tokens.
  """
  choose = lambda log_probs, step: jnp.argmax(log_probs, axis=-1)
  return _decode_token_by_token(logits_fn, cache, batch_size, max_decode_len, eos_id, choose, first_tokens,
                                row_limits)


def filter_logits(logits: jax.Array, temperature=1.0, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
  """Divides logits [..., vocab] by temperature, then sets to MASKED_LOGIT all but the top_k tokens
  (0 = off) and all but the smallest set of most likely tokens with probability >= top_p (1.0 = off).

  top_k and top_p must be Python numbers (they decide shapes and which filters run).
  """
  logits = logits / temperature
  if top_k > 0:
    kth_best = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0][..., -1:]
    logits = jnp.where(logits < kth_best, MASKED_LOGIT, logits)
  if top_p < 1.0:
    sorted_logits = jnp.flip(jnp.sort(logits, axis=-1), axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs  # the most likely token is always kept
    cutoff = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, MASKED_LOGIT, logits)
  return logits


def sample(
  logits_fn: LogitsFn,
  cache: PyTree,
  batch_size: int,
  rng: jax.Array,
  *,
  max_decode_len: int,
  temperature=1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  eos_id: int = EOS_ID,
  first_tokens: jax.Array | None = None,
  row_limits: jax.Array | None = None,
) -> jax.Array:
  """Samples each next token from softmax(filter_logits(logits)); returns tokens [batch, max_decode_len].

  temperature > 0 (it may be traced); top_k (0 = off) and top_p (1.0 = off) as in filter_logits;
  first_tokens: [batch] each row's first input (default BOS_ID); row_limits: [batch] each row's most tokens.
  """

  def choose(log_probs, step):
    filtered = filter_logits(log_probs, temperature, top_k, top_p)
    return jax.random.categorical(jax.random.fold_in(rng, step), filtered, axis=-1)

  return _decode_token_by_token(logits_fn, cache, batch_size, max_decode_len, eos_id, choose, first_tokens,
                                row_limits)
