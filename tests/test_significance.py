"""Paired significance tests between two systems, and reading another system's hypotheses."""

import json
import logging
import os
import random
import shutil
import subprocess
import sys

import pytest

from transformer_jax import cli as tools
from transformer_jax import config as config_lib
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import sources
from transformer_jax.evaluation import scores
from transformer_jax.evaluation import significance
from transformer_jax.evaluation.significance import compare_systems, read_hypotheses
from transformer_jax.inference import restoring
from transformer_jax.jobs import scoring

LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'legacy_run')

N = 200  # resamples / trials: enough for stable numbers on the small corpus, fast enough for a unit test


def _corpus(sentences=120):
  """References and two systems that drop reference words at random: the baseline more often than the system."""
  rng = random.Random(0)
  words = 'der die das Haus Katze Hund sieht läuft schnell heute morgen im Garten ein kleiner großer'.split()
  refs = [' '.join(rng.choice(words) for _ in range(rng.randint(6, 14))) + ' .' for _ in range(sentences)]

  def degrade(p):
    return [' '.join(w if rng.random() > p else 'xx' for w in ref.split()) for ref in refs]

  return refs, degrade(0.3), degrade(0.2)


@pytest.mark.parametrize('method', ['bs', 'ar'])
def test_p_values_and_means_are_those_of_sacrebleus_command_line(tmp_path, method):
  refs, baseline, system = _corpus()
  files = {}
  for name, lines in (('ref', refs), ('baseline', baseline), ('system', system)):
    files[name] = tmp_path / f'{name}.txt'
    files[name].write_text(''.join(line + '\n' for line in lines), encoding='utf-8')
  command = [sys.executable, '-m', 'sacrebleu', str(files['ref']), '-i', str(files['baseline']), str(files['system']),
             f'--paired-{method}', f'--paired-{method}-n', str(N), '-m', 'bleu', '-f', 'json']
  cli = json.loads(subprocess.run(command, check=True, capture_output=True, text=True,
                                  env=dict(os.environ, SACREBLEU_SEED='12345')).stdout)
  ours = compare_systems(baseline, system, refs, method=method, n=N, seed=12345)['bleu']
  cli_baseline, cli_system = cli[0]['BLEU'], cli[1]['BLEU']
  assert (ours['baseline'], ours['system'], ours['p_value']) == (cli_baseline['score'], cli_system['score'],
                                                                 cli_system['p_value'])
  if method == 'bs':  # the command line's 'ar' test reports no bootstrap means
    assert (ours['baseline_mean'], ours['baseline_ci']) == (cli_baseline['mean'], cli_baseline['ci'])
    assert (ours['system_mean'], ours['system_ci']) == (cli_system['mean'], cli_system['ci'])


def test_the_difference_and_its_interval_come_from_paired_resamples():
  refs, baseline, system = _corpus()
  result = compare_systems(baseline, system, refs, n=N)
  assert (result['method'], result['samples'], result['seed'], result['sentences']) == ('bs', N, 12345, len(refs))
  for metric, score_fn in (('bleu', scores.sacrebleu_corpus), ('chrf', scores.chrf_corpus)):
    numbers = result[metric]
    assert numbers['baseline'] == score_fn(baseline, refs)[0]
    assert numbers['system'] == score_fn(system, refs)[0]
    assert numbers['difference'] == numbers['system'] - numbers['baseline']
    low, high = numbers['difference_ci']
    assert 0 < low < numbers['difference'] < high  # the system drops fewer words: a clear, significant gain
    assert numbers['p_value'] == pytest.approx(1 / (N + 1))  # no resampled difference reached the real one
    assert f'bs:{N}' in numbers['signature'] and 'seed:12345' in numbers['signature']
  # Same sentences drawn for both systems: swapping them negates every difference and keeps the p-value.
  swapped = compare_systems(system, baseline, refs, n=N)
  for metric in ('bleu', 'chrf'):
    assert swapped[metric]['difference'] == -result[metric]['difference']
    assert swapped[metric]['difference_ci'] == [-result[metric]['difference_ci'][1],
                                                -result[metric]['difference_ci'][0]]
    assert swapped[metric]['p_value'] == result[metric]['p_value']
    assert swapped[metric]['system_mean'] == result[metric]['baseline_mean']


