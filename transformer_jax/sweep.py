"""Sweeps: a base config, a list of variants (overrides), one training workdir per variant, a results table.

A sweep file (`configs/sweeps/*.py`) defines `get_sweep()`, returning the variants built with the
helpers below, and may set `CONFIG`, the base config used when `sweep.py` gets no `--config`:

    from transformer_jax import sweep

    CONFIG = 'configs/wmt14_ende_base.py:runlocal'

    def get_sweep():
      return sweep.product(('model.num_heads', [2, 4]), ('model.dropout', [0.0, 0.1]))

A variant is a dict of dotted config keys to values. The key `CONFIG_ARG` ('config_arg') is special: its
value is appended to the base config's argument, so `{'config_arg': 'A_h16'}` over
`configs/wmt14_ende_base.py:runlocal` trains `configs/wmt14_ende_base.py:runlocal,A_h16`.

- `axis(key, values)`: one variant per value;
- `product(*sweeps)`: every combination (each argument an axis `(key, values)` or a list of variants);
- `zip(*sweeps)`: the i-th variants merged, for sweeps of equal length;
- `chain(*sweeps)`: one after the other.
`get_sweep()` may also return an explicit list of dicts, or a dict {name: overrides} to choose the names
of the sub-workdirs (otherwise they are derived from the overrides, e.g. `num_heads=2,dropout=0.1`).

`run` trains each variant with `train.py` in `<root>/<name>` one after another, skipping finished ones
(results.json of the final evaluation at train.num_steps) and resuming interrupted ones (train.py restarts
from the latest checkpoint of its workdir); `commands` gives the same launches for a cluster scheduler;
`write_results` tabulates every variant in `<root>/results.md` and `<root>/results.csv`.

(Over 400 lines because the three jobs of a sweep — declaring variants, launching them, tabulating their
workdirs — share the variants' names and workdir reading; split, each part would import the others.)
"""

import builtins
import csv
import dataclasses
import datetime
import io
import itertools
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
from typing import Any, Iterable, Mapping, Sequence

import ml_collections

from transformer_jax import config as config_lib
from transformer_jax.core import files
from transformer_jax.core.workdir import Workdir

CONFIG_ARG = 'config_arg'
LOG_FILE = 'sweep.log'  # <root>/sweep.log: what the runner did; each variant's train.py output: Workdir.train_log
RESULT_COLUMNS = ('status', 'step', 'train_loss', 'eval_loss', 'bleu', 'chrf', 'chrf++', 'tokenized_bleu', 'test_loss',
                  'params', 'steps_per_second')

Overrides = dict[str, Any]


# ----------------------------------------------------------------------------- building sweeps


def axis(key: str, values: Iterable[Any]) -> list[Overrides]:
  """One variant per value of `key`."""
  if not isinstance(key, str):
    raise TypeError(f'a sweep axis is (dotted key, values), got key {key!r}.')
  values = list(values)
  if not values:
    raise ValueError(f'sweep axis {key!r} has no values.')
  return [{key: value} for value in values]


def _as_sweep(item) -> list[Overrides]:
  if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
    return axis(*item)
  if isinstance(item, Sequence) and not isinstance(item, str) and all(isinstance(v, Mapping) for v in item):
    return [dict(v) for v in item]
  raise TypeError(f'expected an axis (key, values) or a list of override dicts, got {item!r}.')


def _merge(parts: Sequence[Mapping]) -> Overrides:
  merged = {}
  for part in parts:
    clash = sorted(set(merged) & set(part))
    if clash:
      raise ValueError(f'sweep keys {clash} are set twice in one variant; combine each key in one axis.')
    merged.update(part)
  return merged


def product(*sweeps) -> list[Overrides]:
  """Every combination of the given axes / sweeps; the last one varies fastest."""
  return [_merge(parts) for parts in itertools.product(*map(_as_sweep, sweeps))]


def zip(*sweeps) -> list[Overrides]:  # pylint: disable=redefined-builtin
  """The i-th variants of each sweep merged; all must have the same length."""
  lists = [_as_sweep(s) for s in sweeps]
  lengths = {len(s) for s in lists}
  if len(lengths) > 1:
    raise ValueError(f'sweep.zip needs sweeps of one length, got lengths {[len(s) for s in lists]}.')
  return [_merge(parts) for parts in builtins.zip(*lists)]


