"""Exports a trained model for serving: python -m transformer_jax.export --workdir=DIR [--step=N | --average_last=K]
--format=ctranslate2 --out=DIR [--quantization=int8|int8_float16|float16]

Writes a CTranslate2 model directory (`export_ctranslate2`) holding the SentencePiece model and the run's decode
settings, for `python -m transformer_jax.translate --engine=ctranslate2 --model=DIR` or `ctranslate2.Translator`.
What CTranslate2 cannot represent is refused in one line before anything is restored.
"""

from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax import export
from transformer_jax import restoring
from transformer_jax.model_config import ModelConfig

_CHECKPOINTS = cli.CheckpointFlags()
_FORMAT = flags.DEFINE_enum('format', 'ctranslate2', ['ctranslate2'], 'The serving format.')
_OUT = flags.DEFINE_string('out', None, 'The model directory to write (new or empty).', required=True)
_QUANTIZATION = flags.DEFINE_enum('quantization', None, [q for q in export.QUANTIZATIONS if q],
                                  'Weight type (default: float32, as trained).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}.')
  runs = _CHECKPOINTS.runs()
  if len(runs) > 1:
    raise ValueError('an export holds one model, not an ensemble: pass one --workdir and at most one --step.')
  (workdir, step), = runs
  config = config_lib.of_run(workdir)
  config.model.scan_layers = False  # the export reads layer by layer: a scanned run's params are converted
  export.check_exportable(ModelConfig.from_dict(config.model), _QUANTIZATION.value, _OUT.value)
  restored = restoring.restore(config, workdir, step=step, average_last=_CHECKPOINTS.average_last)
  out = export.export_ctranslate2(restored.model.config, restored.params, restored.tokenizer.path, _OUT.value,
                                  _QUANTIZATION.value, decode=config.decode)
  print(f'wrote the {_FORMAT.value} model of step(s) {restored.steps} of {workdir} to {out}')


if __name__ == '__main__':
  cli.run(main)
