"""Bad inputs, by class: each ends in one line that names the flag, key, file, line or step and says what to do,
or (where the input is legal) in the right result; nothing is silently wrong. In-process checks of each class,
then every entry point in a subprocess (exit status and a single line on stderr, no traceback)."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from transformer_jax import config as config_lib
from transformer_jax import sweep
from transformer_jax.config.model import ModelConfig
from transformer_jax.core import files
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import pipeline
from transformer_jax.data import text_input
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.inference import generation
from transformer_jax.inference import restoring
from transformer_jax.jobs import trainer
from transformer_jax.model import ensemble
from transformer_jax.model.transformer import Transformer

LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'legacy_run')
BAD_PYTHON = {  # file text -> what the one-line error says
    'def get_config(:\n': 'line 1: syntax error',
    'X = 1\n': 'defines no get_config()',
    'def get_config():\n  return None\n': 'get_config() returned NoneType, not an ml_collections.ConfigDict',
    'def get_config():\n  raise KeyError("missing")\n': 'get_config() failed: KeyError: missing',
    'import nonexistent_module\n': "failed while loading: ModuleNotFoundError: No module named 'nonexistent_module'",
}


def _one_line(error) -> str:
  message = str(error.value)
  assert '\n' not in message, message
  return message


# --- config and sweep files: one reader of Python files


@pytest.mark.parametrize('text', list(BAD_PYTHON))
def test_a_bad_config_file_is_one_line_naming_it(tmp_path, text):
  path = tmp_path / 'config.py'
  path.write_text(text)
  with pytest.raises(ValueError) as error:
    config_lib.load_file(str(path))
  assert str(path) in _one_line(error) and BAD_PYTHON[text] in _one_line(error)


def test_a_missing_config_file_or_an_argument_it_does_not_take(tmp_path):
  with pytest.raises(FileNotFoundError, match=r'config file .*nope\.py does not exist'):
    config_lib.load_file(str(tmp_path / 'nope.py'))
  path = tmp_path / 'plain.py'
  path.write_text('from transformer_jax.config import base_config\ndef get_config():\n  return base_config()\n')
  with pytest.raises(ValueError, match=r"get_config\(\) takes no argument, but .*plain.py:big passes 'big'"):
    config_lib.load_file(f'{path}:big')


def test_a_bad_sweep_file_is_one_line_naming_it(tmp_path):
  path = tmp_path / 'sweep.py'
  path.write_text('def get_sweep(:\n')
  with pytest.raises(ValueError, match=r'sweep file .*sweep\.py line 1: syntax error'):
    sweep.load_sweep_file(str(path))
  path.write_text('def get_config():\n  pass\n')
  with pytest.raises(ValueError, match=r'sweep file .*sweep\.py defines no get_sweep\(\)'):
    sweep.load_sweep_file(str(path))


# --- text, JSON and model files: one reader each


@pytest.mark.parametrize('separator', ['\u2028', '\x0c', '\x0b', '\x1c', '\x85'])
def test_text_lines_end_at_newline_only(separator):
  """Characters str.splitlines breaks at stay inside their line: line i in is line i out."""
  data = f'one{separator}still one\r\ntwo\n\nfour'.encode()
  assert files.text_lines(data, 'standard input') == [f'one{separator}still one', 'two', '', 'four']


def test_text_that_is_not_utf8_names_the_line():
  with pytest.raises(ValueError) as error:
    files.text_lines(b'fine\nalso fine\nbroken \xff here\n', 'standard input')
  assert _one_line(error).startswith('standard input: line 3 is not valid UTF-8')


def test_an_over_long_line_is_named_by_its_place_in_the_input_blank_lines_counted():
  class Words:
    def encode(self, text):
      return [4] * len(text.split())

  def translate(kept, numbers):
    text_input.encode_lines(kept, Words(), 4, False, numbers=numbers)
    return kept

  assert text_input.translate_nonblank(['a b', '', 'c'], translate) == ['a b', '', 'c']
  with pytest.raises(ValueError, match=r"^input line 5 has 5 tokens, more than the model's max length 4: shorten "):
    text_input.translate_nonblank(['a', '', '  ', 'b c', 'd e f g', 'h'], translate)


@pytest.mark.parametrize('content', ['{"model": ', '[1, 2]', '\xff'])
def test_a_damaged_config_json_names_the_file(tmp_path, content):
  run_dir = Workdir(str(tmp_path))
  with open(run_dir.config_file, 'w', encoding='latin-1') as f:
    f.write(content)
  with pytest.raises(ValueError) as error:
    config_lib.of_run(str(tmp_path))
  assert _one_line(error).startswith(f'{run_dir.config_file} ') and 'restore it from a copy' in _one_line(error)


def test_a_truncated_tokenizer_names_the_file(tmp_path):
  path = str(tmp_path / 'spm.model')
  with open(Workdir(LEGACY).tokenizer_model, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(data)
  helpers.truncate(path)
  with pytest.raises(ValueError) as error:
    tokenizer_lib.load_tokenizer(path)
  assert _one_line(error).startswith(f'{path} is not a SentencePiece model (truncated or damaged)')


def test_a_file_that_cannot_be_written_names_it(tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('x')
  with pytest.raises(OSError) as error:
    files.write_atomically(str(blocker / 'tokenizer' / 'spm.model'), b'model')
  assert _one_line(error).startswith(f'cannot write {blocker}/tokenizer/spm.model (')


@pytest.mark.parametrize('mask', [0o022, 0o077], ids=['umask022', 'umask077'])
def test_written_files_get_the_permissions_of_the_umask_as_open_gives_them(tmp_path, mask):
  """Others may read a run or an export where the umask lets them: not mkstemp's or safetensors' owner-only 0600."""
  previous = os.umask(mask)
  try:
    assert files.umask() == mask
    files.write_atomically(str(tmp_path / 'run' / 'config.json'), '{}')
    with files.staged_directory(tmp_path / 'export') as staging:
      owner_only = os.path.join(staging, 'model.safetensors')
      with open(os.open(owner_only, os.O_CREAT | os.O_WRONLY, 0o600), 'wb') as f:
        f.write(b'weights')
  finally:
    os.umask(previous)
  for path in (tmp_path / 'run' / 'config.json', tmp_path / 'export' / 'model.safetensors'):
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask, path
  assert os.stat(tmp_path / 'export').st_mode & 0o777 == 0o777 & ~mask


_UNRAISABLE = """
import asyncio, gc
from transformer_jax import cli
class Callback:
  def __del__(self):  # an error Python can only print, as tensorstore's callbacks into a closed event loop raise
    raise RuntimeError('Event loop is closed')
