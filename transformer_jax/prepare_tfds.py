"""Downloads and prepares a tfds translation dataset in ArrayRecord format, for `data.source='tfds'`.

Run it once on a machine with internet (the training machine may have none), then copy the data directory over
if needed:

  python -m transformer_jax.prepare_tfds --name=wmt14_translate/de-en --data_dir=DIR

It is the Python form of `tfds build NAME --file_format=array_record --data_dir=DIR`.
"""

from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax.data import sources

_NAME = flags.DEFINE_string('name', None, "tfds dataset with config, e.g. 'wmt14_translate/de-en'.", required=True)
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'tfds data directory (default: $TFDS_DATA_DIR or '
                                '~/tensorflow_datasets).')


def prepare(name: str, data_dir: str | None) -> str:
  """Builds `name` as ArrayRecord into data_dir (a no-op if already there); returns its folder."""
  builder = sources.tfds_builder(name, data_dir)
  builder.download_and_prepare()
  return str(builder.data_dir)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}.')
  print(f'{_NAME.value} is ready in {prepare(_NAME.value, _DATA_DIR.value)}')


if __name__ == '__main__':
  cli.run(main)
