"""Prints the devices JAX computes on, as every tool starts it: python -m transformer_jax.devices

`[CpuDevice(id=0)]`, `[CudaDevice(id=0), ...]` or `[TpuDevice(id=0, ...), ...]`, and nothing else: on a machine
without GPU or TPU device files (and no JAX_PLATFORMS) only JAX's CPU backend starts, so an installed CUDA plugin
or libtpu does not log its failed start-up (`runtime.backends`).
"""

import jax
from absl import app

from transformer_jax import cli


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}.')
  print(jax.devices())


if __name__ == '__main__':
  cli.run(main)
