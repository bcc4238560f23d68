"""Where a profiled train step's device time goes, by the part of the model each kernel comes from.

Reads what `bench.train_throughput --profile_dir=DIR` writes for one of our runners (DIR/<config>_<impl>/): the
compiled step's optimized HLO and the jax.profiler trace of a few steps. Each GPU kernel names the HLO op that
launched it (profile with `--xla_flags=--xla_gpu_enable_command_buffer=`: inside a CUDA graph they name the graph
instead); `hlo_costs` attributes that op to a part of the model from its op_name, as bench.step_costs does for a
TPU program, and costs its bytes and FLOPs, so each part's time sits beside what it moves and computes.

python -m bench.step_profile /tmp/prof/base_ours --steps=3
"""

import argparse
import collections
import glob
import gzip
import json
import os

from bench import common
from transformer_jax import hlo_costs

UNKNOWN = 'not in the HLO (no op named)'


def kernel_times(trace_path: str) -> dict[str, float]:
  """Device time (µs) of every kernel in a Perfetto trace, summed by the HLO op that launched it."""
  with gzip.open(trace_path, 'rt', encoding='utf-8') as f:
    trace = json.load(f)
  events = trace['traceEvents'] if isinstance(trace, dict) else trace
  devices = {e['pid'] for e in events if e.get('ph') == 'M' and e.get('name') == 'process_name'
             and e['args']['name'].startswith('/device:')}
  times = collections.Counter()
  for e in events:
    if e.get('ph') == 'X' and e['pid'] in devices and e.get('args', {}).get('hlo_module'):
      times[e['args'].get('hlo_op', UNKNOWN)] += e['dur']
  if not times:
    raise SystemExit(f'{trace_path}: no device kernels with an HLO module; profile on a GPU or TPU')
  return times


def profile_parts(folder: str, steps: int) -> list[dict]:
  """One record per part: device ms per step, its share, and the compiled bytes and FLOPs of its ops."""
  traces = sorted(glob.glob(os.path.join(folder, 'plugins', 'profile', '*', 'perfetto_trace.json.gz')))
  if not traces:
    raise SystemExit(f'{folder}: no plugins/profile/*/perfetto_trace.json.gz; run bench.train_throughput '
                     '--profile_dir first')
  with open(os.path.join(folder, 'step.hlo.txt'), encoding='utf-8') as f:
    ops = {op.name: op for op in hlo_costs.op_costs(f.read())}
  times = kernel_times(traces[-1])
  graphs = [name for name in times if name.startswith('command_buffer')]
  if graphs:
    raise SystemExit(f'{folder}: kernels ran inside CUDA graphs ({graphs[0]}, ...), which hide their HLO ops; '
                     'profile with --xla_flags=--xla_gpu_enable_command_buffer=')
  sums = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
  for name, op in ops.items():
    part = sums[hlo_costs.part_of(op)]
    part[1] += op.total_bytes
    part[2] += op.total_flops
  for name, us in times.items():
    part = sums[hlo_costs.part_of(ops[name]) if name in ops else UNKNOWN]
    part[0] += us / steps / 1e3
    part[3] += 1
  total_ms = sum(v[0] for v in sums.values())
  order = {name: i for i, name in enumerate(hlo_costs.PARTS)}
  return [{'part': name, 'ms_per_step': ms, 'share': ms / total_ms, 'bytes': b, 'flops': fl, 'kernel_ops': n,
           'gb_per_s': b / ms / 1e6 if ms else None, 'tflop_per_s': fl / ms / 1e9 if ms else None}
          for name, (ms, b, fl, n) in sorted(sums.items(), key=lambda kv: order.get(kv[0], len(order)))]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('folder', help='a <config>_<impl> folder of bench.train_throughput --profile_dir')
  p.add_argument('--steps', type=int, default=3, help='steps in the trace (train_throughput --profile_steps)')
  args = p.parse_args(argv)
  records = profile_parts(args.folder, args.steps)
  rows = []
  for r in records:
    common.emit({'bench': 'step_profile', 'folder': args.folder, **r})
    rows.append([r['part'], r['ms_per_step'], f"{100 * r['share']:.1f}%", r['bytes'] / 1e9, r['flops'] / 1e12,
                 r['gb_per_s'] or '', r['tflop_per_s'] or ''])
  total = sum(r['ms_per_step'] for r in records)
  rows.append(['**device time per step**', total, '100%', sum(r['bytes'] for r in records) / 1e9,
               sum(r['flops'] for r in records) / 1e12, '', ''])
  print(common.markdown_table(['part', 'ms per step', 'share', 'GB (compiled)', 'TFLOP (compiled)', 'GB/s',
                               'TFLOP/s'], rows))


if __name__ == '__main__':
  main()
