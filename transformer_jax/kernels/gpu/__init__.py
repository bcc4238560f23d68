"""A GPU's own implementations of the model's ops: Pallas kernels."""
