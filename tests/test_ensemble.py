"""Ensembles: models of any size over one vocabulary decode and score with the mean of their log-softmaxes; one
member is the model itself, two copies of a model are that model; eval.py and translate take several runs or
steps."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sentencepiece import sentencepiece_model_pb2

import helpers
from transformer_jax import config as config_lib
from transformer_jax.config.model import ModelConfig
from transformer_jax.core.tokens import EOS_ID, PAD_ID
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import sources
from transformer_jax.evaluation import significance
from transformer_jax.inference import decoding
from transformer_jax.inference import generation
from transformer_jax.inference import restoring
from transformer_jax.jobs import scoring
from transformer_jax.model import ensemble
from transformer_jax.model.transformer import Transformer
from transformer_jax.training import steps

LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'legacy_run')  # checkpoints 2 and 4
SMALL = ModelConfig(vocab_size=helpers.VOCAB, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1,
                    num_decoder_layers=1, max_len=32, dropout=0.0)
LARGE = SMALL.replace(d_model=32, d_ff=64, num_heads=4, num_decoder_layers=2)  # another size, same vocabulary
MAX_DECODE_LEN = 12
ALPHA = 0.6


def _member(cfg: ModelConfig, seed: int) -> ensemble.Member:
  return ensemble.Member(Transformer(cfg), helpers.perturbed_params(cfg, seed, scale=0.3))


def _inputs() -> jax.Array:
  return jnp.asarray(helpers.synthetic_batches(1, rows=4, length=10, seed=3)[0]['inputs'])


def _decode(members, method, use_cache=True):
  tokens, scores = generation.generate(tuple(members), _inputs(), jax.random.key(0), method=method, beam_size=4,
                                      alpha=ALPHA, max_decode_len=MAX_DECODE_LEN, use_cache=use_cache)
  return np.asarray(tokens)[:, 0], np.asarray(scores)[:, 0]


def _reference_log_probs(members, targets: np.ndarray) -> np.ndarray:
  """The ensemble's distributions by definition, from each member's own teacher-forced pass (jitted: op by op,
  each of its operations would be compiled on its own): the log of the renormalised product of the members'
  probabilities (the mean of their log-softmaxes)."""
  mean = np.mean([jax.nn.log_softmax(jax.jit(m.model.apply)({'params': m.params}, _inputs(), jnp.asarray(targets)), -1)
                  for m in members], axis=0)
  return np.asarray(jax.nn.log_softmax(mean, -1))


def _length(row) -> int:
  """Tokens of a decoded row: up to and including its EOS."""
  row = list(row)
  return row.index(EOS_ID) + 1 if EOS_ID in row else len(row)


def _before_pad(row) -> int:
  """Positions of a decoded row that a teacher-forced pass scores as decoding did: those before its first PAD (a
  random model may emit the PAD id, which teacher forcing treats as the end of the sequence)."""
  row = list(row)
  return row.index(PAD_ID) if PAD_ID in row else len(row)


def _alone(member: ensemble.Member, search):
  """`search(logits_fn, cache, batch)` over the model's own cached logits (no ensemble), as one jitted program."""
  def run(params, inputs):
    start = generation._start(member.model, params, inputs)
    logits_fn, cache = generation._cached_logits_fn(member.model, params, start, MAX_DECODE_LEN)
    return search(logits_fn, cache, inputs.shape[0])
  return jax.jit(run)(member.params, _inputs())


@pytest.mark.slow
def test_an_ensemble_of_one_decodes_as_the_model_alone():
  member = _member(SMALL, seed=0)
  alone_tokens, alone_scores = _alone(member, lambda logits_fn, cache, batch: decoding.beam_search(
      logits_fn, cache, batch, beam_size=4, alpha=ALPHA, max_decode_len=MAX_DECODE_LEN))
  tokens, scores = _decode([member], 'beam')
  np.testing.assert_array_equal(tokens, np.asarray(alone_tokens)[:, 0])
  # One more log-softmax of already normalised values: float32 rounding only.
  np.testing.assert_allclose(scores, np.asarray(alone_scores)[:, 0], rtol=1e-6)
  greedy = _alone(member, lambda logits_fn, cache, batch: decoding.greedy_search(
      logits_fn, cache, batch, max_decode_len=MAX_DECODE_LEN))
  np.testing.assert_array_equal(_decode([member], 'greedy')[0], np.asarray(greedy))
  assert len({tuple(row) for row in tokens}) > 1  # outputs that depend on the input


@pytest.mark.parametrize('method', ['beam', 'greedy'])
def test_two_copies_of_a_model_decode_as_the_model(method):
  member = _member(SMALL, seed=0)
  tokens, scores = _decode([member], method)
  copies_tokens, copies_scores = _decode([member, member], method)
  np.testing.assert_array_equal(copies_tokens, tokens)
  np.testing.assert_allclose(copies_scores, scores, rtol=1e-6)


