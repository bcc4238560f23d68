"""Ensembles: models over one vocabulary whose next-token distributions combine as the mean of their log-softmaxes
(fairseq's and Marian's ensembles). A single model is an ensemble of one member; every path goes through here
(decoding combines the members' logits functions with `generation.ensemble_logits_fn`).

The mean of log-softmaxes is the log of a product of experts, unnormalised; the decoding functions and the loss
take a log-softmax of what they are given, which renormalises it. For one member it is that model's log-softmax,
and for identical members it equals the single model exactly ((a + a) / 2 = a in floating point).
"""

from typing import Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Member:
  """One model of an ensemble: the module (static: part of a compiled program's identity) and its params."""

  model: nn.Module = flax.struct.field(pytree_node=False)  # a Transformer or a LanguageModel
  params: dict


def of_one(model: nn.Module, params) -> tuple[Member]:
  """One model as the members tuple that teacher-forced evaluation and decoding take (params or their shardings)."""
  return (Member(model, params),)


def mean_log_softmax(logits: Sequence[jax.Array]) -> jax.Array:
  """The mean over members of float32 log-softmax(logits [..., vocab])."""
  return sum(jax.nn.log_softmax(x.astype(jnp.float32), axis=-1) for x in logits) / len(logits)


def teacher_forced_log_probs(members: Sequence[Member], model_inputs: dict) -> jax.Array:
  """The ensemble's [batch, length, vocab] scores of teacher-forced targets (dropout off)."""
  return mean_log_softmax([m.model.apply({'params': m.params}, **model_inputs, deterministic=True) for m in members])
