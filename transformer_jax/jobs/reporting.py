"""Where a training run's numbers go: TensorBoard events, `metrics.jsonl` and one progress line per record.

Only process 0 writes and logs; the other processes' reports keep counting but write nothing, so the loop's
calls stay the same on every host. Progress lines go through absl logging once (no second copy on stdout).
Two losses are reported: `loss` is the training objective, label-smoothed cross-entropy minus the smoothed
target's entropy (0 for a perfect model; not comparable with other toolkits' numbers); `nll` is the plain
negative log-likelihood per token (what fairseq or torch call the loss; perplexity = exp(nll)).
"""

import json
import sys
import time

import jax
import numpy as np
from absl import logging

# tensorboardX imports torch wherever it is installed (the Hugging Face extras), only to accept torch tensors,
# which we never pass: seconds at every start of train.py (bench/RESULTS.md, "Start-up"). It loads with torch
# hidden, unless something has imported torch already; a later `import torch` works as ever.
_HIDE_TORCH = 'torch' not in sys.modules
if _HIDE_TORCH:
  sys.modules['torch'] = None  # makes `import torch` raise ImportError, which tensorboardX catches
try:
  from tensorboardX import SummaryWriter  # pylint: disable=wrong-import-position
finally:
  if _HIDE_TORCH:
    del sys.modules['torch']

from transformer_jax.core.workdir import Workdir
from transformer_jax.data import pipeline
from transformer_jax.training import metrics as metrics_lib


class MetricWriter:
  """TensorBoard scalars and JSON lines of (step, split, values); a no-op unless `enabled`."""

  def __init__(self, workdir: Workdir, enabled: bool = True):
    self.enabled = enabled
    if enabled:
      self._tb = SummaryWriter(workdir.tensorboard)
      self._jsonl = open(workdir.metrics_file, 'a', encoding='utf-8')

  def write(self, step: int, split: str, scalars: dict):
    if not self.enabled:
      return
    for name, value in scalars.items():
      self._tb.add_scalar(f'{split}/{name}', value, step)
    self._jsonl.write(json.dumps({'step': step, 'split': split, 'time': time.time(), **scalars}) + '\n')
    self._jsonl.flush()
    self._tb.flush()

  def close(self):
    if self.enabled:
      self._tb.close()
      self._jsonl.close()


class TrainReport:
  """Collects the steps since the last log line, measures throughput and writes train/eval/compile records.

  Time spent compiling or evaluating is taken out of the throughput window (`exclude`), so tokens/s and MFU
  describe training steps only.
  """

  def __init__(self, workdir: Workdir, model_config, num_steps: int, start_step: int, filter_stats=None):
    self._lead = jax.process_index() == 0
    self._writer = MetricWriter(workdir, enabled=self._lead)
    self._model_config, self._num_steps = model_config, num_steps
    self._filter_stats = filter_stats
    self._peak = metrics_lib.peak_flops_per_device(jax.devices()[0])
    self._start_time, self._start_step = time.time(), start_step
    self._reset()

  def _reset(self):
    self._pending, self._tokens, self._flops, self._waited, self._window_start = [], 0, 0.0, 0.0, time.time()

  def log(self, message: str):
    if self._lead:
      logging.info(message)

  def exclude(self, seconds: float):
    """Leaves `seconds` (a compilation, an evaluation) out of the current throughput window."""
    self._window_start += seconds

  def add(self, step_metrics: dict, host_batch: dict, waited: float):
    """One finished step: its (on-device) metrics, this host's batch (tokens counted, FLOPs estimated) and the
    seconds the loop waited for that batch.

    Tokens are those of both sides of a translation batch, of the 'targets' of a language model's.
    """
    self._pending.append(step_metrics)
    self._waited += waited
    sides = [host_batch[key] for key in pipeline.SIDES if key in host_batch]
    self._tokens += sum(int(np.count_nonzero(side)) for side in sides) * jax.process_count()
    rows, target_len = host_batch['targets'].shape
    source_len = host_batch['inputs'].shape[1] if 'inputs' in host_batch else 0
    self._flops += metrics_lib.train_flops(self._model_config, rows * jax.process_count(), source_len, target_len)

  @property
  def has_pending(self) -> bool:
    return bool(self._pending)

  def nonfinite(self) -> int:
    """Updates skipped as non-finite among the steps not yet written (waits for them)."""
    return int(sum(int(m['nonfinite']) for m in jax.device_get(self._pending)))

  def flush(self, step: int) -> dict:
    """Writes one train record and progress line for the steps since the last one; returns the record."""
    fetched = jax.device_get(self._pending)
    elapsed = max(time.time() - self._window_start, 1e-9)
    devices = jax.device_count()
    out = metrics_lib.normalize({k: sum(float(m[k]) for m in fetched) for k in metrics_lib.SUM_KEYS})
    out.update({
        'grad_norm': float(np.mean([m['grad_norm'] for m in fetched])),
        'learning_rate': float(fetched[-1]['learning_rate']),
        'nonfinite': int(sum(int(m['nonfinite']) for m in fetched)),
        'step_seconds': elapsed / len(fetched),
        'input_wait_share': min(self._waited / elapsed, 1.0),  # of the window, the loop waiting for batches
        'tokens_per_second': self._tokens / elapsed,
        'gflops_per_second_per_device': self._flops / elapsed / devices / 1e9,
    })
    if self._filter_stats is not None:
      out['dropped_examples'] = self._filter_stats.dropped
    if self._peak:
      out['mfu'] = self._flops / elapsed / devices / self._peak
    self._writer.write(step, 'train', out)
    done = (step - self._start_step) / max(time.time() - self._start_time, 1e-9)
    eta = (self._num_steps - step) / max(done, 1e-9)
    speed = f'mfu {100 * out["mfu"]:.1f}%' if self._peak else f'{out["gflops_per_second_per_device"]:.1f} GFLOP/s/dev'
    self.log(f'step {step}/{self._num_steps}  loss {out["loss"]:.4f}  nll {out["nll"]:.4f}  '
             f'lr {out["learning_rate"]:.2e}  {out["tokens_per_second"]:,.0f} tok/s  {speed}  '
             f'input wait {100 * out["input_wait_share"]:.0f}%  ETA {format_duration(eta)}')
    self._reset()
    return out

  def evaluation(self, step: int, values: dict):
    self._writer.write(step, 'eval', values)
    self.log(f'step {step}: eval loss {values["loss"]:.4f}  nll {values["nll"]:.4f}  '
             f'perplexity {values["perplexity"]:.2f}  accuracy {values["accuracy"]:.3f}')

  def compilation(self, step: int, seconds: float, what: str):
    self._writer.write(step, 'compile', {'seconds': seconds})
    self.log(f'compiled {what} in {seconds:.1f}s')
    self.exclude(seconds)

  def close(self):
    self._writer.close()


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f'{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'
