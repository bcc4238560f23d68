"""The named ops the model calls and their implementations: attention masks and dropout bits shared by every
platform, and the CPU's, GPU's and TPU's own kernels (`cpu/`, `gpu/`, `tpu/`). Nothing here imports the model."""
