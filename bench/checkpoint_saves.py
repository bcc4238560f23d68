"""Checkpoint saves with and without replica-parallel writes, side by side on the CPU's simulated devices.

A config's sharded train state (params and Adam moments, replicated over a data-parallel mesh) is saved
--saves times with each setting of `checkpoint.make_manager(replica_parallel=...)`, in alternating rounds, and
the seconds a save blocks the training loop (the device-to-host copy; the write to disk is asynchronous) are
reported. Example: python -m bench.checkpoint_saves --devices=8 --model=tiny
"""

import argparse
import os
import sys
import tempfile
import time


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--devices', type=int, default=8, help='simulated CPU devices (a data-parallel mesh)')
  parser.add_argument('--model', choices=('tiny', 'default'), default='tiny',
                      help="tiny: the tests' 1+1-layer width-16 model; default: configs/default.py's model")
  parser.add_argument('--saves', type=int, default=5, help='timed saves per setting and round')
  parser.add_argument('--rounds', type=int, default=3)
  args = parser.parse_args()
  os.environ['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={args.devices}'
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')

  import jax  # pylint: disable=import-outside-toplevel  (after XLA_FLAGS)
  from bench import common  # pylint: disable=import-outside-toplevel
  from configs import default  # pylint: disable=import-outside-toplevel
  from transformer_jax.training import checkpoint, run_builder  # pylint: disable=import-outside-toplevel

  config = default.get_config()
  if args.model == 'tiny':
    common.shrink_to_tiny(config)
  config.mesh.shape = {'data': -1, 'fsdp': 1, 'tensor': 1}
  state = run_builder.build(config).initial_state().as_dict()

  seconds = {True: [], False: []}
  with tempfile.TemporaryDirectory() as root:
    for round_ in range(args.rounds + 1):  # round 0 warms up both settings
      for replica_parallel in (True, False):
        manager = checkpoint.make_manager(os.path.join(root, f'{replica_parallel}{round_}'),
                                          replica_parallel=replica_parallel)
        for step in range(args.saves):
          start = time.perf_counter()
          checkpoint.save(manager, step, state, force=True)
          if round_:
            seconds[replica_parallel].append(time.perf_counter() - start)
          manager.wait_until_finished()
        manager.close()
  rows = []
  for replica_parallel, times in seconds.items():
    record = {'bench': 'checkpoint_saves', 'model': args.model, 'devices': jax.device_count(),
              'replica_parallel': replica_parallel, 'save_blocking_s': common.median(times), 'saves': len(times),
              **common.machine(), 'jax': jax.__version__}
    common.emit(record)
    rows.append([str(replica_parallel), f'{record["save_blocking_s"] * 1e3:.0f}'])
  print(common.markdown_table(['replica_parallel', 'save blocks the loop, ms (median)'], rows), file=sys.stderr)


if __name__ == '__main__':
  main()
