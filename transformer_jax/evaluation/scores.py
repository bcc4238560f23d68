"""Translation scores people compare: sacrebleu's BLEU, chrF and chrF++ with their signatures, and the paper's
tokenized BLEU.

The paper's numbers come from tensor2tensor's get_ende_bleu.sh: Moses tokenizer.perl -l de, hyphenated compounds
"a-b" split into "a ##AT##-##AT## b", then multi-bleu.perl (case-sensitive corpus BLEU, no smoothing). That score
runs higher than sacrebleu's on detokenized text, so the two are not comparable; report both, sacrebleu's with its
signature.
"""

import functools
import re

from sacrebleu.metrics import BLEU, CHRF

_COMPOUND_HYPHEN = re.compile(r'(\S)-(\S)')


def _check_corpus(hypotheses: list[str], references: list[str]) -> None:
  """Rejects inputs that would silently give a meaningless score."""
  if isinstance(hypotheses, str) or isinstance(references, str):
    raise TypeError('scores take lists of sentences, got a single string')
  if not hypotheses or len(hypotheses) != len(references):
    raise ValueError(
        f'scoring needs as many hypotheses as references, and at least one: '
        f'got {len(hypotheses)} hypotheses, {len(references)} references')


def sacrebleu_corpus(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
  """Standard sacrebleu corpus BLEU (0-100) of detokenized text with its 13a tokenizer, and the signature that
  identifies the settings (e.g. 'nrefs:1|case:mixed|eff:no|tok:13a|...')."""
  _check_corpus(hypotheses, references)
  bleu = BLEU()
  score = bleu.corpus_score(list(hypotheses), [list(references)]).score
  return score, str(bleu.get_signature())


def chrf_corpus(hypotheses: list[str], references: list[str], *, word_order: int = 0) -> tuple[float, str]:
  """sacrebleu's corpus chrF (0-100; character 6-grams, β=2), or chrF++ with word_order=2, and its signature."""
  _check_corpus(hypotheses, references)
  chrf = CHRF(word_order=word_order)
  score = chrf.corpus_score(list(hypotheses), [list(references)]).score
  return score, str(chrf.get_signature())


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
  """BLEU, chrF and chrF++ with their signatures, keyed as results.json stores them:
  {'bleu', 'bleu_signature', 'chrf', 'chrf_signature', 'chrf++', 'chrf++_signature'}."""
  bleu, bleu_signature = sacrebleu_corpus(hypotheses, references)
  chrf, chrf_signature = chrf_corpus(hypotheses, references)
  chrf_pp, chrf_pp_signature = chrf_corpus(hypotheses, references, word_order=2)
  return {'bleu': bleu, 'bleu_signature': bleu_signature, 'chrf': chrf, 'chrf_signature': chrf_signature,
          'chrf++': chrf_pp, 'chrf++_signature': chrf_pp_signature}


@functools.cache
def _moses(lang: str):
  """sacremoses' tokenizer, imported on first use: its import compiles regexes for 0.3 s, which every command
  (train.py, eval.py, translate, sweeps) would pay at start-up."""
  from sacremoses import MosesTokenizer  # pylint: disable=import-outside-toplevel
  return MosesTokenizer(lang=lang)


def moses_tokenize(line: str, lang: str) -> str:
  """Moses tokenizer.perl -l <lang> as get_ende_bleu.sh ran it in 2017 (sacremoses; its non-breaking-prefix
  lists ship inside the package). Unknown languages fall back to the English prefixes, as tokenizer.perl does.

  Two deliberate choices: no XML escaping (tokenizer.perl's escaping maps tokens one to one, so it cannot change
  BLEU), and a sentence-final abbreviation keeps its period ("z.B.") as the 2017 script did; tokenizer.perl
  splits it off since November 2018.
  """
  return _moses(lang).tokenize(line, escape=False, return_str=True)


def split_compound_hyphens(line: str) -> str:
  """get_ende_bleu.sh's perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g': "a-b" -> "a ##AT##-##AT## b".

  Like the Perl, matches do not overlap: "a-b-c" -> "a ##AT##-##AT## b-c".
  """
  return _COMPOUND_HYPHEN.sub(r'\1 ##AT##-##AT## \2', line)


def tokenized_bleu(hypotheses: list[str], references: list[str], *, lang: str = 'de',
                   split_compounds: bool = True) -> float:
  """The paper's BLEU (0-100): Moses-tokenize for the target language `lang`, optionally split compounds, then
  multi-bleu.perl semantics (whitespace tokens, case-sensitive, corpus-level, brevity penalty, no smoothing)."""
  _check_corpus(hypotheses, references)

  def prepare(line: str) -> str:
    line = moses_tokenize(line, lang)
    return split_compound_hyphens(line) if split_compounds else line

  bleu = BLEU(tokenize='none', smooth_method='none', force=True)
  return bleu.corpus_score([prepare(h) for h in hypotheses], [[prepare(r) for r in references]]).score
