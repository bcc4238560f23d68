"""XLA:CPU's own implementations of the model's ops."""
