"""The run directory: the one place that names its files and reads and writes its config.

    WORKDIR/config.json              the resolved config of the run (evaluation and translation start from it)
    WORKDIR/tokenizer/spm.model      the shared SentencePiece model
    WORKDIR/checkpoints/<step>/      orbax checkpoints (checkpoint.py holds what is inside one)
    WORKDIR/averaged/<params>/       averaged params written by `eval.py --save_averaged`, a workdir of their own
                                     (config.json, tokenizer/, checkpoints/<step>, averaged.json: where they come
                                     from), named by their steps (`steps_name`: average<K>_step<N>)
    WORKDIR/metrics.jsonl            one JSON line per logged train / eval / compile record
    WORKDIR/tensorboard/             TensorBoard event files
    WORKDIR/results.json             the run's own final evaluation: its final model on the test split with its
                                     own data, decoding and model settings (results_<split>.json for another
                                     split); any other evaluation gets a name of its own that says what differs:
                                     results[_<split>]_<tag>.json, the tag naming the params (step<N>,
                                     average<K>_step<N>, ensemble-<digest of its members>) and each config section
                                     that differs from the run's (data-<digest>, decode-<digest>, model-<digest>):
                                     `params_tag`, `scoring.results_tag`
    WORKDIR/translations/            <split>.{src,hyp,ref}.txt of that evaluation (<split>.<tag>.*.txt)
    WORKDIR/train.log                train.py's output when a sweep launches it
    WORKDIR/train.lock               held by the training process (`Workdir.exclusive`): one run per workdir
"""

import contextlib
import fcntl
import json
import os
import socket

import ml_collections

from transformer_jax.core import files

# Keys earlier versions wrote into config.json that no longer exist (dropped when such a config is read).
_REMOVED_KEYS = {'train': ('reuse_host_memory',)}  # now train.py --host_memory


def _is_file(fd: int, path: str) -> bool:
  """Whether the open file `fd` is the file at `path` now."""
  try:
    return os.path.samestat(os.fstat(fd), os.stat(path))
  except FileNotFoundError:
    return False


def steps_name(steps) -> str:
  """The params of checkpoint `steps` in a name: 'step<N>' for one checkpoint, 'average<K>_step<N>' for an average
  of K ending at step N."""
  steps = list(steps)
  return f'step{steps[-1]}' if len(steps) == 1 else f'average{len(steps)}_step{steps[-1]}'


def params_tag(steps, final_steps) -> str | None:
  """How the results of params from checkpoint `steps` are named beside those of the run's final model
  (`final_steps`): None (results.json) for the final model, else `steps_name`."""
  if final_steps is None or list(steps) == list(final_steps):
    return None
  return steps_name(steps)


class WorkdirInUseError(OSError):
  """Another training process holds the workdir (a double launch)."""