def chain(*sweeps) -> list[Overrides]:
  """The variants of each sweep, one sweep after the other."""
  return [variant for s in sweeps for variant in _as_sweep(s)]


# ----------------------------------------------------------------------------- variants


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str  # also the sub-workdir
  overrides: Overrides  # dotted config keys -> values (CONFIG_ARG excluded)
  config_arg: str | None  # names appended to the base config's argument


def _short_keys(keys: Sequence[str]) -> dict[str, str]:
  """Each dotted key's shortest dotted suffix that no other key shares."""
  short = {}
  for key in keys:
    parts = key.split('.')
    for n in range(1, len(parts) + 1):
      suffix = '.'.join(parts[-n:])
      if not any(other != key and (other == suffix or other.endswith('.' + suffix)) for other in keys):
        break
    short[key] = suffix
  return short


def _format_value(value) -> str:
  if isinstance(value, (list, tuple)):
    return '-'.join(_format_value(v) for v in value)
  return str(value)


_NAME_MAX = 255  # the longest file name of common file systems (ext4, XFS, APFS, NTFS), in bytes


def _safe_name(name: str) -> str:
  name = re.sub(r'[^A-Za-z0-9_.,=+-]', '_', name).strip('.')
  return name or 'variant'


def variants(sweep) -> list[Variant]:
  """Normalizes what `get_sweep()` returns into named variants; names are unique directory names."""
  if isinstance(sweep, Mapping):
    named = [(str(name), dict(overrides)) for name, overrides in sweep.items()]
  else:
    overrides_list = _as_sweep(sweep if isinstance(sweep, tuple) else list(sweep))
    keys = list(dict.fromkeys(k for o in overrides_list for k in o))
    short = _short_keys([k for k in keys if k != CONFIG_ARG])
    named = []
    for overrides in overrides_list:
      parts = [str(overrides[CONFIG_ARG])] if CONFIG_ARG in overrides else []
      parts += [f'{short[k]}={_format_value(v)}' for k, v in overrides.items() if k != CONFIG_ARG]
      named.append((','.join(parts) or 'base', overrides))
  if not named:
    raise ValueError('the sweep has no variants.')
  result, seen = [], {}
  for name, overrides in named:
    for key in overrides:
      if not isinstance(key, str) or not key:
        raise ValueError(f'variant {name!r}: override keys must be dotted config keys, got {key!r}.')
    safe = _safe_name(name)
    if len(safe) > _NAME_MAX:
      raise ValueError(f'variant {safe[:60]}... gets a workdir name of {len(safe)} characters, more than a file name '
                       f'holds ({_NAME_MAX}): return a dict {{name: overrides}} from get_sweep() to name the variants, '
                       'or set the values every variant shares in the base config.')
    if safe in seen:
      raise ValueError(f'variants {seen[safe]!r} and {name!r} both get the workdir name {safe!r}; '
                       'return a dict {name: overrides} from get_sweep() to name them.')
    seen[safe] = name
    arg = overrides.get(CONFIG_ARG)
    result.append(Variant(safe, {k: v for k, v in overrides.items() if k != CONFIG_ARG},
                          None if arg is None else str(arg)))
  return result


def load_sweep_file(path: str):
  """The module of a sweep file (it must define `get_sweep()`)."""
  return files.load_python(path, 'get_sweep', 'sweep file')


# ----------------------------------------------------------------------------- configs


def config_spec(base: str, variant: Variant) -> str:
  """The `--config` value of a variant: the base's file and argument plus the variant's config_arg."""
  if not variant.config_arg:
    return base
  return f'{base},{variant.config_arg}' if ':' in base else f'{base}:{variant.config_arg}'


def variant_config(base: str, variant: Variant) -> ml_collections.ConfigDict:
  """The variant's full config, loaded and validated as train.py will (unknown keys and bad values fail here)."""
  try:
    return config_lib.load(config_spec(base, variant), variant.overrides)
  except ValueError as e:
    raise ValueError(f'variant {variant.name}: {e}') from None


def _flag_value(key: str, value) -> str:
  if value is None:
    raise ValueError(f'{key}=None cannot be passed as a --config flag; set it in a config file instead.')
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (list, tuple)):
    return repr(tuple(value))
  return str(value)