@pytest.mark.slow
def test_members_of_different_sizes_decode_with_the_mean_of_their_log_softmaxes():
  members = [_member(SMALL, seed=0), _member(LARGE, seed=1)]
  greedy, _ = _decode(members, 'greedy')
  reference = _reference_log_probs(members, greedy)
  checked = 0
  for row, log_probs in zip(greedy, reference):
    end = _before_pad(row)
    np.testing.assert_array_equal(row[:end], log_probs[:end].argmax(-1))  # each step's most likely token
    checked += end
  assert checked >= greedy.size // 2

  tokens, scores = _decode(members, 'beam')
  reference = _reference_log_probs(members, tokens)
  for row, score, log_probs in zip(tokens, scores, reference):
    length = _length(row)
    if _before_pad(row) >= length:  # no PAD id among its tokens
      expected = log_probs[np.arange(length), row[:length]].sum() / decoding.length_penalty(length, ALPHA)
      np.testing.assert_allclose(score, expected, rtol=0, atol=1e-4)  # cached steps vs one pass: float32 sums
  for alone in members:  # a combination, not one member's output
    assert not np.array_equal(_decode([alone], 'beam')[0], tokens)
  uncached_tokens, uncached_scores = _decode(members, 'beam', use_cache=False)
  np.testing.assert_array_equal(uncached_tokens, tokens)
  np.testing.assert_allclose(uncached_scores, scores, rtol=0, atol=1e-4)


def test_teacher_forced_metrics_score_targets_with_the_ensembles_distribution():
  members = (_member(SMALL, seed=0), _member(LARGE, seed=1))
  batch = {k: jnp.asarray(v) for k, v in helpers.synthetic_batches(1, rows=4, length=10, seed=5)[0].items()}
  sums = steps.eval_step(members, batch, smoothing=0.0)
  targets = np.asarray(batch['targets'])
  log_probs = [np.asarray(jax.nn.log_softmax(jax.jit(m.model.apply)({'params': m.params}, **steps.model_inputs(batch)),
                                             -1)) for m in members]
  mean = np.asarray(jax.nn.log_softmax(np.mean(log_probs, axis=0), -1))
  real = targets > 0
  target_log_probs = np.take_along_axis(mean, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(sums['nll']), -target_log_probs[real].sum(), rtol=1e-5)
  assert float(sums['correct']) == np.sum((mean.argmax(-1) == targets) & real)
  one = steps.eval_step(members[:1], batch, smoothing=0.0)
  np.testing.assert_allclose(float(one['nll']), -np.take_along_axis(log_probs[0], targets[..., None], -1)[real].sum(),
                             rtol=1e-5)


def _copy_legacy(tmp_path, name='run') -> str:
  workdir = str(tmp_path / name)
  shutil.copytree(LEGACY, workdir)
  return workdir


def _host(tree):
  return jax.tree.leaves(jax.device_get(tree))


def test_restore_an_ensemble_of_steps_or_of_runs(tmp_path):
  workdir, other = _copy_legacy(tmp_path), _copy_legacy(tmp_path, 'other')
  config = config_lib.of_run(workdir)
  restored = restoring.restore_ensemble([(config, workdir, 2), (config, workdir, 4)])
  assert restored.origins == ({'workdir': workdir, 'steps': [2]}, {'workdir': workdir, 'steps': [4]})
  for member, step in zip(restored.members, (2, 4)):
    for a, b in zip(_host(member.params), _host(restoring.restore(config, workdir, step=step).params)):
      np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match='not an ensemble of 2: pass one --workdir') as error:
    restored.params  # pylint: disable=pointless-statement
  assert '\n' not in str(error.value)
  averaged = restoring.restore_ensemble([(config, workdir, None), (config_lib.of_run(other), other, None)],
                                        average_last=2)
  assert [origin['steps'] for origin in averaged.origins] == [[2, 4], [2, 4]]
  assert averaged.members[0].params is not averaged.members[1].params


def test_members_must_share_the_tokenizer(tmp_path):
  workdir, other = _copy_legacy(tmp_path), _copy_legacy(tmp_path, 'other')
  path = Workdir(other).tokenizer_model
  proto = sentencepiece_model_pb2.ModelProto()
  with open(path, 'rb') as f:
    proto.ParseFromString(f.read())
  proto.pieces[10].score += 1.0  # a valid model of the same size, another segmentation
  with open(path, 'wb') as f:
    f.write(proto.SerializeToString())
  config = config_lib.of_run(workdir)
  with pytest.raises(ValueError, match=f'{path} and {Workdir(workdir).tokenizer_model} are different '
                                       'SentencePiece models') as error:
    restoring.restore_ensemble([(config, workdir, None), (config, other, None)])
  assert '\n' not in str(error.value)


