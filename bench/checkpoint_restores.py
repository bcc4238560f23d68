"""Restoring one step's params for evaluation, with the step's metadata read once or twice, side by side.

Orbax reads every array's metadata (the Adam moments' too) to give a step's tree. `restoring` reads it to tell a
scanned checkpoint from an unrolled one and, since it hands that read to `checkpoint.restore_params`, not again
for the shape check. A config's train state is saved once; each round restores its params both ways (a second
`saved_params` read inside `restore_params`, as before, or the first handed over) and reports the medians.
Example: python -m bench.checkpoint_restores --model=base
"""

import argparse
import os
import sys
import tempfile
import time


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', choices=('tiny', 'default', 'base'), default='base',
                      help="tiny: the tests' 1+1-layer width-16 model; default: configs/default.py's; base: "
                           "configs/wmt14_ende_base.py's")
  parser.add_argument('--rounds', type=int, default=5)
  args = parser.parse_args()
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')

  import jax  # pylint: disable=import-outside-toplevel
  from bench import common  # pylint: disable=import-outside-toplevel
  from transformer_jax.training import checkpoint, run_builder  # pylint: disable=import-outside-toplevel
  from transformer_jax import config as config_lib  # pylint: disable=import-outside-toplevel

  config = config_lib.load('configs/wmt14_ende_base.py' if args.model == 'base' else 'configs/default.py')
  if args.model == 'tiny':
    common.shrink_to_tiny(config)
  config.mesh.shape = {'data': 1, 'fsdp': 1, 'tensor': 1}
  run = run_builder.build(config, jax.devices()[:1])
  target = run.abstract_state.params

  def read_twice(manager):
    checkpoint.saved_params(manager, 1)
    return checkpoint.restore_params(manager, 1, target)

  def read_once(manager):
    return checkpoint.restore_params(manager, 1, target, checkpoint.saved_params(manager, 1))

  seconds = {'twice': [], 'once': []}
  with tempfile.TemporaryDirectory() as root:
    manager = checkpoint.make_manager(root, async_save=False)
    checkpoint.save(manager, 1, run.initial_state().as_dict(), force=True)
    manager.wait_until_finished()
    manager.close()
    manager = checkpoint.open_existing(root)
    arrays = len(jax.tree.leaves(checkpoint.saved_state(manager, 1)))
    for round_ in range(args.rounds + 1):  # round 0 warms up both
      for name, restore in (('twice', read_twice), ('once', read_once)):
        start = time.perf_counter()
        jax.block_until_ready(restore(manager))
        if round_:
          seconds[name].append(time.perf_counter() - start)
    manager.close()
  rows = []
  for name, times in seconds.items():
    record = {'bench': 'checkpoint_restores', 'model': args.model, 'arrays_in_step': arrays,
              'metadata_reads': name, 'restore_s': common.median(times), 'rounds': len(times),
              **common.machine(), 'jax': jax.__version__}
    common.emit(record)
    rows.append([name, str(arrays), f'{record["restore_s"]:.2f}'])
  print(common.markdown_table(['metadata read', 'arrays in the step', "a step's params restored, s (median)"],
                              rows), file=sys.stderr)


if __name__ == '__main__':
  main()