def command(base: str, variant: Variant, root: str, python: str = sys.executable, *, train_py: str) -> list[str]:
  """The train.py command line of one variant (`train_py`: the path sweep.py runs, its sibling)."""
  args = [python, train_py, f'--config={config_spec(base, variant)}',
          f'--workdir={os.path.join(root, variant.name)}']
  args += [f'--config.{key}={_flag_value(key, value)}' for key, value in variant.overrides.items()]
  return args


# ----------------------------------------------------------------------------- state of a workdir


def latest_checkpoint(workdir: str) -> int | None:
  """The latest finished checkpoint step (orbax renames a step's directory to its number when complete)."""
  try:
    steps = [int(name) for name in os.listdir(Workdir(workdir).checkpoints) if name.isdigit()]
  except OSError:
    return None
  return max(steps, default=None)


def is_finished(workdir: str, num_steps: int) -> bool:
  return Workdir(workdir).finished_results(num_steps) is not None


# ----------------------------------------------------------------------------- running


class Log:
  """Prints the runner's progress and appends it to <root>/sweep.log."""

  def __init__(self, root: str):
    os.makedirs(root, exist_ok=True)
    self.path = os.path.join(root, LOG_FILE)

  def __call__(self, message: str, show: bool = True):
    if show:
      print(message, flush=True)
    with open(self.path, 'a', encoding='utf-8') as f:
      f.write(f'{datetime.datetime.now().isoformat(timespec="seconds")} {message}\n')


def run(base: str, sweep_variants: Sequence[Variant], root: str, python: str = sys.executable, *,
        train_py: str) -> dict[str, str]:
  """Trains every unfinished variant, one after another; returns name -> 'skipped'|'finished'|'failed: ...'."""
  configs = {v.name: variant_config(base, v) for v in sweep_variants}  # fail on any bad variant before training
  log = Log(root)
  outcome = {}
  for i, variant in enumerate(sweep_variants, start=1):
    workdir = os.path.join(root, variant.name)
    num_steps = configs[variant.name].train.num_steps
    tag = f'[{i}/{len(sweep_variants)}] {variant.name}'
    if is_finished(workdir, num_steps):
      log(f'{tag}: skipped, finished at step {num_steps}')
      outcome[variant.name] = 'skipped'
      continue
    latest = latest_checkpoint(workdir)
    log(f'{tag}: resuming from checkpoint {latest}' if latest is not None else f'{tag}: starting')
    args = command(base, variant, root, python, train_py=train_py)
    os.makedirs(workdir, exist_ok=True)
    with open(Workdir(workdir).train_log, 'a', encoding='utf-8') as train_log:
      train_log.write(f'$ {shlex.join(args)}\n')
      train_log.flush()
      process = subprocess.Popen(args, stdout=train_log, stderr=subprocess.STDOUT)
      try:
        returncode = process.wait()
      except KeyboardInterrupt:  # train.py got the signal too: let it save its checkpoint before leaving
        process.wait()
        log(f'{tag}: interrupted; rerun the sweep to resume', show=False)  # the tool's last line says it
        raise KeyboardInterrupt(f'{tag} stopped (its train.py saves and stops); rerun the sweep to resume') from None
    if returncode == 0 and is_finished(workdir, num_steps):
      log(f'{tag}: finished')
      outcome[variant.name] = 'finished'
    else:
      reason = f'exit code {returncode}' if returncode else f'no final results for step {num_steps}'
      log(f'{tag}: failed ({reason}); see {Workdir(workdir).train_log}')
      outcome[variant.name] = f'failed: {reason}'
  return outcome


def commands(base: str, sweep_variants: Sequence[Variant], root: str, python: str = 'python', *,
             train_py: str) -> list[str]:
  """One shell command per unfinished variant (finished ones as comments), for a cluster scheduler."""
  lines = []
  for variant in sweep_variants:
    num_steps = variant_config(base, variant).train.num_steps
    if is_finished(os.path.join(root, variant.name), num_steps):
      lines.append(f'# {variant.name}: finished')
    else:
      lines.append(shlex.join(command(base, variant, root, python, train_py=train_py)))
  return lines


