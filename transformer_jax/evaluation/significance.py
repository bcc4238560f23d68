"""Is a system better than a baseline on the same test set? sacrebleu's paired tests, as papers report them.

Paired bootstrap resampling ('bs', Koehn 2004) or paired approximate randomisation ('ar', Riezler & Maxwell 2005)
over BLEU and chrF through `sacrebleu.significance.PairedTest`, so the p-values and each system's bootstrap mean
± 95% half-width are those of `sacrebleu REF -i BASELINE SYSTEM --paired-bs` (or `--paired-ar`). The difference
system − baseline gets a 95% confidence interval from paired bootstrap resamples (the same sentences drawn for
both systems); with 'bs' these are the very resamples of the test.
"""

import contextlib
import dataclasses
import os
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from transformer_jax.core import files

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
  _check_settings(method, n, seed)
  if not references or len(baseline) != len(references) or len(system) != len(references):
    raise ValueError(f'the baseline ({len(baseline)}), the system ({len(system)}) and the references '
                     f'({len(references)}) need the same number of sentences, at least one.')


def _check_settings(method, n, seed):
  if method not in METHODS:
    raise ValueError(f"method={method!r}: use 'bs' (paired bootstrap) or 'ar' (approximate randomisation).")
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


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A baseline to compare a system with (eval.py --compare_to) and the test to run. Its hypotheses (and, from a
  results.json, the references it was scored on) are read when it is made, so that a file that cannot be read
  fails before anything is decoded."""

  baseline: str  # a results.json written by eval.py or a hypotheses file
  method: str = 'bs'
  samples: int | None = None  # None: sacrebleu's default for the method
  seed: int = DEFAULT_SEED
  hypotheses: tuple[str, ...] = dataclasses.field(init=False, repr=False)
  references: tuple[str, ...] | None = dataclasses.field(init=False, repr=False)  # None: a plain hypotheses file

  def __post_init__(self):
    _check_settings(self.method, self.samples, self.seed)
    object.__setattr__(self, 'hypotheses', tuple(read_hypotheses(self.baseline)))
    object.__setattr__(self, 'references', read_references(self.baseline))

  def check(self, references: list[str]) -> None:
    """Fails (one line) unless the baseline has a hypothesis for each reference and, where its results.json says
    which references it was scored on, they are these, in this order (the same test set)."""
    _check_count(self.baseline, len(self.hypotheses), len(references))
    if self.references is not None and list(self.references) != list(references):
      index = next((i for i, (a, b) in enumerate(zip(self.references, references)) if a != b),
                   min(len(self.references), len(references)))
      theirs = self.references[index] if index < len(self.references) else '(none)'
      ours = references[index] if index < len(references) else '(none)'
      raise ValueError(f'{self.baseline} was scored on other sentences than this evaluation (reference {index + 1} '
                       f'there: {theirs!r}; here: {ours!r}): pass a baseline evaluated on the same split and data.')

  def run(self, system: list[str], references: list[str]) -> dict:
    """`compare_systems` of `system` against the baseline with these settings, and the baseline's path."""
    return {'baseline_path': str(self.baseline), **compare_systems(
        list(self.hypotheses), system, references, method=self.method, n=self.samples, seed=self.seed)}


def describe(comparison: dict) -> str:
  """The comparison as papers report it: one row per metric with both scores, the difference, its 95% CI and p."""
  test = {'bs': 'paired bootstrap resampling', 'ar': 'paired approximate randomisation'}[comparison['method']]
  lines = [f'against {comparison["baseline_path"]} ({test}, {comparison["samples"]} samples, seed '
           f'{comparison["seed"]}, {comparison["sentences"]} sentences):',
           f'  {"metric":<7}{"baseline":>10}{"this system":>13}{"difference":>12}  {"95% CI":<17}{"p":>7}']
  for key, name in (('bleu', 'BLEU'), ('chrf', 'chrF')):
    m = comparison[key]
    low, high = m['difference_ci']
    lines.append(f'  {name:<7}{m["baseline"]:>10.2f}{m["system"]:>13.2f}{m["difference"]:>+12.2f}  '
                 f'{f"[{low:+.2f}, {high:+.2f}]":<17}{m["p_value"]:>7.4f}')
  return '\n'.join(lines)


def read_hypotheses(path: str | Path, num_references: int | None = None) -> list[str]:
  """Hypotheses of another system: a results.json written by eval.py (its 'translations': {'hyp': path}) or a
  plain UTF-8 file, one sentence per line (`files.text_lines`), as many as `num_references` if given. Errors are
  one line naming the file and what to do."""
  path = Path(path)
  if not path.is_file():
    raise ValueError(f'no such file: {path}; pass a results.json written by eval.py or a hypotheses file, one '
                     'sentence per line.')
  if path.suffix == '.json':
    path = _translations_of_results(path, 'hyp')
  lines = files.read_text_lines(str(path), 'the hypotheses path')
  if num_references is not None:
    _check_count(path, len(lines), num_references)
  return lines


def read_references(path: str | Path) -> tuple[str, ...] | None:
  """The references a baseline's results.json was scored on; None for a plain hypotheses file (or a results.json
  that names none), which only its line count can check."""
  path = Path(path)
  if path.suffix != '.json' or 'ref' not in (files.read_json(str(path), 'results.json').get('translations') or {}):
    return None
  return tuple(files.read_text_lines(str(_translations_of_results(path, 'ref')), 'the references path'))


def _check_count(path, num_lines: int, num_references: int) -> None:
  if num_lines != num_references:
    raise ValueError(f'{path} has {num_lines} lines but the references have {num_references}: pass hypotheses '
                     'of the same test set, one sentence per line.')


def _translations_of_results(results_path: Path, kind: str) -> Path:
  """The file of `kind` ('hyp' or 'ref') a results.json names; a relative name that does not resolve from here is
  looked up in the translations/ folder beside the results.json (where eval.py writes it)."""
  results = files.read_json(str(results_path), 'results.json')
  try:
    named = Path(results['translations'][kind])
  except (KeyError, TypeError):
    raise ValueError(f"{results_path} is not a results.json with a 'translations': {{'{kind}': PATH}} entry: pass "
                     'the results.json of an eval.py run or a plain hypotheses file.') from None
  candidates = [named, results_path.parent / 'translations' / named.name]
  for candidate in candidates:
    if candidate.is_file():
      return candidate
  what = {'hyp': 'hypotheses', 'ref': 'references'}[kind]
  raise ValueError(f'{results_path} names the {what} {named}, which is not there (nor at {candidates[1]}): '
                   f'pass the {"hypotheses file itself" if kind == "hyp" else "hypotheses file alone"}.')
