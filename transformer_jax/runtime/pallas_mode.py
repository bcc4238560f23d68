"""Whether our Pallas kernels (attention, the residual blocks' LayerNorm, the loss) are traced for their
accelerator or in interpret mode, which a CPU can execute: tests enter `interpret_kernels`."""

import contextlib
import contextvars

_INTERPRET = contextvars.ContextVar('interpret_kernels', default=False)


@contextlib.contextmanager
def interpret_kernels():
  """Kernels traced inside run in Pallas interpret mode, which a CPU can execute: for tests.

  Outside it the kernels are traced for their accelerator (also on a CPU host compiling for a TPU slice or a GPU,
  or under `jax.eval_shape`); compiling them for a CPU then fails with Pallas's "Only interpret mode is supported".
  """
  token = _INTERPRET.set(True)
  try:
    yield
  finally:
    _INTERPRET.reset(token)


def interpreting() -> bool:
  """Whether kernels traced now run in interpret mode (inside `interpret_kernels`)."""
  return _INTERPRET.get()
