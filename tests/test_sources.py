"""Tests of `load_split` for the three sources: builtin, local files and tfds (without TensorFlow).

The tfds path is tested twice: by name on 'wmt14_translate/de-en' under `tfds.testing.mock_data`
(which fakes `as_data_source`), and end to end on a tiny real dataset that `prepare_tfds` builds
as ArrayRecord files in a temp dir and `load_split` reads back by name.
"""

import logging
import socket

import numpy as np
import pytest
import urllib3

from transformer_jax import config as config_lib
from transformer_jax import prepare_tfds
from transformer_jax.config import data as data_section
from transformer_jax.data import builtin, sources

tfds = sources.import_tfds()


class TransformerJaxTinyTranslate(tfds.core.GeneratorBasedBuilder):
  """Registers as 'transformer_jax_tiny_translate': 4 train and 2 validation en/de pairs."""
  VERSION = tfds.core.Version('1.0.0')
  PAIRS = {'train': [('one cat', 'eine Katze'), ('two dogs', 'zwei Hunde'), ('ü', 'ö'),
                     ('a house', 'ein Haus')],
           'validation': [('the end', 'das Ende'), ('the start', 'der Anfang')]}

  def _info(self):
    return tfds.core.DatasetInfo(builder=self,
                                 features=tfds.features.Translation(languages=['de', 'en']))

  def _split_generators(self, dl_manager):
    return {split: self._generate_examples(pairs) for split, pairs in self.PAIRS.items()}

  def _generate_examples(self, pairs):
    for i, (en, de) in enumerate(pairs):
      yield i, {'en': en, 'de': de}


class TransformerJaxUnreachable(tfds.core.GeneratorBasedBuilder):
  """Registers as 'transformer_jax_unreachable/de-en' (a config, as wmt14_translate has): its one file is at URL,
  which a test points where nothing listens."""
  VERSION = tfds.core.Version('1.0.0')
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name='de-en')]
  URL = 'http://127.0.0.1:9/pairs.tsv'

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(languages=['de', 'en']))

  def _split_generators(self, dl_manager):
    return {'train': self._generate_examples(dl_manager.download(self.URL))}

  def _generate_examples(self, path):
    yield 0, {'en': path.read_text(), 'de': ''}


def _config(**fields):
  config = data_section.default_config()
  config.update(fields)
  return config


def _files_config(tmp_path, split='train', **files):
  """files: name -> (content bytes or str); makes a files config for `split` pointing at them."""
  entry = {}
  for key, content in files.items():
    path = tmp_path / f'{split}.{key}'
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    entry[key] = str(path)
  return _config(source='files', files={split: entry})


# ----------------------------------------------------------------------------- config, builtin


def test_files_and_tfds_dir_are_settable_as_flags_on_the_default_config(tmp_path):
  """The README's `--config.data.files.train.source=...` works on configs/default.py, as overrides on the
  command line apply (the config is locked: only existing keys can be set)."""
  files = {}
  for split in data_section.FILE_SPLITS:
    for side, text in (('source', 'a b\nc\n'), ('target', 'x\ny z\n')):
      path = tmp_path / f'{split}.{side}'
      path.write_text(text)
      files[f'data.files.{split}.{side}'] = str(path)
  config = config_lib.load('configs/default.py', {'data.source': 'files', **files})
  config_lib.validate(config)  # with data paths, as train.py checks them
  assert list(sources.load_split(config.data, 'test')) == [('a b', 'x'), ('c', 'y z')]
  config = config_lib.load('configs/default.py', {'data.source': 'tfds', 'data.tfds_data_dir': '/data/tfds'})
  assert config.data.tfds_data_dir == '/data/tfds'
  config = config_lib.load('configs/default.py', {'data.source': 'files'})
  with pytest.raises(ValueError, match=r"data.source='files' needs data.files.train.source and .target \(or .tsv\), "
                                       r"got \[\]: pass --config.data.files.train.source=PATH"):
    config_lib.validate(config)


def test_builtin_splits():
  config = _config(builtin_train_size=300, builtin_eval_size=20, builtin_seed=1)
  splits = {split: sources.load_split(config, split) for split in builtin.SPLITS}
  assert {s: len(x) for s, x in splits.items()} == {'train': 300, 'validation': 20, 'test': 20}
  expected = builtin.build_corpus(1, 300, 20)['train']
  train = splits['train']
  assert train[7] == (expected[0][7], expected[1][7])
  assert train[np.int64(7)] == train[7] == train[-293]
  assert all(isinstance(s, str) and isinstance(t, str) for s, t in train)
  assert train.skipped_empty == 0
  with pytest.raises(IndexError):
    train[300]  # pylint: disable=pointless-statement


