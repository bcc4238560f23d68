"""Sweeps: building variants, their names and commands, reading workdirs, and a two-variant sweep of a micro
config run end to end with train.py (one variant interrupted first and resumed, then a rerun that trains nothing)."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import helpers
from configs.table3 import VARIANTS
from transformer_jax import sweep
from transformer_jax.core.workdir import Workdir

MICRO_CONFIG = '''
from transformer_jax.config import base_config


def get_config():
  c = base_config()
  c.model.vocab_size = 200
  c.model.update(d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1)
  c.model.max_len = 64
  c.data.update(builtin_train_size=3000, builtin_eval_size=16)
  c.tokenizer.sample_size = 2000
  c.pipeline.update(packed_length=64, batch_size=8, batch_multiple=1)
  c.train.update(num_steps=8, warmup_steps=2, log_every=4, eval_every=8, eval_batches=1, checkpoint_every=4,
                 keep_checkpoints=2)
  c.eval.update(batch_size=16, average_last=1, num_samples=0)
  c.decode.update(batch_size=16, beam_size=2, max_len_offset=5)
  return c
'''

MICRO_SWEEP = '''
from transformer_jax import sweep


def get_sweep():
  return sweep.zip(('model.num_heads', [1, 2]), ('model.dropout', [0.0, 0.2]))
'''


# ----------------------------------------------------------------------------- building sweeps


def test_product_zip_chain():
  assert sweep.product(('a', [1, 2]), ('b', ['x', 'y'])) == [
      {'a': 1, 'b': 'x'}, {'a': 1, 'b': 'y'}, {'a': 2, 'b': 'x'}, {'a': 2, 'b': 'y'}]
  assert sweep.zip(('a', [1, 2]), ('b', ['x', 'y'])) == [{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'y'}]
  assert sweep.chain(('a', [1]), [{'b': 2}, {'a': 3, 'b': 4}]) == [{'a': 1}, {'b': 2}, {'a': 3, 'b': 4}]
  nested = sweep.product(sweep.zip(('a', [1, 2]), ('b', [3, 4])), ('c', [5]))
  assert nested == [{'a': 1, 'b': 3, 'c': 5}, {'a': 2, 'b': 4, 'c': 5}]


def test_sweep_errors():
  with pytest.raises(ValueError, match='one length'):
    sweep.zip(('a', [1, 2]), ('b', [1]))
  with pytest.raises(ValueError, match=r"\['a'\] are set twice"):
    sweep.product(('a', [1]), ('a', [2]))
  with pytest.raises(ValueError, match='no values'):
    sweep.axis('a', [])
  with pytest.raises(TypeError, match='axis'):
    sweep.product('model.num_heads')
  with pytest.raises(ValueError, match='no variants'):
    sweep.variants([])


def test_variant_names():
  names = [v.name for v in sweep.variants(sweep.product(('model.num_heads', [2, 4]), ('train.seed', [0])))]
  assert names == ['num_heads=2,seed=0', 'num_heads=4,seed=0']
  # a key's shortest suffix that no other key of the sweep shares
  variants = sweep.variants([{'model.dropout': 0.1, 'train.dropout': 0.2}])
  assert variants[0].name == 'model.dropout=0.1,train.dropout=0.2'
  variants = sweep.variants(sweep.product((sweep.CONFIG_ARG, ['A_h16']), ('pipeline.bucket_boundaries', [(8, 16)])))
  assert variants[0] == sweep.Variant('A_h16,bucket_boundaries=8-16', {'pipeline.bucket_boundaries': (8, 16)},
                                      'A_h16')
  assert sweep.variants({'my run/1': {'train.seed': 1}})[0].name == 'my_run_1'
  fixed = [(f'train.key_{i:02d}', [1000 + i]) for i in range(20)]  # 20 × 'key_NN=10NN,': 240 characters
  assert len(sweep.variants(sweep.product(*fixed, ('model.num_heads', [2])))[0].name) == 251
  with pytest.raises(ValueError, match=r'^variant key_00=1000,key_01=1001,.*\.\.\. gets a workdir name of 262 '
                                       r'characters, more than a file name holds \(255\): return a dict '):
    sweep.variants(sweep.product(*fixed, ('model.num_heads', [2, 4]), ('model.d_model', [64, 128])))
  with pytest.raises(ValueError, match='both get the workdir name'):
    sweep.variants({'a b': {}, 'a_b': {'train.seed': 1}})


def test_commands_and_config_args():
  variant = sweep.Variant('v', {'model.dropout': 0.1, 'model.positional': 'learned', 'model.share_embeddings': False,
                                'pipeline.bucket_boundaries': (8, 16)}, 'A_h16')
  args = sweep.command('configs/wmt14_ende_base.py:runlocal', variant, 'root', python='py', train_py=helpers.TRAIN_PY)
  assert args == ['py', helpers.TRAIN_PY, '--config=configs/wmt14_ende_base.py:runlocal,A_h16', '--workdir=root/v',
                  '--config.model.dropout=0.1', '--config.model.positional=learned',
                  '--config.model.share_embeddings=false', '--config.pipeline.bucket_boundaries=(8, 16)']
  assert sweep.config_spec('configs/default.py', sweep.Variant('v', {}, 'x')) == 'configs/default.py:x'
  with pytest.raises(ValueError, match='None cannot be passed'):
    sweep.command('c.py', sweep.Variant('v', {'model.d_k': None}, None), 'root', train_py=helpers.TRAIN_PY)


def test_variant_config_validates():
  base = os.path.join(helpers.REPO, 'configs', 'wmt14_ende_base.py') + ':runlocal'
  config = sweep.variant_config(base, sweep.Variant('v', {'model.num_heads': 4}, 'C_N2'))
  assert (config.model.num_heads, config.model.num_encoder_layers) == (4, 1)
  with pytest.raises(ValueError, match='variant bad: model.num_head: the config has no key model.num_head'):
    sweep.variant_config(base, sweep.Variant('bad', {'model.num_head': 4}, None))
  with pytest.raises(ValueError, match=r"variant bad: model.num_heads='four': Could not override field 'num_heads'"):
    sweep.variant_config(base, sweep.Variant('bad', {'model.num_heads': 'four'}, None))
  with pytest.raises(ValueError, match='variant bad: model.d_model=32 is not divisible by model.num_heads=3'):
    sweep.variant_config(base, sweep.Variant('bad', {'model.num_heads': 3}, None))
  with pytest.raises(ValueError, match=r"unknown config argument\(s\) \['A_h16'\]"):  # a row of another file
    sweep.variant_config(os.path.join(helpers.REPO, 'configs', 'default.py'), sweep.Variant('v', {}, 'A_h16'))


def test_table3_runlocal_sweep_is_every_row_over_runlocal():
  module = sweep.load_sweep_file(os.path.join(helpers.REPO, 'configs', 'sweeps', 'table3_runlocal.py'))
  variants = sweep.variants(module.get_sweep())
  assert [v.name for v in variants] == list(VARIANTS)
  for variant in variants:
    assert variant.overrides == {}
    assert sweep.config_spec(module.CONFIG, variant) == f'configs/wmt14_ende_base.py:runlocal,{variant.name}'
  config = sweep.variant_config(os.path.join(helpers.REPO, module.CONFIG), variants[list(VARIANTS).index('A_h16')])
  assert (config.data.source, config.model.num_heads, config.model.d_k) == ('builtin', 16, 2)


# ----------------------------------------------------------------------------- reading workdirs


def _write(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def test_finished_needs_results_of_the_last_step(tmp_path):
  workdir = str(tmp_path)
  assert not sweep.is_finished(workdir, 8)
  _write(os.path.join(workdir, 'results.json'), '{"step": 4, "bleu": 1.0}')
  assert not sweep.is_finished(workdir, 8) and sweep.is_finished(workdir, 4)
  _write(os.path.join(workdir, 'results.json'), '{"step": 8, "bl')  # being written
  assert not sweep.is_finished(workdir, 8)
  _write(os.path.join(workdir, 'results.json'), '{"bleu": 1.0}')  # no step: the last logged training step counts
  _write(os.path.join(workdir, 'metrics.jsonl'), '{"step": 8, "split": "train", "loss": 1.0}\n')
  assert sweep.is_finished(workdir, 8) and not sweep.is_finished(workdir, 9)


def test_metrics_are_read_defensively_and_compiles_left_out_of_speed(tmp_path):
  lines = [{'step': 0, 'split': 'compile', 'seconds': 9.0},
           {'step': 10, 'split': 'train', 'loss': 3.0, 'step_seconds': 1.0},  # includes the compile
           {'step': 20, 'split': 'train', 'loss': 2.0, 'step_seconds': 0.25},
           {'step': 20, 'split': 'eval', 'loss': 2.5},
           {'step': 20, 'split': 'compile', 'seconds': 9.0},  # resumed
           {'step': 30, 'split': 'train', 'loss': 1.5, 'step_seconds': 2.0},
           {'step': 40, 'split': 'train', 'loss': 1.0, 'step_seconds': 0.25}]
  _write(os.path.join(tmp_path, 'v', 'metrics.jsonl'),
         ''.join(json.dumps(line) + '\n' for line in lines) + '{"step": 50, "split": "tr')
  _write(os.path.join(tmp_path, 'v', 'checkpoints', '40', 'state'), '')
  _write(os.path.join(tmp_path, 'v', 'checkpoints', '50.orbax-checkpoint-tmp-1', 'state'), '')
  assert len(Workdir(os.path.join(tmp_path, 'v')).read_metrics()) == len(lines)
  assert sweep.latest_checkpoint(os.path.join(tmp_path, 'v')) == 40
  base = os.path.join(tmp_path, 'c.py')
  _write(base, 'from transformer_jax.config import base_config\n'
               'def get_config():\n  c = base_config()\n  c.train.update(num_steps=50, warmup_steps=1)\n  return c\n')
  # A finished run whose eval.test_split is 'validation' (as runlocal's): its loss is read under that split's name.
  _write(os.path.join(tmp_path, 'x', 'results.json'),
         '{"step": 50, "split": "validation", "bleu": 1.0, "validation_loss": 2.75}')
  variants = [sweep.Variant(name, {'train.seed': seed}, None) for seed, name in enumerate('vwx', 1)]
  rows = sweep.write_results(base, variants, str(tmp_path))
  assert rows[0]['status'] == 'incomplete' and rows[1]['status'] == 'not started'
  assert (rows[2]['status'], rows[2]['test_loss']) == ('finished', 2.75)
  assert (rows[0]['step'], rows[0]['train_loss'], rows[0]['eval_loss']) == (40, 1.0, 2.5)
  assert rows[0]['steps_per_second'] == 4.0  # the windows of steps 20 and 40, without a compilation
  assert rows[0]['bleu'] is None and rows[1]['train_loss'] is None


FAKE_TRAIN = """
import json, os, sys
args = dict(a[2:].split('=', 1) for a in sys.argv[1:])
os.makedirs(args['workdir'], exist_ok=True)
print('fake train', sys.argv[1:])
if args.get('config.train.seed') == '2':
  sys.exit(3)
