"""Where metrics go: TensorBoard event files, a JSONL log in the workdir, and a progress line.

Only process 0 writes; the other processes get a writer that does nothing, so call sites stay simple.
"""

import json
import logging as py_logging
import os
import time

from absl import logging
from tensorboardX import SummaryWriter


class MetricWriter:
  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    if enabled:
      self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'))
      self._jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a', encoding='utf-8')

  def write(self, step: int, split: str, scalars: dict):
    if not self.enabled:
      return
    for name, value in scalars.items():
      self._tb.add_scalar(f'{split}/{name}', value, step)
    self._jsonl.write(json.dumps({'step': step, 'split': split, 'time': time.time(), **scalars}) + '\n')
    self._jsonl.flush()
    self._tb.flush()

  def progress(self, message: str):
    if self.enabled:
      print(message, flush=True)
      logging.info(message)

  def close(self):
    if self.enabled:
      self._tb.close()
      self._jsonl.close()


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f'{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'


class _DropLibraryInfo(py_logging.Filter):
  """Keeps warnings and errors of orbax/grain, drops their per-save INFO chatter."""

  def filter(self, record):
    return record.levelno >= py_logging.WARNING or not any(
        part in record.pathname for part in ('/orbax/', '/grain/'))


def quiet_library_logs():
  logging.get_absl_handler().addFilter(_DropLibraryInfo())
