"""Sources of (source_text, target_text) sentence pairs, and of documents for a language model: the built-in
corpus, tfds, local files.

`load_split(data_config, split)` returns a *source split*: a random-access sequence of
`(source, target)` str pairs (`len(x)`, `x[i]` for an int i), deterministic and cheap to index.
`load_documents(data_config, split)` returns one of documents (str), what a decoder-only model trains on:
the built-in corpus's English (source) side, one sentence per document; a tfds dataset's text feature
`text_key` (e.g. 'lm1b'); or a plain text file per split, `files.<split>.text`, one document per line
(`documents='lines'`) or one per paragraph, paragraphs separated by blank lines, lines joined by a space
(`documents='paragraphs'`). `load(data_config, split, documents)` picks one of the two.

Fields of `data_config` (the config's `data` section; `config/data.py` gives their defaults and checks them):

* `source`: where pairs come from: 'builtin' | 'tfds' | 'files'.
* `builtin_seed`, `builtin_train_size`, `builtin_eval_size` ('builtin'): seed and sizes of the
  generated English -> German corpus (`transformer_jax.data.builtin`); validation and test have
  eval_size pairs each. Splits: 'train', 'validation', 'test'.
* `tfds_name` ('tfds'): a tfds dataset with a `Translation` feature, with config, e.g.
  'wmt14_translate/de-en'. It must have been prepared in ArrayRecord format beforehand (see
  `transformer_jax/prepare_tfds.py`); it is read with `as_data_source`, so TensorFlow is not needed. Splits: those
  of the dataset, with tfds slicing ('train[:10%]').
* `tfds_data_dir` ('tfds'): the tfds data directory; None means tfds' default ($TFDS_DATA_DIR or
  ~/tensorflow_datasets).
* `source_lang`, `target_lang` ('tfds'): the translation direction, as keys of the Translation
  feature, e.g. 'en' -> 'de'.
* `text_key` ('tfds', documents): the dataset's text feature, e.g. 'text' of lm1b.
* `documents` ('files', documents): 'lines' or 'paragraphs' (see above).
* `files` ('files'): split name -> `{'source': path, 'target': path}` (two aligned plain-text
  files, one sentence per line) or `{'tsv': path}` (one file, `source<TAB>target` per line), or for
  documents `{'text': path}`; keys
  left None are ignored. The default config has empty entries for train, validation and test, so
  `--config.data.files.train.source=PATH` works on any config. Files must be UTF-8 (strict: an invalid byte is an error naming file and
  line, never replaced); a leading BOM and surrounding whitespace (including '\\r') are dropped;
  pairs with an empty side are skipped, counted in `skipped_empty` of the split and logged. A TSV
  line that is not blank must hold exactly one tab.
"""

from __future__ import annotations

import collections.abc
import difflib
import importlib
import operator
from typing import Any, Sequence

from absl import logging
import ml_collections

from transformer_jax.config import data as data_section
from transformer_jax.core import files
from transformer_jax.data import builtin


class PairSequence(collections.abc.Sequence):
  """An in-memory source split: two aligned sequences of sentences.

  skipped_empty: how many input pairs were dropped because a side was empty.
  """

  def __init__(self, sources: Sequence[str], targets: Sequence[str], skipped_empty: int = 0):
    if len(sources) != len(targets):
      raise ValueError(f'{len(sources)} sources but {len(targets)} targets')
    self._sources = sources
    self._targets = targets
    self.skipped_empty = skipped_empty

  def __len__(self) -> int:
    return len(self._sources)

  def __getitem__(self, index: int) -> tuple[str, str]:
    i = operator.index(index)
    return self._sources[i], self._targets[i]

  @property
  def sources(self) -> Sequence[str]:
    """The source side alone."""
    return self._sources


def load_split(data_config: ml_collections.ConfigDict, split: str) -> Sequence[tuple[str, str]]:
  """The `split` of the source chosen by `data_config.source` (see the module docstring).

  'builtin' and 'files' splits are `PairSequence`s (with `skipped_empty`); 'tfds' ones `TfdsTexts`.
  """
  data_section.check_source(data_config)
  loaders = {'builtin': _load_builtin, 'tfds': _load_tfds, 'files': _load_files}
  return loaders[data_config.source](data_config, split)


def load_documents(data_config: ml_collections.ConfigDict, split: str) -> Sequence[str]:
  """The documents of `split` for a language model (see the module docstring); never empty ones."""
  data_section.check_source(data_config)
  if data_config.source == 'builtin':
    return _load_builtin(data_config, split).sources
  if data_config.source == 'tfds':
    return _load_tfds(data_config, split, documents=True)
  return _load_text_file(data_config, split)


