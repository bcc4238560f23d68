"""Where a compiled train step's bytes and FLOPs go: per chip, by the part of the model each op comes from.

Compiles the config's train step at its longest batch shape for a TPU slice or a GPU host
(`aot.longest_train_step`, the program `--compile_only` and bench/fits.py compile) and reads its optimized HLO
with `transformer_jax.compile.hlo_costs`: each op costed from its shapes (loop bodies × trip count, custom calls by their
cost estimate) and attributed by its op_name. Prints one JSON line per part and a Markdown table, with XLA's own
totals beside the breakdown's (a GPU program compiled without its GPU has none), and each part's time op by op
(`step_parts.serial_seconds`: each op at its own roofline, asynchronous copies beside them). For a GPU, --registers
adds each Pallas kernel's registers and spills (`bench.kernel_registers`: ptxas -v), which no byte count shows.

python -m bench.step_costs --config=configs/wmt14_ende_base.py --topology=v4-8 --mesh=data \
    --config.model.num_encoder_layers=2 --config.model.num_decoder_layers=2
JAX_PLATFORMS=cpu python -m bench.step_costs --config=configs/wmt14_ende_base.py --topology=h100-1 \
    "--config.pipeline.bucket_boundaries=(128,)" --config.pipeline.max_length=128 \
    --config.pipeline.tokens_per_batch=25088 --registers

--config and its --config.KEY=VALUE overrides are train.py's (`cli.define_config_file_flag`), checked as it checks
them.
"""

import tempfile
import time

from absl import app
from absl import flags
from ml_collections import config_flags

from bench import common
from bench import kernel_registers
from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax.compile import aot
from transformer_jax.compile import hlo_costs
from transformer_jax.compile import step_parts
from transformer_jax.compile import topologies

MESHES = ('data', 'fsdp', 'fsdp_tensor')


def for_topology(config, topology: str, mesh: str):
  """`config` (loaded as train.py loads it: `config.load`, or its --config flag) on the `mesh` preset of
  `topology`'s chips, in bfloat16."""
  aot.set_mesh_shape(config, aot.mesh_presets(topologies.get_topology(topology).num_devices)[mesh])
  config.model.dtype = 'bfloat16'
  return config


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


def main():
  """The command: its flags are defined here, when it runs (not when a test imports the module)."""
  config = cli.define_config_file_flag('configs/wmt14_ende_base.py', 'Config file, path[:arguments]; change any '
                                       'key with --config.KEY=VALUE, as train.py takes them.')
  topology = flags.DEFINE_string('topology', 'v4-8', 'The TPU slice or GPU host to compile for.')
  mesh = flags.DEFINE_enum('mesh', 'data', MESHES, 'The mesh preset of its chips.')
  dump_hlo = flags.DEFINE_string('dump_hlo', None, 'Also write the optimized HLO text to this file.')
  registers = flags.DEFINE_bool('registers', False, "A GPU topology's kernels: the registers a thread takes and "
                                'its spills, by ptxas -v (bench.kernel_registers).')

  def run(argv):
    if len(argv) > 1:
      raise app.UsageError(f'unexpected arguments {argv[1:]}; settings go in --config.KEY=VALUE.')
    overrides = cli.overrides()
    config_lib.validate(config.value, data_splits=(), overrides=overrides)
    report(measure(for_topology(config.value, topology.value, mesh.value), topology.value, dump_hlo.value,
                   registers.value),
           {'topology': topology.value, 'mesh': mesh.value,
            'config': config_flags.get_config_filename(flags.FLAGS['config']), 'overrides': overrides})

  cli.run(run)


def report(record: dict, settings: dict) -> None:
  """One JSON line per part and one for the step (each with the command's `settings`), then the tables."""
  for part in record['parts']:
    common.emit(dict(part, **settings))
  common.emit({k: v for k, v in record.items() if k != 'parts'} | settings)
  print()
  print(f'{record["what"]}, {settings["topology"]}, {settings["mesh"]} mesh, per device; temporaries '
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