def test_unknown_split_and_source():
  with pytest.raises(ValueError, match="no split 'dev'"):
    sources.load_split(_config(), 'dev')
  with pytest.raises(ValueError, match=r"data.source='hf' is not one of \('builtin'"):
    sources.load_split(_config(source='hf'), 'train')


# ----------------------------------------------------------------------------- files


def test_aligned_files(tmp_path, caplog):
  config = _files_config(tmp_path, source='\ufeffHello world\r\n\nA  \nB\n',
                         target='Hallo Welt\r\nx\n\n B \n')
  with caplog.at_level(logging.WARNING):
    pairs = sources.load_split(config, 'train')
  assert list(pairs) == [('Hello world', 'Hallo Welt'), ('B', 'B')]
  assert pairs.skipped_empty == 2
  assert 'skipped 2 pairs with an empty side' in caplog.text


def test_tsv_file(tmp_path):
  config = _files_config(tmp_path, tsv='ein\tone\n\nzwei \t two\r\n\t\n')
  pairs = sources.load_split(config, 'train')
  assert list(pairs) == [('ein', 'one'), ('zwei', 'two')]
  assert pairs.skipped_empty == 2


def test_tsv_line_without_exactly_one_tab(tmp_path):
  for bad in ('a\tb\nno tab here\n', 'a\tb\nx\ty\tz\n'):
    config = _files_config(tmp_path, tsv=bad)
    with pytest.raises(ValueError, match=r'train\.tsv: line 2 has \d tabs'):
      sources.load_split(config, 'train')


def test_mismatched_line_counts(tmp_path):
  config = _files_config(tmp_path, source='a\nb\nc\n', target='x\ny\n')
  with pytest.raises(ValueError) as error:
    sources.load_split(config, 'train')
  message = str(error.value)
  assert 'train.source has 3 lines' in message and 'train.target has 2' in message
  assert '\n' not in message


def test_invalid_utf8_names_file_and_line(tmp_path):
  config = _files_config(tmp_path, source='a\nb\n', target=b'x\ny \xff\n')
  with pytest.raises(ValueError, match=r'train\.target: line 2 is not valid UTF-8'):
    sources.load_split(config, 'train')


def test_missing_file_names_path_and_config_key(tmp_path):
  config = _config(source='files', files={'test': {'tsv': str(tmp_path / 'nope.tsv')}})
  with pytest.raises(FileNotFoundError, match=r'nope\.tsv does not exist: fix data config key '
                                              r'files\.test\.tsv'):
    sources.load_split(config, 'test')


def test_empty_split_is_an_error(tmp_path):
  config = _files_config(tmp_path, source='a\n\n', target='\nb\n')
  with pytest.raises(ValueError, match=r"split 'train' .* has no pairs \(2 skipped as empty\)"):
    sources.load_split(config, 'train')


def test_unconfigured_or_malformed_split(tmp_path):
  config = _files_config(tmp_path, tsv='a\tb\n')
  with pytest.raises(ValueError, match=r"needs data\.files\.validation\.source and \.target \(or \.tsv\), got \[\]"):
    sources.load_split(config, 'validation')
  config.files.train.source = str(tmp_path / 'x')  # both tsv and source
  with pytest.raises(ValueError, match=r"needs data\.files\.train\..*got \['source', 'tsv'\]"):
    sources.load_split(config, 'train')
  config.files.train.source = None  # None keys are ignored: a tsv split again
  assert len(sources.load_split(config, 'train')) == 1
  with pytest.raises(TypeError):  # a split's entry holds paths by name: a bare path is refused on assignment
    config.files.test = 'a.tsv'


def test_a_million_pairs_load_aligned_from_files_or_tsv(tmp_path):
  lines = [f'sentence number {i}' for i in range(1_000_000)]
  source, target, tsv = tmp_path / 'src', tmp_path / 'tgt', tmp_path / 'all.tsv'
  source.write_text('\n'.join(lines) + '\n')
  target.write_text('\n'.join(line.upper() for line in lines) + '\n')
  tsv.write_text(''.join(f'{line}\t{line.upper()}\n' for line in lines))
  for entry in ({'source': str(source), 'target': str(target)}, {'tsv': str(tsv)}):
    pairs = sources.load_split(_config(source='files', files={'train': entry}), 'train')
    assert len(pairs) == 1_000_000
    assert pairs[123_456] == ('sentence number 123456', 'SENTENCE NUMBER 123456')
    assert pairs[-1] == ('sentence number 999999', 'SENTENCE NUMBER 999999')


