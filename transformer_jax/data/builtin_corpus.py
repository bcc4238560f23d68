"""A built-in English -> German translation corpus, generated deterministically from a seed.

It is the default data of the project's main job: no download, small vocabulary (a few hundred
words), learnable by a 1-5M parameter Transformer on a CPU in minutes, yet it needs what attention
gives. The German is grammatical (few rules, applied exactly) and every English source has exactly
one German translation. Task families, mixed by `_FAMILY_PERCENT`:

* numbers: "342" or "three hundred and forty-two" -> "dreihundertzweiundvierzig" (units before
  tens, compound words);
* dates: "on Monday, the 3rd of May 2021" -> "am Montag, dem 3. Mai 2021", spelled ordinals with
  case endings ("on the third of May" -> "am dritten Mai");
* simple clauses: statements, yes/no questions (verb first) and fronted adverbials (verb second:
  "Today the man sees the dog." -> "Heute sieht der Mann den Hund."), modal verbs sending the
  infinitive to the end, article/adjective agreement in gender, number and case;
* complement and adverbial clauses: "dass"/"weil"/"wenn"/"während" send the verb to the end, a
  fronted subordinate clause inverts the main clause;
* relative clauses: the relative pronoun takes gender and number from its head and case from its
  role in the clause ("der Hund, den der Mann sieht, schläft");
* pronoun reference: English "it" becomes er/sie/es (ihn/ihm/ihr...) according to the grammatical
  gender of a noun several words back.

Sentences are capitalised and end in "." or "?"; number and date phrases are fragments. About 360
English word types; sources have 9-10 words on average, 5-40 for over 90% of them, at most ~35.
`build_corpus` draws fixed, distinct, disjoint train/validation/test splits from a seed.
Determinism: only `random.Random(seed)` draws, over tuples in a fixed order (never sets or str
hashes), so a seed gives the same corpus on every machine and process.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import random
from typing import Callable, NamedTuple

SPLITS = ('train', 'validation', 'test')

# ----------------------------------------------------------------------------- numbers

_EN_SMALL = (
    'zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen '
    'fifteen sixteen seventeen eighteen nineteen'
).split()
_EN_TENS = ('', '', 'twenty', 'thirty', 'forty', 'fifty', 'sixty', 'seventy', 'eighty', 'ninety')
_DE_SMALL = (
    'null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn '
    'fünfzehn sechzehn siebzehn achtzehn neunzehn'
).split()
_DE_TENS = ('', '', 'zwanzig', 'dreißig', 'vierzig', 'fünfzig', 'sechzig', 'siebzig', 'achtzig',
            'neunzig')
MAX_NUMBER = 999_999


def _en_below_100(n: int) -> str:
  if n < 20:
    return _EN_SMALL[n]
  tens, units = divmod(n, 10)
  return _EN_TENS[tens] + (f'-{_EN_SMALL[units]}' if units else '')


def _en_below_1000(n: int) -> str:
  hundreds, rest = divmod(n, 100)
  if not hundreds:
    return _en_below_100(rest)
  head = f'{_EN_SMALL[hundreds]} hundred'
  return f'{head} and {_en_below_100(rest)}' if rest else head


def english_number(n: int) -> str:
  """0..999999 in British English words: 1042 -> 'one thousand and forty-two'."""
  if not 0 <= n <= MAX_NUMBER:
    raise ValueError(f'number {n} is outside 0..{MAX_NUMBER}')
  if n == 0:
    return 'zero'
  thousands, rest = divmod(n, 1000)
  if not thousands:
    return _en_below_1000(rest)
  head = f'{_en_below_1000(thousands)} thousand'
  if not rest:
    return head
  return f'{head} {"and " if rest < 100 else ""}{_en_below_1000(rest)}'


def _de_below_100(n: int, final: bool) -> str:
  """1..99; a final 1 is 'eins', a 1 in a compound is 'ein' (einundzwanzig, hunderteintausend)."""
  if n == 1:
    return 'eins' if final else 'ein'
  if n < 20:
    return _DE_SMALL[n]
  tens, units = divmod(n, 10)
  if not units:
    return _DE_TENS[tens]
  return ('ein' if units == 1 else _DE_SMALL[units]) + 'und' + _DE_TENS[tens]


def _de_below_1000(n: int, final: bool) -> str:
  hundreds, rest = divmod(n, 100)
  head = '' if not hundreds else ('hundert' if hundreds == 1 else _DE_SMALL[hundreds] + 'hundert')
  return head + (_de_below_100(rest, final) if rest else '')


def german_number(n: int) -> str:
  """0..999999 as one German word: 42 -> 'zweiundvierzig', 101 -> 'hunderteins'."""
  if not 0 <= n <= MAX_NUMBER:
    raise ValueError(f'number {n} is outside 0..{MAX_NUMBER}')
  if n == 0:
    return 'null'
  thousands, rest = divmod(n, 1000)
  head = ''
  if thousands:
    head = 'tausend' if thousands == 1 else _de_below_1000(thousands, final=False) + 'tausend'
  return head + (_de_below_1000(rest, final=True) if rest else '')


_EN_ORDINAL_WORDS = {1: 'first', 2: 'second', 3: 'third', 5: 'fifth', 8: 'eighth', 9: 'ninth',
                     12: 'twelfth'}


def english_ordinal(n: int, spelled: bool) -> str:
  """1..31 as '3rd' / 'third', '21st' / 'twenty-first'."""
  if not spelled:
    suffix = 'th' if 11 <= n % 100 <= 13 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')
    return f'{n}{suffix}'
  tens, units = divmod(n, 10)
  if n < 20 or not units:
    if n in _EN_ORDINAL_WORDS:
      return _EN_ORDINAL_WORDS[n]
    word = _en_below_100(n)
    return word[:-1] + 'ieth' if word.endswith('y') else word + 'th'
  return f'{_EN_TENS[tens]}-{english_ordinal(units, spelled=True)}'


def german_ordinal_stem(n: int) -> str:
  """1..31 as the ordinal stem that takes adjective endings: 3 -> 'dritt' (dritte, dritten)."""
  if n < 20:
    return {1: 'erst', 3: 'dritt', 7: 'siebt', 8: 'acht'}.get(n, _DE_SMALL[n] + 't')
  return _de_below_100(n, final=False) + 'st'


# ----------------------------------------------------------------------------- dates

_MONTHS = (('January', 'Januar'), ('February', 'Februar'), ('March', 'März'), ('April', 'April'),
           ('May', 'Mai'), ('June', 'Juni'), ('July', 'Juli'), ('August', 'August'),
           ('September', 'September'), ('October', 'Oktober'), ('November', 'November'),
           ('December', 'Dezember'))
_WEEKDAYS = (('Monday', 'Montag'), ('Tuesday', 'Dienstag'), ('Wednesday', 'Mittwoch'),
             ('Thursday', 'Donnerstag'), ('Friday', 'Freitag'), ('Saturday', 'Samstag'),
             ('Sunday', 'Sonntag'))
_FIRST_DAY = datetime.date(1900, 1, 1).toordinal()
_LAST_DAY = datetime.date(2099, 12, 31).toordinal()

DATE_TEMPLATES = ('the_numeric', 'on_numeric', 'on_weekday', 'the_spelled', 'on_spelled',
                  'american', 'range')


def date_phrase(date: datetime.date, template: str) -> tuple[str, str]:
  """Renders `date` as an (English, German) fragment in one of `DATE_TEMPLATES`.

  'range' spans from the day before `date` to `date` ("from the 2nd to the 3rd of May").
  """
  month_en, month_de = _MONTHS[date.month - 1]
  day, year = date.day, date.year
  if template == 'the_numeric':
    return (f'the {english_ordinal(day, False)} of {month_en} {year}',
            f'der {day}. {month_de} {year}')
  if template == 'on_numeric':
    return (f'on the {english_ordinal(day, False)} of {month_en} {year}',
            f'am {day}. {month_de} {year}')
  if template == 'on_weekday':
    weekday_en, weekday_de = _WEEKDAYS[date.weekday()]
    return (f'on {weekday_en}, the {english_ordinal(day, False)} of {month_en} {year}',
            f'am {weekday_de}, dem {day}. {month_de} {year}')
  if template == 'the_spelled':
    return (f'the {english_ordinal(day, True)} of {month_en}',
            f'der {german_ordinal_stem(day)}e {month_de}')
  if template == 'on_spelled':
    return (f'on the {english_ordinal(day, True)} of {month_en}',
            f'am {german_ordinal_stem(day)}en {month_de}')
  if template == 'american':
    return f'{month_en} {day}, {year}', f'{day}. {month_de} {year}'
  if template == 'range':
    if day == 1:
      raise ValueError('a date range needs a day after the 1st')
    return (f'from the {english_ordinal(day - 1, False)} to the {english_ordinal(day, False)} '
            f'of {month_en}', f'vom {day - 1}. bis zum {day}. {month_de}')
  raise ValueError(f'unknown date template {template!r}; use one of {DATE_TEMPLATES}')


# ----------------------------------------------------------------------------- lexicon

NOM, ACC, DAT = 0, 1, 2
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
_POSSESSIVES = ('my', 'your', 'his', 'her', 'our')
ANY = frozenset({'person', 'animal', 'thing', 'food', 'readable'})  # all noun tags


@dataclasses.dataclass(frozen=True, eq=False)  # one object per word: hash by id
class Noun:
  en_sg: str
  en_pl: str
  de_sg: str
  de_pl: str
  gender: str  # 'm', 'f' or 'n'
  tags: frozenset[str]  # its kind ('person', 'animal', 'thing', 'food'), maybe 'readable'

  def de_form(self, plural: bool, case: int) -> str:
    if not plural:
      return self.de_sg  # no weak nouns in the lexicon: the singular never changes
    if case == DAT and not self.de_pl.endswith(('n', 's')):
      return self.de_pl + 'n'
    return self.de_pl


def _nouns(kind: str, specs: str) -> tuple[Noun, ...]:
  """Parses 'en_sg en_pl de_sg de_pl gender [extra tags]' lines."""
  nouns = []
  for line in specs.strip().splitlines():
    en_sg, en_pl, de_sg, de_pl, gender, *extra = line.split()
    nouns.append(Noun(en_sg, en_pl, de_sg, de_pl, gender, frozenset([kind, *extra])))
  return tuple(nouns)


NOUNS = (
    _nouns('person', """
        man men Mann Männer m
        woman women Frau Frauen f
        child children Kind Kinder n
        girl girls Mädchen Mädchen n
        teacher teachers Lehrer Lehrer m
        doctor doctors Arzt Ärzte m
        friend friends Freund Freunde m
        king kings König Könige m
        queen queens Königin Königinnen f
        sister sisters Schwester Schwestern f
        brother brothers Bruder Brüder m
        mother mothers Mutter Mütter f
        father fathers Vater Väter m
        daughter daughters Tochter Töchter f
        son sons Sohn Söhne m
        cook cooks Koch Köche m
        baker bakers Bäcker Bäcker m
        guest guests Gast Gäste m
        pupil pupils Schüler Schüler m
    """) + _nouns('animal', """
        dog dogs Hund Hunde m
        cat cats Katze Katzen f
        horse horses Pferd Pferde n
        bird birds Vogel Vögel m
        mouse mice Maus Mäuse f
        cow cows Kuh Kühe f
        pig pigs Schwein Schweine n
        fox foxes Fuchs Füchse m
        rabbit rabbits Kaninchen Kaninchen n
        duck ducks Ente Enten f
        wolf wolves Wolf Wölfe m
    """) + _nouns('thing', """
        table tables Tisch Tische m
        chair chairs Stuhl Stühle m
        lamp lamps Lampe Lampen f
        book books Buch Bücher n readable
        letter letters Brief Briefe m readable
        newspaper newspapers Zeitung Zeitungen f readable
        car cars Auto Autos n
        house houses Haus Häuser n
        door doors Tür Türen f
        window windows Fenster Fenster n
        ball balls Ball Bälle m
        bag bags Tasche Taschen f
        key keys Schlüssel Schlüssel m
        picture pictures Bild Bilder n
        cup cups Tasse Tassen f
        hat hats Hut Hüte m
        shoe shoes Schuh Schuhe m
        clock clocks Uhr Uhren f
        box boxes Kiste Kisten f
        bed beds Bett Betten n
        glass glasses Glas Gläser n
        bicycle bicycles Fahrrad Fahrräder n
    """) + _nouns('food', """
        apple apples Apfel Äpfel m
        cake cakes Kuchen Kuchen m
        egg eggs Ei Eier n
        pear pears Birne Birnen f
        banana bananas Banane Bananen f
        soup soups Suppe Suppen f
        sausage sausages Wurst Würste f
        carrot carrots Karotte Karotten f
    """))


@dataclasses.dataclass(frozen=True, eq=False)  # one object per word: hash by id
class Adjective:
  en: str
  de: str
  position: int  # English and German order: 0 opinion < 1 size < 2 state < 3 age < 4 colour
  tags: frozenset[str]  # noun tags it may describe

  def de_form(self, ending: str) -> str:
    """Attributive form: the stem of 'müde' is 'müd' (müde, müden)."""
    return (self.de[:-1] if self.de.endswith('e') else self.de) + ending


def _adjectives(specs: str) -> tuple[Adjective, ...]:
  """Parses 'en de position tag,tag' lines."""
  adjectives = []
  for line in specs.strip().splitlines():
    en, de, position, tags = line.split()
    adjectives.append(Adjective(en, de, int(position), frozenset(tags.split(','))))
  return tuple(adjectives)


ADJECTIVES = _adjectives("""
    good gut 0 person,animal,thing,food
    beautiful schön 0 person,animal,thing
    clever klug 0 person,animal
    friendly freundlich 0 person,animal
    loud laut 0 person,animal
    quiet leise 0 person,animal
    fast schnell 0 person,animal
    strong stark 0 person,animal
    happy glücklich 0 person
    sad traurig 0 person
    rich reich 0 person
    poor arm 0 person
    cheap billig 0 thing
    big groß 1 person,animal,thing
    small klein 1 person,animal,thing,food
    tired müde 2 person,animal
    hungry hungrig 2 person,animal
    heavy schwer 2 thing
    dirty schmutzig 2 animal,thing
    clean sauber 2 animal,thing
    fresh frisch 2 food
    sweet süß 2 food
    cold kalt 2 food
    warm warm 2 food
    old alt 3 person,animal,thing
    young jung 3 person,animal
    new neu 3 thing
    red rot 4 thing
    blue blau 4 thing
    green grün 4 thing
    yellow gelb 4 thing
    black schwarz 4 animal,thing
    white weiß 4 animal,thing
    brown braun 4 animal,thing
