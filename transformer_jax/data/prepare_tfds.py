"""Downloads and prepares a tfds translation dataset in ArrayRecord format, for `source='tfds'`.

Run it once on a machine with internet (the training machine may have none), then copy the data
directory over if needed:

  python -m transformer_jax.data.prepare_tfds --name=wmt14_translate/de-en --data_dir=DIR

It is the Python form of `tfds build NAME --file_format=array_record --data_dir=DIR`.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from transformer_jax.data import sources


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog='python -m transformer_jax.data.prepare_tfds',
      description='Prepare a tfds dataset in ArrayRecord format for transformer_jax.')
  parser.add_argument('--name', required=True,
                      help="tfds dataset with config, e.g. 'wmt14_translate/de-en'")
  parser.add_argument('--data_dir', default=None,
                      help='tfds data directory (default: $TFDS_DATA_DIR or ~/tensorflow_datasets)')
  return parser.parse_args(argv)


def prepare(name: str, data_dir: str | None) -> str:
  """Builds `name` as ArrayRecord into data_dir (a no-op if already there); returns its folder."""
  tfds = sources.import_tfds()
  builder = tfds.builder(name, data_dir=data_dir, file_format='array_record')
  builder.download_and_prepare()
  return str(builder.data_dir)


def main(argv: Sequence[str] | None = None) -> None:
  args = parse_args(argv)
  print(f'{args.name} is ready in {prepare(args.name, args.data_dir)}')


if __name__ == '__main__':
  main()
