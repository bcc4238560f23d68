"""The XLA:CPU backend's speed-ups, behind one seam: hand-written backward passes, host-memory reuse, and
checkpoint saves that copy each array once.

The model and the loss use stock JAX/Flax pieces on every backend. When the run's devices are CPUs
(`model.cpu_kernels='auto'`, the default; 'on'/'off' force it) three of them take backward passes written for
XLA:CPU's layouts, with the same values as autodiff (tested): projections (`dot_general`, for
`nn.DenseGeneral`), the tied pre-softmax layer (`tied_logits`) and the label-smoothed cross-entropy
(`cross_entropy`). Their measured gains, on the CPU and forced on elsewhere, are in bench/RESULTS.md; 'auto' keeps
them to the CPU until a kernel-by-kernel measurement on each accelerator says which to keep where.
"""

import ctypes
import functools
import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from transformer_jax import sharding
from transformer_jax.model_config import CPU_KERNELS

_CONTRACTION = 'contraction'  # checkpoint name of a projection's output, saved by the dot remat policies


def enabled(setting: str) -> bool:
  """Whether `model.cpu_kernels=setting` (`model_config.CPU_KERNELS`) means the CPU kernels, decided when the step
  is traced: 'auto' from the devices it is traced for (`sharding.target_platform`), never from the host's."""
  if setting not in CPU_KERNELS:
    raise ValueError(f'model.cpu_kernels={setting!r} is not one of {CPU_KERNELS}.')
  return setting == 'on' or (setting == 'auto' and sharding.target_platform() == 'cpu')


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


# --------------------------------------------------------------------------------------- tied logits


@jax.custom_vjp
def tied_logits(y: jax.Array, embedding: jax.Array) -> jax.Array:
  """y · Eᵀ, [..., d] × [vocab, d] -> [..., vocab]: the values of `nn.Embed.attend`.

  Autodiff computes dE as gᵀ · y, and XLA:CPU then materialises the [vocab, tokens] transpose of the logits
  cotangent (fused with the softmax backward, recomputed in a cache-hostile order).
  Here dE = (yᵀ · g)ᵀ: only the small [tokens, d] activations and the [d, vocab] result are transposed.
  """
  return jnp.dot(y, embedding.T)


def _tied_logits_fwd(y, embedding):
  return tied_logits(y, embedding), (y, embedding)


def _tied_logits_bwd(residuals, g):
  y, embedding = residuals
  lead = ''.join(chr(ord('a') + i) for i in range(y.ndim - 1))
  d_embedding_t = jnp.einsum(f'{lead}x,{lead}v->xv', y, g)  # [d, vocab]
  return jnp.dot(g, embedding), d_embedding_t.T


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


# --------------------------------------------------------------------------------------- loss


def _smoothing_weights(vocab: int, smoothing: float):
  """(gold, other): the smoothed target's probability of the gold token and of each other token."""
  return 1.0 - smoothing, smoothing / (vocab - 1)


def _cross_entropy_and_lse(logits, targets, smoothing):
  """((smoothed loss, nll, gold logit is a maximum), log-sum-exp) per token from float32 logits [..., vocab]."""
  vocab = logits.shape[-1]
  top = jnp.max(logits, axis=-1)
  lse = top + jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))
  gold_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = lse - gold_logit
  correct = (gold_logit >= top).astype(jnp.float32)  # = argmax == target, up to exact ties
  if smoothing == 0.0:
    return (nll, nll, correct), lse
  gold, other = _smoothing_weights(vocab, smoothing)
  sum_log_probs = jnp.sum(logits, axis=-1) - vocab * lse
  entropy = -(gold * jnp.log(gold) + (vocab - 1) * other * jnp.log(other))
  return (gold * nll - other * (sum_log_probs + nll) - entropy, nll, correct), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def cross_entropy(logits, targets, smoothing):
  """`metrics.cross_entropy`'s (smoothed loss, nll, correct) per token, with a one-pass backward.

  Reads the logits a few times without materialising log-probabilities or a one-hot target, and the backward
  pass is one elementwise pass over them (softmax − smoothed target); autodiff of the plain formula
  materialises several [tokens, vocab] arrays.
  """
  return _cross_entropy_and_lse(logits, targets, smoothing)[0]


def _cross_entropy_fwd(logits, targets, smoothing):
  outputs, lse = _cross_entropy_and_lse(logits, targets, smoothing)
  return outputs, (logits, targets, lse)


def _cross_entropy_bwd(smoothing, residuals, cotangents):
  """d loss/d logits = softmax - q (q the smoothed target, summing to 1); d nll/d logits = softmax - one-hot."""
  logits, targets, lse = residuals
  d_loss, d_nll, _ = cotangents  # `correct` is piecewise constant
  gold, other = _smoothing_weights(logits.shape[-1], smoothing)  # (1, 0) without smoothing
  is_gold = jnp.arange(logits.shape[-1]) == targets[..., None]
  probs = jnp.exp(logits - lse[..., None])
  target_mass = d_loss[..., None] * jnp.where(is_gold, gold, other) + d_nll[..., None] * is_gold
  d_logits = (d_loss + d_nll)[..., None] * probs - target_mass
  return d_logits, np.zeros(targets.shape, jax.dtypes.float0)


cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


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