# ----------------------------------------------------------------------------- tfds


def _tfds_config(**fields):
  return _config(source='tfds', **fields)


def test_tfds_mock_wmt14_by_name():
  with tfds.testing.mock_data(num_examples=7, policy=tfds.testing.MockPolicy.USE_CODE):
    raw = tfds.data_source('wmt14_translate/de-en', split='train', download=False)
    expected = [(str(raw[i]['en']), str(raw[i]['de'])) for i in range(7)]
    pairs = sources.load_split(_tfds_config(), 'train')
    assert len(pairs) == 7
    assert [pairs[i] for i in range(7)] == expected
    assert all(type(s) is str and type(t) is str for s, t in pairs)
    reverse = sources.load_split(_tfds_config(source_lang='de', target_lang='en'), 'test')
    assert reverse[3] == expected[3][::-1]


def test_tfds_prepared_dataset_end_to_end(tmp_path):
  config = _tfds_config(tfds_name='transformer_jax_tiny_translate', tfds_data_dir=str(tmp_path))
  with pytest.raises(ValueError) as error:
    sources.load_split(config, 'train')
  assert 'transformer_jax_tiny_translate is not prepared in' in str(error.value)

  ready = prepare_tfds.prepare('transformer_jax_tiny_translate', str(tmp_path))
  assert ready.startswith(str(tmp_path / 'transformer_jax_tiny_translate'))
  assert list(tmp_path.glob('transformer_jax_tiny_translate/1.0.0/*.array_record-*'))
  train = sources.load_split(config, 'train')
  assert sorted(train) == sorted(TransformerJaxTinyTranslate.PAIRS['train'])  # tfds shuffles
  validation = sources.load_split(config, 'validation')
  assert sorted(validation) == sorted(TransformerJaxTinyTranslate.PAIRS['validation'])
  assert sorted(sources.load_split(config, 'train[:50%]')) != sorted(train)
  with pytest.raises(ValueError,
                     match=r"cannot read split 'test' .*splits: \['train', 'validation'\]"):
    sources.load_split(config, 'test')


def test_prepare_that_cannot_download_says_what_to_do_and_leaves_the_data_dir_as_it_was(tmp_path, monkeypatch):
  """Offline, tfds' requests error (after ~3.5 minutes of retries, cut here to one try) becomes one line with the
  command for a machine with internet; what the build had begun goes, what was there before stays."""
  from tensorflow_datasets.core.download import downloader  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(downloader, 'MAX_RETRIES', 0)
  for name in ('http_proxy', 'HTTP_PROXY', 'all_proxy', 'ALL_PROXY'):
    monkeypatch.delenv(name, raising=False)
  with socket.socket() as unused:  # a port nothing listens on: the connection is refused at once
    unused.bind(('127.0.0.1', 0))
    url = f'http://127.0.0.1:{unused.getsockname()[1]}/pairs.tsv'
  monkeypatch.setattr(TransformerJaxUnreachable, 'URL', url)
  earlier = [tmp_path / 'downloads' / 'finished.tsv', tmp_path / 'downloads' / 'old.tsv.tmp.0123',
             tmp_path / 'transformer_jax_unreachable' / 'de-en' / '0.9.0' / 'dataset_info.json']
  for path in earlier:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('kept')
  before = sorted(tmp_path.rglob('*'))

  with pytest.raises(OSError) as error:
    prepare_tfds.prepare('transformer_jax_unreachable/de-en', str(tmp_path))
  assert str(error.value) == (
      f'cannot download transformer_jax_unreachable/de-en: {url} is out of reach (NewConnectionError). Run this on a '
      f'machine with internet, then copy {tmp_path} to this one: '
      f'{sources.prepare_command("transformer_jax_unreachable/de-en", str(tmp_path))}')
  assert sorted(tmp_path.rglob('*')) == before
  assert all(path.read_text() == 'kept' for path in earlier)
  with pytest.raises(OSError, match='cannot download'):  # a data directory the build made goes too
    prepare_tfds.prepare('transformer_jax_unreachable/de-en', str(tmp_path / 'new'))
  assert sorted(tmp_path.rglob('*')) == before


