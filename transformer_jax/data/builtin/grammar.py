"""German (and English) rendering: noun phrases with agreement, clauses in every word order,
relative and personal pronouns, sentences.

Deterministic functions of lexicon entries; the random choices are in `families.py`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from transformer_jax.data.builtin.lexicon import ACC, DAT, NOM, Adjective, Noun, Verb
from transformer_jax.data.builtin.numbers import english_number, german_number

PLURAL = 'pl'  # the "gender" key of plural noun phrases: German plural declension ignores gender
_DEFINITE = {'m': ('der', 'den', 'dem'), 'f': ('die', 'die', 'der'), 'n': ('das', 'das', 'dem'),
             PLURAL: ('die', 'die', 'den')}
_RELATIVE = {**_DEFINITE, PLURAL: ('die', 'die', 'denen')}
_PERSONAL = {'m': ('er', 'ihn', 'ihm'), 'f': ('sie', 'sie', 'ihr'), 'n': ('es', 'es', 'ihm'),
             PLURAL: ('sie', 'sie', 'ihnen')}
# Endings of ein, kein and the possessives (mein, dein, sein, ihr, unser).
_EIN_ENDINGS = {'m': ('', 'en', 'em'), 'f': ('e', 'e', 'er'), 'n': ('', '', 'em'),
                PLURAL: ('e', 'e', 'en')}
_EIN_WORDS = {'a': 'ein', 'no': 'kein', 'my': 'mein', 'your': 'dein', 'his': 'sein', 'her': 'ihr',
              'our': 'unser'}
POSSESSIVES = ('my', 'your', 'his', 'her', 'our')


class Phrase(NamedTuple):
  """A rendered noun phrase (or pronoun): its English and German text in one case."""
  en: str
  de: str
  person: int  # index into Verb.en_forms / de_forms: 0 I, 1 you, 2 he/she/it, 3 we, 4 they
  gender: str | None  # 'm', 'f', 'n', PLURAL; None for I, you, we
  tags: frozenset[str]


PRONOUNS = tuple(Phrase(en, de, person, gender, frozenset({'person'}))
                 for en, de, person, gender in (
                     ('I', 'ich', 0, None), ('you', 'du', 1, None), ('he', 'er', 2, 'm'),
                     ('she', 'sie', 2, 'f'), ('we', 'wir', 3, None), ('they', 'sie', 4, PLURAL)))


def _adjective_ending(det: str | int | None, gender: str, case: int) -> str:
  """Weak after der/die/das; mixed after ein-words (strong where the article has no ending);
  strong without an article (only plurals here)."""
  weak = 'e' if gender != PLURAL and (case == NOM or (case == ACC and gender != 'm')) else 'en'
  if det == 'the':
    return weak
  if det in _EIN_WORDS:
    if gender != PLURAL and not _EIN_ENDINGS[gender][case]:
      return {'m': 'er', 'n': 'es'}[gender]
    return weak
  return 'en' if case == DAT else 'e'


@functools.lru_cache(maxsize=1 << 16)
def noun_phrase(noun: Noun, case: int, det: str | int | None = 'the', plural: bool = False,
                adjectives: tuple[Adjective, ...] = ()) -> Phrase:
  """Renders e.g. ('the', old, man, ACC) -> 'the old man' / 'den alten Mann'.

  det: 'the', 'a', 'no', a possessive ('my', 'your', 'his', 'her', 'our'), an int (a count, plural
  only, not ending in 01) or None (bare plural).
  """
  misfit = det == 'a' if plural else (det is None or isinstance(det, int))
  if misfit:
    raise ValueError(f'determiner {det!r} does not fit plural={plural}')
  gender = PLURAL if plural else noun.gender
  if det == 'the':
    article_en, article_de = 'the', _DEFINITE[gender][case]
  elif det in _EIN_WORDS:
    article_en, article_de = det, _EIN_WORDS[det] + _EIN_ENDINGS[gender][case]
  elif det is None:
    article_en = article_de = ''
  else:
    article_en, article_de = english_number(det), german_number(det)
  ending = _adjective_ending(det, gender, case)
  en_words = [a.en for a in adjectives] + [noun.en_pl if plural else noun.en_sg]
  if article_en == 'a' and en_words[0][0] in 'aeiou':
    article_en = 'an'
  de_words = [a.de_form(ending) for a in adjectives] + [noun.de_form(plural, case)]
  return Phrase(' '.join(filter(None, [article_en, *en_words])),
                ' '.join(filter(None, [article_de, *de_words])),
                4 if plural else 2, gender, noun.tags)


class Clause(NamedTuple):
  """A finite clause that can be rendered in several word orders.

  en_rest / de_rest: what follows the English verb / what fills the German middle field
  (objects, prepositional phrase, predicate adjective), already in order.
  """
  subject: Phrase
  verb: Verb
  en_rest: str = ''
  de_rest: str = ''
  modal: Verb | None = None

  def _en_verb(self) -> str:
    if self.modal:
      return f'{self.modal.en_forms[self.subject.person]} {self.verb.en_base}'
    return self.verb.en_forms[self.subject.person]

  def en_statement(self) -> str:
    return _join(self.subject.en, self._en_verb(), self.en_rest)

  def en_question(self) -> str:
    person = self.subject.person
    if self.modal and self.modal.en_aux:
      return _join(self.modal.en_forms[person], self.subject.en, self.verb.en_base, self.en_rest)
    if self.verb.frame == 'cop' and not self.modal:
      return _join(self.verb.en_forms[person], self.subject.en, self.en_rest)
    infinitive = f'{self.modal.en_base} {self.verb.en_base}' if self.modal else self.verb.en_base
    return _join('does' if person == 2 else 'do', self.subject.en, infinitive, self.en_rest)

  def _de_finite_and_infinitive(self) -> tuple[str, str]:
    finite = (self.modal or self.verb).de_forms[self.subject.person]
    return finite, self.verb.de_inf if self.modal else ''

  def de_main(self, front: str = '') -> str:
    """Verb second: subject first, or after a fronted adverbial / clause (then inverted)."""
    finite, infinitive = self._de_finite_and_infinitive()
    if front:
      return _join(front, finite, self.subject.de, self.de_rest, infinitive)
    return _join(self.subject.de, finite, self.de_rest, infinitive)

  def de_question(self) -> str:
    finite, infinitive = self._de_finite_and_infinitive()
    return _join(finite, self.subject.de, self.de_rest, infinitive)

  def de_final(self) -> str:
    """Verb last, as in subordinate and relative clauses."""
    finite, infinitive = self._de_finite_and_infinitive()
    return _join(self.subject.de, self.de_rest, infinitive, finite)


def _join(*parts: str) -> str:
  return ' '.join(filter(None, parts))


def sentence(text: str, end: str = '.') -> str:
  return text[0].upper() + text[1:] + end


def with_relative(head: Phrase, en_clause: str, de_clause: str, closed: bool = True) -> Phrase:
  """Attaches a relative clause; closed adds the comma German needs when the sentence goes on."""
  return head._replace(en=f'{head.en} {en_clause}',
                       de=f'{head.de}, {de_clause}' + (',' if closed else ''))


def relative_pronoun(head: Phrase, case: int) -> Phrase:
  """'who' (people) or 'that' / der, den, dem, denen...: gender and number of the head."""
  return Phrase('who' if 'person' in head.tags else 'that', _RELATIVE[head.gender][case],
                head.person, head.gender, head.tags)


def personal_pronoun(antecedent: Phrase, case: int) -> Phrase:
  """English it/they (them) -> er/sie/es, ihn, ihm, ihr, ihnen... by the antecedent's gender."""
  plural = antecedent.gender == PLURAL
  en = ('they' if case == NOM else 'them') if plural else 'it'
  return Phrase(en, _PERSONAL[antecedent.gender][case], antecedent.person, antecedent.gender,
                antecedent.tags)

