"""Lines of text in, token ids or outputs out, the same for every tool and engine: the one reader of text input
(standard input or a flag's text, strict UTF-8), encoding lines for a model, and empty lines kept in place."""

import sys

from transformer_jax.core import files
from transformer_jax.core.tokens import EOS_ID


def read_stdin() -> list[str]:
  """Standard input's lines (`files.text_lines`: strict UTF-8, an invalid byte is an error naming the line)."""
  return files.text_lines(sys.stdin.buffer.read(), 'standard input')


def flag_text(value: str, flag: str) -> str:
  """A command-line flag's text, which must be valid UTF-8 (Python keeps other bytes as lone surrogates, which no
  tokenizer can encode): an error naming the flag otherwise."""
  try:
    value.encode('utf-8')
  except UnicodeEncodeError as e:
    raise ValueError(f'--{flag} is not valid UTF-8 text (byte {e.start} of it): pass UTF-8 text.') from None
  return value


def encode_lines(lines, tokenizer, max_len: int, truncate: bool,
                 what: str = 'input line {number}', fix: str = 'shorten it or pass --truncate',
                 target: bool = False, numbers=None) -> list[list[int]]:
  """Token ids with EOS for each line (source sentences, or `target` ones); an over-long line is an error naming it
  (`what` with its number: its place in `lines` from 1, or in `numbers`), or cut."""
  encode = tokenizer.encode_target if target else tokenizer.encode
  encoded = []
  for number, line in zip(numbers or range(1, len(lines) + 1), lines, strict=True):
    ids = encode(line) + [EOS_ID]
    if len(ids) > max_len:
      if not truncate:
        raise ValueError(f'{what.format(number=number)} has {len(ids)} tokens, more than the model\'s max length '
                         f'{max_len}: {fix}.')
      ids = ids[:max_len - 1] + [EOS_ID]
    encoded.append(ids)
  return encoded


def translate_nonblank(lines: list[str], translate) -> list[str]:
  """`translate(lines, numbers)` of the non-blank lines and their line numbers in `lines` (from 1, for errors),
  put back in order; empty (or blank) lines give empty outputs (as in every translation engine)."""
  keep = [i for i, line in enumerate(lines) if line.strip()]
  out = [''] * len(lines)
  for i, text in zip(keep, translate([lines[i] for i in keep], [i + 1 for i in keep]), strict=True):
    out[i] = text
  return out
