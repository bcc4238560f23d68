"""The `data` section: where sentence pairs (or a language model's documents) come from; see
`transformer_jax.data.sources` for what each key means."""

from typing import Sequence

import ml_collections

SOURCES = ('builtin', 'tfds', 'files')
DOCUMENTS = ('lines', 'paragraphs')
FILE_SPLITS = ('train', 'validation', 'test')  # the `files` entries of the default config
_FILE_KEYS = ('source', 'target', 'tsv', 'text')
# Keys only some sources (and kinds of model) read: key -> its conditions, each (the dotted key that chooses, the
# choices that read it); `config.MODE_KEYS`.
_LANGUAGE_MODEL = ('model.architecture', ('decoder_only',))  # documents, not sentence pairs
MODE_KEYS = {
    **{key: (('data.source', ('builtin',)),) for key in ('builtin_seed', 'builtin_train_size', 'builtin_eval_size')},
    **{key: (('data.source', ('tfds',)),) for key in ('tfds_name', 'tfds_data_dir')},
    'text_key': (('data.source', ('tfds',)), _LANGUAGE_MODEL),
    'files': (('data.source', ('files',)),),
    'documents': (('data.source', ('files',)), _LANGUAGE_MODEL),
}


def default_config() -> ml_collections.ConfigDict:
  """The built-in corpus, and empty `files` entries to fill from the command line."""
  return ml_collections.ConfigDict({
      'source': 'builtin',
      'builtin_seed': 0,
      'builtin_train_size': 200_000,
      'builtin_eval_size': 2000,
      'tfds_name': 'wmt14_translate/de-en',
      'tfds_data_dir': ml_collections.config_dict.placeholder(str),
      'source_lang': 'en',
      'target_lang': 'de',
      'text_key': 'text',
      'documents': 'lines',
      'files': {split: {key: ml_collections.config_dict.placeholder(str) for key in _FILE_KEYS}
                for split in FILE_SPLITS},
  })


def validate(data_config: ml_collections.ConfigDict, splits: Sequence[str], *, paths: bool = True,
             documents: bool = False) -> None:
  """The source is known and, for 'files' (when `paths`), each of `splits` names its files: the pair's, or a
  text file when a decoder-only model reads `documents`."""
  check_source(data_config)
  if data_config.documents not in DOCUMENTS:
    raise ValueError(f'data.documents={data_config.documents!r} is not one of {DOCUMENTS}.')
  if data_config.source == 'files' and paths:
    for split in dict.fromkeys(splits):
      file_paths(data_config, split, documents)


def check_source(data_config: ml_collections.ConfigDict) -> None:
  if data_config.source not in SOURCES:
    raise ValueError(f'data.source={data_config.source!r} is not one of {SOURCES}.')


def file_paths(data_config: ml_collections.ConfigDict, split: str, documents: bool = False) -> dict[str, str]:
  """{'source': path, 'target': path} or {'tsv': path} of a split ({'text': path} for `documents`), or a
  one-line error saying what to pass."""
  entry = data_config.files.get(split)
  is_mapping = hasattr(entry, 'items')
  paths = {k: v for k, v in entry.items() if v is not None} if is_mapping else {}
  got = sorted(paths) if is_mapping else repr(entry)
  if documents:
    if set(paths) == {'text'}:
      return paths
    raise ValueError(f"data.source='files' for a decoder-only model needs data.files.{split}.text (documents), "
                     f'got {got}: pass --config.data.files.{split}.text=PATH (one document per line, or per '
                     "paragraph with --config.data.documents=paragraphs).")
  if set(paths) in ({'source', 'target'}, {'tsv'}):
    return paths
  hint = (f'pass --config.data.files.{split}.source=PATH --config.data.files.{split}.target=PATH '
                 f'(or --config.data.files.{split}.tsv=PATH; .text is for decoder-only models)')
  raise ValueError(f"data.source='files' needs data.files.{split}.source and .target (or .tsv), got "
                   f'{got}: {hint}.')