def load(data_config: ml_collections.ConfigDict, split: str,
         documents: bool) -> Sequence[tuple[str, str]] | Sequence[str]:
  """`load_documents` for a decoder-only model (`documents`), else `load_split`."""
  return load_documents(data_config, split) if documents else load_split(data_config, split)


# ----------------------------------------------------------------------------- builtin


def _load_builtin(data_config: ml_collections.ConfigDict, split: str) -> PairSequence:
  if split not in builtin.SPLITS:
    raise ValueError(f'the builtin corpus has no split {split!r}; use one of {builtin.SPLITS}')
  # Test and validation are the corpus's first draws, whatever the train split's size: evaluating draws only them.
  train_size = data_config.builtin_train_size if split == 'train' else 1
  corpus = builtin.build_corpus(data_config.builtin_seed, train_size, data_config.builtin_eval_size)
  return PairSequence(*corpus[split])


# ----------------------------------------------------------------------------- tfds


def import_tfds() -> Any:
  """tensorflow_datasets, with its legacy translation builders (wmt*, ...) registered.

  tfds imports its dataset modules lazily and without TensorFlow `tfds.builder` does not find
  the translate ones by name until the package is imported.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  importlib.import_module('tensorflow_datasets.translate')
  return tfds


def prepare_command(name: str, data_dir: str) -> str:
  """The shell command that prepares `name` for `load_split`, and what it runs."""
  return (f'python -m transformer_jax.prepare_tfds --name={name} --data_dir={data_dir}  '
          f'(which runs: tfds build {name} --file_format=array_record --data_dir={data_dir})')


class TfdsTexts(collections.abc.Sequence):
  """A tfds ArrayRecord data source seen as str: (source, target) pairs of two features, documents of one."""

  def __init__(self, data_source: Sequence[Any], features: Sequence[str]):
    self._data_source = data_source
    self._features = tuple(features)

  def __len__(self) -> int:
    return len(self._data_source)

  def __getitem__(self, index: int) -> tuple[str, str] | str:
    i, size = operator.index(index), len(self._data_source)
    if not -size <= i < size:  # checked here: not every data source raises (tfds mocks do not)
      raise IndexError(f'index {i} out of range for {size} examples')
    example = self._data_source[i % size]
    texts = tuple(_text(example[feature]) for feature in self._features)
    return texts if len(texts) > 1 else texts[0]


def _text(value: str | bytes) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def _load_tfds(data_config: ml_collections.ConfigDict, split: str, documents: bool = False) -> TfdsTexts:
  """Pairs of the `source_lang` and `target_lang` features, or documents of the `text_key` feature."""
  tfds = import_tfds()
  name = data_config.tfds_name
  builder = tfds_builder(name, data_config.tfds_data_dir)
  features = builder.info.features
  available = sorted(features.keys()) if isinstance(features, tfds.features.FeaturesDict) else []
  keys = ('text_key',) if documents else ('source_lang', 'target_lang')
  for key in keys:
    if data_config[key] not in available:
      kind = 'text feature' if documents else 'language'
      raise ValueError(f'{name} has no {kind} {data_config[key]!r} (its features: {available}); '
                       f'set data config key {key} to one of them')
  try:
    data_source = builder.as_data_source(split=split)
  except (KeyError, ValueError, NotImplementedError) as e:
    raise ValueError(_tfds_failure(builder, name, split, e)) from e
  return TfdsTexts(data_source, [data_config[key] for key in keys])


def tfds_builder(name: str, data_dir: str | None) -> Any:
  """`tfds.builder(name)` for ArrayRecord files, or a one-line error suggesting close dataset or config names."""
  tfds = import_tfds()
  dataset = name.split('/')[0]
  try:
    return tfds.builder(name, data_dir=data_dir, file_format='array_record')
  except tfds.core.DatasetNotFoundError as e:
    known = tfds.list_builders(with_community_datasets=False)
    close = difflib.get_close_matches(dataset, known)
    hint = f'; did you mean {", ".join(close)}?' if close else ''
    raise ValueError(f'unknown tfds dataset {dataset!r} (data config key tfds_name={name!r})'
                     f'{hint}') from e
  except ValueError as e:  # e.g. an unknown config; tfds' message may span several lines
    known = tfds.list_builders(with_community_datasets=False)
    configs = sorted(tfds.builder_cls(dataset).builder_configs) if dataset in known else []
    hint = f' (its configs: {", ".join(configs)})' if configs else ''
    raise ValueError(f'cannot open tfds dataset {name!r}{hint}: {" ".join(str(e).split())}') from e


def _tfds_failure(builder: Any, name: str, split: str, error: Exception) -> str:
  """A one-line reason why `as_data_source(split)` failed."""
  data_dir = str(builder.data_dir_root)
  if not builder.is_prepared():
    return (f'{name} is not prepared in {data_dir} (data.tfds_data_dir): where it is prepared elsewhere, pass '
            f'--config.data.tfds_data_dir=THAT_DIR; else, on a machine with internet, run: '
            f'{prepare_command(name, data_dir)}')
  formats = sorted(f.value for f in builder.info.available_file_formats())
  if 'array_record' not in formats:
    return (f'{name} is prepared in {data_dir} as {formats}, not array_record, which random '
            f'access needs; rebuild it: {prepare_command(name, data_dir)}')
  return (f'cannot read split {split!r} of {name} (its splits: {sorted(builder.info.splits)}): '
          f'{" ".join(str(error).split())}')


# ----------------------------------------------------------------------------- files


def _load_files(data_config: ml_collections.ConfigDict, split: str) -> PairSequence:
  paths = data_section.file_paths(data_config, split)
  key = f'files.{split}'
  if set(paths) == {'source', 'target'}:
    source_lines = files.read_text_lines(paths['source'], f'data config key {key}.source')
    target_lines = files.read_text_lines(paths['target'], f'data config key {key}.target')
    if len(source_lines) != len(target_lines):
      raise ValueError(f'{paths["source"]} has {len(source_lines)} lines but {paths["target"]} '
                       f'has {len(target_lines)}; aligned files need one sentence per line each')
    description = f'{paths["source"]} + {paths["target"]}'
    pairs = zip(source_lines, target_lines)
  else:
    description = paths['tsv']
    pairs = _split_tsv(files.read_text_lines(paths['tsv'], f'data config key {key}.tsv'), paths['tsv'])
  sources, targets, skipped = _drop_empty(pairs)
  if skipped:
    logging.warning('%s: skipped %d pairs with an empty side', description, skipped)
  if not sources:
    raise ValueError(f'split {split!r} from {description} has no pairs '
                     f'({skipped} skipped as empty)')
  logging.info('%s: %d pairs for split %s', description, len(sources), split)
  return PairSequence(sources, targets, skipped_empty=skipped)


def _load_text_file(data_config: ml_collections.ConfigDict, split: str) -> list[str]:
  """The documents of a split's text file: its non-blank lines, or its paragraphs (see the module docstring)."""
  path = data_section.file_paths(data_config, split, documents=True)['text']
  lines = [line.strip() for line in files.read_text_lines(path, f'data config key files.{split}.text')]
  if data_config.documents == 'lines':
    documents = [line for line in lines if line]
  else:
    documents, paragraph = [], []
    for line in lines + ['']:  # a blank line ends a paragraph
      if line:
        paragraph.append(line)
      elif paragraph:
        documents.append(' '.join(paragraph))
        paragraph = []
  if not documents:
    raise ValueError(f'split {split!r} from {path} has no documents (the file is empty or blank): check '
                     f'data.files.{split}.text')
  logging.info('%s: %d documents (%s) for split %s', path, len(documents), data_config.documents, split)
  return documents


def _split_tsv(lines: list[str], path: str) -> list[tuple[str, str]]:
  """source<TAB>target per line; a blank line is kept (as an empty pair, counted later)."""
  pairs = []
  for number, line in enumerate(lines, start=1):
    fields = line.split('\t')
    if len(fields) == 2:
      pairs.append((fields[0], fields[1]))
    elif line.strip():
      raise ValueError(f'{path}: line {number} has {len(fields) - 1} tabs; each line must be '
                       'source<TAB>target')
    else:
      pairs.append(('', ''))
  return pairs


def _drop_empty(
    pairs: collections.abc.Iterable[tuple[str, str]]) -> tuple[list[str], list[str], int]:
  """Strips both sides; returns the sources, targets and number of pairs with an empty side."""
  sources, targets = [], []
  skipped = 0
  for source, target in pairs:
    source, target = source.strip(), target.strip()
    if source and target:
      sources.append(source)
      targets.append(target)
    else:
      skipped += 1
  return sources, targets, skipped
