"""What every command-line tool shares: absl flags with one-line errors, the --config flags, one error boundary.

`run(main)` is each tool's `app.run`: flag errors and the errors a run reports about its inputs end in one line
naming what to change (exit status 1); the traceback goes to the log only with --verbosity=1 (for bug reports).
"""

import atexit
import gc
import logging as py_logging
import sys
import threading
import traceback

from absl import app
from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

from transformer_jax import config as config_lib
from transformer_jax.core.errors import MissingDependencyError
from transformer_jax.core.errors import one_line
from transformer_jax.runtime import backends

# Errors that describe a bad input or a run that cannot go on, already worded for the user.
USER_ERRORS = (ValueError, OSError, ArithmeticError, MissingDependencyError)


def _interrupted_in_one_line(previous):
  """A `sys.excepthook`: Ctrl-C (a KeyboardInterrupt nothing caught, while a tool imports or runs) ends the process
  with one line, 'interrupted' and what to do next where the tool says (its exception's message), instead of a
  traceback; Python still exits as by the signal (status 130). Any other exception goes to `previous`."""

  def hook(kind, value, traceback_):
    if not issubclass(kind, KeyboardInterrupt):
      return previous(kind, value, traceback_)
    sys.stderr.write(f'interrupted: {one_line(value)}\n' if value.args else 'interrupted\n')
    return None

  return hook


sys.excepthook = _interrupted_in_one_line(sys.excepthook)  # from the tool's first import of this module on


class _ConfigFileParser(flags.ArgumentParser):
  """Reads --config files with `config.load_file`, whose every failure is one line naming the file; keeps the last
  config read (`loaded`), for the error of an override that names no key of it."""

  loaded = None

  def parse(self, argument):
    self.loaded = config_lib.load_file(argument)
    return self.loaded

  def flag_type(self):
    return 'config object'


def define_config_file_flag(default: str, help_string: str):
  """--config=path/to/config.py[:arguments] plus --config.key=value overrides (the config is locked: an override
  of a key it lacks fails naming the key in full, with the closest keys)."""
  holder = config_flags.DEFINE_config_file('config', None, help_string, lock_config=True)
  flags.FLAGS['config'].parser = _ConfigFileParser()
  try:
    flags.FLAGS.set_default('config', default)  # without --config on the command line the default loads here
  except Exception as e:  # pylint: disable=broad-except  # a config file runs arbitrary code
    sys.exit(f'FATAL Flags parsing error: {_flag_error(e, sys.argv, _config_read())}')
  return holder


def define_config_overrides_flag(base, help_string: str, name: str = 'config'):
  """--config.key=value overrides of `base`, a template of the config's keys; read them with `overrides()`. Another
  `name` gives a second set of the same syntax (a benchmark's variant: --variant.key=value)."""
  try:  # ml_collections reads the command line's --NAME.* keys as it defines the flag
    return config_flags.DEFINE_config_dict(name, base, help_string, lock_config=True)
  except (KeyError, AttributeError) as e:
    sys.exit(f'FATAL Flags parsing error: {_flag_error(e, sys.argv, base, name)}')


def overrides(name: str = 'config') -> dict:
  """The --config.key=value overrides (those of the flag `name`) given on the command line, by dotted key."""
  return dict(config_flags.get_override_values(flags.FLAGS[name]))


class CheckpointFlags:
  """--workdir, --step and --average_last: the checkpoints a tool uses. One model, or (where the tool takes one)
  an ensemble of several runs (--workdir repeated, each at --step if one is given) or of several steps of one run
  (--step repeated); --average_last averages the last K checkpoints of every member."""

  def __init__(self, workdir_required: bool = True):
    self._workdirs = flags.DEFINE_multi_string(
        'workdir', None, 'The training run\'s workdir; repeat it for an ensemble of runs.', required=workdir_required)
    self._steps = flags.DEFINE_multi_integer(
        'step', None, 'Checkpoint step (default: the run\'s final model, the average of its last eval.average_last '
        'periodic saves, as train.py\'s final evaluation); repeat it for an ensemble of steps of one run.',
        lower_bound=0)
    self._average_last = flags.DEFINE_integer(
        'average_last', None, 'Average the params of the last K checkpoints (§6.1), of every member.', lower_bound=1)
    flags.register_validator('step', lambda steps: not steps or self._average_last.value is None,
                             message='pass either --step or --average_last, not both.')
    flags.register_multi_flags_validator(
        ['workdir', 'step'], lambda values: len(values['workdir'] or ()) < 2 or len(values['step'] or ()) < 2,
        message='repeat --workdir (an ensemble of runs) or --step (an ensemble of steps of one run), not both.')

  @property
  def given(self) -> bool:
    """Whether any of the flags is on the command line."""
    return bool(self._workdirs.value or self._steps.value or self._average_last.value)

  def runs(self) -> list[tuple[str, int | None]]:
    """(workdir, step) of every member, in order; step None: the run's final model (or, with --average_last, the
    average of its last K checkpoints)."""
    workdirs, steps = self._workdirs.value, self._steps.value or [None]
    if len(workdirs) > 1:
      return [(workdir, steps[0]) for workdir in workdirs]
    return [(workdirs[0], step) for step in steps]

  @property
  def average_last(self) -> int | None:
    return self._average_last.value


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing (`app.run(main, flags_parser=parse_flags)`) whose errors are one line."""
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except  # config files run arbitrary code while flags parse
    sys.exit(f'FATAL Flags parsing error: {_flag_error(e, argv, _config_read())}')


def _config_read():
  """The config that --config.KEY=VALUE overrides: the file a config file's flag read last, or the template of an
  overrides' flag; None without a --config flag."""
  if 'config' not in flags.FLAGS:
    return None
  flag = flags.FLAGS['config']
  loaded = getattr(flag.parser, 'loaded', None)
  return loaded if loaded is not None else flag.value


