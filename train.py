"""Trains a Transformer: python train.py --config=configs/default.py --workdir=DIR [--config.key=value ...]."""

import os

from absl import app
from absl import flags
from absl import logging

from transformer_jax import config_cli
from transformer_jax import distributed
from transformer_jax import cpu_backend

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'default.py')
config_cli.define_config_flag(_DEFAULT_CONFIG, 'Experiment config file (configs/*.py[:variant]).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints, logs and the tokenizer go.', required=True)
_HOST_MEMORY = flags.DEFINE_enum(
    'host_memory', 'auto', ['auto', 'reuse', 'system'],
    "'reuse': glibc keeps freed memory for the next step (1.4x a base-model step on a CPU, see "
    "cpu_backend.reuse_host_memory); 'system': glibc's defaults; 'auto': reuse when JAX will run on the CPU.")
distributed.define_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; settings go in --config.key=value.')
  config = flags.FLAGS.config
  reuse = _HOST_MEMORY.value == 'reuse' or (_HOST_MEMORY.value == 'auto' and cpu_backend.will_run_on_cpu())
  reuse = reuse and cpu_backend.reuse_host_memory()  # before JAX starts its threads
  distributed.initialize_from_flags()
  from transformer_jax import config_defaults, evaluation, metric_writer, trainer  # after distributed init
  metric_writer.quiet_library_logs()
  with config_cli.exit_on_user_error(ValueError, OSError, trainer.NonFiniteLossError):
    config_defaults.validate(config)
    logging.info('host memory: %s', 'freed memory kept for reuse' if reuse else "malloc's defaults")
    result = trainer.train_and_evaluate(config, _WORKDIR.value)
    if result['metrics'].get('step') == config.train.num_steps:
      evaluation.final_report(config, _WORKDIR.value)


if __name__ == '__main__':
  app.run(main, flags_parser=config_cli.parse_flags)
