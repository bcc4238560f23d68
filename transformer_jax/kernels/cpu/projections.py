"""The XLA:CPU projections: a hand-written backward pass for `nn.DenseGeneral`'s contraction, with the same values
as autodiff (tested), and the remat policy that still sees those products (`model.cpu_kernels`; measured gains:
bench/RESULTS.md, "Training step on a CPU")."""

import functools

import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp

_CONTRACTION = 'contraction'  # checkpoint name of a projection's output, saved by the dot remat policies


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