if args.get('config.train.seed') != '3':  # seed 3: exits 0 without a final evaluation
  with open(os.path.join(args['workdir'], 'results.json'), 'w') as f:
    json.dump({'step': 50, 'bleu': 1.5, 'params': 7}, f)
"""


@pytest.mark.slow
def test_run_continues_after_a_failure_and_reports_it(tmp_path):
  """The runner's bookkeeping, with a stand-in for train.py that fails for seed 2 and evaluates nothing for 3."""
  base = os.path.join(tmp_path, 'c.py')
  _write(base, 'from transformer_jax.config import base_config\n'
               'def get_config():\n  c = base_config()\n  c.train.update(num_steps=50, warmup_steps=1)\n  return c\n')
  fake = os.path.join(tmp_path, 'fake_train.py')
  _write(fake, FAKE_TRAIN)
  root = str(tmp_path / 'root')
  variants = sweep.variants(sweep.axis('train.seed', [1, 2, 3]))
  outcome = sweep.run(base, variants, root, train_py=fake)
  assert outcome == {'seed=1': 'finished', 'seed=2': 'failed: exit code 3',
                     'seed=3': 'failed: no final results for step 50'}
  with open(os.path.join(root, 'seed=2', 'train.log')) as f:
    log = f.read()
  assert log.startswith('$ ') and '--config.train.seed=2' in log and 'fake train' in log
  rows = sweep.write_results(base, variants, root, outcome)
  assert [(r['status'], r['bleu'], r['params']) for r in rows] == [
      ('finished', 1.5, 7), ('failed: exit code 3', None, None), ('failed: no final results for step 50', None, None)]
  with open(os.path.join(root, 'results.csv')) as f:
    assert [row['status'] for row in csv.DictReader(f)] == [r['status'] for r in rows]
  assert sweep.run(base, variants, root, train_py=fake)['seed=1'] == 'skipped'


