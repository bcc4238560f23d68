"""Helpers shared by the benchmarks: JSON-line output, a Markdown table, timing, machine description. Imported
first by every bench script: it makes the repository root importable and, where the machine has no accelerator,
starts only JAX's CPU backend (an installed CUDA plugin or libtpu then stays quiet)."""

import json
import os
import platform
import statistics
import sys
import time

# `python bench/<name>.py` as well as `python -m bench.<name>`: make the repository root importable.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from transformer_jax.runtime import backends  # noqa: E402  (importable from here on)

backends.skip_absent_accelerators()


def _cpuinfo(field: str, path: str = '/proc/cpuinfo') -> str | None:
  """The first value of `field` in /proc/cpuinfo; None where there is no such file or field."""
  try:
    with open(path, encoding='utf-8') as f:
      for line in f:
        if line.split(':', 1)[0].strip() == field:
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return None


def cpu_model() -> str:
  """The CPU's model name from /proc/cpuinfo (the platform's processor string elsewhere)."""
  return _cpuinfo('model name') or platform.processor() or platform.machine()


def cpu_has_vnni(path: str = '/proc/cpuinfo') -> bool | None:
  """Whether the x86 CPU has VNNI, which sums int8 products in 32 bits (without it CTranslate2's int8 products add
  pairs in 16 bits, which `interop/ctranslate2.py`'s `INT8_WEIGHT_LIMIT` keeps from overflowing); None where
  /proc/cpuinfo lists no flags."""
  flags = _cpuinfo('flags', path)
  return None if flags is None else bool({'avx512_vnni', 'avx_vnni'} & set(flags.split()))


def machine() -> dict:
  return {'cpu': cpu_model(), 'cpu_count': os.cpu_count(), 'python': platform.python_version()}


def emit(record: dict) -> None:
  """One measurement as one JSON line on stdout."""
  print(json.dumps(record, sort_keys=False), flush=True)


def timed(fn, *args):
  """Seconds one call of fn(*args) takes, waiting for its (JAX or other) results; returns (seconds, result)."""
  start = time.perf_counter()
  out = fn(*args)
  block(out)
  return time.perf_counter() - start, out


def block(tree):
  try:
    import jax  # pylint: disable=import-outside-toplevel
    jax.block_until_ready(tree)
  except ImportError:
    pass
  return tree


def shrink_to_tiny(config) -> None:
  """The tests' 1+1-layer model of width 16 and 200 pieces, in place of `config`'s model."""
  config.model.update(d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1)
  config.model.vocab_size = 200


def median(xs):
  return statistics.median(xs) if xs else float('nan')


def markdown_table(header: list[str], rows: list[list]) -> str:
  def fmt(x):
    if isinstance(x, float):
      if x != x:  # nan
        return '–'
      return f'{x:.3g}' if abs(x) < 100 else f'{x:,.0f}'
    return str(x)

  lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join('---' for _ in header) + '|']
  lines += ['| ' + ' | '.join(fmt(x) for x in row) + ' |' for row in rows]
  return '\n'.join(lines)


def parse_ints(text: str) -> list[int]:
  return [int(x) for x in text.split(',') if x.strip()]
