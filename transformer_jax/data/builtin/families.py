"""The random choices (noun phrases, clauses, dates) and the task families built from them.

`generate_pair` draws one (English, German) pair from a family picked with `_FAMILY_PERCENT`.
"""

from __future__ import annotations

import datetime
import functools
import random
from typing import Callable

from transformer_jax.data.builtin.grammar import (
    POSSESSIVES, PRONOUNS, Clause, Phrase, noun_phrase, personal_pronoun, relative_pronoun,
    sentence, with_relative)
from transformer_jax.data.builtin.lexicon import (
    ACC, ADJECTIVES, ADVERBIALS, ANY, CONJUNCTIONS, DAT, MODALS, NOM, NOUNS, SAY_VERBS, VERB, VERBS,
    Adjective, Noun, Verb)
from transformer_jax.data.builtin.numbers import (
    DATE_TEMPLATES, FIRST_DAY, LAST_DAY, date_phrase, english_number, german_number)

# ----------------------------------------------------------------------------- random choices
# Draws use only Random.random(): faster than choice/randint and the same on every Python version.


def _pick(rng: random.Random, options: tuple):
  return options[int(rng.random() * len(options))]


def _randint(rng: random.Random, low: int, high: int) -> int:
  """Uniform in low..high inclusive."""
  return low + int(rng.random() * (high - low + 1))


@functools.lru_cache(maxsize=None)
def _nouns_with(tags: frozenset[str]) -> tuple[Noun, ...]:
  return tuple(noun for noun in NOUNS if noun.tags & tags)


@functools.lru_cache(maxsize=None)
def _adjectives_for(tags: frozenset[str]) -> tuple[Adjective, ...]:
  return tuple(adjective for adjective in ADJECTIVES if adjective.tags & tags)


@functools.lru_cache(maxsize=None)
def _verbs_for(subj_tags: frozenset[str], frames: tuple[str, ...],
               others: frozenset[str]) -> tuple[Verb, ...]:
  """Verbs whose subject may have subj_tags and whose objects can be drawn from `others`."""
  def fits(verb: Verb) -> bool:
    if verb.frame not in frames or not verb.subj_tags & subj_tags:
      return False
    if verb.frame in ('acc', 'dat', 'ditr') and not verb.obj_tags & others:
      return False
    return verb.frame != 'ditr' or bool(verb.obj2_tags & others)
  return tuple(verb for verb in VERBS if fits(verb))


_FRAMES = ('acc', 'dat', 'ditr', 'intr', 'cop')
_OBJECT_FRAMES = ('acc', 'dat')


def _random_adjectives(rng: random.Random, tags: frozenset[str]) -> tuple[Adjective, ...]:
  """None (50%), one (35%) or two of different positions, in English/German order."""
  roll = rng.random()
  if roll < 0.5:
    return ()
  candidates = _adjectives_for(tags)
  first = _pick(rng, candidates)
  if roll < 0.85:
    return (first,)
  second = _pick(rng, candidates)
  if second.position == first.position:
    return (first,)
  return tuple(sorted((first, second), key=lambda a: a.position))


def _random_count(rng: random.Random) -> int:
  """Mostly 2..12, sometimes up to 999999; never ending in 01, which German would treat as
  singular ('hundertundein Hund')."""
  if rng.random() < 0.85:
    return _randint(rng, 2, 12)
  while True:
    n = _randint(rng, 13, 10 ** _randint(rng, 2, 6) - 1)
    if n % 100 != 1:
      return n


def random_noun_phrase(rng: random.Random, tags: frozenset[str], case: int,
                       allow_no: bool = False) -> Phrase:
  """Singular 70%: the, a, my..., no; plural: the, none, a count, my..., no (only if allow_no)."""
  noun = _pick(rng, _nouns_with(tags))
  plural = rng.random() < 0.3
  roll = rng.random()
  if allow_no and roll >= 0.92:
    det = 'no'
  elif plural:
    det = ('the' if roll < 0.45 else None if roll < 0.6 else _random_count(rng) if roll < 0.8
           else _pick(rng, POSSESSIVES))
  else:
    det = 'the' if roll < 0.5 else 'a' if roll < 0.75 else _pick(rng, POSSESSIVES)
  return noun_phrase(noun, case, det, plural, _random_adjectives(rng, noun.tags))


def _random_subject(rng: random.Random, tags: frozenset[str], others: frozenset[str],
                    relative_p: float) -> Phrase:
  """A noun phrase with a relative clause (relative_p), a pronoun (a quarter of people) or a
  plain noun phrase."""
  if rng.random() < relative_p:
    head = random_noun_phrase(rng, tags, NOM)
    return with_relative(head, *_random_relative_clause(rng, head, others))
  if 'person' in tags and rng.random() < 0.25:
    return _pick(rng, PRONOUNS)
  return random_noun_phrase(rng, tags, NOM)


