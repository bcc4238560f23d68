"""BLEU: sacrebleu's standard score and the paper's tokenized, compound-split score."""

import math

import pytest

from transformer_jax.bleu import (
  moses_tokenize,
  sacrebleu_corpus,
  split_compound_hyphens,
  tokenized_bleu,
)


def test_perfect_output_scores_100_both_ways():
  refs = ["Die Katze sitzt auf der Matte.", "Das ist ein rich-text Format, oder?"]
  assert sacrebleu_corpus(refs, refs)[0] == pytest.approx(100.0)
  assert tokenized_bleu(refs, refs) == pytest.approx(100.0)
  assert tokenized_bleu(refs, refs, split_compounds=False) == pytest.approx(100.0)


@pytest.mark.parametrize("bleu", [lambda h, r: sacrebleu_corpus(h, r), tokenized_bleu])
@pytest.mark.parametrize("hyps, refs", [([], []), (["a b"], []), (["a b", "c d"], ["a b"])])
def test_empty_or_mismatched_lists_give_a_one_line_error(bleu, hyps, refs):
  with pytest.raises(ValueError, match="as many hypotheses as references") as error:
    bleu(hyps, refs)
  assert "\n" not in str(error.value)


def test_a_single_string_is_rejected():
  with pytest.raises(TypeError, match="lists of sentences"):
    tokenized_bleu("a b c d", "a b c d")


def test_hand_computed_corpus_bleu_matches_both_implementations():
  hyps = ["the cat sat on the mat", "a b c d e"]
  refs = ["the cat sat on a red mat", "a b c d e"]
  # Clipped n-gram matches / hypothesis n-grams, summed over both sentences:
  # 1-grams: the (1 of 2 clipped), cat, sat, on, mat -> 5/6; second sentence 5/5
  # 2-grams: "the cat", "cat sat", "sat on" of 5 -> 3/5; second 4/4
  # 3-grams: "the cat sat", "cat sat on" of 4 -> 2/4; second 3/3
  # 4-grams: "the cat sat on" of 3 -> 1/3; second 2/2
  precisions = [(5 + 5) / (6 + 5), (3 + 4) / (5 + 4), (2 + 3) / (4 + 3), (1 + 2) / (3 + 2)]
  hyp_len, ref_len = 6 + 5, 7 + 5
  brevity_penalty = math.exp(1 - ref_len / hyp_len)
  expected = 100 * brevity_penalty * math.exp(sum(math.log(p) for p in precisions) / 4)
  assert tokenized_bleu(hyps, refs) == pytest.approx(expected)
  assert sacrebleu_corpus(hyps, refs)[0] == pytest.approx(expected)


def test_tokenized_and_sacrebleu_agree_where_their_tokenizers_do():
  # Commas, final periods, ! ? : and quotes are split the same way by Moses and 13a.
  hyps = ['He said: "It works, mostly!"', "Is this the right way to go?", "We stay here today."]
  refs = ['He said: "It works, somehow!"', "Is this the wrong way to go?", "We stay at home today."]
  score = tokenized_bleu(hyps, refs)
  assert 0 < score < 100
  assert score == pytest.approx(sacrebleu_corpus(hyps, refs)[0])


def test_no_4gram_match_gives_zero_without_smoothing():
  assert tokenized_bleu(["a b c d"], ["a b c e"]) == 0.0


def test_splitting_compounds_credits_partly_right_compounds():
  refs = ["Die Regierung hat die Mehrwert-Steuer und die Anti-Terror-Gesetze erhöht ."]
  hyps = ["Die Regierung hat die Mehrwert-Abgabe und die Anti-Terror-Regeln erhöht ."]
  assert tokenized_bleu(hyps, refs) > tokenized_bleu(hyps, refs, split_compounds=False)


@pytest.mark.parametrize(
  "line, expected",
  [
    ("rich-text format", "rich ##AT##-##AT## text format"),
    ("a-b-c", "a ##AT##-##AT## b-c"),  # non-overlapping, like the Perl one-liner
    ("Anti-Terror-Gesetze", "Anti ##AT##-##AT## Terror ##AT##-##AT## Gesetze"),
    ("5-3 und - allein", "5 ##AT##-##AT## 3 und - allein"),
  ],
)
def test_split_compound_hyphens(line, expected):
  assert split_compound_hyphens(line) == expected


@pytest.mark.parametrize(
  "line, expected",  # checked against tokenizer.perl -l de (without prefix list and escaping)
  [
    (
      'Hello, world! "Quote" (paren) 5,300 z.B. das Ende.',
      'Hello , world ! " Quote " ( paren ) 5,300 z.B. das Ende .',
    ),
    ('Er sagte: "Das ist es..." Wirklich...nicht?', 'Er sagte : " Das ist es ... " Wirklich ... nicht ?'),
    ("Ein Satz. der weiter geht. Und 1.000.000 Euro.", "Ein Satz. der weiter geht . Und 1.000.000 Euro ."),
    ("Müller's Café: 3,5 % vs 3, 5 % user_name", "Müller ' s Café : 3,5 % vs 3 , 5 % user _ name"),
    ("A,B,C and 1,2,", "A , B , C and 1,2 ,"),
  ],
)
def test_moses_tokenize(line, expected):
  assert moses_tokenize(line) == expected


def test_sacrebleu_signature_names_the_settings():
  _, signature = sacrebleu_corpus(["the cat sat on the mat"], ["the cat sat on a mat"])
  assert "nrefs:1" in signature and "tok:13a" in signature and "case:mixed" in signature
  assert "version:" in signature