# A stand-in for `python train.py ...` (sweep.py --python=THIS): it says it started, then on Ctrl-C (SIGINT to the
# terminal's process group) stops and exits 0, as train.py saves its checkpoint and does.
FAKE_PYTHON = """#!{python}
import os, signal, sys
args = dict(a[2:].split('=', 1) for a in sys.argv[2:] if a.startswith('--') and '=' in a)
os.makedirs(args['workdir'], exist_ok=True)
signal.signal(signal.SIGINT, lambda *unused: sys.exit(0))
open(os.path.join(args['workdir'], 'started'), 'w').close()
signal.pause()
"""


@pytest.mark.slow
def test_ctrl_c_ends_a_sweep_in_one_line_saying_how_to_resume(tmp_path):
  base, sweep_file, root = str(tmp_path / 'micro.py'), str(tmp_path / 'micro_sweep.py'), tmp_path / 'root'
  _write(base, MICRO_CONFIG)
  _write(sweep_file, MICRO_SWEEP)
  fake = tmp_path / 'fake_python'
  _write(str(fake), FAKE_PYTHON.format(python=sys.executable))
  fake.chmod(0o755)
  name = sweep.variants(sweep.load_sweep_file(sweep_file).get_sweep())[0].name
  process = subprocess.Popen([sys.executable, 'sweep.py', f'--config={base}', f'--sweep={sweep_file}',
                              f'--workdir={root}', f'--python={fake}'], cwd=helpers.REPO,
                             env=helpers.subprocess_env(device_count=1), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    deadline = time.time() + 240
    while not (root / name / 'started').exists():
      assert process.poll() is None and time.time() < deadline, process.communicate()
      time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in its terminal does
    stdout, stderr = process.communicate(timeout=120)
  finally:
    process.kill()
  assert process.returncode == -signal.SIGINT, stderr
  assert helpers.noise(stderr) == [
      f'interrupted: [1/2] {name} stopped (its train.py saves and stops); rerun the sweep to resume'], stderr
  assert stdout.splitlines() == [f'[1/2] {name}: starting']
  with open(root / sweep.LOG_FILE, encoding='utf-8') as f:
    assert f.read().splitlines()[-1].endswith(f'[1/2] {name}: interrupted; rerun the sweep to resume')


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope='module')
def micro_sweep(tmp_path_factory):
  """Runs the two-variant micro sweep with sweep.py after training its first variant for 4 of its 8 steps."""
  tmp = tmp_path_factory.mktemp('sweep')
  base, sweep_file, root = str(tmp / 'micro.py'), str(tmp / 'micro_sweep.py'), str(tmp / 'root')
  _write(base, MICRO_CONFIG)
  _write(sweep_file, MICRO_SWEEP)
  env = helpers.subprocess_env(device_count=1)
  variants = sweep.variants(sweep.load_sweep_file(sweep_file).get_sweep())
  interrupted = os.path.join(root, variants[0].name)
  first = subprocess.run(sweep.command(base, variants[0], root, train_py=helpers.TRAIN_PY)
                         + ['--config.train.num_steps=4'], cwd=helpers.REPO,
                         env=env, capture_output=True, text=True, timeout=300)
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  assert sweep.latest_checkpoint(interrupted) == 4
  assert sweep.is_finished(interrupted, 4) and not sweep.is_finished(interrupted, 8)
  proc = subprocess.run([sys.executable, 'sweep.py', f'--config={base}', f'--sweep={sweep_file}',
                         f'--workdir={root}'], cwd=helpers.REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return {'base': base, 'sweep_file': sweep_file, 'root': root, 'variants': variants, 'stdout': proc.stdout}


@pytest.mark.slow
def test_every_variant_trains_with_its_overrides(micro_sweep):
  for variant in micro_sweep['variants']:
    workdir = os.path.join(micro_sweep['root'], variant.name)
    assert sweep.is_finished(workdir, 8)
    with open(os.path.join(workdir, 'config.json')) as f:
      saved = json.load(f)
    assert saved['model']['num_heads'] == variant.overrides['model.num_heads']
    assert saved['model']['dropout'] == variant.overrides['model.dropout']


@pytest.mark.slow
def test_interrupted_variant_resumes_from_its_checkpoint(micro_sweep):
  name = micro_sweep['variants'][0].name
  assert f'[1/2] {name}: resuming from checkpoint 4' in micro_sweep['stdout']
  for other in micro_sweep['variants'][1:]:
    assert f'{other.name}: starting' in micro_sweep['stdout']
  workdir = os.path.join(micro_sweep['root'], name)
  train_steps = [r['step'] for r in Workdir(workdir).read_metrics() if r['split'] == 'train']
  assert train_steps == [4, 8]  # steps 1-4 once (the first run), 5-8 after resuming; a restart would log 4 twice
  with open(os.path.join(workdir, 'train.log')) as f:
    assert 'resumed from step 4' in f.read()


@pytest.mark.slow
def test_results_table_has_one_row_per_variant(micro_sweep):
  root, variants = micro_sweep['root'], micro_sweep['variants']
  with open(os.path.join(root, 'results.csv')) as f:
    rows = list(csv.DictReader(f))
  assert [row['variant'] for row in rows] == [v.name for v in variants]
  for row, variant in zip(rows, variants):
    assert (row['model.num_heads'], row['model.dropout']) == tuple(str(v) for v in variant.overrides.values())
    assert (row['status'], row['step']) == ('finished', '8')
    for column in ('train_loss', 'eval_loss', 'bleu', 'test_loss', 'steps_per_second'):
      float(row[column])  # present and a number
    assert int(row['params']) > 0
  with open(os.path.join(root, 'results.md')) as f:
    table = [line for line in f if line.startswith('| ')]
  assert len(table) == 1 + len(variants)
  assert all(f'| {v.name} |' in ''.join(table) for v in variants)


@pytest.mark.slow
def test_rerun_skips_finished_variants(micro_sweep):
  root, variants = micro_sweep['root'], micro_sweep['variants']

  def snapshot():
    files = {}
    for variant in variants:
      for directory, _, names in os.walk(os.path.join(root, variant.name)):
        for name in names:
          path = os.path.join(directory, name)
          files[path] = (os.stat(path).st_mtime_ns, os.stat(path).st_size)
    return files

  before = snapshot()
  outcome = sweep.run(micro_sweep['base'], variants, root, train_py=helpers.TRAIN_PY)
  assert outcome == {v.name: 'skipped' for v in variants}
  assert snapshot() == before  # no checkpoint, log or result touched: nothing retrained
  with open(os.path.join(root, sweep.LOG_FILE)) as f:
    assert sum('skipped, finished at step 8' in line for line in f) == len(variants)
  assert sweep.commands(micro_sweep['base'], variants, root, train_py=helpers.TRAIN_PY) == [
      f'# {v.name}: finished' for v in variants]


@pytest.mark.slow
def test_print_commands_lists_unfinished_variants(micro_sweep, entry_points, tmp_path):
  proc = entry_points.run(['sweep.py', f'--config={micro_sweep["base"]}', f'--sweep={micro_sweep["sweep_file"]}',
                           f'--workdir={tmp_path}', '--print_commands'], text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert len(lines) == 2 and all('train.py --config=' in line for line in lines)
  assert f'--workdir={tmp_path}/num_heads=2,dropout=0.2 --config.model.num_heads=2 --config.model.dropout=0.2' \
      in lines[1]
  assert not os.listdir(tmp_path)  # printing launches nothing