def _complements(rng: random.Random, verb: Verb, subject: Phrase,
                 others: frozenset[str]) -> tuple[str, str]:
  """(English, German) of what the verb needs besides its subject."""
  if verb.frame in _OBJECT_FRAMES:
    obj = random_noun_phrase(rng, verb.obj_tags & others, verb.case, allow_no=True)
    return obj.en, obj.de
  if verb.frame == 'ditr':
    indirect = random_noun_phrase(rng, verb.obj_tags & others, DAT)
    direct = random_noun_phrase(rng, verb.obj2_tags & others, ACC, allow_no=True)
    en = (f'{indirect.en} {direct.en}' if rng.random() < 0.5 else f'{direct.en} to {indirect.en}')
    return en, f'{indirect.de} {direct.de}'  # German: dative noun before accusative noun
  if verb.frame == 'cop':
    adjective = _pick(rng, _adjectives_for(subject.tags))
    return adjective.en, adjective.de
  if verb.pp and verb.pp.tags & others and rng.random() < 0.5:
    obj = random_noun_phrase(rng, verb.pp.tags & others, verb.pp.case)
    return f'{verb.pp.en} {obj.en}', f'{verb.pp.de} {obj.de}'
  return '', ''


def random_clause(rng: random.Random, *, subject: Phrase | None = None, verb: Verb | None = None,
                  frames: tuple[str, ...] = _FRAMES, others: frozenset[str] = ANY,
                  omit_object: bool = False, modal_p: float = 0.2,
                  relative_p: float = 0.0) -> Clause:
  """A random clause. others: the noun tags allowed for every noun drawn here; omit_object: the
  object is a relative pronoun placed by the caller; relative_p: chance that a drawn noun-phrase
  subject gets a relative clause (only for subject-first word orders)."""
  if verb is None:
    verb = _pick(rng, _verbs_for(subject.tags if subject else others, frames, others))
  if subject is None:
    subject = _random_subject(rng, verb.subj_tags & others, others, relative_p)
  en_rest, de_rest = ('', '') if omit_object else _complements(rng, verb, subject, others)
  modal = None
  if rng.random() < modal_p:
    modal = _pick(rng, MODALS[:2] if verb.frame == 'cop' else MODALS)
  return Clause(subject, verb, en_rest, de_rest, modal)


def _random_relative_clause(rng: random.Random, head: Phrase,
                            others: frozenset[str] = ANY) -> tuple[str, str]:
  """(English, German) relative clause on head, which is its subject or its object."""
  object_verbs = _verbs_for(others, _OBJECT_FRAMES, head.tags)
  if object_verbs and rng.random() < 0.5:
    verb = _pick(rng, object_verbs)
    pronoun = relative_pronoun(head, verb.case)
    clause = random_clause(rng, verb=verb, others=others, omit_object=True)
    return f'{pronoun.en} {clause.en_statement()}', f'{pronoun.de} {clause.de_final()}'
  clause = random_clause(rng, subject=relative_pronoun(head, NOM), others=others)
  return clause.en_statement(), clause.de_final()


def _random_adverbial(rng: random.Random) -> tuple[str, str]:
  if rng.random() < 0.7:
    return _pick(rng, ADVERBIALS)
  return date_phrase(_random_date(rng), _pick(rng, ('on_numeric', 'on_spelled')))


def _random_date(rng: random.Random) -> datetime.date:
  return datetime.date.fromordinal(_randint(rng, FIRST_DAY, LAST_DAY))


# ----------------------------------------------------------------------------- families


def number_pair(rng: random.Random) -> tuple[str, str]:
  """'342' or 'three hundred and forty-two' -> 'dreihundertzweiundvierzig'."""
  n = _randint(rng, 0, 10 ** _randint(rng, 1, 6) - 1)
  return (str(n) if rng.random() < 0.5 else english_number(n)), german_number(n)


def date_pair(rng: random.Random) -> tuple[str, str]:
  date = _random_date(rng)
  templates = DATE_TEMPLATES if date.day > 1 else DATE_TEMPLATES[:-1]
  return date_phrase(date, _pick(rng, templates))


def simple_pair(rng: random.Random) -> tuple[str, str]:
  """A statement, a yes/no question, or a statement with a fronted adverbial (inversion)."""
  clause = random_clause(rng)
  roll = rng.random()
  if roll < 0.4:
    return sentence(clause.en_statement()), sentence(clause.de_main())
  if roll < 0.7:
    return sentence(clause.en_question(), '?'), sentence(clause.de_question(), '?')
  adverbial_en, adverbial_de = _random_adverbial(rng)
  return (sentence(f'{adverbial_en} {clause.en_statement()}'),
          sentence(clause.de_main(front=adverbial_de)))


def complement_pair(rng: random.Random) -> tuple[str, str]:
  """'I think that ...' -> 'Ich denke, dass ...' (verb last), as a statement or a question."""
  say = _pick(rng, SAY_VERBS)
  matrix = random_clause(rng, verb=say, modal_p=0.0)
  inner = random_clause(rng, relative_p=0.2)
  if rng.random() < 0.2:
    return (sentence(f'{matrix.en_question()} that {inner.en_statement()}', '?'),
            sentence(f'{matrix.de_question()}, dass {inner.de_final()}', '?'))
  return (sentence(f'{matrix.en_statement()} that {inner.en_statement()}'),
          sentence(f'{matrix.de_main()}, dass {inner.de_final()}'))


