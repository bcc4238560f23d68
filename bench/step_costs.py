"""Where a compiled train step's bytes and FLOPs go: per chip, by the part of the model each op comes from.

Compiles the config's train step at its longest batch shape for a TPU slice or a GPU host
(`aot.longest_train_step`, the program `--compile_only` and bench/fits.py compile) and reads its optimized HLO
with `transformer_jax.compile.hlo_costs`: each op costed from its shapes (loop bodies × trip count, custom calls by their
cost estimate) and attributed by its op_name. Prints one JSON line per part and a Markdown table, with XLA's own
totals beside the breakdown's (a GPU program compiled without its GPU has none), and each part's time op by op
(`step_parts.serial_seconds`: each op at its own roofline, asynchronous copies beside them). For a GPU, --registers
adds each Pallas kernel's registers and spills (`bench.kernel_registers`: ptxas -v), which no byte count shows.

python -m bench.step_costs --config=configs/wmt14_ende_base.py --topology=v4-8 --mesh=data \
    --set model.num_encoder_layers=2 --set model.num_decoder_layers=2
JAX_PLATFORMS=cpu python -m bench.step_costs --config=configs/wmt14_ende_base.py --topology=h100-1 \
    --set "pipeline.bucket_boundaries=(128,)" --set pipeline.max_length=128 --set pipeline.tokens_per_batch=25088 \
    --registers
"""

import argparse
import ast
import tempfile
import time

from bench import common
from bench import kernel_registers
from transformer_jax import config as config_lib
from transformer_jax.compile import aot
from transformer_jax.compile import hlo_costs
from transformer_jax.compile import step_parts
from transformer_jax.compile import topologies


def load_config(path: str, topology: str, mesh: str, overrides: list[str]):
  """The config file with the `--set` overrides, checked as train.py checks its --config.key=value ones."""
  config = config_lib.load(path, dict(_parsed(override) for override in overrides))
  aot.set_mesh_shape(config, aot.mesh_presets(topologies.get_topology(topology).num_devices)[mesh])
  config.model.dtype = 'bfloat16'
  return config


def _parsed(override: str) -> tuple[str, object]:
  key, value = override.split('=', 1)
  try:
    return key, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return key, value  # a string


def measure(config, topology: str, dump_hlo: str | None = None, registers: bool = False) -> dict:
  target = topologies.get_topology(topology)
  if registers and target.chip.platform != 'gpu':
    raise SystemExit(f'--registers reads the PTX of a GPU program: {topology} is a TPU topology')
  ptxas = kernel_registers.ptxas() if registers else None  # before the compile: a missing tool fails at once
  program = aot.longest_train_step(config, topology)
  with tempfile.TemporaryDirectory() as dump:
    start = time.perf_counter()
    compiled = aot.compile_program(program, {'xla_dump_to': dump} if registers else None)
    seconds = time.perf_counter() - start
    kernels = kernel_registers.summary(kernel_registers.kernels(dump, compiled.as_text(), ptxas)) if registers else None
  if dump_hlo:
    with open(dump_hlo, 'w', encoding='utf-8') as f:
      f.write(compiled.as_text())
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  ops = hlo_costs.op_costs(compiled.as_text())
  parts = step_parts.breakdown(ops)
  devices, chip = target.num_devices, target.chip
  serial = step_parts.serial_seconds_by_part(ops, chip.peak_flops, chip.hbm_bandwidth)
  rows, length = next(iter(program.args[1].values())).shape
  return {'what': program.what, 'topology': topology, 'num_devices': devices, 'batch_rows': rows,
          'batch_length': length,
          'compile_seconds': seconds,
          # a GPU program compiled without its GPU has no cost analysis of XLA's
          'xla_bytes_accessed': None if cost is None else float(cost['bytes accessed']),
          'xla_flops': None if cost is None else float(cost['flops']),
          'bytes': sum(p.bytes for p in parts), 'hbm_bytes': sum(p.hbm_bytes for p in parts),
          'flops': sum(p.flops for p in parts),
          'model_flops_per_device': program.model_flops / devices,
          'temp_bytes': compiled.memory_analysis().temp_size_in_bytes,
          'custom_calls_without_estimate': sum(1 for op in ops if not op.estimated),
          'kernel_flops': sum(op.total_flops for op in ops if not op.estimated),
          'serial_seconds': sum(serial.values()), 'peak_flops': chip.peak_flops, 'hbm_bandwidth': chip.hbm_bandwidth,
          'integer_ops': sum(p.integer_ops for p in parts), 'kernel_registers': kernels,
          'parts': [vars(p) | {'serial_seconds': serial.get(p.name, 0.0)} for p in parts]}