def _flag_error(error: BaseException, argv=(), config=None, name: str = 'config') -> str:
  """One line for a flag error; where `argv` overrides (--NAME.key=value) a key that `config` lacks, that key, named
  in full with the closest keys (`config.unknown_key`)."""
  if isinstance(config, ml_collections.ConfigDict):
    for arg in argv[1:]:
      key = arg.removeprefix(f'--{name}.').split('=', 1)[0]
      problem = arg.startswith(f'--{name}.') and config_lib.unknown_key(config, key)
      if problem:
        return f'--{name}.{key}: {problem}'
  if isinstance(error, (KeyError, AttributeError)) and getattr(error, 'name', None) != 'get_config':
    return f'a --{name}.* override names no key of the config: {one_line(error)}'
  return one_line(error)


class _QuietLibraries(py_logging.Filter):
  """orbax and grain: drops their per-save INFO chatter and, unless --verbosity=1, the tracebacks of their errors
  (the error itself stays; the run reports it in one line of its own). asyncio likewise: its event loop logs the
  failed writes of a failed orbax save that nobody awaited any more ('Future exception was never retrieved').
  sacrebleu: its significance tests' INFO lines (which statistics it computes), before the table eval.py prints."""

  def filter(self, record):
    if not any(part in record.pathname for part in ('/orbax/', '/grain/', '/asyncio/', '/sacrebleu/')):
      return True
    if record.levelno < py_logging.WARNING:
      return False
    if record.exc_info and not logging.level_debug():
      record.exc_info, record.exc_text = None, None
    return True


def _unraisable_in_one_line(previous):
  """A `sys.unraisablehook` for errors nobody can catch: tensorstore's callbacks into the closed event loops of a
  failed save or restore, dozens of them after the run has said what failed. The first is logged in one line, and at
  exit how many more came; --verbosity=1 keeps each one's traceback."""
  lock, count = threading.Lock(), [0]

  def report_the_rest():
    if count[0] > 1:
      logging.warning('%d more errors raised where nothing can catch them (--verbosity=1 shows each)', count[0] - 1)

  def hook(unraisable):
    if logging.level_debug():
      previous(unraisable)
      return
    with lock:
      count[0] += 1
      first = count[0] == 1
    if first:
      logging.warning('an error raised where nothing can catch it (--verbosity=1 shows each): %s',
                      one_line(unraisable.exc_value))
      atexit.register(report_the_rest)

  return hook


def _shared_flags_in_help() -> None:
  """absl's --help lists the flags of the tool's own module; those this package defines for it (--config,
  --workdir, --step, --average_last, --distributed, ...) are declared the tool's key flags, so they are listed too."""
  for module, defined in flags.FLAGS.flags_by_module_dict().items():
    if module.startswith('transformer_jax.'):
      for flag in defined:
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def run(main):
  """`app.run(main)` with one-line flag errors, the shared flags in --help, no start-up of accelerators the machine
  lacks, orbax/grain/asyncio logs kept short, uncatchable (unraisable) errors logged as one line and a count,
  USER_ERRORS from `main` as one line on stderr, and the imports' objects frozen for the garbage collector (a quicker
  exit)."""

  def guarded(argv):
    backends.skip_absent_accelerators()
    logging.get_absl_handler().addFilter(_QuietLibraries())
    sys.unraisablehook = _unraisable_in_one_line(sys.unraisablehook)
    try:
      return main(argv)
    except USER_ERRORS as e:
      logging.debug('%s', traceback.format_exc())
      sys.exit(f'error: {one_line(e)}')

  _shared_flags_in_help()
  gc.freeze()  # the libraries' objects, imported by now: neither the collector nor the exit walks them again
  app.run(guarded, flags_parser=parse_flags)
