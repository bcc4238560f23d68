"""Multi-process start-up: `jax.distributed.initialize` from flags or the cluster's standard environment.

One process per host (TPU VM worker, GPU node, or several CPU processes on one machine for tests). With no flags
and no cluster environment, this is a no-op and the run is single-process.
"""

import jax
from absl import flags
from absl import logging

from transformer_jax.core.errors import one_line


def define_flags():
  flags.DEFINE_bool('distributed', False, 'Call jax.distributed.initialize() (auto-detects TPU pods, SLURM, '
                    'Open MPI); implied by --coordinator_address.')
  flags.DEFINE_string('coordinator_address', None, 'host:port of process 0, for clusters JAX cannot detect.')
  flags.DEFINE_integer('num_processes', None, 'Total number of processes (with --coordinator_address).',
                       lower_bound=1)
  flags.DEFINE_integer('process_id', None, 'This process index (with --coordinator_address).', lower_bound=0)
  flags.register_multi_flags_validator(
      ['process_id', 'num_processes'],
      lambda f: f['process_id'] is None or f['num_processes'] is None or f['process_id'] < f['num_processes'],
      message='--process_id must be in [0, --num_processes).')
  flags.register_validator(
      'coordinator_address', lambda address: address is None or _is_host_port(address),
      message='--coordinator_address must be host:port, e.g. node0:1234.')


def _is_host_port(address: str) -> bool:
  host, _, port = address.rpartition(':')
  return bool(host) and port.isdigit()


def requested() -> bool:
  """Whether the flags ask for several processes (known before JAX starts)."""
  f = flags.FLAGS
  return bool(f.distributed or f.coordinator_address)


def initialize(coordinator_address=None, num_processes=None, process_id=None, auto=False):
  """Initializes the JAX distributed runtime when asked to; CPU processes talk through gloo collectives.

  A runtime that cannot start (no cluster to detect, a coordinator that does not answer) is one line naming the
  flags to pass.
  """
  if coordinator_address is None and not auto:
    return
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')  # only affects CPU devices
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)
  except (ValueError, RuntimeError) as e:
    raise ValueError(f'the distributed runtime did not start ({one_line(e)}); on a cluster JAX does not detect, '
                     'pass --coordinator_address=HOST:PORT --num_processes=N --process_id=I.') from None
  logging.info('process %d of %d, %d local / %d global devices', jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def initialize_from_flags():
  f = flags.FLAGS
  initialize(f.coordinator_address, f.num_processes, f.process_id, auto=f.distributed)
