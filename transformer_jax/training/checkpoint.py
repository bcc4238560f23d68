"""Checkpoint layout and I/O with orbax.

Layout: `<checkpoints>/<step>/state` (`Workdir.checkpoints`) holds {'step', 'params', 'opt_state', 'rng'} (PyTree handler,
so params alone can be restored onto any mesh), `<step>/data` holds each process's input-iterator state
(grain's handler, one JSON file per process). Orbax writes each step to a temporary directory and renames
it when complete, so a crash mid-save leaves the previous step restorable; a training run removes such stale
temporary directories when it starts. A finished step that no longer restores (any file of it truncated or
unreadable: metadata, manifests, array data, the iterator's file, `_CHECKPOINT_METADATA`) never blocks a run:
`restore_newest` names it and falls back to the newest step that restores, and a training run sets it aside as
`<step>.damaged` (kept, never deleted) so that it can save that step again. A step restores when every array
asked for has been read (orbax reads lazily) and its small files parse, not when its metadata alone does.

A run's periodic saves (every `train.checkpoint_every` steps, and its last step) are what it keeps and what its final
model averages (`final_model_candidates`); a preemption save in between is kept only while it is the newest, the
step a resumed run starts from, so a preempted and resumed run keeps and averages what the uninterrupted one does.
"""

import contextlib
import dataclasses
import glob
import os
import re
from typing import Callable

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from orbax.checkpoint._src.metadata import array_metadata_store  # what orbax's default array handler is given
from orbax.checkpoint._src.metadata import checkpoint as step_metadata  # where orbax keeps a step's metadata

from transformer_jax.core import files
from transformer_jax.core.errors import one_line
from transformer_jax.core.errors import root_cause

STATE, DATA = 'state', 'data'
DAMAGED_SUFFIX = '.damaged'


class CheckpointMismatchError(ValueError):
  """The checkpoint is intact but was written by a model of other shapes (a config error, not damage)."""


class DamagedCheckpointError(ValueError):
  """A step's files do not restore (truncated, missing or unreadable), whichever file and however orbax,
  tensorstore or json report it."""


class SaveError(OSError):
  """A checkpoint could not be written (disk full, permissions): the run stops instead of training on."""


def is_periodic(train_config, step: int) -> bool:
  """Whether `step` is one of the periodic saves of a run of `train_config` (every `checkpoint_every` steps, and its
  last, `num_steps`), not a preemption save between them."""
  return step % train_config.checkpoint_every == 0 or step == train_config.num_steps


def final_model_candidates(config, saved_steps) -> list[int]:
  """The saved steps the run's final model averages, newest first: the newest `eval.average_last` of them that
  restore (`average_params`). They are the periodic saves (`is_periodic`), so that a preemption save never changes
  the final model; a fine-tune's imported params (step 0) only until it has trained; where no save is periodic
  (a run stopped before its first periodic save), the newest save."""
  saved = sorted(saved_steps, reverse=True)
  periodic = [step for step in saved if is_periodic(config.train, step)]
  return [step for step in periodic if step > 0] or periodic or saved[:1]


def describe_steps(steps) -> str:
  """Params of checkpoint `steps` in words: 'step 800', or 'the average of steps [400, 600, 800]'."""
  steps = list(steps)
  return f'the average of steps {steps}' if len(steps) > 1 else f'step {steps[0]}'


@dataclasses.dataclass
class _Retention:
  """orbax's preservation policy of a training run: the newest `keep` periodic saves (all with `keep` None) and the
  newest save of any kind, which a resumed run starts from."""

  periodic: Callable[[int], bool]
  keep: int | None

  def should_preserve(self, checkpoints, *, context) -> list[bool]:  # pylint: disable=unused-argument
    periodic = [i for i, info in enumerate(checkpoints) if self.periodic(info.step)]
    kept = set(periodic if self.keep is None else periodic[max(len(periodic) - self.keep, 0):])
    kept.update(range(len(checkpoints))[-1:])  # checkpoints come oldest first
    return [i in kept for i in range(len(checkpoints))]