""")


@dataclasses.dataclass(frozen=True, eq=False)  # one object per word: hash by id
class Prep:
  en: str
  de: str
  case: int
  tags: frozenset[str]


@dataclasses.dataclass(frozen=True, eq=False)  # one object per word: hash by id
class Verb:
  """A verb and its frame: 'intr', 'acc', 'dat', 'ditr' (dative + accusative), 'cop' (+ adjective),
  'clause' (+ a that-clause) or 'modal' (+ infinitive). Tags say which nouns may fill each slot."""
  en_base: str
  en_forms: tuple[str, ...]  # present tense for I, you, he/she/it, we, they
  de_inf: str
  de_forms: tuple[str, ...]  # present tense for ich, du, er/sie/es, wir, sie
  frame: str
  subj_tags: frozenset[str]
  obj_tags: frozenset[str] = frozenset()  # the (indirect) object
  obj2_tags: frozenset[str] = frozenset()  # the direct object of 'ditr'
  pp: Prep | None = None  # optional prepositional phrase of 'intr'
  en_aux: bool = False  # a modal that inverts in English questions (can, must)

  @property
  def case(self) -> int:
    return DAT if self.frame == 'dat' else ACC


_IRREGULAR = {inf: tuple(forms.split()) for inf, forms in (
    ('sehen', 'sehe siehst sieht sehen sehen'), ('lesen', 'lese liest liest lesen lesen'),
    ('essen', 'esse isst isst essen essen'), ('helfen', 'helfe hilfst hilft helfen helfen'),
    ('geben', 'gebe gibst gibt geben geben'), ('treffen', 'treffe triffst trifft treffen treffen'),
    ('tragen', 'trage trägst trägt tragen tragen'),
    ('waschen', 'wasche wäschst wäscht waschen waschen'),
    ('schlafen', 'schlafe schläfst schläft schlafen schlafen'),
    ('laufen', 'laufe läufst läuft laufen laufen'), ('haben', 'habe hast hat haben haben'),
    ('mögen', 'mag magst mag mögen mögen'), ('wissen', 'weiß weißt weiß wissen wissen'),
    ('sein', 'bin bist ist sind sind'), ('können', 'kann kannst kann können können'),
    ('müssen', 'muss musst muss müssen müssen'), ('wollen', 'will willst will wollen wollen'),
)}


def german_present(inf: str) -> tuple[str, ...]:
  """Present tense (ich, du, er, wir, sie): regular -en verbs, with -est/-et after t or d and
  -t after s or z; the irregular verbs of the lexicon are listed in full."""
  if inf in _IRREGULAR:
    return _IRREGULAR[inf]
  stem = inf[:-2]
  if stem.endswith(('t', 'd')):
    return stem + 'e', stem + 'est', stem + 'et', inf, inf
  return stem + 'e', stem + ('t' if stem.endswith(('s', 'z', 'ß')) else 'st'), stem + 't', inf, inf


def _english_present(base: str, third: str) -> tuple[str, ...]:
  return (base, base, third, base, base)


def _verb(en: str, de: str, frame: str, subj: str, obj: str = '', obj2: str = '',
          pp: Prep | None = None) -> Verb:
  """en is 'base/third-person' ('see/sees', 'look for/looks for'); tags are space separated."""
  base, third = en.split('/')
  return Verb(base, _english_present(base, third), de, german_present(de), frame,
              frozenset(subj.split()), frozenset(obj.split()), frozenset(obj2.split()), pp)


def _prep(en_de: str, case: int, tags: str) -> Prep:
  en, de = en_de.split()
  return Prep(en, de, case, frozenset(tags.split()))


_ANIMATE = 'person animal'
_ALL = 'person animal thing food'
VERBS = (
    _verb('see/sees', 'sehen', 'acc', _ANIMATE, _ALL),
    _verb('find/finds', 'finden', 'acc', _ANIMATE, _ALL),
    _verb('look for/looks for', 'suchen', 'acc', _ANIMATE, _ALL),
    _verb('like/likes', 'mögen', 'acc', _ANIMATE, _ALL),
    _verb('need/needs', 'brauchen', 'acc', _ANIMATE, _ALL),
    _verb('love/loves', 'lieben', 'acc', _ANIMATE, _ANIMATE),
    _verb('hear/hears', 'hören', 'acc', _ANIMATE, _ANIMATE),
    _verb('eat/eats', 'essen', 'acc', _ANIMATE, 'food'),
    _verb('have/has', 'haben', 'acc', 'person', 'animal thing food'),
    _verb('buy/buys', 'kaufen', 'acc', 'person', 'animal thing food'),
    _verb('carry/carries', 'tragen', 'acc', 'person', 'animal thing food'),
    _verb('wash/washes', 'waschen', 'acc', 'person', 'animal thing'),
    _verb('paint/paints', 'malen', 'acc', 'person', _ALL),
    _verb('read/reads', 'lesen', 'acc', 'person', 'readable'),
    _verb('call/calls', 'rufen', 'acc', 'person', _ANIMATE),
    _verb('visit/visits', 'besuchen', 'acc', 'person', 'person'),
    _verb('meet/meets', 'treffen', 'acc', 'person', 'person'),
    _verb('ask/asks', 'fragen', 'acc', 'person', 'person'),
    _verb('help/helps', 'helfen', 'dat', _ANIMATE, _ANIMATE),
    _verb('follow/follows', 'folgen', 'dat', _ANIMATE, _ANIMATE),
    _verb('thank/thanks', 'danken', 'dat', 'person', 'person'),
    _verb('answer/answers', 'antworten', 'dat', 'person', 'person'),
    _verb('give/gives', 'geben', 'ditr', 'person', _ANIMATE, 'thing food'),
    _verb('bring/brings', 'bringen', 'ditr', 'person', _ANIMATE, 'thing food'),
    _verb('show/shows', 'zeigen', 'ditr', 'person', 'person', 'animal thing'),
    _verb('sleep/sleeps', 'schlafen', 'intr', _ANIMATE),
    _verb('laugh/laughs', 'lachen', 'intr', 'person'),
    _verb('cry/cries', 'weinen', 'intr', 'person'),
    _verb('play/plays', 'spielen', 'intr', _ANIMATE, pp=_prep('with mit', DAT, f'{_ANIMATE} thing')),
    _verb('work/works', 'arbeiten', 'intr', 'person', pp=_prep('for für', ACC, 'person')),
    _verb('sing/sings', 'singen', 'intr', _ANIMATE, pp=_prep('for für', ACC, 'person')),
    _verb('dance/dances', 'tanzen', 'intr', 'person', pp=_prep('with mit', DAT, 'person')),
    _verb('wait/waits', 'warten', 'intr', _ANIMATE, pp=_prep('for auf', ACC, _ANIMATE)),
    _verb('run/runs', 'laufen', 'intr', _ANIMATE, pp=_prep('with mit', DAT, _ANIMATE)),
    _verb('swim/swims', 'schwimmen', 'intr', _ANIMATE, pp=_prep('with mit', DAT, _ANIMATE)),
    _verb('come/comes', 'kommen', 'intr', _ANIMATE, pp=_prep('with mit', DAT, _ANIMATE)),
    Verb('be', ('am', 'are', 'is', 'are', 'are'), 'sein', german_present('sein'), 'cop', ANY),
)
MODALS = (
    Verb('can', ('can',) * 5, 'können', german_present('können'), 'modal', ANY, en_aux=True),
    Verb('must', ('must',) * 5, 'müssen', german_present('müssen'), 'modal', ANY, en_aux=True),
    Verb('want to', _english_present('want to', 'wants to'), 'wollen', german_present('wollen'),
         'modal', ANY),
)
# Verbs that take a "that" clause.
SAY_VERBS = tuple(_verb(en, de, 'clause', 'person') for en, de in (
    ('think/thinks', 'denken'), ('believe/believes', 'glauben'), ('hope/hopes', 'hoffen'),
    ('say/says', 'sagen'), ('know/knows', 'wissen')))
CONJUNCTIONS = (('because', 'weil'), ('if', 'wenn'), ('while', 'während'))
ADVERBIALS = (('today', 'heute'), ('tomorrow', 'morgen'), ('now', 'jetzt'),
              ('every day', 'jeden Tag'), ('in the morning', 'am Morgen'),
              ('in the evening', 'am Abend')) + tuple(
                  (f'on {en}', f'am {de}') for en, de in _WEEKDAYS)

NOUN = {noun.en_sg: noun for noun in NOUNS}
ADJECTIVE = {adjective.en: adjective for adjective in ADJECTIVES}
VERB = {verb.en_base: verb for verb in VERBS + MODALS + SAY_VERBS}

# ----------------------------------------------------------------------------- rendering


class Phrase(NamedTuple):
  """A rendered noun phrase (or pronoun): its English and German text in one case."""
  en: str
  de: str
  person: int  # index into Verb.en_forms / de_forms: 0 I, 1 you, 2 he/she/it, 3 we, 4 they
  gender: str | None  # 'm', 'f', 'n', PLURAL; None for I, you, we
  tags: frozenset[str]


_PRONOUNS = tuple(Phrase(en, de, person, gender, frozenset({'person'}))
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
           else _pick(rng, _POSSESSIVES))
  else:
    det = 'the' if roll < 0.5 else 'a' if roll < 0.75 else _pick(rng, _POSSESSIVES)
  return noun_phrase(noun, case, det, plural, _random_adjectives(rng, noun.tags))


def _random_subject(rng: random.Random, tags: frozenset[str], others: frozenset[str],
                    relative_p: float) -> Phrase:
  """A noun phrase with a relative clause (relative_p), a pronoun (a quarter of people) or a
  plain noun phrase."""
  if rng.random() < relative_p:
    head = random_noun_phrase(rng, tags, NOM)
    return with_relative(head, *_random_relative_clause(rng, head, others))
  if 'person' in tags and rng.random() < 0.25:
    return _pick(rng, _PRONOUNS)
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
  return datetime.date.fromordinal(_randint(rng, _FIRST_DAY, _LAST_DAY))


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


# ----------------------------------------------------------------------------- corpus


@functools.lru_cache(maxsize=4)
def build_corpus(seed: int, train_size: int,
                 eval_size: int) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
  """{split: (sources, targets)}, generated once per arguments and cached.

  Pairs are drawn from `random.Random(seed)` and kept only if their source is new, so every pair
  is distinct and no validation or test source occurs in train. Test takes the first eval_size
  new pairs, validation the next eval_size, train the rest.
  """
  if train_size < 1 or eval_size < 1:
    raise ValueError(f'builtin_train_size ({train_size}) and builtin_eval_size ({eval_size}) '
                     'must be at least 1')
  rng = random.Random(seed)
  total = train_size + 2 * eval_size
  seen: set[str] = set()
  sources: list[str] = []
  targets: list[str] = []
  for _ in range(4 * total):
    source, target = generate_pair(rng)
    if source not in seen:
      seen.add(source)
      sources.append(source)
      targets.append(target)
      if len(sources) == total:
        break
  else:
    raise ValueError(f'only {len(sources)} distinct pairs after {4 * total} draws; lower '
                     'builtin_train_size / builtin_eval_size')
  bounds = {'test': (0, eval_size), 'validation': (eval_size, 2 * eval_size),
            'train': (2 * eval_size, total)}
  return {split: (tuple(sources[start:stop]), tuple(targets[start:stop]))
          for split, (start, stop) in bounds.items()}
