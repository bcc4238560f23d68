"""Compile time and program size of the train step against depth, with the layers scanned (`model.scan_layers`)
and unrolled.

python -m bench.compile_depth [--depths=2,24] [--architecture=decoder_only] [--rounds=2]

For a narrow model (d_model 64, 4 heads, d_ff 256, vocabulary 1000; packed batches of 8 rows × 64 tokens) at each
depth (the decoder's layers, and the encoder's as many for encoder_decoder) builds the trainer's jitted train step
(Adam with the paper's schedule, dropout 0.1, float32, one device, the CPU kernels where they apply) and times
tracing + lowering and XLA's compilation of it, from abstract values (nothing is allocated). Rounds interleave the
settings in one process; every measurement compiles afresh (no persistent cache). Prints one JSON line per
measurement and a Markdown table of medians, with each setting's ratio to its shallowest depth.
"""

import time

import jax
from absl import app
from absl import flags

from bench import common
from transformer_jax import config as config_lib
from transformer_jax.training import run_builder

_DEPTHS = flags.DEFINE_string('depths', '2,24', 'Comma-separated layer counts.')
_ARCHITECTURE = flags.DEFINE_enum('architecture', 'decoder_only', ['decoder_only', 'encoder_decoder'],
                                  'model.architecture')
_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Interleaved rounds.')
ROWS, LENGTH = 8, 64


def train_step_config(depth: int, scan_layers: bool, architecture: str):
  config = config_lib.base_config()
  config.model.update(architecture=architecture, vocab_size=1000, d_model=64, d_ff=256, num_heads=4,
                      num_decoder_layers=depth, num_encoder_layers=0 if architecture == 'decoder_only' else depth,
                      scan_layers=scan_layers)
  config.train.update(num_steps=10, warmup_steps=4)
  config.mesh.shape = {'data': 1, 'fsdp': 1, 'tensor': 1}
  return config


def measure(depth: int, scan_layers: bool, architecture: str) -> dict:
  """Seconds to trace and lower, and to compile, the train step; the lowered program's size."""
  config = train_step_config(depth, scan_layers, architecture)
  run = run_builder.build(config, jax.devices()[:1])
  batch = run.abstract_batch({key: (ROWS, LENGTH) for key in run.train_batch_shapes[0]})
  with run.activate():
    start = time.perf_counter()
    lowered = run.train_step.lower(run.abstract_state, batch)
    lowered_at = time.perf_counter()
    lowered.compile()
    compiled_at = time.perf_counter()
  return {'architecture': architecture, 'depth': depth, 'scan_layers': scan_layers,
          'lower_seconds': lowered_at - start, 'compile_seconds': compiled_at - lowered_at,
          'program_kib': len(lowered.as_text()) / 1024}


def main(argv):
  del argv
  depths = common.parse_ints(_DEPTHS.value)
  settings = [(depth, scan) for scan in (True, False) for depth in depths]
  records = {setting: [] for setting in settings}
  for _ in range(_ROUNDS.value):
    for depth, scan in settings:
      record = measure(depth, scan, _ARCHITECTURE.value)
      records[(depth, scan)].append(record)
      common.emit(record)
  median = lambda setting, key: common.median([r[key] for r in records[setting]])
  rows = []
  for depth, scan in settings:
    base = (min(depths), scan)
    total = median((depth, scan), 'lower_seconds') + median((depth, scan), 'compile_seconds')
    base_total = median(base, 'lower_seconds') + median(base, 'compile_seconds')
    rows.append(['scanned' if scan else 'unrolled', depth, median((depth, scan), 'lower_seconds'),
                 median((depth, scan), 'compile_seconds'), total, total / base_total,
                 median((depth, scan), 'program_kib')])
  print(f'\n{_ARCHITECTURE.value}, {common.machine()}, jax {jax.__version__}, {_ROUNDS.value} rounds (medians)\n')
  print(common.markdown_table(['layers', 'depth', 'trace + lower s', 'compile s', 'total s',
                               f'× depth {min(depths)}', 'program KiB'], rows))


if __name__ == '__main__':
  app.run(main)
