"""SentencePiece tokenizer with one vocabulary shared by source and target (paper §5.1).

The model is trained once from a seeded, bounded sample of the training pairs (both sides) or documents,
saved atomically in the workdir (`Workdir.tokenizer_model`), and reused from there by later runs
and by evaluation, so training, restarts and evaluation all see the same ids.

A pre-trained checkpoint's tokenizer (`python -m transformer_jax.convert`) is a `PairTokenizer` instead: its own
source and target SentencePiece models over one vocabulary of pieces, in our ids, kept beside `spm.model`'s place
(PAIR_FILES); it is never retrained.
"""

import io
import os
import re
from collections.abc import Iterator, Sequence

import jax
import ml_collections
import numpy as np
import sentencepiece as spm
from absl import logging
from jax.experimental import multihost_utils
from sentencepiece import sentencepiece_model_pb2

from transformer_jax.config import tokenizer as tokenizer_section
from transformer_jax.core import files
from transformer_jax.core.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

_MODEL_TYPE_NAMES = {sentencepiece_model_pb2.TrainerSpec.BPE: 'bpe',
                     sentencepiece_model_pb2.TrainerSpec.UNIGRAM: 'unigram'}


class Tokenizer:
  """A SentencePiece model with the reserved ids of `transformer_jax.core.tokens`."""

  def __init__(self, model_proto: bytes, path: str = '<memory>'):
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.model_proto = model_proto  # the serialized model: two tokenizers are the same when these bytes are
    self.path = path
    self.vocab_size = self._sp.vocab_size()
    self.model_type = _MODEL_TYPE_NAMES.get(_trainer_spec(model_proto).model_type, 'other')
    expected = {'pad': PAD_ID, 'eos': EOS_ID, 'bos': BOS_ID, 'unk': UNK_ID}
    actual = {'pad': self._sp.pad_id(), 'eos': self._sp.eos_id(), 'bos': self._sp.bos_id(),
              'unk': self._sp.unk_id()}
    if actual != expected:
      raise ValueError(f'SentencePiece model {path} has special ids {actual}, expected {expected};'
                       ' delete it and let load_or_train_tokenizer train a new one.')

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` (a source sentence or a document), without EOS."""
    return self._sp.encode(text, out_type=int)

  def encode_target(self, text: str) -> list[int]:
    """Token ids of a target sentence, without EOS (one model: as `encode`)."""
    return self.encode(text)

  @property
  def pieces(self) -> list[str]:
    """The vocabulary's pieces in id order."""
    return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]

  @property
  def files(self) -> dict[str, str]:
    """{file name: path} of what defines this tokenizer (copied into exports)."""
    return {os.path.basename(self.path): self.path}

  @property
  def spm_files(self) -> tuple[str, str]:
    """The SentencePiece models of the source and of the target side: both this one."""
    return self.path, self.path

  def decode(self, ids) -> str:
    """Text of `ids` up to the first EOS; PAD and BOS are skipped (e.g. a padded decoder row)."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if EOS_ID in ids:
      ids = ids[:ids.index(EOS_ID)]
    return self._sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

  def id_to_piece(self, token_id: int) -> str:
    """The vocabulary piece of one id (e.g. for labelling attention maps)."""
    return self._sp.id_to_piece(int(token_id))

  def piece_to_id(self, piece: str) -> int:
    """The id of one vocabulary piece (e.g. of another engine's output)."""
    return self._sp.piece_to_id(piece)


SOURCE_SPM, TARGET_SPM, PIECES = 'source.spm', 'target.spm', 'pieces.json'  # pieces.json: {"pieces": [...]}
PAIR_FILES = (SOURCE_SPM, TARGET_SPM, PIECES)
SPECIAL_PIECES = {PAD_ID: '<pad>', EOS_ID: '</s>', BOS_ID: '<s>', UNK_ID: '<unk>'}


class PairTokenizer:
  """A source and a target SentencePiece model whose pieces map onto one vocabulary (`pieces`, in our ids, the
  reserved ones first): a pre-trained checkpoint's tokenizer. A piece not in the vocabulary is UNK_ID."""

  def __init__(self, directory: str):
    self.path = directory
    self._source, self._target = (_read_processor(os.path.join(directory, name)) for name in (SOURCE_SPM, TARGET_SPM))
    pieces_file = os.path.join(directory, PIECES)
    try:
      pieces = files.read_json(pieces_file, 'vocabulary').get('pieces')
    except FileNotFoundError:
      raise ValueError(f'{pieces_file} is missing: convert the checkpoint again (python -m transformer_jax.convert).'
                       ) from None
    if not isinstance(pieces, list) or not all(isinstance(p, str) for p in pieces) or len(set(pieces)) != len(pieces):
      raise ValueError(f'{pieces_file} is not a list of distinct pieces: convert the checkpoint again.')
    special = {i: pieces[i] for i in SPECIAL_PIECES if i < len(pieces)}
    if special != SPECIAL_PIECES:
      raise ValueError(f'{pieces_file} starts with {special}, expected {SPECIAL_PIECES}: convert the checkpoint again.')
    self.pieces = pieces
    self._ids = {piece: i for i, piece in enumerate(pieces)}
    self.vocab_size = len(pieces)
    self.model_type = _MODEL_TYPE_NAMES.get(_trainer_spec(self._source.serialized_model_proto()).model_type, 'other')
    self.model_proto = b''.join(_read_bytes(path) for path in self.files.values())  # identifies the tokenizer

  @property
  def files(self) -> dict[str, str]:
    return {name: os.path.join(self.path, name) for name in PAIR_FILES}

  @property
  def spm_files(self) -> tuple[str, str]:
    return self.files[SOURCE_SPM], self.files[TARGET_SPM]

  def _ids_of(self, pieces: list[str]) -> list[int]:
    return [self._ids.get(piece, UNK_ID) for piece in pieces]

  def encode(self, text: str) -> list[int]:
    """Token ids of a source sentence, without EOS."""
    return self._ids_of(self._source.encode(text, out_type=str))

  def encode_target(self, text: str) -> list[int]:
    """Token ids of a target sentence, without EOS."""
    return self._ids_of(self._target.encode(text, out_type=str))

  def decode(self, ids) -> str:
    """Target text of `ids` up to the first EOS; PAD and BOS are skipped."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if EOS_ID in ids:
      ids = ids[:ids.index(EOS_ID)]
    return self._target.decode_pieces([self.pieces[i] for i in ids if i not in (PAD_ID, BOS_ID)])

  def id_to_piece(self, token_id: int) -> str:
    return self.pieces[int(token_id)]

  def piece_to_id(self, piece: str) -> int:
    return self._ids.get(piece, UNK_ID)


def _read_bytes(path: str) -> bytes:
  with open(path, 'rb') as f:
    return f.read()


def _read_processor(path: str) -> spm.SentencePieceProcessor:
  if not os.path.isfile(path):
    raise ValueError(f'{path} is missing: convert the checkpoint again (python -m transformer_jax.convert).')
  try:
    return spm.SentencePieceProcessor(model_proto=_read_bytes(path))
  except RuntimeError:
    raise ValueError(f'{path} is not a SentencePiece model (truncated or damaged): restore it from the checkpoint '
                     'directory it was converted from.') from None


def is_pair(path: str) -> bool:
  """Whether the tokenizer at `path` (a `Workdir.tokenizer_model`) is a `PairTokenizer` in its directory."""
  return os.path.exists(os.path.join(os.path.dirname(path), PIECES))


def _trainer_spec(model_proto: bytes):
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(model_proto)
  return proto.trainer_spec


def _sample_sentences(train_pairs: Sequence[tuple[str, str]] | Sequence[str], sample_size: int,
                      seed: int) -> Iterator[str]:
  """Both sides of at most ceil(sample_size / 2) pairs, or at most sample_size documents (str), chosen without
  replacement (seeded)."""
  texts_per_item = 1 if isinstance(train_pairs[0], str) else 2
  count = min(len(train_pairs), -(-sample_size // texts_per_item))
  indices = np.random.default_rng(seed).choice(len(train_pairs), count, replace=False)
  for i in np.sort(indices):
    item = train_pairs[int(i)]
    yield from (item,) if texts_per_item == 1 else item


def train_tokenizer(config: ml_collections.ConfigDict,
                    train_pairs: Sequence[tuple[str, str]] | Sequence[str]) -> bytes:
  """Trains a SentencePiece model on a sample of both sides of `train_pairs` (or of documents); returns its bytes."""
  tokenizer_section.validate(config)
  if len(train_pairs) == 0:
    raise ValueError('Cannot train a tokenizer on an empty training split; check the data config.')
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=_sample_sentences(train_pairs, config.sample_size, config.seed),
        model_writer=model, model_type=config.model_type, vocab_size=config.vocab_size,
        character_coverage=config.character_coverage,
        hard_vocab_limit=True,  # exactly vocab_size pieces, so the embedding size is known upfront
        pad_id=PAD_ID, eos_id=EOS_ID, bos_id=BOS_ID, unk_id=UNK_ID,
        num_threads=2, minloglevel=2)
  except RuntimeError as e:
    limit = re.search(r'Vocabulary size too high.*<= (\d+)', str(e))
    if limit:
      raise ValueError(f'tokenizer.vocab_size={config.vocab_size} is too large for this training'
                       f' sample (at most {limit.group(1)}); lower tokenizer.vocab_size or use more'
                       ' data.') from None
    raise
  return model.getvalue()


def _read_tokenizer(path: str) -> Tokenizer | PairTokenizer:
  if is_pair(path):
    return PairTokenizer(os.path.dirname(path))
  with open(path, 'rb') as f:
    model_proto = f.read()
  try:
    return Tokenizer(model_proto, path)
  except RuntimeError:  # sentencepiece: the bytes do not parse as a model
    raise ValueError(f'{path} is not a SentencePiece model (truncated or damaged): restore it from a copy; a '
                     'run\'s checkpoints need the tokenizer they were trained with.') from None


def load_or_train_tokenizer(config: ml_collections.ConfigDict, path: str,
                            train_pairs: Sequence[tuple[str, str]]) -> Tokenizer:
  """Loads the SentencePiece model at `path`, or trains and saves it there first if it does not exist.

  A saved model whose vocab_size or model_type differs from `config` is an error (the ids a
  checkpoint was trained with must not change). Multi-host runs use `for_training`.
  """
  tokenizer_section.validate(config)
  if os.path.exists(path) or is_pair(path):
    tokenizer = _read_tokenizer(path)
    saved = (tokenizer.vocab_size, tokenizer.model_type)
    if saved != (config.vocab_size, config.model_type):
      raise ValueError(
          f'{path} has vocab_size={saved[0]}, model_type={saved[1]!r} but the config asks for'
          f' vocab_size={config.vocab_size}, model_type={config.model_type!r}; set tokenizer.*'
          ' to match or use a new workdir.')
    where = ', '.join(tokenizer.files.values()) if isinstance(tokenizer, PairTokenizer) else path
    logging.info('Loaded tokenizer %s (%s, %d pieces).', where, saved[1], saved[0])
    return tokenizer
  logging.info('Training a %s tokenizer with %d pieces on up to %d sentences.',
               config.model_type, config.vocab_size, config.sample_size)
  model_proto = train_tokenizer(config, train_pairs)
  files.write_atomically(path, model_proto)
  logging.info('Saved tokenizer to %s.', path)
  return Tokenizer(model_proto, path)


def for_training(config: ml_collections.ConfigDict, path: str, train_pairs: Sequence[tuple[str, str]],
                 model_vocab_size: int) -> Tokenizer:
  """`load_or_train_tokenizer` on process 0 while the other processes wait, then load what it saved."""
  if jax.process_index() == 0:
    tokenizer = load_or_train_tokenizer(config, path, train_pairs)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('tokenizer ready')
  if jax.process_index() != 0:
    tokenizer = load_tokenizer(path)
  check_vocab_size(tokenizer, model_vocab_size)
  return tokenizer


def load_tokenizer(path: str) -> Tokenizer:
  """Loads the tokenizer a training run saved (`Workdir.tokenizer_model`) for evaluation and decoding."""
  if not (os.path.exists(path) or is_pair(path)):
    raise FileNotFoundError(f'No tokenizer at {path}; train first (training creates it) or pass'
                            ' the workdir of a training run.')
  return _read_tokenizer(path)


def check_vocab_size(tokenizer: Tokenizer, model_vocab_size: int,
                     config_key: str = 'model.vocab_size'):
  """Raises if the model's embedding size differs from the tokenizer's vocabulary size."""
  if tokenizer.vocab_size != model_vocab_size:
    raise ValueError(f'The tokenizer {tokenizer.path} has {tokenizer.vocab_size} pieces but'
                     f' {config_key}={model_vocab_size}; set {config_key}={tokenizer.vocab_size}.')