def main(argv):
  del argv
  for _ in range(3):  # as a failed restore's reads raise them, one per read
    Callback()
  # A failed write nobody awaits any more, as a failed orbax save leaves them: asyncio logs it when it is collected.
  loop = asyncio.new_event_loop()
  future = loop.create_future()
  try:
    raise ValueError('OUT_OF_RANGE: Error writing a fragment')
  except ValueError as e:
    future.set_exception(e)
  del future
  gc.collect()
  loop.close()
cli.run(main)
"""


@pytest.mark.slow
@pytest.mark.parametrize('verbosity', [0, 1])
def test_an_error_nothing_can_catch_is_one_line_unless_verbose(verbosity):
  result = subprocess.run([sys.executable, '-c', _UNRAISABLE, f'--verbosity={verbosity}'], cwd=helpers.REPO,
                          capture_output=True, text=True, timeout=120, env=helpers.subprocess_env())
  assert result.returncode == 0
  assert 'Event loop is closed' in result.stderr
  assert 'exception was never retrieved' in result.stderr and 'Error writing a fragment' in result.stderr
  assert ('Traceback' in result.stderr) == bool(verbosity), result.stderr
  if not verbosity:  # the first in one line, and at exit how many more came
    lines = result.stderr.splitlines()
    assert sum('an error raised where nothing can catch it' in line for line in lines) == 1, result.stderr
    assert sum(line.endswith('] 2 more errors raised where nothing can catch them (--verbosity=1 shows each)')
               for line in lines) == 1, result.stderr
  else:
    assert result.stderr.count("RuntimeError: Event loop is closed") == 3, result.stderr


# --- checkpoints: a damaged one never blocks a run


def _train(workdir, **overrides):
  return trainer.train_and_evaluate(helpers.tiny_config(**overrides), workdir)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('trained'))
  _train(workdir, train__num_steps=6, train__checkpoint_every=2)
  return workdir


@pytest.mark.slow
def test_evaluation_falls_back_from_a_damaged_latest_checkpoint_and_keeps_it(trained, tmp_path, caplog):
  workdir = str(tmp_path / 'run')
  shutil.copytree(trained, workdir)
  config = config_lib.of_run(workdir)
  expected = restoring.restore(config, workdir, step=4).params
  helpers.damage_checkpoint(os.path.join(Workdir(workdir).checkpoints, '6'))
  digest = helpers.tree_digest(Workdir(workdir).checkpoints)
  restored = restoring.restore(config, workdir)
  assert restored.steps == [4]
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params), jax.device_get(expected))
  assert 'checkpoint step 6 in' in caplog.text and 'does not restore' in caplog.text
  assert restoring.restore(config, workdir, average_last=2).steps == [2, 4]  # the newest two that restore
  with pytest.raises(ValueError) as error:  # an explicitly asked-for step is not replaced by another
    restoring.restore(config, workdir, step=6)
  assert str(error.value).startswith(f'checkpoint step 6 in {Workdir(workdir).checkpoints} does not restore (')
  assert helpers.tree_digest(Workdir(workdir).checkpoints) == digest  # nothing deleted or rewritten


@pytest.mark.slow
def test_a_workdir_past_the_configured_steps_is_refused_untouched(trained):
  before = helpers.tree_digest(trained)
  with pytest.raises(ValueError) as error:
    _train(trained, train__num_steps=4, train__checkpoint_every=2)
  assert _one_line(error) == (f'{Workdir(trained).checkpoints} holds step 6, past train.num_steps=4: nothing to '
                              'train (nothing was changed); pass a larger train.num_steps to continue, or another '
                              '--workdir.')
  assert helpers.tree_digest(trained) == before  # config.json included


# --- batch sizes against the devices, before any work


@pytest.mark.parametrize('key', ['decode.batch_size', 'eval.batch_size', 'pipeline.batch_size'])
def test_every_batch_size_is_checked_against_the_devices_first(tmp_path, key, monkeypatch):
  def must_not_run(*args, **kwargs):
    raise AssertionError('the batch sizes should have been checked first')

  monkeypatch.setattr(trainer.sources, 'load_split', must_not_run)
  config = helpers.tiny_config(**{key.replace('.', '__'): 12})
  with pytest.raises(ValueError) as error:
    trainer.train_and_evaluate(config, str(tmp_path))
  assert _one_line(error).startswith(f'{key}: a global batch of 12 rows does not divide over the 8 ')


# --- learned positions: decoding never produces NaN


@pytest.mark.slow
def test_learned_positions_decode_within_the_table_and_never_nan():
  cfg = ModelConfig(vocab_size=40, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                    dropout=0.0, max_len=12, positional='learned')
  inputs = jnp.asarray(np.random.default_rng(0).integers(4, 40, (2, 16)), jnp.int32)  # padded past max_len
  inputs = inputs.at[:, 10:].set(0)
  model = Transformer(cfg)
  params = model.init(jax.random.key(0), inputs, inputs)['params']
  max_decode_len = cfg.decode_length(inputs.shape[1], max_len_offset=50)
  assert max_decode_len == 12  # input + 50, capped at the 12 positions the table has
  for method in ('beam', 'greedy'):
    tokens, scores = generation.generate((ensemble.Member(model, params),), inputs, jax.random.key(0),
                                        method=method, max_decode_len=max_decode_len)
    assert tokens.shape[-1] == 12 and np.all(np.isfinite(np.asarray(scores)))
  encoded = model.apply({'params': params}, inputs, method=Transformer.encode)
  assert np.all(np.isfinite(np.asarray(encoded)))


def test_evaluation_cuts_sentences_longer_than_learned_positions_and_counts_them():
  class Words:
    def encode(self, text):
      return [4 + len(word) for word in text.split()]

    encode_target = encode  # one vocabulary for both sides

  pairs = [('a b c', 'd e'), ('a b c d e f g h', 'x'), ('a', 'b c d e f g h i j')]
  assert pipeline.count_over(pairs, Words(), 5) == 2 and pipeline.count_over(pairs, Words(), None) == 0
  batch = next(pipeline.make_eval_batches(pairs, Words(), 3, max_length=5))
  assert np.count_nonzero(batch['inputs'], axis=1).tolist() == [4, 5, 2]
  assert np.count_nonzero(batch['targets'], axis=1).tolist() == [3, 2, 5]
  assert batch['inputs'][1, 4] == batch['targets'][2, 4] == 1  # EOS kept at the cut


# --- every entry point: one line on stderr, no traceback


_LOG_LINE = re.compile(r'^[IWE]\d{4} \d\d:\d\d:\d\d')  # absl's prefix: progress and library logs, not errors


def _run(entry_points, args, stdin=None):
  """The exit status and what stderr says besides log lines (no traceback anywhere)."""
  result = entry_points.run(args, stdin)
  stderr = result.stderr.decode('utf-8', 'replace')
  assert 'Traceback' not in stderr, stderr[-3000:]
  return result.returncode, [line for line in stderr.strip().splitlines() if not _LOG_LINE.match(line)]


@pytest.mark.slow
@pytest.mark.parametrize('args,message', [
    (['train.py', '--workdir=W', '--config=CFG/nope.py'], 'config file CFG/nope.py does not exist.'),
    (['train.py', '--workdir=W', '--config=CFG/none.py'], 'get_config() returned NoneType'),
    (['train.py', '--workdir=W', '--config=CFG/noget.py'], 'defines no get_config()'),
    (['train.py', '--workdir=W', '--config=CFG/syntax.py'], 'line 1: syntax error'),
    (['train.py', '--workdir=W', '--config=CFG/noarg.py:runlocal'],
     "CFG/noarg.py: get_config() takes no argument, but CFG/noarg.py:runlocal passes 'runlocal'."),
    (['train.py', '--workdir=W', '--config=configs/default.py:run_local'], "unknown config argument(s) ['run_local']"),
    (['train.py', '--workdir=W', '--topology=v4-8'],
     'flag --topology=v4-8: --topology names the TPU slice or GPU host that --compile_only compiles for'),
    (['train.py', '--workdir=W', '--topology=v5e-8', '--nocompile_only'], 'add --compile_only, or drop --topology.'),
    (['train.py', '--workdir=W', '--distributed'], 'the distributed runtime did not start'),
    (['train.py', '--workdir=W', '--coordinator_address=localhost:1', '--num_processes=2', '--process_id=2'],
     '--process_id must be in [0, --num_processes).'),
    (['train.py', '--workdir=W', '--config.data.source=files',
      *[f'--config.data.files.{split}.{side}=CFG/{split}.{side}' for split in ('train', 'validation', 'test')
        for side in ('source', 'target')]],
     'CFG/train.source does not exist: fix data config key files.train.source'),
    (['train.py', '--workdir=W', '--config.data.source=files', '--config.data.files.train.tsv=CFG/pairs.tsv',
      '--config.data.files.validation.tsv=CFG/pairs.tsv', '--config.data.files.test.tsv=CFG/nope.tsv'],
     'CFG/nope.tsv does not exist: fix data config key files.test.tsv'),  # before training, not after it
    (['eval.py', f'--workdir={LEGACY}', '--average_last=-1'], 'flag --average_last=-1: -1 is not a positive integer'),
    (['eval.py', f'--workdir={LEGACY}', '--config.decode.beam_sise=2'],
     '--config.decode.beam_sise: the config has no key decode.beam_sise; did you mean decode.beam_size or '
     'decode.batch_size? valid keys of decode: alpha, batch_size, beam_size, max_len_offset, max_new_tokens, '),
    (['eval.py', f'--workdir={LEGACY}', '--config.decode.beam_size=0'], 'decode.beam_size must be >= 1, got 0.'),
    (['eval.py', f'--workdir={LEGACY}', '--config.decode.top_k=5'],
     "--config.decode.top_k is not read while model.architecture='encoder_decoder', only when it is 'decoder_only'"),
    (['eval.py', f'--workdir={LEGACY}', '--config.model.attention=flash_tpu'],
     "model.attention='flash_tpu' is a TPU kernel, and this step is compiled for CPU devices: set"),
    (['train.py', '--workdir=W', '--config.model.attention=flash_gpu'],
     "model.attention='flash_gpu' is a GPU kernel, and this step is compiled for CPU devices: set"),
    (['eval.py', f'--workdir={LEGACY}', f'--workdir={LEGACY}', '--step=2', '--step=4'],
     'repeat --workdir (an ensemble of runs) or --step (an ensemble of steps of one run), not both.'),
    (['eval.py', f'--workdir={LEGACY}', f'--workdir={LEGACY}', '--save_averaged'], '--save_averaged saves one run'),
    (['eval.py', f'--workdir={LEGACY}', '--compare_samples=10'], 'pass --compare_to too.'),
    (['eval.py', f'--workdir={LEGACY}', '--compare_to=CFG/nope.txt'], 'no such file: CFG/nope.txt'),
    (['-m', 'transformer_jax.translate'], '--engine=jax translates with a run\'s checkpoints: pass --workdir=DIR'),
    (['-m', 'transformer_jax.translate', '--engine=ctranslate2', f'--workdir={LEGACY}'],
     '--engine=ctranslate2 translates with an export: pass --model=DIR'),
    (['-m', 'transformer_jax.translate', '--engine=ctranslate2', '--model=CFG'], 'CFG holds no transformer_jax.json'),
    (['-m', 'transformer_jax.export', f'--workdir={LEGACY}', '--out=W', '--quantization=int4'],
     'flag --quantization=int4: value should be one of <float32|int8|int8_float16|float16>'),
    (['-m', 'transformer_jax.export', f'--workdir={LEGACY}', f'--workdir={LEGACY}', '--out=W'],
     'an export holds one model, not an ensemble'),
    (['-m', 'transformer_jax.export', f'--workdir={LEGACY}', '--out=CFG'], 'CFG exists and is not an empty directory'),
    (['-m', 'transformer_jax.translate', f'--workdir={LEGACY}', '--beam_size=0'],
     'flag --beam_size=0: 0 is not a positive integer'),
    (['-m', 'transformer_jax.translate', f'--workdir={LEGACY}', '--method=greedy', '--beam_size=5'],
     '--beam_size is for --method=beam; greedy search keeps one hypothesis: drop one of them.'),
    (['-m', 'transformer_jax.attention_plots', '--workdir=W', '--sentence=Hi'], 'workdir W does not exist'),
    (['-m', 'transformer_jax.attention_plots', f'--workdir={LEGACY}', '--sentence=Hi', '--layer=5'],
     '--layer=5 is out of range: the model has layers 0..0.'),
    (['-m', 'transformer_jax.attention_plots', f'--workdir={LEGACY}', '--sentence=Hi', '--head=2'],
     '--head=2 is out of range: the model has heads 0..1.'),
    (['-m', 'transformer_jax.attention_plots', f'--workdir={LEGACY}', '--sentence=  '], '--sentence is blank'),
    (['-m', 'transformer_jax.attention_plots', f'--workdir={LEGACY}', '--sentence=Hi', '--out=CFG/a_file'],
     '--out=CFG/a_file is a file: pass a directory for the PNG files.'),
    (['-m', 'transformer_jax.attention_plots', f'--workdir={LEGACY}', '--sentence=' + 'word ' * 40],
     "more than the model's max length 32: shorten it."),
    (['sweep.py', '--sweep=CFG/syntax.py', '--workdir=W'], 'sweep file CFG/syntax.py line 1: syntax error'),
    (['sweep.py', '--sweep=CFG/sweep_no_config.py', '--workdir=W'], 'pass --config: CFG/sweep_no_config.py sets no CONFIG.'),
    (['sweep.py', '--sweep=configs/sweeps/heads_dropout_runlocal.py', '--workdir=CFG/a_file'],
     'workdir CFG/a_file is not writable'),
    (['-m', 'transformer_jax.prepare_tfds', '--name=wmt14_translat/de-en', '--data_dir=W'],
     "unknown tfds dataset 'wmt14_translat'"),
])
def test_entry_points_fail_with_one_line(entry_points, tmp_path, args, message):
  config_dir = tmp_path / 'cfg'
  config_dir.mkdir()
  for name, text in (('none.py', 'def get_config():\n  return None\n'), ('noget.py', 'X = 1\n'),
                     ('noarg.py', 'from transformer_jax import config\ndef get_config():\n  return config.base_config()\n'),
                     ('syntax.py', 'def get_config(:\n'), ('sweep_no_config.py', 'def get_sweep():\n  return [{}]\n'),
                     ('a_file', 'not a directory\n'), ('pairs.tsv', 'A dog.\tEin Hund.\nA cat.\tEine Katze.\n')):
    (config_dir / name).write_text(text)
  args = [arg.replace('CFG', str(config_dir)).replace('=W', f'={tmp_path / "w"}') for arg in args]
  message = message.replace('CFG', str(config_dir)).replace('workdir W', f'workdir {tmp_path / "w"}')
  returncode, lines = _run(entry_points, args)
  assert returncode != 0
  assert len(lines) == 1 and message in lines[0], lines[-5:]
  assert not os.path.exists(tmp_path / 'w') or not os.listdir(tmp_path / 'w')


@pytest.mark.slow
@pytest.mark.parametrize('args,stdin,message', [
    (['-m', 'transformer_jax.generate', '--prompt=The \udcff dog'], b'',
     '--prompt is not valid UTF-8 text (byte 4 of it): pass UTF-8 text.'),
    (['-m', 'transformer_jax.generate'], b'The dog\nbad \xff\n',
     'standard input: line 2 is not valid UTF-8 (invalid start byte at byte 12); convert it to UTF-8'),
    (['-m', 'transformer_jax.attention_plots', '--sentence=\udcfe'], b'',
     '--sentence is not valid UTF-8 text (byte 0 of it): pass UTF-8 text.'),
    (['-m', 'transformer_jax.attention_plots', '--sentence=Hi', '--target=\udcc3'], b'',
     '--target is not valid UTF-8 text (byte 0 of it): pass UTF-8 text.'),
])
def test_every_tool_refuses_text_that_is_not_utf8_in_one_line(entry_points, args, stdin, message):
  """Bytes that are not UTF-8 reach a tool as lone surrogates in its flags (Python's reading of argv) or as raw
  bytes on standard input; every tool reads them through `text_input` and names where the bad byte is."""
  returncode, errors = _run(entry_points, [*args, f'--workdir={LEGACY}'], stdin=stdin)
  assert returncode == 1 and errors == [f'error: {message}'], errors


@pytest.mark.slow
def test_a_loss_that_goes_non_finite_before_any_checkpoint_stops_train_py_in_one_line(entry_points, tmp_path):
  workdir = str(tmp_path / 'w')
  returncode, lines = _run(entry_points, helpers.train_args(workdir, train__learning_rate_scale=1e9))  # the report's
  assert returncode == 1
  assert len(lines) == 1 and re.fullmatch(
      r'error: non-finite loss, gradients or update by step \d+ \(\d updates skipped\); stopping without saving; no '
      r'checkpoint has been saved yet\. Lower the learning rate or set train\.on_nonfinite=skip\.', lines[0]), lines
  assert helpers.checkpoint_steps(workdir) == []


@pytest.mark.slow
@pytest.mark.parametrize('args, stdin, output', [
    (['-m', 'transformer_jax.devices'], None, re.escape('[CpuDevice(id=0)]\n')),
    (['-m', 'transformer_jax.translate', f'--workdir={LEGACY}', '--method=greedy'], 'The dog sees the cat.\n',
     r'[^\n]*\n'),  # one line (the legacy run's model is barely trained)
    (['-m', 'bench.attention', '--lengths=16', '--implementations=reference', '--repeats=1'], None,
     r'\{"bench": "attention", .*"backend": "cpu".*\n\{"length": 16, "implementation": "reference", .*\| 16 \| .*'),
], ids=['devices', 'translate', 'bench'])
def test_a_cpu_run_says_nothing_about_accelerators_it_does_not_have(args, stdin, output):
  """With every requirements file installed (libtpu and the CUDA plugin: requirements-test.txt) and no JAX_PLATFORMS,
  JAX would start both and print their failures (about 25 lines); a tool, the devices check and a bench script on
  this CPU machine print their own output and log lines only."""
  env = {k: v for k, v in helpers.subprocess_env(device_count=1).items() if k != 'JAX_PLATFORMS'}
  result = subprocess.run([sys.executable, *args], input=stdin, cwd=helpers.REPO, env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert not helpers.noise(result.stderr), result.stderr
  assert re.fullmatch(output, result.stdout, re.DOTALL), result.stdout


@pytest.mark.slow
@pytest.mark.parametrize('args, listed', [
    (['train.py'], 'compile_only config coordinator_address distributed host_memory num_processes process_id topology '
                   'workdir'),
    (['eval.py'], 'average_last compare_method compare_samples compare_seed compare_to config coordinator_address '
                  'distributed num_processes process_id save_averaged split step workdir'),
    (['sweep.py'], 'collect config print_commands python sweep workdir'),
    (['-m', 'transformer_jax.translate'], 'average_last batch_size beam_size engine method model step truncate workdir'),
    (['-m', 'transformer_jax.export'], 'average_last format out quantization step workdir'),
], ids=['train', 'eval', 'sweep', 'translate', 'export'])
def test_help_lists_a_tools_own_flags_and_those_it_shares(entry_points, args, listed):
  """The flags a tool takes from `cli` (--config, the checkpoint flags) and `distributed` are its own in --help,
  not only under --helpfull; absl's logging flags stay there."""
  result = entry_points.run([*args, '--help'], text=True)
  assert re.findall(r'^  --(?:\[no\])?(\w+)', result.stdout, re.MULTILINE) == listed.split(), result.stdout


def _reading_stdin(pid: int) -> bool:
  """Whether process `pid` waits in a read of its file descriptor 0, a pipe (Linux's /proc: the system call's first
  argument, and where the process sleeps)."""
  with open(f'/proc/{pid}/syscall', encoding='ascii') as syscall, open(f'/proc/{pid}/wchan', encoding='ascii') as wchan:
    return syscall.read().split()[1:2] == ['0x0'] and 'pipe' in wchan.read()


@pytest.mark.slow
def test_ctrl_c_ends_a_tool_in_one_line(tmp_path):
  """A tool interrupted (here generate, waiting for its prompts on standard input) says so in one line and ends as
  by the signal, without a traceback."""
  process = subprocess.Popen([sys.executable, '-m', 'transformer_jax.generate', f'--workdir={tmp_path}'],
                             cwd=helpers.REPO, env=helpers.subprocess_env(device_count=1), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 240
    while not _reading_stdin(process.pid):  # its prompts: then it has started, and only the signal can end it
      assert process.poll() is None and time.time() < deadline, process.communicate()
      time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
  finally:
    process.kill()
  assert (process.returncode, stdout, stderr) == (-signal.SIGINT, '', 'interrupted\n')


@pytest.mark.slow
def test_translate_keeps_lines_aligned_and_refuses_bytes_that_are_not_utf8(entry_points):
  lines = ['The dog sees the cat.', 'One\u2028line\x0cstill', '', 'He sleeps.']
  result = entry_points.run(['-m', 'transformer_jax.translate', f'--workdir={LEGACY}', '--method=greedy'],
                            ''.join(line + '\n' for line in lines).encode())
  assert result.returncode == 0, result.stderr[-2000:]
  translations = result.stdout.decode().split('\n')
  assert len(translations) == len(lines) + 1 and translations[-1] == ''  # one line out per line in
  assert translations[2] == ''  # the empty input line stays in its place
  returncode, errors = _run(entry_points, ['-m', 'transformer_jax.translate', f'--workdir={LEGACY}'],
                            stdin=b'fine\nbad \xff\n')
  assert returncode == 1 and errors == ['error: standard input: line 2 is not valid UTF-8 (invalid start byte at '
                                        'byte 9); convert it to UTF-8']
