"""Config files: every file and argument loads and validates, Table 3 rows change exactly what the paper changes,
the paper setups hold the paper's values, validation catches bad combinations, and train.py reports them in
one line."""

import copy
import json
import glob
import os
import re

import ml_collections
import pytest

import helpers
from configs import presets
from transformer_jax import config as config_lib
from transformer_jax.core import files
from configs.table3 import VARIANTS

CONFIG_DIR = os.path.join(helpers.REPO, 'configs')
# Config files that need an argument, with one to test them by: fine_tune takes a converted (or any) run's workdir.
REQUIRED_ARGS = {'fine_tune': os.path.join(helpers.REPO, 'tests', 'data', 'legacy_run')}
PAPER_FILES = ('wmt14_ende_base', 'wmt14_ende_big', 'wmt14_enfr_big', 'wsj_parsing')


def _load(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
  path = os.path.join(CONFIG_DIR, f'{name}.py')
  return config_lib.load(f'{path}:{arg}' if arg else path)


def _flat(config) -> dict:
  out = {}

  def visit(prefix, value):
    if isinstance(value, dict):
      for k, v in value.items():
        visit(f'{prefix}.{k}' if prefix else k, v)
    else:
      out[prefix] = tuple(value) if isinstance(value, list) else value

  visit('', config.to_dict())
  return out


def _diff(a, b) -> dict:
  fa, fb = _flat(a), _flat(b)
  assert fa.keys() == fb.keys()
  return {k: (fa[k], fb[k]) for k in fa if fa[k] != fb[k]}


def _config_files():
  files = sorted(glob.glob(os.path.join(CONFIG_DIR, '*.py')))
  names = [os.path.basename(f)[:-3] for f in files]
  return [n for n in names if n not in ('__init__', 'presets', 'table3')]  # the modules configs build on


def _all_args():
  """(file, argument) for every config file: no argument, each name it accepts, and a combination."""
  cases = []
  for name in _config_files():
    module = files.load_python(os.path.join(CONFIG_DIR, f'{name}.py'), 'get_config', 'config file')
    args = list(getattr(module, 'ARGS', ()))
    cases += [(name, REQUIRED_ARGS.get(name))] + [(name, arg) for arg in args]
    if args:
      cases.append((name, 'runlocal,gpu8'))
  return cases


def test_expected_config_files_exist():
  assert set(PAPER_FILES) | {'default'} <= set(_config_files())


@pytest.mark.parametrize('name', sorted(REQUIRED_ARGS))
def test_a_config_that_needs_an_argument_says_so_in_one_line(name):
  with pytest.raises(ValueError, match=rf'configs/{name}\.py takes .*: --config=configs/{name}\.py:'):
    _load(name)


@pytest.mark.parametrize('name,arg', _all_args())
def test_every_config_and_argument_loads_and_validates(name, arg):
  config = _load(name, arg)
  config_lib.validate(config, data_splits=() if config.data.source == 'files' else None)


@pytest.mark.parametrize('row', [r for r in VARIANTS if r != 'base'])
def test_table3_row_differs_from_base_row_exactly_in_the_paper_keys(row):
  diff = _diff(_load('wmt14_ende_base', row), _load('wmt14_ende_base', 'base'))
  overrides = VARIANTS[row].overrides
  assert set(diff) == set(overrides)
  for key, value in overrides.items():
    assert diff[key][0] == value


def test_table3_base_row_is_the_base_setup_measured_as_table3():
  """Table 3: newstest2013 (validation) without checkpoint averaging; nothing else changes."""
  diff = _diff(_load('wmt14_ende_base', 'base'), _load('wmt14_ende_base'))
  assert diff == {'eval.test_split': ('validation', 'test'), 'eval.average_last': (1, 5)}


@pytest.mark.parametrize('row', [r for r in VARIANTS if r != 'base'])
def test_runlocal_rows_keep_what_the_row_changes(row):
  """runlocal shrinks width by 16 and depth by 2 but a row still changes only its own keys, heads kept."""
  local = _load('wmt14_ende_base', f'{row},runlocal')
  diff = _diff(local, _load('wmt14_ende_base', 'base,runlocal'))
  overrides = VARIANTS[row].overrides
  assert set(diff) <= set(overrides)
  assert {k for k in overrides if k.startswith(('model.', 'train.label'))} <= set(diff)
  for key, value in overrides.items():
    if key == 'model.num_heads':
      assert local.model.num_heads == value
    elif key in ('model.d_model', 'model.d_ff', 'model.d_k', 'model.d_v'):
      assert local.model[key.split('.')[1]] == value // presets.RUNLOCAL_WIDTH_DIVISOR
    elif key in ('model.num_encoder_layers', 'model.num_decoder_layers'):
      assert local.model[key.split('.')[1]] == (value + 1) // 2
    elif key.startswith('model.') or key.startswith('train.label'):
      assert local[key.split('.')[0]][key.split('.')[1]] == value


def test_runlocal_is_smaller_local_and_on_the_default_mesh():
  defaults = config_lib.base_config()
  for name in PAPER_FILES:
    full, config = _load(name), _load(name, 'runlocal')
    assert config.data.source == defaults.data.source  # the built-in corpus: nothing to download
    assert config.model.d_model < full.model.d_model and config.model.vocab_size < full.model.vocab_size
    assert config.model.vocab_size == config.tokenizer.vocab_size
    assert config.train.num_steps < full.train.num_steps and config.train.warmup_steps < config.train.num_steps
    assert dict(config.mesh.shape) == dict(defaults.mesh.shape)  # every device on the batch, whatever the machine
    assert config.train.keep_checkpoints >= config.eval.average_last
    config_lib.validate(config)  # no data paths needed, even for wsj_parsing


# The paper's EN-DE data, vocabulary and batches (§5.1).
PAPER_BASE_DATA = {'data.source': 'tfds', 'data.tfds_name': 'wmt14_translate/de-en', 'data.source_lang': 'en',
                   'data.target_lang': 'de', 'model.vocab_size': 37000, 'tokenizer.vocab_size': 37000,
                   'pipeline.batching': 'token_budget', 'pipeline.tokens_per_batch': 25000}


def test_wmt14_ende_base_is_the_library_defaults_on_the_papers_data():
  """The defaults are the paper's base model, optimizer, schedule, regularisation and beam search (they are what
  ModelConfig and the sections hold); the file changes the data, vocabulary and batching to the paper's, and how
  often a long run checkpoints and evaluates - nothing of the model or its training."""
  config, defaults = _load('wmt14_ende_base'), config_lib.base_config()
  diff = _diff(config, defaults)
  assert {key: _flat(config)[key] for key in PAPER_BASE_DATA} == PAPER_BASE_DATA
  assert not {key for key in diff if key.startswith(('model.', 'decode.')) and key not in PAPER_BASE_DATA}, diff
  assert not {key for key in diff if key.startswith('train.') and key not in (
      'train.checkpoint_every', 'train.eval_every', 'train.keep_checkpoints', 'train.log_every')}, diff
  assert config.train.keep_checkpoints >= config.eval.average_last


def test_big_configs_are_the_papers_setup():
  base, big, enfr = _load('wmt14_ende_base'), _load('wmt14_ende_big'), _load('wmt14_enfr_big')
  checkpointing = {'train.checkpoint_every', 'train.keep_checkpoints', 'train.eval_every', 'eval.average_last'}
  assert set(_diff(big, base)) == set(VARIANTS['big'].overrides) | checkpointing
  assert (big.model.d_model, big.model.d_ff, big.model.num_heads, big.model.dropout) == (1024, 4096, 16, 0.3)
  assert big.train.num_steps == 300_000 and big.eval.average_last == 20 <= big.train.keep_checkpoints
  assert set(_diff(enfr, big)) == {'data.tfds_name', 'data.target_lang', 'model.vocab_size', 'tokenizer.vocab_size',
                                   'model.dropout'}
  assert (enfr.data.tfds_name, enfr.data.target_lang, enfr.model.vocab_size, enfr.model.dropout) == (
      'wmt14_translate/fr-en', 'fr', 32000, 0.1)


def test_wsj_parsing_is_the_papers_setup_and_needs_local_files():
  c = _load('wsj_parsing')
  assert (c.model.num_encoder_layers, c.model.num_decoder_layers, c.model.d_model) == (4, 4, 1024)
  assert c.model.vocab_size == c.tokenizer.vocab_size == 16000
  assert (c.decode.beam_size, c.decode.alpha, c.decode.max_len_offset) == (21, 0.3, 300)
  assert c.data.source == 'files'
  with pytest.raises(ValueError, match=r'data\.files\.train\.source'):
    config_lib.validate(c)
  for split in ('train', 'validation', 'test'):
    c.data.files[split].source = f'/data/{split}.sent'
    c.data.files[split].target = f'/data/{split}.tree'
  config_lib.validate(c)


@pytest.mark.parametrize('preset', sorted(presets.MESH_PRESETS))
def test_mesh_presets(preset):
  config = _load('wmt14_ende_big', preset)
  shape = presets.MESH_PRESETS[preset]
  assert dict(config.mesh.shape) == shape
  assert config.pipeline.batch_multiple == shape['data'] * shape['fsdp']
  assert shape['data'] * shape['fsdp'] * shape['tensor'] in (8, 16)


def test_bad_arguments_are_errors():
  with pytest.raises(ValueError, match='unknown config argument'):
    _load('wmt14_ende_base', 'A_h99')
  with pytest.raises(ValueError, match='more than one variant'):
    _load('wmt14_ende_base', 'A_h4,A_h16')
  with pytest.raises(ValueError, match='more than one mesh preset'):
    _load('wmt14_ende_big', 'gpu8,tpu_v4_32')
  with pytest.raises(ValueError, match=r'model\.num_heads=1 does not divide over the 2 devices'):
    _load('wmt14_ende_base', 'A_h1,gpu8_fsdp_tp')


def _base():
  return _load('wmt14_ende_base', 'runlocal')


@pytest.mark.parametrize('change,message', [
    ({'model.num_heads': 7}, r'model\.d_model=32 is not divisible by model\.num_heads=7'),
    ({'train.warmup_steps': 1000}, r'train\.warmup_steps=1000 > train\.num_steps=200'),
    # each key's own range first: a run of -5 steps is the problem, not its warmup
    ({'train.num_steps': -5, 'train.warmup_steps': 0}, r'^train\.num_steps must be >= 1, got -5\.$'),
    ({'train.warmup_steps': 0}, r"^train\.warmup_steps must be >= 1 with train\.schedule='paper', got 0\.$"),
    ({'train.warmup_steps': -1, 'train.schedule': 'linear_warmup_cosine'},
     r"^train\.warmup_steps must be >= 0 with train\.schedule='linear_warmup_cosine', got -1\.$"),
    ({'eval.average_last': 9}, r'train\.keep_checkpoints=3 < eval\.average_last=9'),
    ({'pipeline.batching': 'sorted'}, r"pipeline\.batching='sorted'"),
    ({'decode.max_len_offset': -1}, r'decode\.max_len_offset'),
    ({'train.adam_eps': 0.0}, r'train\.adam_eps must be > 0, got 0\.0: Adam divides by sqrt\(v\) \+ eps'),
])
def test_validate_rejects(change, message):
  config = _base()
  config.update_from_flattened_dict(change)
  with pytest.raises(ValueError, match=message):
    config_lib.validate(config)


def test_a_warmup_longer_than_the_run_is_allowed_where_the_schedule_has_none():
  config = _base()
  config.update_from_flattened_dict({'train.warmup_steps': 1000, 'train.schedule': 'constant'})
  config_lib.validate(config)  # 'constant' never reads warmup_steps: the paper schedule's check above does not apply


def test_validate_rejects_unknown_mesh_axes():
  config = _base()
  config.mesh.shape = {'data': -1, 'model': 2}
  with pytest.raises(ValueError, match=r"mesh\.shape has unknown mesh axes \['model'\]"):
    config_lib.validate(config)
  config = _base()
  config.mesh.dcn_shape = {'data': 1, 'pipeline': 2}
  with pytest.raises(ValueError, match=r"mesh\.dcn_shape has unknown mesh axes \['pipeline'\]"):
    config_lib.validate(config)
  config = _base()
  config.mesh.rules = [['batch', 'model']]
  with pytest.raises(ValueError, match="unknown mesh axis 'model'"):
    config_lib.validate(config)


# (config file, overrides, the override refused and the choice that leaves it unread)
_UNREAD = [
    ('default.py', {'pipeline.tokens_per_batch': 4096}, "pipeline.tokens_per_batch is not read while "
     "pipeline.batching='packed', only when it is 'token_budget': drop it, or pass --config.pipeline.batching="
     "token_budget too."),
    ('wmt14_ende_base.py:runlocal', {'pipeline.batch_size': 64}, "batching='token_budget', only when it is 'packed'"),
    ('default.py', {'data.files.train.source': 'train.en', 'data.files.train.target': 'train.de'},
     "data.files.train.source is not read while data.source='builtin', only when it is 'files'"),
    ('default.py', {'data.tfds_name': 'wmt14_translate/fr-en'}, "data.source='builtin', only when it is 'tfds'"),
    ('default.py', {'decode.temperature': 0.5}, "model.architecture='encoder_decoder', only when it is 'decoder_only'"),
    ('lm_default.py', {'decode.beam_size': 8}, "model.architecture='decoder_only', only when it is 'encoder_decoder'"),
    ('default.py', {'train.learning_rate': 0.1}, "train.schedule='paper', only when it is 'linear_warmup_rsqrt' or "),
    ('lm1b.py', {'train.learning_rate_scale': 2.0}, "train.schedule='linear_warmup_rsqrt', only when it is 'paper'"),
    ('default.py', {'model.attention_chunk_size': 64}, "model.attention='auto', only when it is 'chunked' or"),
    ('default.py', {'model.sinusoids': 'split', 'model.positional': 'learned'},
     "model.sinusoids is not read while model.positional='learned', only when it is 'sinusoidal'"),
    ('default.py', {'train.warmup_steps': 100, 'train.schedule': 'constant'},
     "train.warmup_steps is not read while train.schedule='constant'"),
    # keys of one source that only a language model reads, given with that source to a translation model
    ('default.py', {'data.text_key': 'content', 'data.source': 'tfds'},
     "data.text_key is not read while model.architecture='encoder_decoder', only when it is 'decoder_only'"),
    ('default.py', {'data.documents': 'paragraphs', 'data.source': 'files', 'data.files.train.text': 'train.txt'},
     "data.documents is not read while model.architecture='encoder_decoder', only when it is 'decoder_only'"),
]


@pytest.mark.parametrize('spec,overrides,message', _UNREAD)
def test_an_override_the_run_would_not_read_is_refused_in_one_line(spec, overrides, message):
  """A --config override that the config's choices leave unread would change nothing: refused, naming the choice."""
  with pytest.raises(ValueError, match=re.escape(message)) as error:
    config_lib.load(f'configs/{spec}', overrides)
  assert '\n' not in str(error.value)


def _with_needs(config: ml_collections.ConfigDict, choice: dict[str, str]) -> dict[str, object]:
  """`choice` and what it needs besides on `config`: no encoder for a language model, the files of the other splits
  (a text file each for a language model, else a TSV)."""
  config = copy.deepcopy(config)
  config.update_from_flattened_dict(choice)
  needs = {}
  if config.model.architecture == 'decoder_only':
    needs['model.num_encoder_layers'] = 0
  if config.data.source == 'files':
    field = 'text' if config.model.architecture == 'decoder_only' else 'tsv'
    needs.update({f'data.files.{split}.{field}': f'{split}.{field}' for split in ('validation', 'test')})
  return {**choice, **needs}


@pytest.mark.parametrize('spec,overrides,message', _UNREAD)
def test_the_same_override_with_the_choices_that_read_it_loads(spec, overrides, message):
  del message
  key = next(iter(overrides))
  choice = {chooser: readers[0] for chooser, readers in config_lib.mode_rule(key)}
  config = config_lib.load(f'configs/{spec}', {**overrides, **_with_needs(config_lib.load_file(f'configs/{spec}'),
                                                                          choice)})
  assert all(config_lib.is_read(config, key) for key in overrides)


def test_every_mode_key_names_a_key_and_choices_its_chooser_accepts():
  """`MODE_KEYS` names keys of the config, and each choice that reads one passes the chooser's own check (with the
  key's other conditions met)."""
  for key, rule in config_lib.MODE_KEYS.items():
    assert config_lib.unknown_key(config_lib.base_config(), key) is None, key
    assert rule and all(readers for _, readers in rule), key
    first = {chooser: readers[0] for chooser, readers in rule}
    for chooser, readers in rule:
      for choice in readers:
        config = config_lib.base_config()
        config.update_from_flattened_dict(_with_needs(config, {**first, chooser: choice}))
        config_lib.validate(config, data_splits=())  # an unknown choice would fail here
        assert config_lib.is_read(config, key)


@pytest.mark.parametrize('args,message', [
    (['--config=configs/wmt14_ende_base.py:runlocal', '--config.train.warmup_steps=100000'],
     'error: train.warmup_steps=100000 > train.num_steps=200'),
    (['--config=configs/wmt14_ende_base.py:runlocal', '--config.mesh.shape.model=2'],
     'FATAL Flags parsing error: --config.mesh.shape.model: the config has no key mesh.shape.model; valid keys of '
     'mesh.shape: data, fsdp, tensor.'),
    (['--config=configs/wmt14_ende_base.py:A_h99'], "unknown config argument(s) ['A_h99']"),
    (['--config=configs/wsj_parsing.py'], 'data.files.train.source and .target (or .tsv)'),
    (['--config.data.files.train.source=train.en', '--config.data.files.train.target=train.de'],
     "error: --config.data.files.train.source is not read while data.source='builtin'"),  # not silently the corpus
])
@pytest.mark.slow
def test_train_py_fails_with_one_line(entry_points, tmp_path, args, message):
  proc = entry_points.run(['train.py', f'--workdir={tmp_path}', *args], text=True)
  output = (proc.stdout + proc.stderr).strip().splitlines()
  assert proc.returncode != 0
  assert len(output) == 1 and message in output[0], output
  assert not os.listdir(tmp_path)  # failed before writing anything


def test_a_resume_may_change_paths_threads_and_steps_but_not_what_makes_the_batches():
  config = helpers.tiny_config(data__source='tfds', pipeline__batching='token_budget')
  saved = json.loads(config.to_json_best_effort())
  assert config_lib.changes_since(saved, config) == {}  # tuples saved as JSON lists are no change
  saved['train']['num_steps'] = 4
  saved['data']['tfds_data_dir'] = '/old/mount'
  saved['pipeline']['read_threads'] = 2
  saved['pipeline']['bucket_boundaries'] = [8, 32]
  saved['model']['removed_key'] = 1  # a key of another version: not compared
  saved['pipeline']['batch_size'] = 99  # not read while pipeline.batching is 'token_budget': no change
  saved['data']['files']['train']['tsv'] = '/old/train.tsv'  # nor while data.source is 'tfds'
  changes = config_lib.changes_since(saved, config)
  assert changes == {'train.num_steps': (4, 8), 'data.tfds_data_dir': ('/old/mount', None),
                     'pipeline.read_threads': (2, 0), 'pipeline.bucket_boundaries': ([8, 32], [8, 16, 24, 32])}
  with pytest.raises(ValueError, match=r'^W was trained with pipeline.bucket_boundaries=\[8, 32\] \(now \[8, 16, 24, '
                                       r'32\]\): its checkpoints continue the batches those values make'):
    config_lib.check_resume(changes, 'W')
  del changes['pipeline.bucket_boundaries']
  config_lib.check_resume(changes, 'W')  # the rest may change
