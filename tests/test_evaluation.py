"""Evaluation and decoding with a trained (tiny) model: restore anywhere (the language model too), averaging, beam
search, BLEU, translate."""

import json
import logging
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from transformer_jax import attention_plots
from transformer_jax import config as config_lib
from transformer_jax.core.tokens import EOS_ID, PAD_ID
from transformer_jax.core.workdir import Workdir
from transformer_jax.evaluation import scores
from transformer_jax.inference import generation
from transformer_jax.inference import restoring
from transformer_jax.jobs import scoring
from transformer_jax.jobs import trainer
from transformer_jax.runtime import progress
from transformer_jax.runtime import sharding
from transformer_jax.training import checkpoint
from transformer_jax.training import steps
import helpers


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A micro model trained for 30 steps on an 8-device FSDP mesh, checkpoints every 10 steps."""
  workdir = str(tmp_path_factory.mktemp('trained'))
  config = helpers.tiny_config(train__num_steps=30, train__checkpoint_every=10, train__keep_checkpoints=5,
                               mesh__shape={'data': 1, 'fsdp': 8, 'tensor': 1})
  trainer.train_and_evaluate(config, workdir)
  return config, workdir


def _data_only(config):
  mesh_cfg = config.mesh.copy_and_resolve_references()
  mesh_cfg.shape = {'data': -1, 'fsdp': 1, 'tensor': 1}
  return mesh_cfg


def _host(tree):
  return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


@pytest.mark.slow
@pytest.mark.parametrize('run', ['trained', 'trained_lm'])
def test_restore_onto_one_device_and_eight(run, request):
  config, workdir = request.getfixturevalue(run)
  on_eight = restoring.restore(config, workdir)
  on_one = restoring.restore(config, workdir, mesh=sharding.make_mesh(_data_only(config), jax.devices()[:1]))
  assert on_eight.steps == on_one.steps == [30]
  assert len(jax.tree.leaves(on_one.params)[0].sharding.device_set) == 1
  for a, b in zip(jax.tree.leaves(_host(on_eight.params)), jax.tree.leaves(_host(on_one.params))):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize('run', ['trained', 'trained_lm'])
def test_checkpoint_from_one_device_restores_on_eight_fsdp(run, request, tmp_path):
  config, workdir = request.getfixturevalue(run)
  one_mesh = sharding.make_mesh(_data_only(config), jax.devices()[:1])
  restored = restoring.restore(config, workdir, mesh=one_mesh)
  other = str(tmp_path / 'copy')
  os.makedirs(other)
  manager = checkpoint.make_manager(Workdir(other).checkpoints, async_save=False)
  checkpoint.save(manager, 7, {'params': restored.params}, force=True)
  manager.wait_until_finished()
  fsdp_cfg = config.mesh.copy_and_resolve_references()
  fsdp_cfg.shape = {'data': 1, 'fsdp': 8, 'tensor': 1}
  mesh8 = sharding.make_mesh(fsdp_cfg)
  target = steps.abstract_params(restored.model, mesh8, restored.rules)
  params8 = checkpoint.restore_params(checkpoint.make_manager(Workdir(other).checkpoints, create=False), 7, target)
  embedding = params8['shared_embedding']['embedding']
  assert len(embedding.sharding.device_set) == 8
  for a, b in zip(jax.tree.leaves(_host(params8)), jax.tree.leaves(_host(restored.params))):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_restore_a_given_step_and_unknown_step(trained):
  config, workdir = trained
  assert restoring.restore(config, workdir, step=20).steps == [20]
  with pytest.raises(ValueError, match='no checkpoint of step 25'):
    restoring.restore(config, workdir, step=25)


@pytest.mark.slow
def test_averaging(trained, tmp_path):
  config, workdir = trained
  steps_params = {s: _host(restoring.restore(config, workdir, step=s).params) for s in (20, 30)}
  averaged = _host(restoring.restore(config, workdir, average_last=2).params)
  for a, p20, p30 in zip(*(jax.tree.leaves(t) for t in (averaged, steps_params[20], steps_params[30]))):
    np.testing.assert_allclose(a, (p20 + p30) / 2, rtol=1e-6, atol=1e-7)
  # averaging K identical checkpoints returns them unchanged
  restored = restoring.restore(config, workdir, step=30)
  same = str(tmp_path / 'same')
  manager = checkpoint.make_manager(Workdir(same).checkpoints, async_save=False)
  for step in (1, 2, 3):
    checkpoint.save(manager, step, {'params': restored.params}, force=True)
  manager.wait_until_finished()
  target = steps.abstract_params(restored.model, restored.mesh, restored.rules)
  mean, averaged = checkpoint.average_params(manager, [1, 2, 3],
                                             lambda s: checkpoint.restore_params(manager, s, target))
  assert averaged == [1, 2, 3]
  for a, b in zip(jax.tree.leaves(_host(mean)), jax.tree.leaves(_host(restored.params))):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match=r'asked to average 9 checkpoints but only 3 of .* restore'):
    restoring.restore(config, workdir, average_last=9)


@pytest.mark.slow
def test_averaging_reads_each_steps_metadata_once(trained, monkeypatch):
  """Orbax reads every array's metadata (the Adam moments' too) for a step's tree: the layout check and the shape
  check share one read."""
  config, workdir = trained
  read = []
  item_metadata = ocp.CheckpointManager.item_metadata
  monkeypatch.setattr(ocp.CheckpointManager, 'item_metadata',
                      lambda self, step: read.append(step) or item_metadata(self, step))
  assert restoring.restore(config, workdir, average_last=3).steps == [10, 20, 30]
  assert sorted(read) == [10, 20, 30]


@pytest.mark.slow
def test_save_averaged_writes_a_workdir_of_its_own_and_never_over_another_average(trained):
  config, workdir = trained
  restored = restoring.restore(config, workdir, average_last=3)
  path, written = restoring.save_averaged(restored, workdir)
  average = Workdir(workdir).averaged([10, 20, 30])
  assert written and path == average.path == os.path.join(workdir, 'averaged', 'average3_step30')
  assert config_lib.of_run(path).to_dict() == config_lib.of_run(workdir).to_dict()  # the run's config
  assert helpers.tree_digest(os.path.dirname(average.tokenizer_model)) == helpers.tree_digest(
      os.path.dirname(Workdir(workdir).tokenizer_model))
  with open(average.averaged_from_file, encoding='utf-8') as f:
    assert json.load(f) == {'workdir': os.path.abspath(workdir), 'steps': [10, 20, 30]}
  # A params-only step (what fine-tuning starts from) gives its params' metadata; a training step, None.
  shapes = jax.tree.map(lambda x: tuple(x.shape), restored.params)
  for directory, expected in [(average.checkpoints, shapes), (Workdir(workdir).checkpoints, None)]:
    manager = checkpoint.open_existing(directory)
    try:
      assert manager.all_steps() == [30] or directory != average.checkpoints
      saved = checkpoint.params_only(manager, 30)
      assert (saved if saved is None else jax.tree.map(lambda m: tuple(m.shape), saved)) == expected
    finally:
      manager.close()
  digest = helpers.tree_digest(path)
  assert restoring.save_averaged(restored, workdir) == (path, False)  # the same average: left as it was
  two = restoring.restore(config, workdir, average_last=2)
  other, written = restoring.save_averaged(two, workdir)  # another average ending at the same step: its own
  assert written and other == Workdir(workdir).averaged([20, 30]).path != path
  assert helpers.tree_digest(path) == digest
  os.remove(Workdir(other).averaged_from_file)  # as a save that did not finish leaves it
  with pytest.raises(ValueError, match='is not a finished save of the average of steps \\[20, 30\\]'):
    restoring.save_averaged(two, workdir)
  shutil.rmtree(other)  # the module's run as it was, for the tests after


@pytest.mark.slow
def test_a_saved_average_is_evaluated_translated_and_exported_by_the_ordinary_commands(entry_points, trained,
                                                                                      tmp_path):
  _, workdir = trained
  result = entry_points.run(['eval.py', f'--workdir={workdir}', '--average_last=2', '--save_averaged',
                             '--config.eval.num_samples=0'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  average = Workdir(workdir).averaged([20, 30]).path
  assert (f'saved the params of steps [20, 30] as the workdir {average} (eval.py, translate and export read it: '
          f'--workdir={average})') in result.stdout
  result = entry_points.run(['eval.py', f'--workdir={average}', '--config.eval.num_samples=0'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  with open(Workdir(average).final_results_file, encoding='utf-8') as f:
    assert json.load(f)['averaged_steps'] == [30]  # its own final model: the one checkpoint it holds
  lines = 'The dog sees the cat.\nHe sleeps.\n'
  translated = [entry_points.run(['-m', 'transformer_jax.translate', *args], lines, text=True)
                for args in ([f'--workdir={average}'], [f'--workdir={workdir}', '--average_last=2'])]
  assert translated[0].returncode == 0, translated[0].stderr[-2000:]
  assert translated[0].stdout == translated[1].stdout  # the averaged params, bit for bit
  assert f'{average}: the saved average of steps [20, 30] of {os.path.abspath(workdir)}' in translated[0].stderr
  result = entry_points.run(['-m', 'transformer_jax.export', f'--workdir={average}', f'--out={tmp_path / "ct2"}'],
                            text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert os.path.isfile(tmp_path / 'ct2' / 'model.bin')


def _inputs(restored, sentences):
  batch = np.zeros((len(sentences), 32), np.int32)
  for i, s in enumerate(sentences):
    ids = restored.tokenizer.encode(s) + [EOS_ID]
    batch[i, :len(ids)] = ids
  return jnp.asarray(batch)


SENTENCES = ['The dog sees the cat.', 'I paint the glass.', 'Does she visit eight sisters?', 'He sleeps.']


@pytest.mark.slow
def test_beam_one_equals_greedy_and_cache_equals_no_cache(trained):
  config, workdir = trained
  restored = restoring.restore(config, workdir, mesh=sharding.make_mesh(_data_only(config), jax.devices()[:1]))
  inputs = _inputs(restored, SENTENCES)
  kw = dict(max_decode_len=20)
  greedy, _ = generation.generate(restored.members, inputs, jax.random.key(0), method='greedy', **kw)
  beam1, _ = generation.generate(restored.members, inputs, jax.random.key(0), method='beam', beam_size=1, alpha=0.0,
                                 **kw)
  np.testing.assert_array_equal(greedy, beam1)
  for method in ('greedy', 'beam'):
    cached, s1 = generation.generate(restored.members, inputs, jax.random.key(0), method=method, **kw)
    uncached, s2 = generation.generate(restored.members, inputs, jax.random.key(0), method=method, use_cache=False,
                                       **kw)
    np.testing.assert_array_equal(cached, uncached)
    np.testing.assert_allclose(s1, s2, rtol=1e-4, atol=1e-4)
  # after EOS only padding
  for row in np.asarray(beam1)[:, 0]:
    if EOS_ID in row:
      assert np.all(row[list(row).index(EOS_ID) + 1:] == PAD_ID)


@pytest.mark.slow
def test_evaluate_split_writes_bleu_results_and_translations(trained):
  config, workdir = trained
  restored = restoring.restore(config, workdir)
  results = scoring.evaluate_split(restored, workdir, 'test')
  saved = json.load(open(Workdir(workdir).final_results_file))
  for key in ('bleu', 'tokenized_bleu', 'bleu_signature', 'test_loss', 'test_perplexity', 'test_accuracy', 'params'):
    assert key in saved
  assert 'nrefs:1' in saved['bleu_signature']
  hyps = open(saved['translations']['hyp'], encoding='utf-8').read().splitlines()
  refs = open(saved['translations']['ref'], encoding='utf-8').read().splitlines()
  assert len(hyps) == len(refs) == saved['num_sentences'] == config.data.builtin_eval_size
  # The scores are those of the files written: anyone can re-score them with the same tools.
  assert saved['bleu'] == results['bleu'] == scores.sacrebleu_corpus(hyps, refs)[0]
  assert (saved['chrf'], saved['chrf++']) == (scores.chrf_corpus(hyps, refs)[0], scores.chrf_corpus(hyps, refs, word_order=2)[0])
  assert saved['chrf_signature'].startswith('nrefs:1') and 'nw:2' in saved['chrf++_signature']
  assert saved['tokenized_bleu'] == scores.tokenized_bleu(hyps, refs, lang='de')
  assert np.isclose(saved['test_perplexity'], np.exp(saved['test_nll']), rtol=1e-5)
  text = scoring.describe(results, 2)
  assert 'BLEU' in text and text.count('reference:') == 2
  assert f'results written to {Workdir(workdir).final_results_file}' in text


@pytest.mark.slow
def test_evaluating_another_checkpoint_keeps_the_final_evaluation(trained):
  """eval.py of params other than the run's final model writes files named by their steps, not results.json."""
  config, workdir = trained
  final_steps = restoring.final_model_steps(config, workdir)
  assert final_steps == [30]  # eval.average_last=1: the last checkpoint
  final = scoring.evaluate_split(restoring.restore(config, workdir), workdir, 'test', final_steps=final_steps)
  assert final['results_file'] == Workdir(workdir).final_results_file
  with open(final['results_file'], 'rb') as f:
    final_bytes = f.read()
  earlier = scoring.evaluate_split(restoring.restore(config, workdir, step=10), workdir, 'test',
                                   final_steps=final_steps)
  assert earlier['results_file'] == Workdir(workdir).results_file('test', 'test', 'step10')
  assert json.load(open(earlier['results_file']))['step'] == 10
  assert earlier['translations']['hyp'] == Workdir(workdir).translation_file('test', 'hyp', 'step10')
  with open(Workdir(workdir).final_results_file, 'rb') as f:
    assert f.read() == final_bytes


