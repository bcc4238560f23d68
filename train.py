"""Trains a Transformer: python train.py --config=configs/default.py --workdir=DIR [--config.key=value ...]."""

from transformer_jax.jobs import preemption

# First, before the heavy imports: from here until the process exits, SIGTERM/SIGINT ask the run to save and stop.
_STOP = preemption.StopRequest.for_this_process()

# pylint: disable=wrong-import-position
import os  # noqa: E402

import jax  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from transformer_jax import cli  # noqa: E402
from transformer_jax.runtime import backends  # noqa: E402
from transformer_jax.runtime import distributed  # noqa: E402
from transformer_jax.runtime import host_memory  # noqa: E402
# pylint: enable=wrong-import-position

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'default.py')
_CONFIG = cli.define_config_file_flag(_DEFAULT_CONFIG, 'Experiment config file, configs/*.py[:arguments] (default: '
                                      'configs/default.py); change any key with --config.KEY=VALUE.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints, logs and the tokenizer go.', required=True)
_HOST_MEMORY = flags.DEFINE_enum(
    'host_memory', 'auto', ['auto', 'reuse', 'system'],
    "'reuse': glibc keeps freed memory for the next step (faster CPU steps, see "
    "host_memory.reuse_host_memory); 'system': glibc's defaults; 'auto': reuse when JAX will run on the CPU.")
_COMPILE_ONLY = flags.DEFINE_bool(
    'compile_only', False, 'Compile what the run would compile (its train step for every batch shape, its eval '
    'step) for --topology, without its chips and without reading data; report per-chip HBM, FLOPs, collectives '
    'and a roofline step time; exit 1 with what to change if it does not fit.')
_TOPOLOGY = flags.DEFINE_string(
    'topology', None, 'The TPU slice or GPU host for --compile_only, e.g. v4-8, v4-32, v5e-8, v5p-8, h100-1, '
    'h100-8 (transformer_jax/compile/topologies.py).')
distributed.define_flags()
flags.register_validator('compile_only', lambda on: not on or _TOPOLOGY.value,
                         message='--compile_only needs --topology (e.g. --topology=v4-32).')
flags.register_validator('topology', lambda topology: topology is None or _COMPILE_ONLY.value,
                         message='--topology names the TPU slice or GPU host that --compile_only compiles for; a run '
                         'trains on the devices it has: add --compile_only, or drop --topology.')


def compile_only(config) -> None:
  """--compile_only: every program of the run compiled for --topology, reported; one line if one does not fit."""
  from transformer_jax.compile import aot, topologies  # pylint: disable=import-outside-toplevel
  from transformer_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from transformer_jax.runtime import progress  # pylint: disable=import-outside-toplevel
  config_lib.validate(config, data_splits=(), overrides=cli.overrides())
  with progress.Progress(f'tracing the run\'s programs for {_TOPOLOGY.value}', memory=True):
    programs = aot.run_programs(config, topologies.topology_devices(_TOPOLOGY.value))
  print(f'{programs[0].kernels.describe()}\n', flush=True)
  unfit = []
  for number, (what, analysis) in enumerate(aot.compile_run(programs, _TOPOLOGY.value), start=1):
    # each as it is compiled: a program takes minutes
    print(f'{what} (program {number} of {len(programs)}):\n{aot.summary(analysis)}\n', flush=True)
    if not analysis.fits:
      unfit.append(f'{what} does not fit on {_TOPOLOGY.value}: {aot.advice(analysis, config)}')
  if unfit:
    raise ValueError(unfit[0])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; settings go in --config.key=value.')
  if _COMPILE_ONLY.value:
    _STOP.end_at_once()  # nothing to save: a signal ends the compilation as it would any program
    return compile_only(_CONFIG.value)
  if distributed.requested():
    _STOP.hand_back()
  reuse = _HOST_MEMORY.value == 'reuse' or (_HOST_MEMORY.value == 'auto' and backends.will_run_on_cpu())
  reuse = reuse and host_memory.reuse_host_memory()  # before JAX starts its threads
  distributed.initialize_from_flags()
  from transformer_jax import config  # pylint: disable=import-outside-toplevel
  from transformer_jax.jobs import scoring, trainer  # pylint: disable=import-outside-toplevel
  config.validate(_CONFIG.value, overrides=cli.overrides())
  logging.info('host memory: %s', 'freed memory kept for reuse' if reuse else "malloc's defaults")
  if not jax.config.jax_compilation_cache_dir:  # JAX_COMPILATION_CACHE_DIR, if set, wins
    jax.config.update('jax_compilation_cache_dir', trainer.compilation_cache_dir(_CONFIG.value.train, _WORKDIR.value))
  logging.info('compilation cache: %s', jax.config.jax_compilation_cache_dir)
  result = trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value, _STOP)
  if result['metrics'].get('step') != _CONFIG.value.train.num_steps:
    return
  try:
    with _STOP.at_safe_points():  # training is saved: a signal now ends the report, not the run's work
      scoring.final_report(_CONFIG.value, _WORKDIR.value)
  except preemption.StopRequested as signal:
    logging.warning('stopped during the final evaluation (%s): training is saved at step %d; evaluate it with '
                    'python eval.py --workdir=%s', signal, result['metrics']['step'], _WORKDIR.value)


if __name__ == '__main__':
  cli.run(main)