def make_manager(directory: str, *, save_every: int = 1, keep: int | None = None,
                 periodic: Callable[[int], bool] | None = None, async_save: bool = True, create: bool = True,
                 replica_parallel: bool | None = None) -> ocp.CheckpointManager:
  """An orbax manager over `directory` (a `Workdir.checkpoints`) with the state and data-iterator items; a
  writing one (`create`) first removes the temporary directories of saves a kill interrupted. It keeps the newest
  `keep` steps that `periodic` accepts (default: every step) and the newest step (`_Retention`). `replica_parallel`:
  True keeps orbax's array handler (replica-parallel writes), False saves each replicated array from one replica;
  None: `replica_parallel_saves()`."""
  retention = _Retention(periodic or (lambda step: True), keep)
  options = ocp.CheckpointManagerOptions(save_interval_steps=save_every, create=create,
                                         enable_async_checkpointing=async_save, cleanup_tmp_directories=create,
                                         preservation_policy=retention)
  handlers = {STATE: _state_handler(replica_parallel), DATA: grain.checkpoint.CheckpointHandler()}
  return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


def replica_parallel_saves() -> bool:
  """Whether checkpoint saves keep orbax's replica-parallel writes (its default except on GPUs: each replicated
  array split over its replicas, so that devices and hosts share the copies off the accelerators). Not on the CPU:
  its devices are one host memory, where the split only adds a dispatched slice per replica and array
  (`bench.checkpoint_saves` measures it)."""
  return jax.default_backend() != 'cpu'


def _state_handler(replica_parallel: bool | None) -> ocp.PyTreeCheckpointHandler:
  """The state item's handler: orbax's, or one whose jax.Array handler writes without replica parallelism (a
  checkpoint restores the same either way)."""
  if replica_parallel is None:
    replica_parallel = replica_parallel_saves()
  if replica_parallel:
    return ocp.PyTreeCheckpointHandler()
  arrays = ocp.type_handlers.ArrayHandler(use_replica_parallel=False,
                                          array_metadata_store=array_metadata_store.Store())
  defaults = [(t, ocp.type_handlers.get_type_handler(t)) for t in ocp.type_handlers.supported_types()]
  return ocp.PyTreeCheckpointHandler(
      type_handler_registry=ocp.type_handlers.create_type_handler_registry(*defaults, (jax.Array, arrays)))


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
  """Starts saving `step` (asynchronously when the manager is); an earlier save that failed raises SaveError."""
  check_saves(manager)
  items = {STATE: ocp.args.PyTreeSave(state)}
  if data_iterator is not None:
    items[DATA] = grain.checkpoint.CheckpointSave(data_iterator)
  try:
    return manager.save(step, args=ocp.args.Composite(**items), force=force)
  except Exception as e:  # pylint: disable=broad-except  # orbax re-raises an earlier async save's error here
    raise _save_error(manager, e) from None


def check_saves(manager: ocp.CheckpointManager, wait: bool = False) -> None:
  """Raises SaveError if an asynchronous save failed (after waiting for the one in flight if `wait`)."""
  try:
    if wait:
      manager.wait_until_finished()
    manager.check_for_errors()
  except Exception as e:  # pylint: disable=broad-except  # orbax re-raises its writer thread's error as it was
    raise _save_error(manager, e) from None


@contextlib.contextmanager
def closing(manager: ocp.CheckpointManager):
  """Waits for the save in flight and closes the manager when the run ends; when it ends with an error, a
  save's own error (often the same disk's) does not replace it."""
  try:
    yield manager
  except BaseException:
    with contextlib.suppress(Exception):
      manager.wait_until_finished()
    raise
  else:
    check_saves(manager, wait=True)
  finally:
    manager.close()


def _save_error(manager, error: BaseException) -> SaveError:
  cause = root_cause(error)
  os_error = re.search(r"os_error_code='(\d+)'", str(cause))  # tensorstore's form of an OSError
  reason = (getattr(cause, 'strerror', None) or (os.strerror(int(os_error.group(1))) if os_error else None)
            or one_line(cause))
  return SaveError(f'saving a checkpoint in {manager.directory} failed ({reason}); {last_good(manager)}. Free disk '
                   'space (or fix the permissions) and rerun the same command to resume.')