@pytest.mark.slow
def test_the_final_evaluations_restore_scoring_and_translation_report_their_progress(trained, monkeypatch, caplog):
  """Each wait reports how far it is (here from its start: the threshold set to 0) and a last line when it ends."""
  config, workdir = trained
  monkeypatch.setattr(progress, 'AFTER', 0.0)
  caplog.set_level(logging.INFO, logger='absl')
  scoring.evaluate_split(restoring.restore(config, workdir), workdir, 'test')
  sentences = config.data.builtin_eval_size
  for what, total, unit in ((f'restoring {workdir}', 1, 'checkpoints'), ('scoring test (teacher-forced)', sentences,
                                                                         'sentences'),
                            ('translating test', sentences, 'sentences')):
    said = [message for message in caplog.messages if message.startswith(f'{what}: ')]
    assert re.match(rf'\d+ of {total} {unit}, ', said[0][len(what) + 2:]), said
    assert said[-1].startswith(f'{what}: {total} {unit} done in '), said


@pytest.mark.slow
def test_evaluating_other_data_or_settings_keeps_the_runs_own_results(trained):
  """The final model evaluated on other data (any data.* override), or decoded or computed otherwise, gets results
  and translations of its own, named for what differs and recording it: the run's results.json and translations
  stay the run's own evaluation."""
  config, workdir = trained
  final_steps = restoring.final_model_steps(config, workdir)
  own = scoring.evaluate_split(restoring.restore(config, workdir), workdir, 'test', final_steps=final_steps)
  assert own['results_file'] == Workdir(workdir).final_results_file
  before = helpers.tree_digest(workdir)
  written = {}
  for overrides in ({'data.builtin_eval_size': 8}, {'decode.beam_size': 2}, {'model.attention': 'reference'},
                    {'data.builtin_eval_size': 8, 'decode.beam_size': 2}, {'decode.batch_size': 8}):
    if 'decode.batch_size' in overrides:  # the last: it scores what the run's own evaluation scored
      after = helpers.tree_digest(workdir)
      assert {k: v for k, v in after.items() if k in before} == before  # results.json and translations/test.* kept
    evaluation = config_lib.for_evaluation(workdir, overrides, 'test')
    results = scoring.evaluate_split(restoring.restore(evaluation, workdir), workdir, 'test', final_steps=final_steps)
    written[tuple(overrides)] = results['results_file']
    with open(results['results_file'], encoding='utf-8') as f:
      saved = json.load(f)
    settings = saved['settings']
    assert settings['data']['builtin_eval_size'] == evaluation.data.builtin_eval_size == saved['num_sentences']
    assert settings['decode']['beam_size'] == evaluation.decode.beam_size
    assert settings['model']['attention'] == evaluation.model.attention
  names = {key: os.path.basename(path) for key, path in written.items()}
  assert names[('decode.batch_size',)] == 'results.json'  # decoding in other batches scores the same thing
  assert names[('data.builtin_eval_size',)].startswith('results_data-')
  assert names[('decode.beam_size',)].startswith('results_decode-')
  assert names[('model.attention',)].startswith('results_model-')
  data, decode = names[('data.builtin_eval_size',)][8:-5], names[('decode.beam_size',)][8:-5]
  assert names[('data.builtin_eval_size', 'decode.beam_size')] == f'results_{data}_{decode}.json'


