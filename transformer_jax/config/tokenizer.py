"""The `tokenizer` section: the SentencePiece model a run trains on its data (`transformer_jax.data.tokenizer`)."""

import ml_collections

from transformer_jax.core.tokens import NUM_RESERVED

MODEL_TYPES = ('bpe', 'unigram')


def default_config() -> ml_collections.ConfigDict:
  """BPE as in the paper, a vocabulary that trains in seconds on ~100k pairs."""
  return ml_collections.ConfigDict({
      'vocab_size': 8000,  # number of pieces incl. the 4 reserved ids; WMT configs use 37000
      'model_type': 'bpe',  # 'bpe' (paper) or 'unigram'
      'sample_size': 400_000,  # max sentences (both sides counted; or documents) sampled to train on
      'seed': 0,  # seeds the choice of the training sample
      'character_coverage': 1.0,  # keep every character seen in the sample
  })


def validate(config: ml_collections.ConfigDict):
  if config.model_type not in MODEL_TYPES:
    raise ValueError(f'tokenizer.model_type={config.model_type!r}; set it to one of {MODEL_TYPES}.')
  if config.vocab_size <= NUM_RESERVED:
    raise ValueError(f'tokenizer.vocab_size={config.vocab_size} leaves no room besides the'
                     f' {NUM_RESERVED} reserved ids; set it to e.g. 8000.')
  if config.sample_size < 2:
    raise ValueError(f'tokenizer.sample_size={config.sample_size}; set it to at least 2 sentences.')
