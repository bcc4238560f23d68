"""The lexicon: nouns, adjectives, verbs (with their frames), prepositions and fixed phrases.

Word lists are specs parsed at import; tags say which nouns may fill which slot, so that drawn
sentences make sense ("the man reads a book", never "the book reads a man").
"""

from __future__ import annotations

import dataclasses

from transformer_jax.data.builtin.numbers import WEEKDAYS

NOM, ACC, DAT = 0, 1, 2  # German cases
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
                  (f'on {en}', f'am {de}') for en, de in WEEKDAYS)

NOUN = {noun.en_sg: noun for noun in NOUNS}
ADJECTIVE = {adjective.en: adjective for adjective in ADJECTIVES}
VERB = {verb.en_base: verb for verb in VERBS + MODALS + SAY_VERBS}
