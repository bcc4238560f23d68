"""Registers and spills of a compiled GPU program's kernels, by ptxas -v over the PTX XLA wrote for them.

A Triton kernel whose threads need more than the 255 registers a thread may hold spills to local memory: it moves
the bytes the program's count says, and many more it does not (bench/RESULTS.md, seventh H100 visit: the residual
blocks' kernels did, and big's step ran 44% slower). `bench.step_costs --registers` compiles with XLA's dump on and
reports each Pallas kernel and any kernel that spills.
"""

import dataclasses
import glob
import os
import re
import shutil
import subprocess

from bench import common

_ENTRY = re.compile(r'\.entry\s+(\w+)')
_TARGET = re.compile(r'^\.target\s+(\w+)', re.MULTILINE)
_FUNCTION = re.compile(r"Compiling entry function '(\w+)'")
_FIGURES = {'registers': re.compile(r'Used (\d+) registers'), 'stack': re.compile(r'(\d+) bytes stack frame'),
            'spill_stores': re.compile(r'(\d+) bytes spill stores'),
            'spill_loads': re.compile(r'(\d+) bytes spill loads')}
_PALLAS_NAME = re.compile(r'op_name="[^"]*/(\w+)/pallas_call"')


@dataclasses.dataclass
class Kernel:
  """One kernel's figures, the largest over its copies (XLA names a kernel's further copies name__1, name__2…)."""

  name: str
  pallas: bool
  copies: int = 0
  registers: int = 0
  stack: int = 0  # bytes a thread's stack frame holds
  spill_stores: int = 0  # bytes a thread spills
  spill_loads: int = 0


def ptxas() -> str:
  """The newest ptxas of CUDA's nvcc wheels (nvidia-cuda-nvcc-cu12, which requirements-gpu.txt brings, or CUDA 13's
  nvidia-cuda-nvcc, beside jax 0.11's plugin) or on PATH: a newer ptxas reads an older CUDA's PTX."""
  try:
    import nvidia  # pylint: disable=g-import-not-at-top
    wheels = [path for root in nvidia.__path__ for path in glob.glob(os.path.join(root, '*', 'bin', 'ptxas'))]
  except ImportError:
    wheels = []
  found = [path for path in wheels if os.access(path, os.X_OK)] or list(filter(None, [shutil.which('ptxas')]))
  if not found:
    raise SystemExit('ptxas not found, which --registers needs: pip install nvidia-cuda-nvcc-cu12 '
                     '(requirements-gpu.txt brings it)')
  return max(found, key=_release)


def _release(tool: str) -> tuple[int, ...]:
  """ptxas's CUDA release, e.g. (12, 9)."""
  version = subprocess.run([tool, '--version'], capture_output=True, text=True, check=True).stdout
  return tuple(map(int, re.search(r'release (\d+)\.(\d+)', version).groups()))


def kernels(dump_dir: str, hlo_text: str, tool: str) -> list[Kernel]:
  """Every kernel in the PTX files of XLA's dump folder, by name, through the ptxas at `tool`; `pallas` for those
  the HLO's Pallas calls name."""
  pallas_names, found = set(_PALLAS_NAME.findall(hlo_text)), {}
  for path in sorted(glob.glob(os.path.join(dump_dir, '*.ptx'))):
    with open(path, encoding='utf-8') as f:
      text = f.read()
    target = _TARGET.search(text)
    if not _ENTRY.search(text) or not target:
      continue
    run = subprocess.run([tool, f'-arch={target.group(1)}', '-v', path, '-o', os.devnull], capture_output=True,
                         text=True, check=False)
    if run.returncode:
      last = (run.stderr.strip().splitlines() or ['no message'])[-1]
      raise SystemExit(f'{tool} could not read {os.path.basename(path)} ({last}): install the nvcc wheel of the '
                       "CUDA version of jax's plugin")
    report = run.stderr
    for block in re.split(r'(?=ptxas info\s+: Compiling entry function)', report)[1:]:
      function = _FUNCTION.search(block).group(1)
      name = re.sub(r'__\d+$', '', function)
      kernel = found.setdefault(name, Kernel(name, name in pallas_names))
      kernel.copies += 1
      for field, pattern in _FIGURES.items():
        value = pattern.search(block)
        setattr(kernel, field, max(getattr(kernel, field), int(value.group(1)) if value else 0))
  if not found:
    raise SystemExit(f'XLA wrote no PTX to {dump_dir}: --registers needs the CUDA 12 plugin of the pinned jax '
                     "(requirements-test.txt); jax 0.11's CUDA 13 plugin writes none when it compiles without a GPU")
  return list(found.values())


def summary(found: list[Kernel]) -> dict:
  """The Pallas kernels and any kernel that spills, each as a dict, and a count of the rest."""
  shown = [k for k in found if k.pallas or k.spill_stores or k.spill_loads]
  rest = [k.registers for k in found if k not in shown]
  return {'kernels': [vars(k) for k in shown], 'other_kernels': len(rest), 'other_most_registers': max(rest, default=0)}


def table(record: dict) -> str:
  rows = [[k['name'] + ('' if k['pallas'] else ' (XLA)'), k['copies'], k['registers'], k['stack'], k['spill_stores'],
           k['spill_loads']] for k in record['kernels']]
  rows.append([f"{record['other_kernels']} other kernels (XLA's), none spilling", '',
               f"at most {record['other_most_registers']}", '', '', ''])
  return common.markdown_table(['kernel', 'copies', 'registers a thread', 'stack bytes', 'spill stores (bytes)',
                                'spill loads (bytes)'], rows)
