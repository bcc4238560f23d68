"""Tests of the shared SentencePiece tokenizer: reserved ids, round trips, reuse from the workdir,
and the one-line errors (vocab mismatch, missing model, vocab too large for the data)."""

import os

import numpy as np
import pytest
import sentencepiece as spm

from transformer_jax.config import tokenizer as tokenizer_section
from transformer_jax.core.tokens import BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID, UNK_ID
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import tokenizer as tk

WORDS = ('the a cat dog house tree red blue small big runs sees and of in on with green over under'
         ' die der das Katze Hund Haus Baum rot blau klein groß läuft sieht und über unter').split()


def _pairs(n, seed=0):
  rng = np.random.default_rng(seed)
  return [(' '.join(rng.choice(WORDS[:20], rng.integers(1, 10))),
           ' '.join(rng.choice(WORDS[20:], rng.integers(1, 10)))) for _ in range(n)]


def _config(**fields):
  config = tokenizer_section.default_config()
  config.update({'vocab_size': 120, **fields})
  return config


class _NoAccess(list):
  """Training pairs that fail if read: proves that a saved tokenizer is reused, not retrained."""

  def __getitem__(self, index):
    raise AssertionError('the tokenizer was retrained')

  def __len__(self):
    return 100


@pytest.fixture(scope='module')
def model_path(tmp_path_factory):
  path = Workdir(str(tmp_path_factory.mktemp('run'))).tokenizer_model
  tk.load_or_train_tokenizer(_config(), path, _pairs(300))
  return path


def test_saved_model_has_the_reserved_ids_and_the_requested_size(model_path):
  sp = spm.SentencePieceProcessor(model_file=model_path)
  assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == (PAD_ID, EOS_ID, BOS_ID, UNK_ID)
  assert sp.vocab_size() == 120
  assert sp.get_piece_size() > NUM_RESERVED
  assert os.listdir(os.path.dirname(model_path)) == ['spm.model']  # no temp file
  tokenizer = tk.load_tokenizer(model_path)
  assert [tokenizer.id_to_piece(i) for i in (PAD_ID, EOS_ID, BOS_ID, UNK_ID)] == [
      '<pad>', '</s>', '<s>', '<unk>']


@pytest.mark.parametrize('text', ['the cat sees a big red tree', 'die Katze läuft über das Haus',
                                  'treed catdog'])  # the last one: unseen words, seen characters
def test_encode_decode_round_trip(model_path, text):
  tokenizer = tk.load_tokenizer(model_path)
  ids = tokenizer.encode(text)
  assert ids and EOS_ID not in ids and min(ids) >= NUM_RESERVED
  assert tokenizer.decode(ids) == text
  assert tokenizer.decode(np.array(ids)) == text


def test_decode_stops_at_eos_and_skips_pad_and_bos(model_path):
  tokenizer = tk.load_tokenizer(model_path)
  ids = tokenizer.encode('the dog')
  assert tokenizer.decode([BOS_ID] + ids + [EOS_ID] + tokenizer.encode('the cat')) == 'the dog'
  assert tokenizer.decode(ids + [PAD_ID, PAD_ID]) == 'the dog'
  assert tokenizer.decode([EOS_ID] + ids) == ''


def test_unseen_characters_map_to_unk(model_path):
  assert UNK_ID in tk.load_tokenizer(model_path).encode('the 猫')


def test_saved_tokenizer_is_reused_without_retraining(model_path):
  path = model_path
  mtime = os.stat(path).st_mtime_ns
  tokenizer = tk.load_or_train_tokenizer(_config(), model_path, _NoAccess())
  assert os.stat(path).st_mtime_ns == mtime
  assert tokenizer.encode('the cat') == tk.load_tokenizer(model_path).encode('the cat')


@pytest.mark.parametrize('fields, message', [({'vocab_size': 150}, 'vocab_size=120'),
                                             ({'model_type': 'unigram'}, "model_type='bpe'")])
def test_saved_tokenizer_with_other_settings_is_an_error(model_path, fields, message):
  with pytest.raises(ValueError, match=message):
    tk.load_or_train_tokenizer(_config(**fields), model_path, _NoAccess())


def test_training_is_deterministic_and_uses_a_bounded_sample():
  pairs = _pairs(300)
  assert tk.train_tokenizer(_config(), pairs) == tk.train_tokenizer(_config(), pairs)
  half = {'sample_size': 300, 'vocab_size': 100}  # 150 of the 300 pairs: the seed picks which
  assert tk.train_tokenizer(_config(**half), pairs) != tk.train_tokenizer(_config(seed=1, **half),
                                                                          pairs)
  # Only one pair (two sentences) has a 'q'; a 20-sentence sample (seed 0) does not contain it.
  pairs[123] = ('qq', 'qq')
  assert UNK_ID in tk.Tokenizer(tk.train_tokenizer(_config(sample_size=20, vocab_size=60),
                                                   pairs)).encode('qq')
  assert UNK_ID not in tk.Tokenizer(tk.train_tokenizer(_config(), pairs)).encode('qq')


def test_unigram_option(tmp_path):
  config = _config(model_type='unigram', vocab_size=60)
  tokenizer = tk.load_or_train_tokenizer(config, Workdir(str(tmp_path)).tokenizer_model, _pairs(300))
  assert (tokenizer.model_type, tokenizer.vocab_size) == ('unigram', 60)
  assert tk.load_tokenizer(Workdir(str(tmp_path)).tokenizer_model).model_type == 'unigram'
  assert tokenizer.decode(tokenizer.encode('the blue house')) == 'the blue house'


def test_missing_tokenizer_says_to_train_first(tmp_path):
  with pytest.raises(FileNotFoundError, match='train first') as error:
    tk.load_tokenizer(Workdir(str(tmp_path)).tokenizer_model)
  assert Workdir(str(tmp_path)).tokenizer_model in str(error.value)


def test_check_vocab_size_names_the_config_key(model_path):
  tokenizer = tk.load_tokenizer(model_path)
  tk.check_vocab_size(tokenizer, 120)
  with pytest.raises(ValueError, match=r'set model\.vocab_size=120'):
    tk.check_vocab_size(tokenizer, 37000)


@pytest.mark.parametrize('fields, pairs, message', [
    ({'vocab_size': 5000}, _pairs(50), r'tokenizer.vocab_size=5000 is too large .*at most \d+'),
    ({'model_type': 'word'}, _pairs(5), 'tokenizer.model_type'),
    ({'vocab_size': NUM_RESERVED}, _pairs(5), 'tokenizer.vocab_size'),
    ({}, [], 'empty training split'),
])
def test_bad_training_inputs_are_one_line_errors(tmp_path, fields, pairs, message):
  with pytest.raises(ValueError, match=message) as error:
    tk.load_or_train_tokenizer(_config(**fields), Workdir(str(tmp_path)).tokenizer_model, pairs)
  assert '\n' not in str(error.value)
  assert not os.path.exists(Workdir(str(tmp_path)).tokenizer_model)
