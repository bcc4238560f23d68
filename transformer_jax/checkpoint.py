"""Checkpoint layout and I/O with orbax.

Layout: `<checkpoints>/<step>/state` (`Workdir.checkpoints`) holds {'step', 'params', 'opt_state', 'rng'} (PyTree handler,
so params alone can be restored onto any mesh), `<step>/data` holds each process's input-iterator state
(grain's handler, one JSON file per process). Orbax writes each step to a temporary directory and renames
it when complete, so a crash mid-save leaves the previous step restorable.
"""

import os

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

STATE, DATA = 'state', 'data'


def make_manager(directory: str, *, save_every: int = 1, keep: int | None = None, async_save: bool = True,
                 create: bool = True) -> ocp.CheckpointManager:
  """An orbax manager over `directory` (a `Workdir.checkpoints`) with the state and data-iterator items."""
  options = ocp.CheckpointManagerOptions(save_interval_steps=save_every, max_to_keep=keep, create=create,
                                         enable_async_checkpointing=async_save)
  handlers = {STATE: ocp.PyTreeCheckpointHandler(), DATA: grain.checkpoint.CheckpointHandler()}
  return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


def open_existing(directory: str) -> ocp.CheckpointManager:
  """A read-only manager over a checkpoint directory that must already hold checkpoints (evaluation)."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'no checkpoints in {os.path.dirname(directory)} (expected {directory}): train first '
                            'or pass the --workdir of a training run.')
  manager = make_manager(directory, create=False, async_save=False)
  if manager.latest_step() is None:
    raise FileNotFoundError(f'{directory} holds no finished checkpoint: train first.')
  return manager


def save(manager: ocp.CheckpointManager, step: int, state: dict, data_iterator=None, *, force=False) -> bool:
  items = {STATE: ocp.args.PyTreeSave(state)}
  if data_iterator is not None:
    items[DATA] = grain.checkpoint.CheckpointSave(data_iterator)
  return manager.save(step, args=ocp.args.Composite(**items), force=force)


def _restore_args(abstract_tree):
  return jax.tree.map(
      lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, global_shape=x.shape, dtype=x.dtype)
      if getattr(x, 'sharding', None) is not None else ocp.RestoreArgs(restore_type=np.ndarray), abstract_tree)


def saved_params(manager: ocp.CheckpointManager, step: int):
  """The metadata (shapes, dtypes) of a step's params, as a tree like the params."""
  saved = manager.item_metadata(step)[STATE]
  return getattr(saved, 'tree', saved)['params']


def check_shapes(manager: ocp.CheckpointManager, step: int, abstract_params) -> None:
  """Raises, listing every mismatch, when the checkpoint's params differ in shape from the config's model."""
  saved = saved_params(manager, step)
  saved_shapes = {jax.tree_util.keystr(p): tuple(m.shape) for p, m in jax.tree_util.tree_leaves_with_path(saved)}
  wanted = {jax.tree_util.keystr(p): tuple(x.shape)
            for p, x in jax.tree_util.tree_leaves_with_path(abstract_params)}
  problems = [f'{k}: checkpoint {saved_shapes.get(k, "missing")} vs config {wanted.get(k, "missing")}'
              for k in sorted(set(saved_shapes) | set(wanted)) if saved_shapes.get(k) != wanted.get(k)]
  if problems:
    raise ValueError(f'the checkpoint at step {step} in {manager.directory} was written by a model of other shapes '
                     f'than the config ({len(problems)} differences): ' + '; '.join(problems[:12])
                     + ('; …' if len(problems) > 12 else '') + '. Use the config it was trained with or another '
                     'workdir.')


def restore_state(manager: ocp.CheckpointManager, step: int, abstract_state: dict, data_iterator=None) -> dict:
  """The full training state (onto the abstract state's shardings) and, if given, the iterator's position."""
  check_shapes(manager, step, abstract_state['params'])
  items = {STATE: ocp.args.PyTreeRestore(item=abstract_state, restore_args=_restore_args(abstract_state))}
  if data_iterator is not None:
    items[DATA] = grain.checkpoint.CheckpointRestore(data_iterator)
  restored = manager.restore(step, args=ocp.args.Composite(**items))
  logging.info('restored step %d from %s', step, manager.directory)
  return restored[STATE]


def restore_params(manager: ocp.CheckpointManager, step: int, abstract_params):
  """Only the params of a step, resharded onto `abstract_params`' shardings (any mesh, any device count)."""
  check_shapes(manager, step, abstract_params)
  item = {'params': abstract_params}
  args = ocp.args.PyTreeRestore(item=item, restore_args=_restore_args(item), partial_restore=True)
  return manager.restore(step, args=ocp.args.Composite(**{STATE: args}))[STATE]['params']


def average_params(manager: ocp.CheckpointManager, steps, abstract_params):
  """The element-wise mean of the params of `steps` (§6.1 checkpoint averaging).

  A running mean in float32, m += (x - m) / k, so averaging identical checkpoints returns them bit for bit.
  """
  if not steps:
    raise ValueError('no checkpoints to average.')
  mean = None
  for k, step in enumerate(steps, 1):
    params = jax.tree.map(lambda x: x.astype(np.float32), restore_params(manager, step, abstract_params))
    mean = params if mean is None else jax.tree.map(lambda m, x: m + (x - m) / k, mean, params)
  return jax.tree.map(lambda m, ref: m.astype(ref.dtype), mean, abstract_params)


def last_steps(manager: ocp.CheckpointManager, count: int) -> list[int]:
  steps = sorted(manager.all_steps())
  if count > len(steps):
    raise ValueError(f'asked to average the last {count} checkpoints but {manager.directory} holds {len(steps)} '
                     f'(steps {steps}); lower --average_last or keep more (train.keep_checkpoints).')
  return steps[-count:]
