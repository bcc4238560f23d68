"""Compile time and program size of the train step against depth, with the layers scanned (`model.scan_layers`)
and unrolled.

python -m bench.compile_depth [--depths=2,24] [--config.model.architecture=encoder_decoder] [--rounds=2]

For a narrow model (decoder-only, d_model 64, 4 heads, d_ff 256, vocabulary 1000; packed batches of 8 rows × 64
tokens; its keys changed as train.py takes them, `--config.model.KEY=VALUE`, but for the layer counts and
`model.scan_layers`, which the bench sets) at each depth (the decoder's layers, and the encoder's as many for
encoder_decoder) builds the trainer's jitted train step
(Adam with the paper's schedule, dropout 0.1, float32, one device, the CPU kernels where they apply) and times
tracing + lowering and XLA's compilation of it, from abstract values (nothing is allocated). Rounds interleave the
settings in one process; every measurement compiles afresh (no persistent cache). Prints one JSON line per
measurement and a Markdown table of medians, with each setting's ratio to its shallowest depth.
"""

import time

import jax
from absl import app
from absl import flags
import ml_collections

from bench import common
from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax.training import run_builder

ROWS, LENGTH = 8, 64
SET_BY_THE_BENCH = ('model.num_encoder_layers', 'model.num_decoder_layers', 'model.scan_layers')


def narrow_model() -> ml_collections.ConfigDict:
  """The model section the bench measures, before --config.model.* changes."""
  model = config_lib.base_config().model
  model.update(architecture='decoder_only', vocab_size=1000, d_model=64, d_ff=256, num_heads=4, num_encoder_layers=0)
  return model


def train_step_config(model: ml_collections.ConfigDict, depth: int, scan_layers: bool):
  """A one-device run of `model` at `depth` layers a stack, scanned or unrolled."""
  config = config_lib.base_config()
  config.model.update(model.to_dict())
  config.model.update(num_decoder_layers=depth, num_encoder_layers=0 if model.architecture == 'decoder_only' else depth,
                      scan_layers=scan_layers)
  config.train.update(num_steps=10, warmup_steps=4)
  config.mesh.shape = {'data': 1, 'fsdp': 1, 'tensor': 1}
  return config


def measure(model: ml_collections.ConfigDict, depth: int, scan_layers: bool) -> dict:
  """Seconds to trace and lower, and to compile, the train step; the lowered program's size."""
  config = train_step_config(model, depth, scan_layers)
  run = run_builder.build(config, jax.devices()[:1])
  batch = run.abstract_batch({key: (ROWS, LENGTH) for key in run.train_batch_shapes[0]})
  with run.activate():
    start = time.perf_counter()
    lowered = run.train_step.lower(run.abstract_state, batch)
    lowered_at = time.perf_counter()
    lowered.compile()
    compiled_at = time.perf_counter()
  return {'architecture': model.architecture, 'depth': depth, 'scan_layers': scan_layers,
          'lower_seconds': lowered_at - start, 'compile_seconds': compiled_at - lowered_at,
          'program_kib': len(lowered.as_text()) / 1024}


def main():
  """The command: its flags are defined here, when it runs."""
  config_flag = cli.define_config_overrides_flag(
      ml_collections.ConfigDict({'model': narrow_model()}),
      "The model's changes, as train.py takes them: --config.model.KEY=VALUE (the bench sets the layer counts and "
      'model.scan_layers).')
  depths_flag = flags.DEFINE_string('depths', '2,24', 'Comma-separated layer counts.')
  rounds = flags.DEFINE_integer('rounds', 2, 'Interleaved rounds.', lower_bound=1)

  def run(argv):
    if len(argv) > 1:
      raise app.UsageError(f'unexpected arguments {argv[1:]}; model changes go in --config.model.KEY=VALUE.')
    owned = sorted(set(cli.overrides()) & set(SET_BY_THE_BENCH))
    if owned:
      raise ValueError(f'the bench sets {owned} itself (--depths; scanned and unrolled): drop them.')
    model = config_flag.value.model
    config_lib.validate(train_step_config(model, 2, False), data_splits=())
    report(model, common.parse_ints(depths_flag.value), rounds.value)

  cli.run(run)


def report(model: ml_collections.ConfigDict, depths: list[int], rounds: int):
  """Every depth scanned and unrolled, in interleaved rounds: a JSON line each, then a table of medians."""
  settings = [(depth, scan) for scan in (True, False) for depth in depths]
  records = {setting: [] for setting in settings}
  for _ in range(rounds):
    for depth, scan in settings:
      record = measure(model, depth, scan)
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
  print(f'\n{model.architecture}, {common.machine()}, jax {jax.__version__}, {rounds} rounds (medians)\n')
  print(common.markdown_table(['layers', 'depth', 'trace + lower s', 'compile s', 'total s',
                               f'× depth {min(depths)}', 'program KiB'], rows))


if __name__ == '__main__':
  main()
