"""Scores: sacrebleu's BLEU, chrF and chrF++, and the paper's tokenized, compound-split BLEU."""

import math

import pytest

from transformer_jax.evaluation.scores import (
    chrf_corpus,
    corpus_scores,
    moses_tokenize,
    sacrebleu_corpus,
    split_compound_hyphens,
    tokenized_bleu,
)


def _bleu(precisions, hyp_len, ref_len):
  """Corpus BLEU (0-100) from clipped n-gram precisions and lengths, as multi-bleu.perl computes it."""
  brevity_penalty = min(1.0, math.exp(1 - ref_len / hyp_len))
  return 100 * brevity_penalty * math.exp(sum(math.log(p) for p in precisions) / 4)


def test_perfect_output_scores_100_every_way():
  refs = ['Die Katze sitzt auf der Matte.', 'Das ist ein rich-text Format, oder?']
  assert sacrebleu_corpus(refs, refs)[0] == pytest.approx(100.0)
  assert chrf_corpus(refs, refs)[0] == pytest.approx(100.0)
  assert chrf_corpus(refs, refs, word_order=2)[0] == pytest.approx(100.0)
  assert tokenized_bleu(refs, refs) == pytest.approx(100.0)
  assert tokenized_bleu(refs, refs, split_compounds=False) == pytest.approx(100.0)


@pytest.mark.parametrize('score', [sacrebleu_corpus, chrf_corpus, corpus_scores, tokenized_bleu])
@pytest.mark.parametrize('hyps, refs', [([], []), (['a b'], []), (['a b', 'c d'], ['a b'])])
def test_empty_or_mismatched_lists_give_a_one_line_error(score, hyps, refs):
  with pytest.raises(ValueError, match='as many hypotheses as references') as error:
    score(hyps, refs)
  assert '\n' not in str(error.value)


def test_a_single_string_is_rejected():
  with pytest.raises(TypeError, match='lists of sentences'):
    tokenized_bleu('a b c d', 'a b c d')


def test_hand_computed_corpus_bleu_matches_both_implementations():
  hyps = ['the cat sat on the mat', 'a b c d e']
  refs = ['the cat sat on a red mat', 'a b c d e']
  # Clipped n-gram matches / hypothesis n-grams, summed over both sentences:
  # 1-grams: the (1 of 2 clipped), cat, sat, on, mat -> 5/6; second sentence 5/5
  # 2-grams: "the cat", "cat sat", "sat on" of 5 -> 3/5; second 4/4
  # 3-grams: "the cat sat", "cat sat on" of 4 -> 2/4; second 3/3
  # 4-grams: "the cat sat on" of 3 -> 1/3; second 2/2
  expected = _bleu([(5 + 5) / (6 + 5), (3 + 4) / (5 + 4), (2 + 3) / (4 + 3), (1 + 2) / (3 + 2)], 6 + 5, 7 + 5)
  assert tokenized_bleu(hyps, refs) == pytest.approx(expected)
  assert sacrebleu_corpus(hyps, refs)[0] == pytest.approx(expected)


def test_hand_computed_chrf_and_chrf_plus_plus():
  # Whitespace is dropped: characters "ab" against "abc". Character n-grams (orders 1..6; orders the hypothesis
  # or the reference lacks are not averaged): 1-grams P 2/2, R 2/3; 2-grams P 1/1, R 1/2; 3-grams: the
  # hypothesis has none. Mean P = 1, R = 7/12; chrF = (1 + β²) P R / (β² P + R) with β = 2 -> 7/11.
  assert chrf_corpus(['a b'], ['a bc'])[0] == pytest.approx(100 * 7 / 11)
  # chrF++ adds word 1- and 2-grams: words (a, b) against (a, bc): P = R = 1/2; "a b" against "a bc": P = R = 0.
  # Mean P = (1 + 1 + 1/2 + 0) / 4 = 5/8, R = (2/3 + 1/2 + 1/2 + 0) / 4 = 5/12 -> F = 25/56.
  assert chrf_corpus(['a b'], ['a bc'], word_order=2)[0] == pytest.approx(100 * 25 / 56)


def test_corpus_scores_holds_every_score_with_its_signature():
  hyps = ['the cat sat on the mat', 'a b c d e']
  refs = ['the cat sat on a red mat', 'a b c d e']
  scores = corpus_scores(hyps, refs)
  assert list(scores) == ['bleu', 'bleu_signature', 'chrf', 'chrf_signature', 'chrf++', 'chrf++_signature']
  assert (scores['bleu'], scores['bleu_signature']) == sacrebleu_corpus(hyps, refs)
  assert (scores['chrf'], scores['chrf_signature']) == chrf_corpus(hyps, refs)
  assert (scores['chrf++'], scores['chrf++_signature']) == chrf_corpus(hyps, refs, word_order=2)
  assert 'nw:0' in scores['chrf_signature'] and 'nw:2' in scores['chrf++_signature']
  assert 'nc:6' in scores['chrf_signature'] and 'version:' in scores['chrf_signature']


def test_tokenized_and_sacrebleu_agree_where_their_tokenizers_do():
  # Commas, final periods, ! ? : and quotes are split the same way by Moses and 13a.
  hyps = ['He said: "It works, mostly!"', 'Is this the right way to go?', 'We stay here today.']
  refs = ['He said: "It works, somehow!"', 'Is this the wrong way to go?', 'We stay at home today.']
  score = tokenized_bleu(hyps, refs)
  assert 0 < score < 100
  assert score == pytest.approx(sacrebleu_corpus(hyps, refs)[0])


