"""Command-line config handling for the absl mains: the --config flag and one-line errors for bad configs.

`define_config_flag` + `app.run(main, flags_parser=parse_flags)` turn ml_collections' tracebacks (a config
file that raises, an override of a key the config lacks) into one line naming the flag and, for unknown keys,
the closest valid ones. `exit_on_user_error` does the same for the errors a run reports about its inputs.
"""

import contextlib
import difflib
import re
import sys
import traceback

import ml_collections
from absl import flags
from absl import logging
from ml_collections import config_flags
from ml_collections.config_flags import config_flags as config_flags_lib


@contextlib.contextmanager
def exit_on_user_error(*errors):
  """Turns the listed exceptions (bad inputs, already worded for the user) into a one-line exit.

  The traceback still goes to the log at debug verbosity (--verbosity=1) for bug reports.
  """
  try:
    yield
  except errors as e:
    logging.debug('%s', traceback.format_exc())
    sys.exit(f'error: {e}')


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing (`app.run(main, flags_parser=parse_flags)`) whose errors are one line.

  config_flags reports an exception raised by a config file with its whole traceback; this keeps the flag
  and the exception's last line, e.g. `flag --config=...:A_h99: ValueError: unknown config argument(s) ...`.
  """
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    message = lines[0] if len(lines) == 1 else (
        f'{lines[0].split(": Error whilst parsing config file")[0]}: {lines[-1]}')
    sys.exit(f'FATAL Flags parsing error: {message}')
  except (AttributeError, KeyError) as e:  # config_flags: an override of a key that the config lacks
    sys.exit(f'FATAL Flags parsing error: {_unknown_override(argv, e)}')


def unknown_key_message(config: ml_collections.ConfigDict, path: str) -> str | None:
  """None if the dotted `path` names a field of `config`, else one line with the closest valid keys."""
  node, parts = config, path.split('.')
  for depth, name in enumerate(parts):
    if not isinstance(node, (ml_collections.ConfigDict, dict)):
      return f'{".".join(parts[:depth])} is a value ({type(node).__name__}), not a section with keys.'
    if name in node:
      node = node[name]
      continue
    parent = '.'.join(parts[:depth])
    full = lambda key: f'{parent}.{key}' if parent else key
    valid = sorted(node.keys())
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f'did you mean {" or ".join(full(k) for k in close)}? ' if close else ''
    return (f'the config has no key {full(name)}; {hint}valid keys of {parent or "the config"}: '
            f'{", ".join(valid) or "none"}.')
  return None


def define_config_flag(default: str, help_string: str):
  """`config_flags.DEFINE_config_file('config', default, ...)` with the one-line errors of `parse_flags`.

  Without --config on the command line, config_flags loads the default file and applies the --config.*
  overrides at definition time, so an unknown key fails here, before `parse_flags` runs.
  """
  try:
    return config_flags.DEFINE_config_file('config', default, help_string)
  except (AttributeError, KeyError) as e:
    sys.exit(f'FATAL Flags parsing error: {_unknown_override(sys.argv, e, default)}')


def _unknown_override(argv: list[str], error: Exception, default: str | None = None) -> str:
  """Names the --config.* override whose key the config file lacks, with the closest valid keys."""
  quoted = re.search(r"'([^'\\]+)", str(error))
  fallback = f'a --config.* override names a key the config lacks ({quoted.group(1) if quoted else error}).'
  try:
    config = _load_config_flag(argv, default)
  except Exception:  # pylint: disable=broad-except  # the config file itself fails: say what is known
    return fallback
  for arg in argv[1:]:
    if arg.startswith('--config.'):
      path = arg[len('--config.'):].split('=', 1)[0]
      message = unknown_key_message(config, path)
      if message:
        return f'--config.{path}: {message}'
  return fallback


def _load_config_flag(argv: list[str], default: str | None) -> ml_collections.ConfigDict:
  """The config that --config (or its default) names, loaded again without the overrides."""
  spec = default
  for i, arg in enumerate(argv[1:], 1):
    if arg.startswith(('--config=', '-config=')):
      spec = arg.split('=', 1)[1]
    elif arg in ('--config', '-config') and i + 1 < len(argv):
      spec = argv[i + 1]
  if spec is None:
    spec = flags.FLAGS['config'].default_as_str.strip('\'"')
  return load_config_file(spec)


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """The config of a 'path/to/config.py[:argument]' string, loaded as the --config flag loads it."""
  try:
    return config_flags_lib.ConfigFileFlagParser(name='config').parse(spec)
  except TypeError as e:
    if 'takes 0 positional arguments' not in str(e):
      raise
    path, _, arg = spec.partition(':')
    raise ValueError(f'{path}: get_config() takes no argument, but the config {spec!r} passes {arg!r}.') from None
