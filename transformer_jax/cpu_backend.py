"""The XLA:CPU backend's speed-ups, behind one seam: hand-written backward passes, dropout masks from fewer random
bits, host-memory reuse, and checkpoint saves that copy each array once.

The model uses stock JAX/Flax pieces on every backend. When the run's devices are CPUs (`model.cpu_kernels='auto'`,
the default; 'on'/'off' force it) its projections (`dot_general`, for `nn.DenseGeneral`) take a backward pass
written for XLA:CPU's layouts, with the same values as autodiff (tested), and its dropout masks
(`dropout_masks.sixteen_bit_keep`) come from a quarter of bernoulli's random work. The pre-softmax layer and the
loss have one implementation on every backend, `loss.token_sums`, whose gradient contracts in the layout-friendly
order.
Measured gains, on the CPU and forced on elsewhere, are in bench/RESULTS.md; 'auto' keeps the projections' backward
pass to the CPU until a kernel-by-kernel measurement on each accelerator says which to keep where.

One piece is not a speed-up and not optional: `einsum_f32`, the products with float32 results from compute-dtype
operands, which XLA:CPU cannot run for bf16 ones.
"""

import ctypes
import functools
import glob
import os

import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp

from transformer_jax import sharding
from transformer_jax.model_config import CPU_KERNELS

_CONTRACTION = 'contraction'  # checkpoint name of a projection's output, saved by the dot remat policies


def enabled(setting: str) -> bool:
  """Whether `model.cpu_kernels=setting` (`model_config.CPU_KERNELS`) means the CPU kernels, decided when the step
  is traced: 'auto' from the devices it is traced for (`sharding.target_platform`), never from the host's."""
  if setting not in CPU_KERNELS:
    raise ValueError(f'model.cpu_kernels={setting!r} is not one of {CPU_KERNELS}.')
  return setting == 'on' or (setting == 'auto' and sharding.target_platform() == 'cpu')


def einsum_f32(subscripts: str, a, b):
  """`jnp.einsum` of compute-dtype operands with float32 accumulation and result. XLA:CPU has no product of bf16
  operands with a float32 result (the step fails when it runs), so a step traced for a CPU casts the operands to
  float32 first (f16 ones too, for one rule): the same products exactly (a bf16 or f16 product fits float32's
  mantissa), and gradients that are float32 products too. On accelerators the operands stay in their dtype."""
  if sharding.target_platform() == 'cpu':
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  return jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32)


# --------------------------------------------------------------------------------------- projections


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _contract(x, kernel, num_in):
  return jnp.tensordot(x, kernel, axes=num_in)


def _contract_fwd(x, kernel, num_in):
  return _contract(x, kernel, num_in), (x, kernel)


def _contract_bwd(num_in, residuals, g):
  """dx = g · Wᵀ and dW = xᵀ · g. Autodiff's form makes XLA:CPU materialise the cotangent g transposed, fused
  with the dropout backward before it (re-read in a cache-hostile order); this form transposes only the saved
  input x."""
  x, kernel = residuals
  num_batch = x.ndim - num_in
  dx = jnp.tensordot(g, kernel, axes=(tuple(range(num_batch, g.ndim)), tuple(range(num_in, kernel.ndim))))
  d_kernel = jnp.tensordot(x, g, axes=(tuple(range(num_batch)), tuple(range(num_batch))))
  return dx, d_kernel


_contract.defvjp(_contract_fwd, _contract_bwd)


def dot_general(x, kernel, dimension_numbers, precision=None, preferred_element_type=None):
  """`nn.DenseGeneral`'s dot_general: x's last axes against the kernel's first through the CPU backward pass
  (any other contraction goes to `jax.lax.dot_general` unchanged)."""
  (lhs_contract, rhs_contract), (lhs_batch, _) = dimension_numbers
  num_in = len(lhs_contract)
  if (tuple(lhs_contract) != tuple(range(x.ndim - num_in, x.ndim)) or tuple(rhs_contract) != tuple(range(num_in))
      or lhs_batch or precision is not None or preferred_element_type is not None):
    return jax.lax.dot_general(x, kernel, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
  return checkpoint_name(_contract(x, kernel, num_in), _CONTRACTION)


def remat_policy(policy):
  """A stock dot remat policy that also saves the projections above (it cannot see dots inside a custom_vjp)."""
  if policy is None:
    return None
  return jax.checkpoint_policies.save_from_both_policies(
      policy, jax.checkpoint_policies.save_only_these_names(_CONTRACTION))


# --------------------------------------------------------------------------------------- host memory

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_ACCELERATOR_DEVICES = ('/dev/nvidia[0-9]*', '/dev/kfd', '/dev/accel[0-9]*', '/dev/vfio/[0-9]*')  # GPUs, TPUs


def reuse_host_memory() -> bool:
  """Makes glibc keep freed memory for reuse instead of returning it to the kernel; True if it applied.

  With glibc's defaults a block over 32 MiB is mmap'ed on malloc and unmapped on free, so XLA:CPU's temp buffer
  of a whole jitted step is fresh memory every step: one page fault per 4 KiB page plus the kernel zeroing it
  (bench/RESULTS.md has the cost). One arena, no mmap and
  no trimming make later steps reuse the heap; the process keeps its peak heap size. Call it before JAX starts
  its threads (so they share the main arena). False where the C library is not glibc.
  """
  try:
    mallopt = ctypes.CDLL('libc.so.6').mallopt
  except (OSError, AttributeError):
    return False
  never_trim = -1  # read by glibc as SIZE_MAX
  return bool(mallopt(_M_ARENA_MAX, 1) and mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, never_trim))


def replica_parallel_saves() -> bool:
  """Whether checkpoint saves keep orbax's replica-parallel writes (its default except on GPUs: each replicated
  array split over its replicas, so that devices and hosts share the copies off the accelerators). Not on the CPU:
  its devices are one host memory, where the split only adds a dispatched slice per replica and array
  (`bench.checkpoint_saves` measures it)."""
  return jax.default_backend() != 'cpu'


def will_run_on_cpu(platforms: str | None = None) -> bool:
  """Whether JAX will compute on the CPU, decided before any backend starts (JAX_PLATFORMS, else whether the
  machine has GPU or TPU device files; an installed plugin without its hardware falls back to the CPU):
  `train.py --host_memory=auto` reuses host memory only then."""
  if platforms is None:
    platforms = os.environ.get('JAX_PLATFORMS') or jax.config.jax_platforms or ''
  if platforms:
    return platforms.split(',')[0].strip() == 'cpu'
  return not any(glob.glob(pattern) for pattern in _ACCELERATOR_DEVICES)


def skip_absent_accelerators() -> None:
  """Where JAX would fall back to the CPU anyway (no JAX_PLATFORMS, no GPU or TPU device files), starts only its
  CPU backend: an installed libtpu or CUDA plugin then does not log its failed start-up on every run."""
  if not os.environ.get('JAX_PLATFORMS') and not jax.config.jax_platforms and will_run_on_cpu():
    jax.config.update('jax_platforms', 'cpu')