def test_no_4gram_match_gives_zero_without_smoothing():
  assert tokenized_bleu(['a b c d'], ['a b c e']) == 0.0


def test_splitting_compounds_credits_partly_right_compounds():
  refs = ['Die Regierung hat die Mehrwert-Steuer und die Anti-Terror-Gesetze erhöht .']
  hyps = ['Die Regierung hat die Mehrwert-Abgabe und die Anti-Terror-Regeln erhöht .']
  assert tokenized_bleu(hyps, refs) > tokenized_bleu(hyps, refs, split_compounds=False)


@pytest.mark.parametrize(
    'line, expected',
    [
        ('rich-text format', 'rich ##AT##-##AT## text format'),
        ('a-b-c', 'a ##AT##-##AT## b-c'),  # non-overlapping, like the Perl one-liner
        ('Anti-Terror-Gesetze', 'Anti ##AT##-##AT## Terror ##AT##-##AT## Gesetze'),
        ('5-3 und - allein', '5 ##AT##-##AT## 3 und - allein'),
    ],
)
def test_split_compound_hyphens(line, expected):
  assert split_compound_hyphens(line) == expected


# Written by hand from tokenizer.perl's rules (mosesdecoder as of 2017, what get_ende_bleu.sh ran; -no-escape):
# a word-final period stays when the word holds another period and a letter ("z.B."), is on the language's
# non-breaking-prefix list (de: "Dr", "usw", ordinals "3"; en: "Dr", and "No" only before a number), or the next
# word starts lower-case. Apostrophes: en splits "'s" off as one token, other languages split "'" alone.
@pytest.mark.parametrize(
    'line, lang, expected',
    [
        ('Dr. Müller kam z.B. um 5 Uhr.', 'de', 'Dr. Müller kam z.B. um 5 Uhr .'),
        ('Ich kam am 3. Oktober.', 'de', 'Ich kam am 3. Oktober .'),
        ('Ich kam am 3. Oktober.', 'en', 'Ich kam am 3 . Oktober .'),
        ('See No. 5 and No. Five.', 'en', 'See No. 5 and No . Five .'),
        ('Wir kaufen Äpfel, Birnen usw.', 'de', 'Wir kaufen Äpfel , Birnen usw.'),  # final, but on the list
        ('Wir kaufen Äpfel, Birnen usw.', 'en', 'Wir kaufen Äpfel , Birnen usw .'),
        ("Müller's Café: 3,5 % vs 3, 5 % user_name", 'de', "Müller ' s Café : 3,5 % vs 3 , 5 % user _ name"),
        ("Müller's Café", 'en', "Müller 's Café"),
        ('Hello, world! "Quote" (paren) 5,300 z.B. das Ende.', 'de',
         'Hello , world ! " Quote " ( paren ) 5,300 z.B. das Ende .'),
        ('Er sagte: "Das ist es..." Wirklich...nicht?', 'de', 'Er sagte : " Das ist es ... " Wirklich ... nicht ?'),
        ('Ein Satz. der weiter geht. Und 1.000.000 Euro.', 'de', 'Ein Satz. der weiter geht . Und 1.000.000 Euro .'),
        ('A,B,C and 1,2,', 'de', 'A , B , C and 1,2 ,'),
        ('Regeln & [1] <gut> | ok', 'de', 'Regeln & [ 1 ] < gut > | ok'),  # not escaped
    ],
)
def test_moses_tokenize(line, lang, expected):
  assert moses_tokenize(line, lang) == expected


def test_tokenized_bleu_tokenizes_for_the_target_language():
  hyps, refs = ['Ich kam am 3. Oktober.'], ['Ich kam am 3. November.']
  # de keeps "3." (an ordinal on the German prefix list): 6 tokens each; matches 5/6, 3/5, 2/4, 1/3.
  assert tokenized_bleu(hyps, refs, lang='de') == pytest.approx(_bleu([5 / 6, 3 / 5, 2 / 4, 1 / 3], 6, 6))
  # en splits it, "3 .": 7 tokens each; matches 6/7, 4/6, 3/5, 2/4.
  assert tokenized_bleu(hyps, refs, lang='en') == pytest.approx(_bleu([6 / 7, 4 / 6, 3 / 5, 2 / 4], 7, 7))


def test_tokenized_bleu_keeps_non_breaking_prefixes_whole():
  # "Dr." stays one token (German prefix list): 7 tokens each; matches 6/7, 4/6, 2/5, 1/4. A tokenizer without
  # the list would split "Dr ." and count 8 tokens.
  expected = _bleu([6 / 7, 4 / 6, 2 / 5, 1 / 4], 7, 7)
  assert tokenized_bleu(['Dr. Müller kam um 5 Uhr.'], ['Dr. Müller kam um 6 Uhr.']) == pytest.approx(expected)


def test_sacrebleu_signature_names_the_settings():
  _, signature = sacrebleu_corpus(['the cat sat on the mat'], ['the cat sat on a mat'])
  assert 'nrefs:1' in signature and 'tok:13a' in signature and 'case:mixed' in signature
  assert 'version:' in signature