def finished_steps(manager: ocp.CheckpointManager) -> list[int]:
  """The steps whose saves have finished on disk (not orbax's in-memory steps, which include a save in flight)."""
  return sorted(ocp.path.step.checkpoint_steps(manager.directory))


def last_good(manager: ocp.CheckpointManager) -> str:
  """What a stopped run can resume from, for its error message: the newest finished step on disk, or none."""
  steps = finished_steps(manager)
  return f'the last good checkpoint is step {steps[-1]}' if steps else 'no checkpoint has been saved yet'


def _restore_args(abstract_tree):
  return jax.tree.map(
      lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, global_shape=x.shape, dtype=x.dtype)
      if getattr(x, 'sharding', None) is not None else ocp.RestoreArgs(restore_type=np.ndarray), abstract_tree)


@contextlib.contextmanager
def _reading(manager: ocp.CheckpointManager, step: int):
  """Any failure to read `step` becomes one DamagedCheckpointError naming the step and the innermost cause."""
  try:
    yield
  except (CheckpointMismatchError, DamagedCheckpointError):
    raise
  except Exception as e:  # pylint: disable=broad-except  # orbax and tensorstore raise many kinds, some bare
    reason = re.sub(r"\s*\[tensorstore_spec='.*'\]", '', one_line(root_cause(e)))  # its whole spec: noise here
    raise DamagedCheckpointError(f'checkpoint step {step} in {manager.directory} does not restore ({reason})') from e


def _check_small_files(manager: ocp.CheckpointManager, step: int) -> None:
  """The step's JSON files that orbax would read leniently or not at all: its `_CHECKPOINT_METADATA` and every
  process's data-iterator file."""
  directory = os.path.join(manager.directory, str(step))
  for path in [str(step_metadata.step_metadata_file_path(directory)),
               *glob.glob(os.path.join(directory, DATA, '*.json'))]:
    files.read_json(path, 'checkpoint file')


def saved_state(manager: ocp.CheckpointManager, step: int) -> dict:
  """The metadata (shapes, dtypes) of everything a step's state item holds, as a tree like it (orbax reads every
  array's for it)."""
  saved = manager.item_metadata(step)[STATE]
  return getattr(saved, 'tree', saved)


def saved_params(manager: ocp.CheckpointManager, step: int):
  """The metadata (shapes, dtypes) of a step's params, as a tree like the params."""
  with _reading(manager, step):
    return saved_state(manager, step)['params']


def params_only(manager: ocp.CheckpointManager, step: int):
  """The step's `saved_params` if it holds params alone (an imported model, averaged params), without a training
  state to resume; else None."""
  saved = saved_state(manager, step)
  return None if 'opt_state' in saved else saved['params']


def check_shapes(manager: ocp.CheckpointManager, step: int, abstract_params, saved=None) -> None:
  """Raises, listing every mismatch, when the checkpoint's params differ in shape from the config's model.
  `saved`: the step's `saved_params` where the caller has read them (orbax reads every array's metadata for it)."""
  saved = saved_params(manager, step) if saved is None else saved
  saved_shapes = {jax.tree_util.keystr(p): tuple(m.shape) for p, m in jax.tree_util.tree_leaves_with_path(saved)}
  wanted = {jax.tree_util.keystr(p): tuple(x.shape)
            for p, x in jax.tree_util.tree_leaves_with_path(abstract_params)}
  problems = [f'{k}: checkpoint {saved_shapes.get(k, "missing")} vs config {wanted.get(k, "missing")}'
              for k in sorted(set(saved_shapes) | set(wanted)) if saved_shapes.get(k) != wanted.get(k)]
  if problems:
    raise CheckpointMismatchError(
        f'the checkpoint at step {step} in {manager.directory} was written by a model of other shapes than the '
        f'config ({len(problems)} differences): ' + '; '.join(problems[:12]) + ('; …' if len(problems) > 12 else '')
        + '. Use the config it was trained with or another workdir.')


