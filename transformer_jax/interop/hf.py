"""A `transformers` MarianMT directory, read (import) and written (export): config.json, model.safetensors (or
pytorch_model.bin), the tokenizer files source.spm, target.spm and vocab.json, and our export's model card.

The mapping of configs, weights and ids is `marian.py`; this module only moves files, and says in one line what is
wrong with a directory that is not a MarianMT checkpoint. Nothing is downloaded: a hub id must be in the local
Hugging Face cache.
"""

import dataclasses
import json
import os
import shutil
from pathlib import Path

from transformer_jax.config.model import ModelConfig
from transformer_jax.core import files
from transformer_jax.core.tokens import UNK_ID
from transformer_jax.interop import marian

CONFIG, SAFETENSORS, PYTORCH = 'config.json', 'model.safetensors', 'pytorch_model.bin'
SOURCE_SPM, TARGET_SPM, VOCAB = 'source.spm', 'target.spm', 'vocab.json'
CARD = 'README.md'  # our export's model card (`card.model_card`)
TOKENIZER_FILES = (SOURCE_SPM, TARGET_SPM, VOCAB)


@dataclasses.dataclass
class Checkpoint:
  """What an import reads from a MarianMT directory."""

  directory: str
  config: dict  # config.json
  tensors: dict  # name -> numpy array
  tensors_file: str  # the file they were read from
  vocab: dict  # vocab.json: piece -> Marian id


def resolve(name: str) -> str:
  """A checkpoint directory: `name` itself, or a hub id's snapshot in the local Hugging Face cache."""
  if os.path.isdir(name):
    return name
  if os.path.exists(name) or name.count('/') != 1:
    raise ValueError(f'{name} is not a directory: pass the directory of a transformers MarianMT checkpoint (or a hub '
                     'id such as Helsinki-NLP/opus-mt-en-de that is in the local Hugging Face cache).')
  import huggingface_hub  # pylint: disable=import-outside-toplevel
  try:
    return huggingface_hub.snapshot_download(name, local_files_only=True)
  except Exception:  # pylint: disable=broad-except  # huggingface_hub: not cached (several exception types)
    raise ValueError(f'{name} is not in the local Hugging Face cache and nothing is downloaded at run time: fetch it '
                     f'first with `hf download {name}` (or pass a directory holding the checkpoint).') from None


def read_config(directory: str) -> dict:
  """A MarianMT checkpoint's config.json; one line if the directory has none or it is not a MarianMT one."""
  config_file = os.path.join(directory, CONFIG)
  if not os.path.isfile(config_file):
    raise ValueError(f'{directory} has no {CONFIG}: it is not a transformers checkpoint; pass the directory holding '
                     f'{CONFIG}, {SAFETENSORS} (or {PYTORCH}) and {", ".join(TOKENIZER_FILES)}.')
  config = files.read_json(config_file, 'checkpoint\'s config')
  if config.get('model_type') != 'marian':
    raise ValueError(f'{config_file} describes a {config.get("model_type")!r} model, not a MarianMT one: pass the '
                     'directory of a transformers MarianMT checkpoint (model_type "marian").')
  return config


def read(directory: str) -> Checkpoint:
  """Reads a MarianMT checkpoint directory; every problem is one line naming the file and what to do."""
  config = read_config(directory)
  for name in TOKENIZER_FILES:
    if not os.path.isfile(os.path.join(directory, name)):
      raise ValueError(f'{os.path.join(directory, name)} is missing: a MarianMT checkpoint needs its tokenizer files '
                       f'{", ".join(TOKENIZER_FILES)}; copy them from where the model came from.')
  if os.path.exists(os.path.join(directory, 'target_vocab.json')):
    raise ValueError(f'{directory} has separate source and target vocabularies (target_vocab.json), which our model '
                     '(one vocabulary) cannot hold: convert a checkpoint with one vocab.json.')
  vocab = files.read_json(os.path.join(directory, VOCAB), 'tokenizer vocabulary')
  return Checkpoint(directory, config, *_read_tensors(directory), vocab)


def _read_tensors(directory: str) -> tuple[dict, str]:
  """The checkpoint's tensors by name, and the file they come from."""
  path = os.path.join(directory, SAFETENSORS)
  if os.path.isfile(path):
    from safetensors import SafetensorError  # pylint: disable=import-outside-toplevel
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
    try:
      return load_file(path), path
    except (SafetensorError, OSError) as e:
      raise ValueError(f'{path} does not read as safetensors ({e}): it is truncated or damaged; download it again.'
                       ) from None
  path = os.path.join(directory, PYTORCH)
  if os.path.isfile(path):
    import torch  # pylint: disable=import-outside-toplevel
    try:
      state = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:  # pylint: disable=broad-except  # torch: a damaged archive (several exception types)
      raise ValueError(f'{path} does not load ({type(e).__name__}): it is truncated or damaged; download it again.'
                       ) from None
    return {k: v.float().numpy() for k, v in state.items()}, path
  raise ValueError(f'{directory} holds neither {SAFETENSORS} nor {PYTORCH}: copy the model weights there.')


def write(cfg: ModelConfig, params, tokenizer, out_dir, *, decode, card: str) -> Path:
  """Writes `params` (unrolled numpy) of model `cfg` as a MarianMT directory `out_dir` (new or empty; whole or not at
  all) that `MarianMTModel`, `MarianTokenizer` and `AutoTokenizer` load, with `card` as README.md."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  marian.check_exportable(cfg)
  files.check_new_directory(out_dir)
  positions = marian.max_positions(cfg)
  with files.staged_directory(out_dir) as staging:
    save_file(marian.to_state_dict(cfg, params), os.path.join(staging, SAFETENSORS), metadata={'format': 'pt'})
    _write_json(staging, CONFIG, marian.marian_config(cfg))
    ids, pieces = marian.export_special_ids(cfg), marian.export_pieces(cfg, tokenizer.pieces)
    _write_json(staging, 'generation_config.json', {
        'decoder_start_token_id': ids['start'], 'eos_token_id': ids['eos'], 'pad_token_id': ids['pad'],
        'num_beams': decode.beam_size, 'max_length': positions})
    _write_json(staging, VOCAB, {piece: i for i, piece in enumerate(pieces)})
    _write_json(staging, 'tokenizer_config.json', {
        'tokenizer_class': 'MarianTokenizer', 'model_max_length': positions, 'separate_vocabs': False,
        'unk_token': tokenizer.id_to_piece(UNK_ID), 'eos_token': pieces[ids['eos']], 'pad_token': pieces[ids['pad']]})
    source, target = tokenizer.spm_files
    shutil.copyfile(source, os.path.join(staging, SOURCE_SPM))
    shutil.copyfile(target, os.path.join(staging, TARGET_SPM))
    with open(os.path.join(staging, CARD), 'w', encoding='utf-8') as f:
      f.write(card)
  return Path(out_dir)


def _write_json(directory: str, name: str, value) -> None:
  with open(os.path.join(directory, name), 'w', encoding='utf-8') as f:
    json.dump(value, f, indent=2, ensure_ascii=False)