@pytest.mark.slow
def test_ensembles_are_evaluated_into_files_named_for_their_members(tmp_path):
  """Each ensemble evaluated from a workdir keeps its own results and translations (named by a digest of its
  members, who are listed inside); the run's own results.json is left as it was."""
  workdir, other = _copy_legacy(tmp_path), _copy_legacy(tmp_path, 'other')
  config = config_lib.of_run(workdir)
  before = helpers.tree_digest(workdir)
  run_dir, saved = Workdir(workdir), {}
  for members in ([(workdir, 2), (workdir, 4)], [(workdir, 4), (other, 2)]):
    restored = restoring.restore_ensemble([(config, member, step) for member, step in members])
    results = scoring.evaluate_split(restored, workdir, 'validation')  # the legacy run's test split
    assert 'ensemble of' in scoring.describe(results, 0)
    tag = results['results_file'][len(os.path.join(workdir, 'results_')):-len('.json')]
    assert tag.startswith('ensemble-') and results['translations']['hyp'] == run_dir.translation_file(
        'validation', 'hyp', tag)
    with open(results['results_file'], encoding='utf-8') as f:
      saved[tag] = json.load(f)
    assert saved[tag]['ensemble'] == [{'workdir': member, 'steps': [step]} for member, step in members]
  assert len(saved) == 2  # the second ensemble kept the first's files
  first = next(iter(saved.values()))
  assert 'step' not in first
  assert first['params'] == 2 * sum(x.size for x in _host(restoring.restore(config, workdir).params))
  single = scoring.teacher_forced_metrics(restoring.restore(config, workdir, step=4),
                                          sources.load_split(config.data, 'validation'), 'validation')
  assert first['validation_nll'] != single['nll']  # the ensemble's own loss, not a member's
  assert {k: v for k, v in helpers.tree_digest(workdir).items() if k in before} == before  # results.json kept


@pytest.mark.slow
def test_eval_and_translate_take_several_steps_or_runs(entry_points, tmp_path):
  workdir, other = _copy_legacy(tmp_path), _copy_legacy(tmp_path, 'other')
  references = [target for _, target in sources.load_split(config_lib.of_run(workdir).data, 'validation')]
  baseline = tmp_path / 'baseline.txt'
  baseline.write_text(''.join(' '.join(ref.split()[::2]) + '\n' for ref in references), encoding='utf-8')
  result = entry_points.run(['eval.py', f'--workdir={workdir}', '--step=2', '--step=4', f'--compare_to={baseline}',
                             '--compare_method=ar', '--compare_samples=50'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  (written,) = [line.split('results written to ')[1] for line in result.stdout.splitlines()
                if line.startswith('results written to ')]
  assert os.path.basename(written).startswith('results_ensemble-')
  with open(written, encoding='utf-8') as f:
    saved = json.load(f)
  assert saved['ensemble'] == [{'workdir': workdir, 'steps': [2]}, {'workdir': workdir, 'steps': [4]}]
  comparison = saved['comparison']
  assert (comparison['method'], comparison['samples'], comparison['baseline_path']) == ('ar', 50, str(baseline))
  hypotheses = significance.read_hypotheses(saved['translations']['hyp'], len(references))
  expected = significance.compare_systems(significance.read_hypotheses(baseline, len(references)), hypotheses,
                                          references, method='ar', n=50)
  assert comparison['bleu'] == expected['bleu'] and expected['bleu']['difference'] < 0
  assert f'{expected["bleu"]["difference"]:+.2f}' in result.stdout and 'ensemble of' in result.stdout
  result = entry_points.run(['-m', 'transformer_jax.translate', f'--workdir={workdir}', f'--workdir={other}',
                             '--average_last=2'], 'The dog sees the cat.\n\nHe sleeps.\n', text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.count('\n') == 3


@pytest.mark.slow
def test_an_ensemble_of_two_seeded_runs_scores_at_least_the_better_runs_bleu(seeded_runs):
  workdirs, bleu = seeded_runs, {}
  for workdir in workdirs:  # train.py's final report: the test split, greedy, as the ensemble is evaluated below
    with open(Workdir(workdir).final_results_file, encoding='utf-8') as f:
      bleu[workdir] = json.load(f)['bleu']
  better = max(workdirs, key=bleu.get)
  restored = restoring.restore_ensemble([(config_lib.of_run(workdir), workdir, None) for workdir in workdirs])
  results = scoring.evaluate_split(restored, workdirs[0], 'test', significance.Comparison(
      Workdir(better).final_results_file))
  print(f'test BLEU on 200 sentences, greedy: runs {list(bleu.values())}, ensemble {results["bleu"]}')
  print(significance.describe(results['comparison']))
  assert min(bleu.values()) > 20  # trained far enough for the comparison to mean something
  assert results['bleu'] >= bleu[better]