def adverbial_clause_pair(rng: random.Random) -> tuple[str, str]:
  """because/if/while -> weil/wenn/während (verb last); fronted, it inverts the main clause."""
  conjunction_en, conjunction_de = _pick(rng, CONJUNCTIONS)
  sub = random_clause(rng)
  if rng.random() < 0.5:
    main = random_clause(rng, relative_p=0.2)
    return (sentence(f'{main.en_statement()} {conjunction_en} {sub.en_statement()}'),
            sentence(f'{main.de_main()}, {conjunction_de} {sub.de_final()}'))
  main = random_clause(rng)
  return (sentence(f'{conjunction_en} {sub.en_statement()}, {main.en_statement()}'),
          sentence(main.de_main(front=f'{conjunction_de} {sub.de_final()},')))


def relative_pair(rng: random.Random) -> tuple[str, str]:
  """A relative clause on the subject (the main verb agrees across it) or on a final object."""
  if rng.random() < 0.6:
    clause = random_clause(rng, relative_p=1.0)
    return sentence(clause.en_statement()), sentence(clause.de_main())
  clause = random_clause(rng, frames=_OBJECT_FRAMES, omit_object=True, modal_p=0.0)
  obj = random_noun_phrase(rng, clause.verb.obj_tags, clause.verb.case)
  obj = with_relative(obj, *_random_relative_clause(rng, obj), closed=False)
  return (sentence(f'{clause.en_statement()} {obj.en}'),
          sentence(f'{clause.de_main()} {obj.de}'))


_PERSON = frozenset({'person'})
_NOT_PERSON = ANY - _PERSON


def pronoun_pair(rng: random.Random) -> tuple[str, str]:
  """English 'it'/'they' whose German form depends on a noun several words back.

  All other nouns in the sentence are people, so the antecedent is never ambiguous.
  """
  roll = rng.random()
  if roll < 0.4:  # the subject: "The cat that I see sleeps because it is tired."
    antecedent = random_noun_phrase(rng, frozenset({'animal'}), NOM)
    subject = antecedent
    if rng.random() < 0.3:
      subject = with_relative(antecedent, *_random_relative_clause(rng, antecedent, _PERSON))
    clause = random_clause(rng, subject=subject, others=_PERSON)
    return _because_it_is(rng, clause.en_statement(), clause.de_main(), antecedent)
  verb = _pick(rng, _verbs_for(_PERSON, ('acc',), _NOT_PERSON))
  clause = random_clause(rng, verb=verb, others=_PERSON, omit_object=True, modal_p=0.0)
  obj = random_noun_phrase(rng, clause.verb.obj_tags & _NOT_PERSON, ACC)
  en, de = f'{clause.en_statement()} {obj.en}', f'{clause.de_main()} {obj.de}'
  if roll < 0.7:  # the object: "The woman buys a car because it is cheap."
    return _because_it_is(rng, en, de, obj)
  # the object again: "The woman buys a cake and eats it." (ihn / ihm / sie / ihnen ...)
  second = _pick(rng, tuple(v for v in _verbs_for(_PERSON, _OBJECT_FRAMES, obj.tags)
                            if v is not clause.verb))
  pronoun = personal_pronoun(obj, second.case)
  person = clause.subject.person
  return (sentence(f'{en} and {second.en_forms[person]} {pronoun.en}'),
          sentence(f'{de} und {second.de_forms[person]} {pronoun.de}'))


def _because_it_is(rng: random.Random, en: str, de: str, antecedent: Phrase) -> tuple[str, str]:
  pronoun = personal_pronoun(antecedent, NOM)
  adjective = _pick(rng, _adjectives_for(antecedent.tags))
  be = VERB['be']
  return (sentence(f'{en} because {pronoun.en} {be.en_forms[pronoun.person]} {adjective.en}'),
          sentence(f'{de}, weil {pronoun.de} {adjective.de} {be.de_forms[pronoun.person]}'))


FAMILIES: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    'number': number_pair, 'date': date_pair, 'simple': simple_pair,
    'complement': complement_pair, 'adverbial_clause': adverbial_clause_pair,
    'relative': relative_pair, 'pronoun': pronoun_pair,
}
_FAMILY_PERCENT = {'number': 10, 'date': 8, 'simple': 22, 'complement': 15,
                   'adverbial_clause': 15, 'relative': 15, 'pronoun': 15}
_FAMILY_TABLE = tuple(FAMILIES[name] for name, percent in _FAMILY_PERCENT.items()
                      for _ in range(percent))


def generate_pair(rng: random.Random) -> tuple[str, str]:
  """One (English, German) pair from a family drawn with the odds of `_FAMILY_PERCENT`."""
  return _pick(rng, _FAMILY_TABLE)(rng)

