"""Where a profiled train step's device time goes, by the part of the model each kernel comes from.

Reads what `bench.train_throughput --profile_dir=DIR` writes for one of our runners (DIR/<model>_<impl>/): the
compiled step's optimized HLO and the jax.profiler trace of a few steps. Each GPU kernel names the HLO op that
launched it (profile with `--xla_flags=--xla_gpu_enable_command_buffer=`: inside a CUDA graph they name the graph
instead); `hlo_costs` attributes that op to a part of the model from its op_name, as bench.step_costs does for a
TPU program, and costs its bytes and FLOPs, so each part's time sits beside what it moves and computes, and beside
its ops' rooflines op by op on the chip profiled (`step_parts.serial_seconds`): how far each part is from its bound.

python -m bench.step_profile /tmp/prof/base_ours --steps=3 --chip=h100
"""

import argparse
import collections
import glob
import gzip
import json
import os

from bench import common
from transformer_jax.compile import hlo_costs
from transformer_jax.compile import step_parts
from transformer_jax.compile import topologies

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


def profile_parts(folder: str, steps: int, chip: str = 'h100') -> list[dict]:
  """One record per part: device ms per step, its share, the compiled bytes and FLOPs of its ops, and their time op
  by op on `chip` (a key of `topologies.CHIPS`)."""
  traces = sorted(glob.glob(os.path.join(folder, 'plugins', 'profile', '*', 'perfetto_trace.json.gz')))
  if not traces:
    raise SystemExit(f'{folder}: no plugins/profile/*/perfetto_trace.json.gz; run bench.train_throughput '
                     '--profile_dir first')
  hlo_path = os.path.join(folder, 'step.hlo.txt')
  if not os.path.exists(hlo_path):
    raise SystemExit(f'{hlo_path}: missing; the trace and the HLO come together from bench.train_throughput '
                     '--profile_dir')
  with open(hlo_path, encoding='utf-8') as f:
    costs = hlo_costs.op_costs(f.read())
  times = kernel_times(traces[-1])
  graphs = [name for name in times if name.startswith('command_buffer')]
  if graphs:
    raise SystemExit(f'{folder}: kernels ran inside CUDA graphs ({graphs[0]}, ...), which hide their HLO ops; '
                     'profile with --xla_flags=--xla_gpu_enable_command_buffer=')
  part_of = {op.name: step_parts.part_of(op) for op in costs}
  ms, kernel_ops = collections.Counter(), collections.Counter()
  for name, us in times.items():
    part = part_of.get(name, UNKNOWN)
    ms[part] += us / steps / 1e3
    kernel_ops[part] += 1
  compiled = {p.name: p for p in step_parts.breakdown(costs)}  # bytes and FLOPs per part, in PARTS order
  target = topologies.CHIPS[chip]
  bound = step_parts.serial_seconds_by_part(costs, target.peak_flops, target.hbm_bandwidth, lambda op: part_of[op.name])
  total_ms = sum(ms.values())
  records = []
  for name in [*compiled, *(n for n in ms if n not in compiled)]:
    b, fl = (compiled[name].bytes, compiled[name].flops) if name in compiled else (0.0, 0.0)
    t = ms[name]
    records.append({'part': name, 'ms_per_step': t, 'share': t / total_ms, 'bytes': b, 'flops': fl,
                    'kernel_ops': kernel_ops[name], 'gb_per_s': b / t / 1e6 if t else None,
                    'tflop_per_s': fl / t / 1e9 if t else None,
                    'bound_ms': 1e3 * bound.get(name, 0.0) if name in compiled else None})
  return records

def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('folder', help='a <model>_<impl> folder of bench.train_throughput --profile_dir')
  p.add_argument('--steps', type=int, default=3, help='steps in the trace (train_throughput --profile_steps)')
  p.add_argument('--chip', default='h100', choices=list(topologies.CHIPS),
                 help='the chip profiled, for the op-by-op bound')
  args = p.parse_args(argv)
  records = profile_parts(args.folder, args.steps, args.chip)
  rows = []
  for r in records:
    common.emit({'bench': 'step_profile', 'folder': args.folder, 'chip': args.chip, **r})
    bound = r['bound_ms']
    rows.append([r['part'], r['ms_per_step'], f"{100 * r['share']:.1f}%", r['bytes'] / 1e9, r['flops'] / 1e12,
                 r['gb_per_s'] or '', r['tflop_per_s'] or '', '' if bound is None else bound,
                 f"{r['ms_per_step'] / bound:.1f}×" if bound else ''])
  total, bound = sum(r['ms_per_step'] for r in records), sum(r['bound_ms'] or 0 for r in records)
  rows.append(['**device time per step**', total, '100%', sum(r['bytes'] for r in records) / 1e9,
               sum(r['flops'] for r in records) / 1e12, '', '', bound, f'{total / bound:.1f}×' if bound else ''])
  print(common.markdown_table(['part', 'ms per step', 'share', 'GB (compiled)', 'TFLOP (compiled)', 'GB/s',
                               'TFLOP/s', 'ms op by op', 'measured / op by op'], rows))


if __name__ == '__main__':
  main()
