"""The old name of `transformer_jax.scores`, kept while evaluation.py still imports it; delete with that import."""

from transformer_jax.scores import sacrebleu_corpus, tokenized_bleu, write_translations  # noqa: F401
