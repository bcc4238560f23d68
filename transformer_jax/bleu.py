"""BLEU two ways: sacrebleu's standard score, and the paper's tokenized score.

The paper's numbers come from tensor2tensor's get_ende_bleu.sh: Moses-tokenize hypotheses and
references, split hyphenated compounds "a-b" into "a ##AT##-##AT## b", then multi-bleu.perl
(case-sensitive corpus BLEU, no smoothing). That score runs higher than sacrebleu's on detokenized
text, so the two are not comparable; report both, sacrebleu's with its signature.
"""

import re

from sacrebleu.metrics import BLEU

# Moses tokenizer.perl: every character other than letters, digits, whitespace and . ' ` , -
# becomes a token of its own (\w also matches "_", which Moses does separate).
_SPECIAL_CHAR = re.compile(r"([^\w\s.'`,\-]|_)")
_COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)")


def _check_corpus(hypotheses: list[str], references: list[str]) -> None:
  """Rejects inputs that would silently give a meaningless score."""
  if isinstance(hypotheses, str) or isinstance(references, str):
    raise TypeError("BLEU takes lists of sentences, got a single string")
  if not hypotheses or len(hypotheses) != len(references):
    raise ValueError(
      f"BLEU needs as many hypotheses as references, and at least one: "
      f"got {len(hypotheses)} hypotheses, {len(references)} references"
    )


def sacrebleu_corpus(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
  """Standard sacrebleu corpus BLEU (0-100) of detokenized text with its 13a tokenizer, and the
  signature that identifies the settings (e.g. 'nrefs:1|case:mixed|eff:no|tok:13a|...')."""
  _check_corpus(hypotheses, references)
  bleu = BLEU()
  score = bleu.corpus_score(list(hypotheses), [list(references)]).score
  return score, str(bleu.get_signature())


def moses_tokenize(line: str) -> str:
  """Moses tokenizer.perl as get_ende_bleu.sh runs it (-l de, no -a), ported rule by rule.

  Two simplifications: no language-specific non-breaking-prefix list, so a word-final period is
  split off unless the word holds another period and a letter ("z.B.") or the next word starts
  lower-case ("Dr. Müller" -> "Dr . Müller"); and no XML escaping of & | < > ' " [ ], which
  tokenizer.perl always leaves as tokens of their own, so escaping cannot change BLEU.
  """
  text = re.sub(r"[\x00-\x1f]", "", re.sub(r"\s+", " ", line)).strip()
  text = _SPECIAL_CHAR.sub(r" \1 ", text)
  text = _protect_multi_dots(text)
  text = re.sub(r"(\D),", r"\1 , ", text)  # commas, except inside numbers (5,300)
  text = re.sub(r",(\D)", r" , \1", text)
  text = re.sub(r"(\d),$", r"\1 ,", text)
  text = text.replace("'", " ' ")  # tokenizer.perl splits every apostrophe except for en/fr/it
  text = " ".join(_split_final_periods(text.split(" ")))
  return _restore_multi_dots(re.sub(" +", " ", text).strip())


def _protect_multi_dots(text: str) -> str:
  """Turns runs of periods into DOTMULTI placeholders, split from the words around them."""
  text = re.sub(r"\.(\.+)", r" DOTMULTI\1", text)
  while "DOTMULTI." in text:
    text = re.sub(r"DOTMULTI\.([^.])", r"DOTDOTMULTI \1", text)
    text = text.replace("DOTMULTI.", "DOTDOTMULTI")
  return text


def _restore_multi_dots(text: str) -> str:
  while "DOTDOTMULTI" in text:
    text = text.replace("DOTDOTMULTI", "DOTMULTI.")
  return text.replace("DOTMULTI", ".")


def _split_final_periods(words: list[str]) -> list[str]:
  """Splits a word-final period off, unless the word looks like an abbreviation (see moses_tokenize)."""
  while words and not words[-1]:  # Perl's split drops trailing empty fields
    words.pop()
  out = []
  for i, word in enumerate(words):
    match = re.fullmatch(r"(\S+)\.", word)
    if match:
      pre = match.group(1)
      is_last = i == len(words) - 1
      abbreviation = "." in pre and any(c.isalpha() for c in pre)
      if is_last or not (abbreviation or words[i + 1][:1].islower()):
        word = pre + " ."
    out.append(word)
  return out


def split_compound_hyphens(line: str) -> str:
  """get_ende_bleu.sh's perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g': "a-b" -> "a ##AT##-##AT## b".

  Like the Perl, matches do not overlap: "a-b-c" -> "a ##AT##-##AT## b-c".
  """
  return _COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hypotheses: list[str], references: list[str], *, split_compounds: bool = True) -> float:
  """The paper's BLEU (0-100): Moses-tokenize, optionally split compounds, then multi-bleu.perl
  semantics (whitespace tokens, case-sensitive, corpus-level, brevity penalty, no smoothing)."""
  _check_corpus(hypotheses, references)

  def prepare(line: str) -> str:
    line = moses_tokenize(line)
    return split_compound_hyphens(line) if split_compounds else line

  bleu = BLEU(tokenize="none", smooth_method="none", force=True)
  return bleu.corpus_score([prepare(h) for h in hypotheses], [[prepare(r) for r in references]]).score
