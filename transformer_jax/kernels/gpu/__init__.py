"""A GPU's own implementations of the model's ops: Pallas kernels on its Triton backend, which jax 0.11 deprecated.
Each has a maintained path beside it, one model setting away (`model.attention='dot_product'` or 'chunked',
`model.residual_norm_kernel=False`, `model.loss_kernel=False`), which a GPU times before it becomes the default."""