class Workdir:
  """Paths of one run directory; nothing is created until asked (`ensure_writable`)."""

  def __init__(self, path: str):
    self.path = str(path)

  def __repr__(self) -> str:
    return f'Workdir({self.path!r})'

  def _join(self, *parts: str) -> str:
    return os.path.join(self.path, *parts)

  @property
  def config_file(self) -> str:
    return self._join('config.json')

  @property
  def tokenizer_model(self) -> str:
    return self._join('tokenizer', 'spm.model')

  @property
  def checkpoints(self) -> str:
    return os.path.join(os.path.abspath(self.path), 'checkpoints')  # orbax wants an absolute path

  def averaged(self, steps) -> 'Workdir':
    """The workdir that `eval.py --save_averaged` makes of the params of checkpoint `steps` (averaged)."""
    return Workdir(self._join('averaged', steps_name(steps)))

  @property
  def averaged_from_file(self) -> str:
    """In a workdir of averaged params: the run and checkpoint steps they come from."""
    return self._join('averaged.json')

  @property
  def metrics_file(self) -> str:
    return self._join('metrics.jsonl')

  @property
  def tensorboard(self) -> str:
    return self._join('tensorboard')

  @property
  def train_log(self) -> str:
    return self._join('train.log')

  @property
  def final_results_file(self) -> str:
    """The evaluation of the test split (`eval.test_split`), which a finished run ends with."""
    return self._join('results.json')

  def results_file(self, split: str, test_split: str, tag: str | None = None) -> str:
    """results.json for the test split, results_<split>.json for another; a tag (e.g. 'ensemble': another system
    evaluated from this workdir) is added to the name: results_ensemble.json, results_<split>_ensemble.json."""
    name = 'results' if split == test_split else f'results_{split}'
    return self._join(f'{name}_{tag}.json' if tag else f'{name}.json')

  def translation_file(self, split: str, kind: str, tag: str | None = None) -> str:
    """kind: 'src', 'hyp' or 'ref'; a tag as in `results_file`: translations/<split>.<tag>.<kind>.txt."""
    return self._join('translations', '.'.join([split, *([tag] if tag else []), kind, 'txt']))

  def read_metrics(self) -> list[dict]:
    """The records of metrics.jsonl that parse (a killed run may leave a partial last line); [] without the file."""
    records = []
    try:
      with open(self.metrics_file, encoding='utf-8') as f:
        for line in f:
          try:
            record = json.loads(line)
          except ValueError:
            continue
          if isinstance(record, dict) and isinstance(record.get('step'), int):
            records.append(record)
    except OSError:
      pass
    return records

  def finished_results(self, num_steps: int) -> dict | None:
    """results.json if the run is finished: the final evaluation of a run trained to `num_steps` (the params it
    scored end at that step; an older results.json without its step: the last logged training step). None while
    there is none, or while it is being written."""
    try:
      results = files.read_json(self.final_results_file, 'results')
    except (OSError, ValueError):
      return None
    step = results.get('step')
    if step is None:
      step = max((r['step'] for r in self.read_metrics() if r.get('split') == 'train'), default=None)
    return results if step == num_steps else None

  @property
  def lock_file(self) -> str:
    return self._join('train.lock')

  @contextlib.contextmanager
  def exclusive(self):
    """Held by one training process at a time, so that two runs never write one workdir's checkpoints: a second
    is refused in one line naming the first. The OS releases the lock when its holder exits, however it exits; a
    holder that exits normally also removes the file."""
    while True:
      fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode(errors='replace').strip() or 'a process that is starting'
        os.close(fd)
        raise WorkdirInUseError(f'workdir {self.path} is in use by another training run ({holder}): wait for it to '
                                'finish or stop it, or pass another --workdir.') from None
      if _is_file(fd, self.lock_file):
        break
      os.close(fd)  # locked a file that its holder removed as it finished: lock the current one
    try:
      os.ftruncate(fd, 0)
      os.pwrite(fd, f'pid {os.getpid()} on {socket.gethostname()}'.encode(), 0)
      yield
    finally:
      with contextlib.suppress(FileNotFoundError):
        os.remove(self.lock_file)
      os.close(fd)

  def ensure_writable(self, process_index: int = 0) -> None:
    """Creates the directory; fails with one line, before any work, if it cannot be written."""
    try:
      os.makedirs(self.path, exist_ok=True)
      probe = self._join(f'.write_probe_{process_index}')
      with open(probe, 'w') as f:
        f.write('ok')
      os.remove(probe)
    except OSError as e:
      raise PermissionError(f'workdir {self.path} is not writable ({e.strerror}): pass a --workdir you can write '
                            'to.') from None

  def save_config(self, config: ml_collections.ConfigDict) -> None:
    """Writes the resolved config atomically (a reader never sees half a file)."""
    files.write_atomically(self.config_file, config.to_json_best_effort(indent=2))

  def has_config(self) -> bool:
    return os.path.exists(self.config_file)

  def load_config(self) -> ml_collections.ConfigDict:
    """The run's saved config; keys of earlier versions that no longer exist are dropped."""
    if not os.path.isdir(self.path):
      raise FileNotFoundError(f'workdir {self.path} does not exist: pass the --workdir of a training run.')
    if not self.has_config():
      raise FileNotFoundError(f'{self.config_file} not found: {self.path} is not the workdir of a training run.')
    values = files.read_json(self.config_file, "run's config")
    for section, keys in _REMOVED_KEYS.items():
      for key in keys:
        values.get(section, {}).pop(key, None)
    return ml_collections.ConfigDict(values)