@pytest.mark.slow
def test_translate_lines_empty_and_too_long(trained):
  config, workdir = trained
  restored = restoring.restore(config, workdir)
  out = generation.translate_lines(restored, ['The dog sees the cat.', '', '   ', 'He sleeps.'])
  assert len(out) == 4 and out[1] == '' and out[2] == ''
  assert out[0] == generation.translate_lines(restored, ['The dog sees the cat.'])[0]
  long_line = ' '.join(['dog'] * 200)
  with pytest.raises(ValueError, match='line 1 has .* tokens, more than the model'):
    generation.translate_lines(restored, [long_line])
  assert len(generation.translate_lines(restored, [long_line], truncate=True)) == 1


@pytest.mark.slow
def test_attention_heatmaps(trained, tmp_path):
  config, workdir = trained
  restored = restoring.restore(config, workdir)
  src = restored.tokenizer.encode('The dog sees the cat.') + [EOS_ID]
  tgt = restored.tokenizer.encode('Der Hund sieht die Katze.') + [EOS_ID]
  maps = attention_plots.attention_maps(restored, src, tgt)
  cfg = restored.model.config
  assert maps['encoder'].shape == (cfg.num_encoder_layers, cfg.num_heads, len(src), len(src))
  assert maps['cross'].shape == (cfg.num_decoder_layers, cfg.num_heads, len(tgt), len(src))
  for weights in maps.values():
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  assert np.allclose(np.triu(maps['decoder'][0, 0], k=1), 0.0)  # causal
  paths = attention_plots.plot_sentence(restored, 'The dog sees the cat.', str(tmp_path), layers=[0])
  assert len(paths) == 3
  for path in paths:
    with open(path, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.slow
def test_eval_and_translate_commands(entry_points, trained):
  _, workdir = trained
  # The run's own config.json is the config: none of its training overrides are repeated here.
  result = entry_points.run(['eval.py', f'--workdir={workdir}', '--average_last=2', '--config.decode.beam_size=2'],
                            text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'BLEU' in result.stdout and '[20, 30]' in result.stdout
  # Not the final model (eval.average_last=1) nor its decoding: the results are named by their steps, then decoding.
  (written,) = [line.split('results written to ')[1] for line in result.stdout.splitlines()
                if line.startswith('results written to ')]
  assert written.startswith(Workdir(workdir).results_file('test', 'test', 'average2_step30_decode-')[:-len('.json')])
  with open(written) as f:
    saved = json.load(f)
  assert saved['beam_size'] == saved['settings']['decode']['beam_size'] == 2
  result = entry_points.run(['-m', 'transformer_jax.translate', f'--workdir={workdir}'],
                            'The dog sees the cat.\n\nHe sleeps.\n', text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert len(result.stdout.split('\n')) == 4 and result.stdout.split('\n')[1] == ''


@pytest.mark.slow
def test_eval_bad_inputs(entry_points, trained, tmp_path):
  config, workdir = trained
  result = entry_points.run(['eval.py', f'--workdir={tmp_path / "missing"}'], text=True)
  assert result.returncode != 0 and 'missing does not exist: pass the --workdir of a training run' in \
      result.stderr.splitlines()[-1]
  result = entry_points.run(['eval.py', f'--workdir={workdir}', '--config.model.d_ff=8'], text=True)
  lines = result.stderr.strip().splitlines()
  assert result.returncode != 0 and len(lines) == 1
  assert '--config.model.d_ff: evaluation cannot change model.d_ff, which the training run fixed' in lines[0]
  result = entry_points.run(['eval.py', f'--workdir={workdir}', f'--config={helpers.DEFAULT_CONFIG}'], text=True)
  assert result.returncode != 0 and 'drop --config=FILE' in result.stderr
  empty = tmp_path / 'empty'
  empty.mkdir()
  (empty / 'config.json').write_text(open(os.path.join(workdir, 'config.json')).read())
  with pytest.raises(FileNotFoundError, match='tokenizer'):
    restoring.restore(config, str(empty))
  wrong = config.copy_and_resolve_references()
  wrong.model.d_ff = 24
  with pytest.raises(ValueError, match=r'ffn.*checkpoint \(\d+, \d+\) vs config'):
    restoring.restore(wrong, workdir)


def test_write_translations_writes_one_line_per_sentence(tmp_path):
  run_dir = Workdir(str(tmp_path))
  texts = {'src': ['Hallo Welt', 'Ä'], 'hyp': ['Hello world', 'A'], 'ref': ['Hi world', 'Ae']}
  paths = scoring.write_translations(run_dir, 'test', texts)
  assert paths == {kind: str(tmp_path / 'translations' / f'test.{kind}.txt') for kind in ('src', 'hyp', 'ref')}
  assert (tmp_path / 'translations' / 'test.src.txt').read_text(encoding='utf-8') == 'Hallo Welt\nÄ\n'
  for kind, lines in texts.items():
    assert (tmp_path / 'translations' / f'test.{kind}.txt').read_text(encoding='utf-8').splitlines() == lines
  with pytest.raises(ValueError, match='differ in length'):
    scoring.write_translations(run_dir, 'dev', {'src': ['a'], 'hyp': ['b', 'c'], 'ref': ['d']})
  with pytest.raises(ValueError, match='line break'):
    scoring.write_translations(run_dir, 'dev', {'src': ['a'], 'hyp': ['b\nc'], 'ref': ['d']})