# ----------------------------------------------------------------------------- results


def _last(records: list[dict], split: str, key: str):
  values = [(r['step'], r[key]) for r in records if r.get('split') == split and _number(r.get(key))]
  return max(values, key=lambda sv: sv[0])[1] if values else None


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _step_seconds(records: list[dict]) -> list[float]:
  """Seconds per step of each logged training window, leaving out windows that include a compilation."""
  compiles = {r['step'] for r in records if r.get('split') == 'compile'}  # compiled before step + 1 ran
  windows, previous = [], None
  for r in sorted((r for r in records if r.get('split') == 'train'), key=lambda r: r['step']):
    seconds = r.get('step_seconds')
    if _number(seconds) and seconds > 0:
      compiled = any((previous is None or previous <= c) and c < r['step'] for c in compiles)
      windows.append((seconds, compiled))
    previous = r['step']
  clean = [seconds for seconds, compiled in windows if not compiled]
  return clean or [seconds for seconds, _ in windows]


def result_row(base: str, variant: Variant, root: str, outcome: str | None = None) -> dict:
  """One row of the results table, read from the variant's workdir (absent values are None).

  outcome: what `run` reported for the variant, if it just ran (a failure shows as the status).
  """
  workdir = os.path.join(root, variant.name)
  num_steps = variant_config(base, variant).train.num_steps
  records = Workdir(workdir).read_metrics()
  results = Workdir(workdir).finished_results(num_steps)
  step = max((r['step'] for r in records if r.get('split') == 'train'), default=None)
  if results is not None:
    status = 'finished'
  elif outcome and outcome.startswith('failed'):
    status = outcome
  elif step is None and latest_checkpoint(workdir) is None:
    status = 'not started'
  else:
    status = 'incomplete'
  step_seconds = _step_seconds(records)
  results = results or {}
  row = {'variant': variant.name}
  if variant.config_arg is not None:
    row[CONFIG_ARG] = variant.config_arg
  row.update(variant.overrides)
  row.update({
      'status': status,
      'step': results.get('step', step),
      'train_loss': _last(records, 'train', 'loss'),
      'eval_loss': _last(records, 'eval', 'loss'),
      'bleu': results.get('bleu'),
      'chrf': results.get('chrf'),
      'chrf++': results.get('chrf++'),
      'tokenized_bleu': results.get('tokenized_bleu'),
      'test_loss': results.get(f'{results.get("split", "test")}_loss'),  # on eval.test_split, whatever it names
      'params': results.get('params'),
      'steps_per_second': 1 / statistics.median(step_seconds) if step_seconds else None,
  })
  return row


def _cell(value, column: str) -> str:
  """Measured floats with 4 significant digits; the variant's own values as written."""
  if value is None:
    return ''
  if isinstance(value, float) and column in RESULT_COLUMNS:
    return f'{value:.4g}'
  return _format_value(value)


def write_results(base: str, sweep_variants: Sequence[Variant], root: str,
                  outcome: Mapping[str, str] | None = None) -> list[dict]:
  """Writes <root>/results.md and <root>/results.csv, one row per variant; returns the rows.

  outcome: `run`'s result, so that variants that failed in this run say so.
  """
  rows = [result_row(base, v, root, (outcome or {}).get(v.name)) for v in sweep_variants]
  columns = list(dict.fromkeys(k for row in rows for k in row if k not in RESULT_COLUMNS)) + list(RESULT_COLUMNS)
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, 'results.csv'), 'w', newline='', encoding='utf-8') as f:
    writer = csv.writer(f)
    writer.writerow(columns)
    for row in rows:
      writer.writerow([_cell(row.get(c), c) for c in columns])
  text = io.StringIO()
  text.write(f'Sweep over `{base}`.\n\n')
  text.write('| ' + ' | '.join(columns) + ' |\n')
  text.write('|' + '|'.join('---:' if c in RESULT_COLUMNS[1:] else '---' for c in columns) + '|\n')
  for row in rows:
    text.write('| ' + ' | '.join(_cell(row.get(c), c).replace('|', '\\|') or '–' for c in columns) + ' |\n')
  with open(os.path.join(root, 'results.md'), 'w', encoding='utf-8') as f:
    f.write(text.getvalue())
  return rows
