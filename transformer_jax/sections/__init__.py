"""The config's sections, one module each: its keys with their defaults (`default_config`) and its checks
(`validate`). Leaves of the house: nothing here imports more than ml_collections and other leaves, so reading or
checking a config never loads JAX, the data pipeline, the training loop or inference. `transformer_jax.config`
assembles them; the model's section is `transformer_jax.model_config`."""
