"""One reader (and writer) for each kind of file the project reads from users or writes into a run: UTF-8 text
lines, JSON objects, Python files (configs, sweeps), export directories written whole or not at all. Every
failure is one line naming the file and what to do."""

import codecs
import contextlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile
import types

from transformer_jax.core import stops
from transformer_jax.core.errors import one_line


def text_lines(data: bytes, name: str) -> list[str]:
  """The lines of UTF-8 `data` (strict: an invalid byte is an error naming `name` and the line), without line
  ends, a trailing '\\r' or a leading BOM. Lines end at '\\n' only: U+2028, form feed and the other characters
  `str.splitlines` breaks at stay inside their line, so line i of the input is always line i of the output."""
  if data.startswith(codecs.BOM_UTF8):
    data = data[len(codecs.BOM_UTF8):]
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError as e:
    line = data.count(b'\n', 0, e.start) + 1
    raise ValueError(f'{name}: line {line} is not valid UTF-8 ({e.reason} at byte {e.start}); '
                     'convert it to UTF-8') from None
  lines = text.split('\n')
  if lines[-1] == '':
    lines.pop()
  return [line[:-1] if line.endswith('\r') else line for line in lines]


def read_text_lines(path: str, what: str) -> list[str]:
  """`text_lines` of a file; `what` says where the path came from (e.g. a config key) for the error. Reading may
  block for good (a pipe with no writer): a stop may interrupt it (`stops.interruptible`)."""
  try:
    with stops.interruptible(), open(path, 'rb') as f:
      data = f.read()
  except FileNotFoundError:
    raise FileNotFoundError(f'{path} does not exist: fix {what}') from None
  except OSError as e:
    raise OSError(f'cannot read {path} ({e.strerror}): fix {what}') from None
  return text_lines(data, path)


def read_json(path: str, what: str) -> dict:
  """A JSON object from `path`; a damaged file is one line naming it."""
  try:
    with open(path, encoding='utf-8') as f:
      value = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f'{path} is not valid JSON ({e}): the {what} is damaged; restore it from a copy.') from None
  if not isinstance(value, dict):
    raise ValueError(f'{path} does not hold a JSON object: the {what} is damaged; restore it from a copy.')
  return value


def umask() -> int:
  """This process's umask, read without setting it where Linux shows it (os.umask sets while it reads)."""
  try:
    with open('/proc/self/status', encoding='ascii') as f:
      return next(int(line.split()[1], 8) for line in f if line.startswith('Umask:'))
  except (OSError, StopIteration, ValueError):
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path: str, data: bytes | str) -> None:
  """Writes via a temporary file in the same directory and a rename: readers never see half a file, and a full
  disk leaves the previous file as it was (the error names the file)."""
  directory = os.path.dirname(path) or '.'
  try:
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f'.{os.path.basename(path)}-', suffix='.tmp')
    try:
      os.fchmod(fd, 0o666 & ~umask())  # the permissions open() gives a new file, not mkstemp's owner-only ones
      with os.fdopen(fd, 'wb' if isinstance(data, bytes) else 'w') as f:
        f.write(data)
      os.replace(tmp, path)
    except BaseException:
      os.unlink(tmp)
      raise
  except OSError as e:
    raise OSError(f'cannot write {path} ({e.strerror or e}): free disk space or raise the file size limit, then '
                  'rerun.') from None


def load_python(path: str, function: str, what: str) -> types.ModuleType:
  """Runs the Python file at `path` as a module that must define `function`; any failure is one line."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{what} {path} does not exist.')
  name = f'_{function}_{abs(hash(os.path.abspath(path)))}'
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # as for an imported module (dataclasses in the file look it up)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ValueError(f'{what} {path} line {e.lineno}: syntax error ({e.msg}).') from None
  except Exception as e:  # pylint: disable=broad-except  # the file's own code failed
    raise ValueError(f'{what} {path} failed while loading: {type(e).__name__}: {one_line(e)}') from None
  if not callable(getattr(module, function, None)):
    raise ValueError(f'{what} {path} defines no {function}().')
  return module


def check_new_directory(path) -> None:
  """Refuses, in one line, a `path` that exists and is not an empty directory (an export's output)."""
  path = pathlib.Path(path)
  if path.exists() and (not path.is_dir() or any(path.iterdir())):
    raise ValueError(f'{path} exists and is not an empty directory: pass a new export directory.')
  existing = next(parent for parent in path.absolute().parents if parent.exists())
  if not existing.is_dir():
    raise ValueError(f'{existing} is a file, so {path} cannot be made: pass an export directory outside it.')


@contextlib.contextmanager
def staged_directory(path):
  """Yields a new directory beside `path` (new or empty) to fill; it becomes `path` when the block ends, and is
  removed if the block fails: a reader never sees half a directory. Its files get the permissions open() gives a
  new file, whatever wrote them (safetensors writes owner-only files)."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f'.{path.name}.', dir=path.parent)
  mask = umask()
  os.chmod(staging, 0o777 & ~mask)  # the permissions os.mkdir gives, not mkdtemp's owner-only 0o700
  try:
    yield staging
    for directory, _, names in os.walk(staging):
      for name in names:
        os.chmod(os.path.join(directory, name), 0o666 & ~mask)
    if path.exists():
      path.rmdir()
    os.rename(staging, path)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