def test_prepare_says_that_tfds_retries_a_download_and_for_how_long(tmp_path, monkeypatch, caplog):
  """tfds retries a failed download 10 times over about 3.5 minutes (urllib3's doubling backoff): each retry is one
  line with its number and the waiting left (here 2 retries: no wait before the first, 0.4 s before the second)."""
  from tensorflow_datasets.core.download import downloader  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(downloader, 'MAX_RETRIES', 2)
  for name in ('http_proxy', 'HTTP_PROXY', 'all_proxy', 'ALL_PROXY'):
    monkeypatch.delenv(name, raising=False)
  with socket.socket() as unused:
    unused.bind(('127.0.0.1', 0))
    monkeypatch.setattr(TransformerJaxUnreachable, 'URL', f'http://127.0.0.1:{unused.getsockname()[1]}/pairs.tsv')
  with pytest.raises(OSError, match='cannot download'):
    prepare_tfds.prepare('transformer_jax_unreachable/de-en', str(tmp_path))
  said = [record.getMessage() for record in caplog.records if record.name == 'urllib3.connectionpool']
  assert said == [f'transformer_jax_unreachable/de-en: downloading /pairs.tsv failed (NewConnectionError): retry {n} '
                  'of 2; tfds gives up after about 0s more' for n in (1, 2)]
  # tfds' own settings, 10 retries with a backoff factor of 0.2: 0, 0.4, 0.8, ... 102.4 s between them.
  retry, error = urllib3.util.Retry(total=10, backoff_factor=0.2), urllib3.exceptions.NewConnectionError(None, 'no')
  lines = []
  for _ in range(10):
    retry = retry.increment('GET', '/pairs.tsv', error=error)
    record = logging.LogRecord('urllib3.connectionpool', logging.WARNING, 'connectionpool.py', 1,
                               "Retrying (%r) after connection broken by '%r': %s", (retry, error, '/pairs.tsv'),
                               None)
    prepare_tfds._SayRetries('wmt14_translate/de-en').filter(record)  # pylint: disable=protected-access
    lines.append(record.getMessage().split(': retry ')[1])
  # urllib3 logs a retry after sleeping before it: what is left is the sleeps before the later retries, none after
  # the last (its failure ends the download at once).
  assert lines == ['1 of 10; tfds gives up after about 3m24s more', '2 of 10; tfds gives up after about 3m24s more',
                   '3 of 10; tfds gives up after about 3m23s more', '4 of 10; tfds gives up after about 3m22s more',
                   '5 of 10; tfds gives up after about 3m18s more', '6 of 10; tfds gives up after about 3m12s more',
                   '7 of 10; tfds gives up after about 2m59s more', '8 of 10; tfds gives up after about 2m34s more',
                   '9 of 10; tfds gives up after about 1m42s more', '10 of 10; tfds gives up after about 0s more']


def test_tfds_not_prepared_says_how_to_prepare(tmp_path):
  with pytest.raises(ValueError) as error:
    sources.load_split(_tfds_config(tfds_data_dir=str(tmp_path)), 'train')
  assert str(error.value) == (
      f'wmt14_translate/de-en is not prepared in {tmp_path} (data.tfds_data_dir): where it is prepared elsewhere, '
      f'pass --config.data.tfds_data_dir=THAT_DIR; else, on a machine with internet, run: '
      f'python -m transformer_jax.prepare_tfds --name=wmt14_translate/de-en '
      f'--data_dir={tmp_path}  (which runs: tfds build wmt14_translate/de-en '
      f'--file_format=array_record --data_dir={tmp_path})')


def test_tfds_unknown_dataset_or_config(tmp_path):
  with pytest.raises(ValueError) as error:
    sources.load_split(_tfds_config(tfds_name='wmt14_translat/de-en', tfds_data_dir=str(tmp_path)),
                       'train')
  message = str(error.value)
  assert "unknown tfds dataset 'wmt14_translat'" in message
  assert 'did you mean wmt14_translate' in message and '\n' not in message
  with pytest.raises(ValueError) as error:
    sources.load_split(_tfds_config(tfds_name='wmt14_translate/xx-en', tfds_data_dir=str(tmp_path)),
                       'train')
  assert 'its configs: cs-en, de-en, fr-en' in str(error.value) and '\n' not in str(error.value)


def test_tfds_language_must_be_in_the_translation_feature(tmp_path):
  config = _tfds_config(target_lang='fr', tfds_data_dir=str(tmp_path))
  with pytest.raises(ValueError, match=r"has no language 'fr' \(its features: \['de', 'en'\]\); "
                                       r'set data config key target_lang'):
    sources.load_split(config, 'train')
  with pytest.raises(ValueError, match=r"mnist has no language 'en' \(its features: "):
    sources.load_split(_tfds_config(tfds_name='mnist', tfds_data_dir=str(tmp_path)), 'train')