def restore_state(manager: ocp.CheckpointManager, step: int, abstract_state: dict, data_iterator=None) -> dict:
  """The full training state (onto the abstract state's shardings) and, if given, the iterator's position."""
  check_shapes(manager, step, abstract_state['params'])
  items = {STATE: ocp.args.PyTreeRestore(item=abstract_state, restore_args=_restore_args(abstract_state))}
  if data_iterator is not None:
    items[DATA] = grain.checkpoint.CheckpointRestore(data_iterator)
  with _reading(manager, step):
    _check_small_files(manager, step)
    restored = jax.block_until_ready(manager.restore(step, args=ocp.args.Composite(**items))[STATE])
  logging.info('restored step %d from %s', step, manager.directory)
  return restored


def restore_params(manager: ocp.CheckpointManager, step: int, abstract_params, saved=None):
  """Only the params of a step, resharded onto `abstract_params`' shardings (any mesh, any device count); `saved`
  as `check_shapes` takes it."""
  check_shapes(manager, step, abstract_params, saved)
  item = {'params': abstract_params}
  args = ocp.args.PyTreeRestore(item=item, restore_args=_restore_args(item), partial_restore=True)
  with _reading(manager, step):
    _check_small_files(manager, step)
    return jax.block_until_ready(manager.restore(step, args=ocp.args.Composite(**{STATE: args}))[STATE]['params'])


def average_params(manager: ocp.CheckpointManager, steps, restore_step, count: int | None = None):
  """(mean, averaged steps): the element-wise mean of the params `restore_step(step)` gives for the first `count`
  of `steps` (all of them by default) that restore (§6.1 checkpoint averaging). A damaged step is named in a
  warning and skipped, so `steps` newest first averages the newest `count` that restore.

  A running mean in float32, m += (x - m) / k, so averaging identical checkpoints returns them bit for bit.
  """
  steps = list(steps)
  count = len(steps) if count is None else count
  mean, used = None, []
  for step in steps:
    if len(used) == count:
      break
    try:
      params = restore_step(step)
    except DamagedCheckpointError as e:  # as in restore_newest
      logging.warning('%s: averaging without it', e)
      continue
    used.append(step)
    dtypes = jax.tree.map(lambda x: x.dtype, params)
    params = jax.tree.map(lambda x: x.astype(np.float32), params)
    mean = params if mean is None else jax.tree.map(lambda m, x, k=len(used): m + (x - m) / k, mean, params)
  if len(used) < count:
    raise ValueError(f'asked to average {count} checkpoints but only {len(used)} of {manager.directory} restore '
                     f'(steps {sorted(used)} of {sorted(steps)}); lower --average_last or keep more '
                     '(train.keep_checkpoints).')
  return jax.tree.map(lambda m, dtype: m.astype(dtype), mean, dtypes), sorted(used)


def restore_newest(manager: ocp.CheckpointManager, restore_step, steps=None):
  """(step, restore_step(step)) for the newest of `steps` (default: all) that restores, and the newer steps
  that did not. A damaged step (DamagedCheckpointError) is named in a warning and skipped; anything else, a model
  mismatch included, is raised as it is."""
  candidates = sorted(manager.all_steps() if steps is None else steps, reverse=True)
  broken = []
  for step in candidates:
    try:
      result = restore_step(step)
    except DamagedCheckpointError as e:
      logging.warning('%s: trying the one before', e)
      broken.append(step)
      continue
    if broken:
      logging.warning('restored step %d of %s: the newer checkpoint(s) %s are damaged', step, manager.directory,
                      broken)
    return step, result, broken
  raise ValueError(f'no checkpoint in {manager.directory} restores (damaged: steps {broken}): restore the directory '
                   'from a copy, or train in a new workdir.')


def set_aside(manager: ocp.CheckpointManager, steps) -> list[str]:
  """Renames damaged steps to `<step>.damaged` (kept for inspection; orbax no longer sees them); returns the new
  paths. Call on one process; the manager is reloaded."""
  paths = []
  for step in steps:
    source = os.path.join(manager.directory, str(step))
    target = source + DAMAGED_SUFFIX
    index = 1
    while os.path.exists(target):
      target, index = f'{source}{DAMAGED_SUFFIX}{index}', index + 1
    os.rename(source, target)
    paths.append(target)
  manager.reload()
  return paths
