"""English and German numbers (0..999999), ordinals (1..31) and date phrases.

The words of the number and date families, and of counts in noun phrases ("three old dogs").
"""

from __future__ import annotations

import datetime

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


def _check_range(n: int) -> None:
  if not 0 <= n <= MAX_NUMBER:
    raise ValueError(f'number {n} is outside 0..{MAX_NUMBER}')


def english_number(n: int) -> str:
  """0..999999 in British English words: 1042 -> 'one thousand and forty-two'."""
  _check_range(n)
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
  _check_range(n)
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
WEEKDAYS = (('Monday', 'Montag'), ('Tuesday', 'Dienstag'), ('Wednesday', 'Mittwoch'),
            ('Thursday', 'Donnerstag'), ('Friday', 'Freitag'), ('Saturday', 'Samstag'),
            ('Sunday', 'Sonntag'))
# Random dates are drawn between these days (as date ordinals).
FIRST_DAY = datetime.date(1900, 1, 1).toordinal()
LAST_DAY = datetime.date(2099, 12, 31).toordinal()

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
    weekday_en, weekday_de = WEEKDAYS[date.weekday()]
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
