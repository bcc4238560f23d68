"""Multi-process start-up: `jax.distributed.initialize` from flags or the cluster's standard environment.

One process per host (TPU VM worker, GPU node, or several CPU processes on one machine for tests). With
no flags and no cluster environment, this is a no-op and the run is single-process.
"""

import jax
from absl import flags
from absl import logging

def define_flags():
  flags.DEFINE_bool('distributed', False, 'Call jax.distributed.initialize() (auto-detects TPU pods, SLURM, '
                    'Open MPI); implied by --coordinator_address.')
  flags.DEFINE_string('coordinator_address', None, 'host:port of process 0, for clusters JAX cannot detect.')
  flags.DEFINE_integer('num_processes', None, 'Total number of processes (with --coordinator_address).')
  flags.DEFINE_integer('process_id', None, 'This process index (with --coordinator_address).')


def initialize(coordinator_address=None, num_processes=None, process_id=None, auto=False):
  """Initializes the JAX distributed runtime when asked to; CPU processes talk through gloo collectives."""
  if coordinator_address is None and not auto:
    return
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')  # only affects CPU devices
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id)
  logging.info('process %d of %d, %d local / %d global devices', jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def initialize_from_flags():
  f = flags.FLAGS
  initialize(f.coordinator_address, f.num_processes, f.process_id, auto=f.distributed)
