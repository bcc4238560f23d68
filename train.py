"""Trains a Transformer: python train.py --config=configs/default.py --workdir=DIR [--config.key=value ...]."""

import os

import jax
from absl import app
from absl import flags
from absl import logging

from transformer_jax import cli
from transformer_jax import cpu_backend
from transformer_jax import distributed
from transformer_jax import preemption

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'default.py')
_CONFIG = cli.define_config_file_flag(_DEFAULT_CONFIG, 'Experiment config file (configs/*.py[:arguments]).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints, logs and the tokenizer go.', required=True)
_HOST_MEMORY = flags.DEFINE_enum(
    'host_memory', 'auto', ['auto', 'reuse', 'system'],
    "'reuse': glibc keeps freed memory for the next step (1.4x a base-model step on a CPU, see "
    "cpu_backend.reuse_host_memory); 'system': glibc's defaults; 'auto': reuse when JAX will run on the CPU.")
distributed.define_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; settings go in --config.key=value.')
  with preemption.StopRequest(multi_process=distributed.requested()) as stop:  # from here to the final report
    reuse = _HOST_MEMORY.value == 'reuse' or (_HOST_MEMORY.value == 'auto' and cpu_backend.will_run_on_cpu())
    reuse = reuse and cpu_backend.reuse_host_memory()  # before JAX starts its threads
    distributed.initialize_from_flags()
    from transformer_jax import config, scoring, trainer  # pylint: disable=import-outside-toplevel
    config.validate(_CONFIG.value)
    logging.info('host memory: %s', 'freed memory kept for reuse' if reuse else "malloc's defaults")
    if not jax.config.jax_compilation_cache_dir:  # JAX_COMPILATION_CACHE_DIR, if set, wins
      jax.config.update('jax_compilation_cache_dir', trainer.compilation_cache_dir(_CONFIG.value.train, _WORKDIR.value))
    logging.info('compilation cache: %s', jax.config.jax_compilation_cache_dir)
    result = trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value, stop)
    if result['metrics'].get('step') != _CONFIG.value.train.num_steps:
      return
    try:
      with stop.raising():  # training is saved: a signal now ends the report, not the run's work
        scoring.final_report(_CONFIG.value, _WORKDIR.value)
    except preemption.StopRequested as signal:
      logging.warning('stopped during the final evaluation (%s): training is saved at step %d; evaluate it with '
                      'python eval.py --workdir=%s', signal, result['metrics']['step'], _WORKDIR.value)


if __name__ == '__main__':
  cli.run(main)
