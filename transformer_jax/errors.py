"""How an error reads in one line, for the one-line messages every tool prints."""


def one_line(error: BaseException) -> str:
  """An exception's own words on one line: the innermost of nested exceptions (ml_collections wraps KeyErrors
  in AttributeErrors), a multi-line message as its first and last lines (a traceback ends with the error)."""
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  if len(lines) > 2:
    lines = [lines[0], lines[-1]]
  return ' '.join(lines) or type(error).__name__
