"""Is a system better than a baseline on the same test set? sacrebleu's paired tests, as papers report them.

Paired bootstrap resampling ('bs', Koehn 2004) or paired approximate randomisation ('ar', Riezler & Maxwell 2005)
over BLEU and chrF through `sacrebleu.significance.PairedTest`, so the p-values and each system's bootstrap mean
± 95% half-width are those of `sacrebleu REF -i BASELINE SYSTEM --paired-bs` (or `--paired-ar`). The difference
system − baseline gets a 95% confidence interval from paired bootstrap resamples (the same sentences drawn for
both systems); with 'bs' these are the very resamples of the test.
"""

import contextlib
import json
import os
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

METHODS = ('bs', 'ar')
DEFAULT_SAMPLES = {'bs': 1000, 'ar': 10000}  # sacrebleu's defaults: bootstrap resamples, randomisation trials
CONFIDENCE_SAMPLES = 1000  # bootstrap resamples for the confidence intervals of an 'ar' test
DEFAULT_SEED = 12345  # sacrebleu's default SACREBLEU_SEED


def compare_systems(baseline: list[str], system: list[str], references: list[str], *, method: str = 'bs',
                    n: int | None = None, seed: int = DEFAULT_SEED) -> dict:
  """Paired test of `system` against `baseline` (detokenized hypotheses of the same references).

  Returns {'method', 'samples', 'seed', 'sentences', 'bleu': {...}, 'chrf': {...}}; each metric holds 'baseline',
  'system', 'difference' (system − baseline), 'difference_ci' ([low, high], 95%), 'p_value', 'baseline_mean',
  'baseline_ci', 'system_mean', 'system_ci' (bootstrap mean ± 95% half-width) and sacrebleu's 'signature'.
  n: resamples ('bs') or trials ('ar'), sacrebleu's default when None. Deterministic given the seed.

  sacrebleu counts only resampled differences strictly above the observed one, so a system compared with itself
  gets p = 1/(n+1), not 1: read the p-value together with the difference and its interval.
  """
  _check_arguments(baseline, system, references, method, n, seed)
  samples = n or DEFAULT_SAMPLES[method]
  metrics = {'bleu': BLEU(), 'chrf': CHRF()}
  with _sacrebleu_seed(seed):
    test = PairedTest([('baseline', list(baseline)), ('system', list(system))], metrics, [list(references)],
                      test_type=method, n_samples=samples,
                      n_ar_confidence=CONFIDENCE_SAMPLES if method == 'ar' else -1)
    signatures, results = test()
  # sacrebleu's bootstrap draws: rows of sentence indices from default_rng(seed), as its 'bs' test draws them.
  resamples = samples if method == 'bs' else CONFIDENCE_SAMPLES
  indices = np.random.default_rng(seed).choice(len(references), size=(resamples, len(references)), replace=True)
  out = {'method': method, 'samples': samples, 'seed': seed, 'sentences': len(references)}
  for (key, metric), name in zip(metrics.items(), test.metrics):
    base, sys = results[name]
    differences = (_resampled_scores(metric, system, references, indices)
                   - _resampled_scores(metric, baseline, references, indices))
    out[key] = {'baseline': base.score, 'system': sys.score, 'difference': sys.score - base.score,
                'difference_ci': _interval(differences), 'p_value': float(sys.p_value),
                'baseline_mean': float(base.mean), 'baseline_ci': float(base.ci), 'system_mean': float(sys.mean),
                'system_ci': float(sys.ci), 'signature': str(signatures[name])}
  return out