@pytest.mark.parametrize('method', ['bs', 'ar'])
def test_deterministic_given_the_seed(method):
  refs, baseline, system = _corpus()
  first = compare_systems(baseline, system, refs, method=method, n=N, seed=7)
  assert compare_systems(baseline, system, refs, method=method, n=N, seed=7) == first
  other = compare_systems(baseline, system, refs, method=method, n=N, seed=8)
  assert other['bleu']['difference_ci'] != first['bleu']['difference_ci']


def test_a_system_against_itself_differs_by_zero():
  refs, baseline, _ = _corpus()
  result = compare_systems(baseline, baseline, refs, n=N)
  assert result['bleu']['difference'] == 0 and result['bleu']['difference_ci'] == [0.0, 0.0]
  # sacrebleu counts resampled differences strictly above the real one (0), so even here p = 1/(n+1).
  assert result['bleu']['p_value'] == pytest.approx(1 / (N + 1))


@pytest.mark.parametrize(
    'kwargs, message',
    [
        ({'method': 'ttest'}, "use 'bs'"),
        ({'n': 0}, 'positive number of samples'),
        ({'seed': 0}, 'positive integer'),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, message):
  refs, baseline, system = _corpus(sentences=5)
  with pytest.raises(ValueError, match=message) as error:
    compare_systems(baseline, system, refs, **kwargs)
  assert '\n' not in str(error.value)


def test_systems_of_another_test_set_are_refused():
  refs, baseline, system = _corpus(sentences=5)
  with pytest.raises(ValueError, match='same number of sentences'):
    compare_systems(baseline, system[:4], refs)


def test_reads_a_plain_hypotheses_file(tmp_path):
  path = tmp_path / 'hyps.txt'
  path.write_text('eins\n\nzwei\u2028drei\r\n', encoding='utf-8')  # an empty line; U+2028 is not a line break
  assert read_hypotheses(path, 3) == ['eins', '', 'zwei\u2028drei']


def test_reads_the_hypotheses_a_results_json_names(tmp_path):
  paths = scoring.write_translations(Workdir(str(tmp_path)), 'test', {'src': ['a', 'b'], 'hyp': ['A', 'B'],
                                                                      'ref': ['a', 'b']})
  results = tmp_path / 'results.json'
  results.write_text(json.dumps({'bleu': 1.0, 'translations': {k: str(v) for k, v in paths.items()}}))
  assert read_hypotheses(results, 2) == ['A', 'B']
  # A relative name written from another working directory is found in translations/ beside the results.json.
  results.write_text(json.dumps({'translations': {'hyp': 'elsewhere/runs/x/translations/test.hyp.txt'}}))
  assert read_hypotheses(results, 2) == ['A', 'B']


@pytest.mark.parametrize(
    'name, content, message',
    [
        ('missing.txt', None, 'no such file'),
        ('hyps.txt', b'a\nb\n', 'has 2 lines but the references have 3'),
        ('hyps.txt', 'a\nb\nc\xe4\n'.encode('latin-1'), 'line 3 is not valid UTF-8'),
        ('results.json', b'{"bleu": 1.0}', "'translations'"),
        ('results.json', b'not json', 'is not valid JSON'),
        ('results.json', b'{"translations": {"hyp": "/nowhere/test.hyp.txt"}}', 'which is not there'),
    ],
)
def test_unreadable_hypotheses_are_one_line_errors(tmp_path, name, content, message):
  path = tmp_path / name
  if content is not None:
    path.write_bytes(content)
  with pytest.raises(ValueError, match=message) as error:
    read_hypotheses(path, 3)
  assert '\n' not in str(error.value)


def test_evaluation_stores_and_prints_the_paired_test_of_the_files_it_wrote(tmp_path):
  """What eval.py --compare_to=BASELINE runs: `evaluate_split` with a `Comparison`."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(LEGACY, workdir)
  config = config_lib.of_run(workdir)
  references = [target for _, target in sources.load_split(config.data, 'validation')]  # its eval.test_split
  baseline = tmp_path / 'baseline.txt'
  baseline.write_text(''.join(' '.join(ref.split()[::2]) + '\n' for ref in references), encoding='utf-8')
  comparison = significance.Comparison(str(baseline), samples=N)
  results = scoring.evaluate_split(restoring.restore(config, workdir), workdir, 'validation', comparison)
  with open(Workdir(workdir).final_results_file, encoding='utf-8') as f:
    saved = json.load(f)
  written = {kind: read_hypotheses(path, len(references)) for kind, path in saved['translations'].items()}
  expected = compare_systems(read_hypotheses(baseline, len(references)), written['hyp'], written['ref'], n=N)
  assert saved['comparison'] == results['comparison'] == {'baseline_path': str(baseline), **expected}
  assert expected['bleu']['difference'] < 0  # the 4-step legacy model translates worse than half the reference
  text = scoring.describe(results, 0)
  for metric in ('bleu', 'chrf'):
    numbers = expected[metric]
    low, high = numbers['difference_ci']
    assert (f'{numbers["baseline"]:.2f}  ' in text and f'{numbers["difference"]:+.2f}' in text
            and f'[{low:+.2f}, {high:+.2f}]' in text and f'{numbers["p_value"]:.4f}' in text)


def test_a_baseline_of_another_test_set_stops_evaluation_before_it_decodes(tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(LEGACY, workdir)
  restored = restoring.restore(config_lib.of_run(workdir), workdir)
  baseline = tmp_path / 'baseline.txt'
  baseline.write_text('one line\n', encoding='utf-8')
  with pytest.raises(ValueError, match=f'{baseline} has 1 lines but the references have 16'):
    scoring.evaluate_split(restored, workdir, 'validation', significance.Comparison(str(baseline)))
  assert not os.path.exists(os.path.join(workdir, 'translations'))
  # Settings and the file itself are checked when the comparison is made, before any restore.
  with pytest.raises(ValueError, match='no such file'):
    significance.Comparison(str(tmp_path / 'missing.txt'))
  with pytest.raises(ValueError, match='positive integer'):
    significance.Comparison(str(baseline), seed=0)


@pytest.mark.parametrize('baseline_split, order', [('test', 1), ('validation', -1)])
def test_a_results_json_scored_on_other_sentences_stops_evaluation_before_it_decodes(tmp_path, baseline_split, order):
  """A baseline's results.json names the references it was scored on: another split of the same size, or the same
  sentences in another order, is refused although the line counts agree."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(LEGACY, workdir)
  config = config_lib.of_run(workdir)
  theirs = [target for _, target in sources.load_split(config.data, baseline_split)][::order]
  ours = [target for _, target in sources.load_split(config.data, 'validation')]
  assert len(theirs) == len(ours)
  paths = scoring.write_translations(Workdir(str(tmp_path / 'baseline')), baseline_split, {'hyp': theirs, 'ref': theirs})
  baseline = tmp_path / 'baseline' / 'results.json'
  baseline.write_text(json.dumps({'split': baseline_split, 'translations': paths}), encoding='utf-8')
  restored = restoring.restore(config, workdir)
  with pytest.raises(ValueError) as error:
    scoring.evaluate_split(restored, workdir, 'validation', significance.Comparison(str(baseline)))
  assert str(error.value) == (f'{baseline} was scored on other sentences than this evaluation (reference 1 there: '
                              f'{theirs[0]!r}; here: {ours[0]!r}): pass a baseline evaluated on the same split and '
                              'data.')
  assert not os.path.exists(os.path.join(workdir, 'translations'))


def test_the_tools_logs_leave_out_sacrebleus_lines_about_a_paired_test(caplog):
  """sacrebleu logs which statistics each paired test computes (INFO); a tool's log keeps only its own table
  (and sacrebleu's warnings)."""
  refs, baseline, system = _corpus()
  caplog.set_level(logging.INFO)
  compare_systems(baseline, system, refs, n=N)
  info = [r for r in caplog.records if '/sacrebleu/' in r.pathname and r.levelno == logging.INFO]
  quiet = tools._QuietLibraries()  # pylint: disable=protected-access
  assert info and not [r.getMessage() for r in info if quiet.filter(r)]
