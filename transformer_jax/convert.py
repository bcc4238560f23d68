"""python -m transformer_jax.convert --from_hf=DIR_OR_CACHED_HUB_ID --workdir=NEW: a transformers MarianMT
checkpoint as a workdir at step 0 (`interop/marian_import.py`)."""

from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax.interop import hf
from transformer_jax.interop import marian
from transformer_jax.interop import marian_import as convert

_FROM_HF = flags.DEFINE_string('from_hf', None, 'A transformers MarianMT checkpoint: its directory, or a hub id in '
                               'the local Hugging Face cache.', required=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'The new workdir to write (new or empty).', required=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}.')
  directory = hf.resolve(_FROM_HF.value)
  cfg = convert.import_checkpoint(directory, _WORKDIR.value)
  print(f'wrote {_WORKDIR.value}: a {cfg.num_encoder_layers}+{cfg.num_decoder_layers}-layer MarianMT model '
        f'(d_model {cfg.d_model}, {cfg.vocab_size} ids) from {directory} at step 0')
  generation = marian.generation_settings(hf.read_config(directory))
  if generation:
    settings = ', '.join(f'{key}={value!r}' for key, value in generation.items())
    print(f'not carried: config.json\'s settings of transformers\' generate ({settings}), which are not the model; '
          f'our tools decode with the run\'s decode section (--config.decode.beam_size=..., alpha, max_len_offset)')


if __name__ == '__main__':
  cli.run(main)