def table(record: dict) -> str:
  ms = lambda seconds: f'{1e3 * seconds:.2f}'
  rows = [[p['name'], f'{p["bytes"] / 1e9:.2f}', f'{p["backward_bytes"] / 1e9:.2f}',
           f'{p["borrowed_bytes"] / 1e9:.2f}', f'{p["hbm_bytes"] / 1e9:.2f}',
           f'{100 * p["bytes"] / record["bytes"]:.0f}%', f'{p["flops"] / 1e9:,.1f}', ms(p['serial_seconds']), p['ops']]
          for p in record['parts']]
  rows.append(['**all parts**', f'{record["bytes"] / 1e9:.2f}', '', '', f'{record["hbm_bytes"] / 1e9:.2f}', '100%',
               f'{record["flops"] / 1e9:,.1f}', ms(record['serial_seconds']), sum(p['ops'] for p in record['parts'])])
  if record['xla_flops'] is not None:
    rows.append(['XLA cost analysis (its loop bodies counted once)', f'{record["xla_bytes_accessed"] / 1e9:.2f}',
                 '', '', '', '', f'{record["xla_flops"] / 1e9:,.1f}', '', ''])
    rows.append(['XLA + attention kernels without a cost estimate (their FLOPs from shapes)', '', '', '', '', '',
                 f'{(record["xla_flops"] + record["kernel_flops"]) / 1e9:,.1f}', '', ''])
  rows.append(['analytic model FLOPs (metrics.train_flops)', '', '', '', '', '',
               f'{record["model_flops_per_device"] / 1e9:,.1f}',
               ms(record['model_flops_per_device'] / record['peak_flops']), ''])
  return common.markdown_table(['part', 'GB accessed', 'of it backward', 'of it memory moves', 'of it HBM', 'share',
                                'GFLOP', 'ms op by op', 'ops'], rows)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--config', default='configs/wmt14_ende_base.py')
  p.add_argument('--topology', default='v4-8')
  p.add_argument('--mesh', default='data', choices=('data', 'fsdp', 'fsdp_tensor'))
  p.add_argument('--set', action='append', default=[], metavar='SECTION.KEY=VALUE',
                 help='a config override, e.g. model.num_encoder_layers=2 (repeatable)')
  p.add_argument('--dump_hlo', default=None, help='also write the optimized HLO text to this file')
  p.add_argument('--registers', action='store_true',
                 help="a GPU topology's kernels: registers a thread and spills, by ptxas -v (bench.kernel_registers)")
  args = p.parse_args(argv)
  record = measure(load_config(args.config, args.topology, args.mesh, args.set), args.topology, args.dump_hlo,
                   args.registers)
  for part in record['parts']:
    common.emit(dict(part, topology=args.topology, mesh=args.mesh, config=args.config, overrides=args.set))
  common.emit({k: v for k, v in record.items() if k != 'parts'} | {'mesh': args.mesh, 'config': args.config,
                                                                     'overrides': args.set})
  print()
  print(f'{record["what"]}, {args.topology}, {args.mesh} mesh, per device; temporaries '
        f'{record["temp_bytes"] / 2**30:.2f} GiB; compiled in {record["compile_seconds"]:.0f} s')
  print(f'Op by op (`step_parts.serial_seconds`): {1e3 * record["serial_seconds"]:.2f} ms, MFU at most '
        f'{record["model_flops_per_device"] / (record["peak_flops"] * record["serial_seconds"]):.0%}; of the FLOPs, '
        f'{record["integer_ops"] / 1e9:,.1f} G are element-wise ops on integers (random bits), which a TPU runs on '
        'its vector units, not at the peak counted here')
  print()
  print(table(record))
  if record['kernel_registers']:
    print()
    print(kernel_registers.table(record['kernel_registers']))


if __name__ == '__main__':
  main()
