"""transformer_jax: the Transformer of "Attention Is All You Need" in JAX/Flax."""
