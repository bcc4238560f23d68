"""How an error reads in one line, for the one-line messages every tool prints."""


class MissingDependencyError(ImportError):
  """An optional package that a feature needs is not installed; the message says what to install."""


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


def root_cause(error: BaseException) -> BaseException:
  """The innermost exception of a chain (`raise ... from`, or raised while handling another): the one that says
  what failed, under the wrappers of orbax, tensorstore or asyncio."""
  while (inner := error.__cause__ or (None if error.__suppress_context__ else error.__context__)) is not None:
    error = inner
  return error