def _check_arguments(baseline, system, references, method, n, seed):
  if method not in METHODS:
    raise ValueError(f"method={method!r}: use 'bs' (paired bootstrap) or 'ar' (approximate randomisation).")
  if not references or len(baseline) != len(references) or len(system) != len(references):
    raise ValueError(f'the baseline ({len(baseline)}), the system ({len(system)}) and the references '
                     f'({len(references)}) need the same number of sentences, at least one.')
  if n is not None and n < 1:
    raise ValueError(f'n={n}: pass a positive number of samples, or None for sacrebleu\'s default.')
  if not isinstance(seed, int) or seed < 1:
    raise ValueError(f'seed={seed!r}: pass a positive integer (sacrebleu treats 0 as "no seed").')


@contextlib.contextmanager
def _sacrebleu_seed(seed: int):
  """PairedTest reads its seed from SACREBLEU_SEED (its only seed setting); set it for the test, then restore."""
  before = os.environ.get('SACREBLEU_SEED')
  os.environ['SACREBLEU_SEED'] = str(seed)
  try:
    yield
  finally:
    if before is None:
      del os.environ['SACREBLEU_SEED']
    else:
      os.environ['SACREBLEU_SEED'] = before


def _resampled_scores(metric, hypotheses, references, indices) -> np.ndarray:
  """The metric's corpus score on every resample (a row of sentence indices), from per-sentence statistics
  summed in float32 as sacrebleu's paired test sums them."""
  stats = np.array(metric._extract_corpus_statistics(list(hypotheses), [list(references)]), dtype='float32')
  return np.array([metric._compute_score_from_stats(s.sum(0)).score for s in stats[indices]])


def _interval(values: np.ndarray) -> list[float]:
  """The 95% percentile interval, with sacrebleu's `estimate_ci` choice of order statistics."""
  values = np.sort(values)
  lower = len(values) // 40
  return [float(values[lower]), float(values[len(values) - lower - 1])]


def read_hypotheses(path: str | Path, num_references: int) -> list[str]:
  """Hypotheses of another system: a results.json written by eval.py (its 'translations': {'hyp': path}) or a
  plain UTF-8 file, one sentence per line. Errors (ValueError, one line) name the file and what to do."""
  path = Path(path)
  if path.suffix == '.json':
    path = _hypotheses_of_results(path)
  lines = _read_lines(path)
  if len(lines) != num_references:
    raise ValueError(f'{path} has {len(lines)} lines but the references have {num_references}: pass hypotheses '
                     'of the same test set, one sentence per line.')
  return lines


def _hypotheses_of_results(results_path: Path) -> Path:
  """The hypotheses file a results.json names; a relative name that does not resolve from here is looked up in
  the translations/ folder beside the results.json (where eval.py writes it)."""
  try:
    results = json.loads(_read_text(results_path))
    hyp = Path(results['translations']['hyp'])
  except (json.JSONDecodeError, KeyError, TypeError):
    raise ValueError(f"{results_path} is not a results.json with a 'translations': {{'hyp': PATH}} entry: pass "
                     'the results.json of an eval.py run or a plain hypotheses file.') from None
  candidates = [hyp, results_path.parent / 'translations' / hyp.name]
  for candidate in candidates:
    if candidate.is_file():
      return candidate
  raise ValueError(f'{results_path} names the hypotheses {hyp}, which is not there (nor at {candidates[1]}): '
                   'pass the hypotheses file itself.')


def _read_text(path: Path) -> str:
  try:
    data = path.read_bytes()
  except (FileNotFoundError, IsADirectoryError):
    raise ValueError(f'no such file: {path}; pass a results.json written by eval.py or a hypotheses file, one '
                     'sentence per line.') from None
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError as error:
    line = data[:error.start].count(b'\n') + 1
    raise ValueError(f'{path} is not UTF-8 (line {line}): convert it, e.g. iconv -t UTF-8.') from None


def _read_lines(path: Path) -> list[str]:
  """Lines split at '\\n' only (not at the other characters str.splitlines breaks on); a final newline ends the
  last line rather than starting an empty one."""
  text = _read_text(path)
  if not text:
    return []
  text = text[:-1] if text.endswith('\n') else text
  return [line.removesuffix('\r') for line in text.split('\n')]
