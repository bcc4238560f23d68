"""Imports a transformers MarianMT checkpoint (e.g. OPUS-MT) as a workdir at step 0, to evaluate, translate,
export or fine-tune; its command is `transformer_jax/convert.py` (python -m transformer_jax.convert --from_hf=...
--workdir=NEW).

NEW gets config.json (the `model` section matching the checkpoint, `tokenizer` its vocabulary; for an export of
ours, the `data`, `eval` and `decode` sections of the run it came from, which its card records: the workdir evaluates
what that run did), the tokenizer (tokenizer/source.spm, target.spm and pieces.json: Marian's pieces in our ids) and a params-only checkpoint at step
0. `eval.py`, `transformer_jax.translate`, `attention_plots` and `export` read it as a trained run's workdir;
`train.py --config=configs/fine_tune.py:NEW --workdir=NEW` fine-tunes it (the trainer starts from those params).
"""

import json
import os

import flax.linen as nn
import jax
import numpy as np

from transformer_jax import config as config_lib
from transformer_jax.config.model import ModelConfig
from transformer_jax.core import files
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.interop import card
from transformer_jax.interop import hf
from transformer_jax.interop import marian
from transformer_jax.model import transformer as model_lib
from transformer_jax.training import checkpoint

def special_ids(source: hf.Checkpoint) -> dict[str, int]:
  """Marian's pad, eos, decoder start and unk ids (config.json, or MarianConfig's defaults, and vocab.json): four
  distinct ids, or the pad token as the decoder start (`model.pad_is_bos`)."""
  config, vocab = source.config, source.vocab
  ids = {'pad': marian.setting(config, 'pad_token_id'), 'eos': marian.setting(config, 'eos_token_id'),
         'start': marian.setting(config, 'decoder_start_token_id'), 'unk': vocab.get('<unk>')}
  missing = [name for name, value in ids.items() if not isinstance(value, int)]
  if missing:
    raise ValueError(f'{source.directory}: no single {"/".join(missing)} token id in config.json (or <unk> in '
                     'vocab.json): pass a MarianMT checkpoint that sets them.')
  if config.get('unk_token_id', ids['unk']) != ids['unk']:
    raise ValueError(f'{source.directory}: config.json\'s unk_token_id={config["unk_token_id"]} is not vocab.json\'s '
                     f'<unk> ({ids["unk"]}): pass a config.json and vocab.json of one checkpoint.')
  others = {name: value for name, value in ids.items() if name != 'pad'}
  if len(set(others.values())) < 3 or ids['pad'] in (ids['eos'], ids['unk']):
    raise ValueError(f'{source.directory}: the special tokens {ids} share ids (only the pad token may be the decoder '
                     'start), which our reserved ids cannot hold: convert a checkpoint with distinct ones.')
  return ids


def vocabulary(source: hf.Checkpoint, order: list[int]) -> list[str]:
  """Our pieces in id order: Marian's pieces in `order`, our BOS row named '<s>' (Marian starts with its pad)."""
  by_id = {i: piece for piece, i in source.vocab.items()}
  size = marian.setting(source.config, 'vocab_size')
  if sorted(by_id) != list(range(size)) or len(by_id) != len(source.vocab):
    raise ValueError(f'{os.path.join(source.directory, hf.VOCAB)} does not give each of the model\'s {size} ids '
                     'one piece: pass the vocab.json of this checkpoint.')
  pieces = [by_id[i] for i in order]
  for i, piece in tokenizer_lib.SPECIAL_PIECES.items():
    pieces[i] = piece
  if len(set(pieces)) != len(pieces):
    raise ValueError(f'{os.path.join(source.directory, hf.VOCAB)} names an ordinary piece like one of our '
                     f'reserved pieces {sorted(tokenizer_lib.SPECIAL_PIECES.values())}: it cannot be imported.')
  return pieces


def import_checkpoint(directory: str, workdir: str) -> ModelConfig:
  """Writes the workdir of the MarianMT checkpoint in `directory` (see the module's docstring); returns its model."""
  run = Workdir(workdir)
  if os.path.exists(run.path) and os.listdir(run.path):
    raise ValueError(f'{run.path} exists and is not empty: pass a new --workdir.')
  source = hf.read(directory)
  ids = special_ids(source)
  size = marian.setting(source.config, 'vocab_size')
  order = marian.import_order(ids['pad'], ids['eos'], ids['start'], ids['unk'], size)
  pieces = vocabulary(source, order)
  section = marian.model_config(source.config, os.path.join(directory, hf.CONFIG),
                                attention_bias=marian.has_attention_bias(source.tensors),
                                logits_bias=marian.has_logits_bias(source.tensors), vocab_size=len(order),
                                pad_is_bos=ids['pad'] == ids['start'])
  config = config_lib.base_config()
  _evaluate_as_exported(config, card.training_config(directory))
  section['max_len'] = min(config.model.max_len, section['max_positions'])  # also pipeline.max_length
  cfg = ModelConfig(**section)
  params = marian.from_state_dict(cfg, source.tensors, order, source.tensors_file)
  _check_shapes(cfg, params, directory)

  run.ensure_writable()
  tokenizer_dir = os.path.dirname(run.tokenizer_model)
  os.makedirs(tokenizer_dir)
  for ours, theirs in ((tokenizer_lib.SOURCE_SPM, hf.SOURCE_SPM), (tokenizer_lib.TARGET_SPM, hf.TARGET_SPM)):
    with open(os.path.join(directory, theirs), 'rb') as f:
      files.write_atomically(os.path.join(tokenizer_dir, ours), f.read())
  files.write_atomically(os.path.join(tokenizer_dir, tokenizer_lib.PIECES),
                         json.dumps({'pieces': pieces}, ensure_ascii=False))
  tok = tokenizer_lib.load_tokenizer(run.tokenizer_model)

  config.model.update(section)  # vocab_size also sets tokenizer.vocab_size
  config.tokenizer.model_type = tok.model_type
  run.save_config(config)
  manager = checkpoint.make_manager(run.checkpoints, async_save=False)
  checkpoint.save(manager, 0, {'params': params}, force=True)
  manager.wait_until_finished()
  manager.close()
  return cfg


# What an export of ours brings back into its workdir from the card: what the run evaluated on and how.
_EVALUATION_SECTIONS = ('data', 'eval', 'decode')


def _evaluate_as_exported(config, trained: dict | None) -> None:
  """The new workdir's config evaluates what the exported run's did (`trained`: its config from our card), the
  same split decoded the same way; another MarianMT checkpoint's keeps the defaults."""
  for section in _EVALUATION_SECTIONS if trained else ():
    config[section].update({key: value for key, value in trained.get(section, {}).items() if key in config[section]})


def _check_shapes(cfg: ModelConfig, params, directory: str) -> None:
  """The converted params have exactly the shapes and names of our model of `cfg`."""
  wanted = jax.eval_shape(lambda: nn.unbox(model_lib.make_model(cfg).init(
      jax.random.key(0), **model_lib.init_inputs(cfg, (1, 2)))['params']))
  shapes = lambda tree: {jax.tree_util.keystr(path): tuple(np.shape(x))
                         for path, x in jax.tree_util.tree_leaves_with_path(tree)}
  if shapes(wanted) != shapes(params):
    raise ValueError(f'{directory}: the weights do not have the shapes its config.json describes; download the '
                     'checkpoint again.')
