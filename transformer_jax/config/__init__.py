"""The run's config: each section's defaults and checks come from its own module of this package (`model.py` for
the model's, one module per other section), one `validate` runs every section's checks, and config files load one
way for every tool. Nothing here imports JAX, the data pipeline, the training loop or inference.

| section | defaults and checks | used by |
|---|---|---|
| `model` | `config/model.py` (`ModelConfig`) | `model/transformer.py` |
| `data` | `config/data.py` | `data/sources.py` |
| `tokenizer` | `config/tokenizer.py` | `data/tokenizer.py` |
| `pipeline` | `config/pipeline.py` | `data/pipeline.py` |
| `mesh` | `config/mesh.py` | `runtime/sharding.py` |
| `train` | `config/train.py` | `jobs/trainer.py`, `training/optim.py` |
| `eval` | `config/eval.py` | `jobs/scoring.py` |
| `decode` | `config/decode.py` | `inference/generation.py` |

Config files (`configs/*.py`) start from `base_config()` and change what their experiment changes. Values that
must agree are tied with `FieldReference`s, so overriding one key keeps them consistent: the model's and the
tokenizer's vocabulary size, and the model's max length and the pipeline's length filter.
"""

import difflib
import inspect
import json
from typing import Any, Iterable, Mapping, Sequence

import ml_collections

from transformer_jax.config import data
from transformer_jax.config import decode
from transformer_jax.config import eval as eval_section
from transformer_jax.config import mesh
from transformer_jax.config import model as model_config
from transformer_jax.config import pipeline
from transformer_jax.config import tokenizer
from transformer_jax.config import train
from transformer_jax.core import files
from transformer_jax.core.errors import one_line
from transformer_jax.core.workdir import Workdir

# What evaluation may change in a run's saved config: how it decodes, what it evaluates on, and the model's
# runtime choices (same parameters, other computation or layer layout). Everything else is fixed by the training run.
EVALUATION_KEYS = ('decode', 'eval', 'data', 'model.attention', 'model.attention_chunk_size', 'model.dtype',
                   'model.cpu_kernels', 'model.residual_norm_kernel', 'model.loss_kernel', 'model.scan_layers')

# Keys that only some settings of other keys read: dotted key -> its conditions, each (the dotted key that chooses,
# the choices that read it), all of which must hold. Each section declares its own; an override of one the run would
# not read is an error (`check_overrides`).
MODE_KEYS = {f'{name}.{key}': rule
             for name, section in (('model', model_config), ('data', data), ('pipeline', pipeline), ('train', train),
                                   ('decode', decode))
             for key, rule in section.MODE_KEYS.items()}


def base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  vocab_size = ml_collections.FieldReference(37000)
  max_length = ml_collections.FieldReference(256)
  config.model = model_config.default_config()
  config.model.vocab_size = vocab_size
  config.model.max_len = max_length
  config.data = data.default_config()
  config.tokenizer = tokenizer.default_config()
  config.tokenizer.vocab_size = vocab_size
  config.pipeline = pipeline.default_config()
  config.pipeline.max_length = max_length
  config.mesh = mesh.default_config()
  config.train = train.default_config()
  config.eval = eval_section.default_config()
  config.decode = decode.default_config()
  return config


def validate(config: ml_collections.ConfigDict, *, data_splits: Sequence[str] | None = None,
             overrides: Iterable[str] = ()) -> None:
  """Every section's checks, then the checks across sections; each problem is one line naming the keys.

  data_splits: the splits whose files a `data.source='files'` config must name; None: those a training run
  reads (train, eval.split, eval.test_split); () for config files, whose paths come from the command line.
  overrides: the dotted keys given as --config.key=value, each of which the run must read (`check_overrides`).
  """
  check_overrides(config, overrides)
  model = model_config.ModelConfig.from_dict(config.model)
  if data_splits is None:
    data_splits = ('train', config.eval.split, config.eval.test_split)
  data.validate(config.data, data_splits, documents=model.decoder_only)  # a language model reads documents
  tokenizer.validate(config.tokenizer)
  pipeline.validate(config.pipeline)
  mesh.validate(config.mesh, model)
  train.validate(config.train)
  eval_section.validate(config.eval)
  decode.validate(config.decode)
  keep = config.train.keep_checkpoints
  if keep is not None and keep < config.eval.average_last:
    raise ValueError(f'train.keep_checkpoints={keep} < eval.average_last={config.eval.average_last}: the final '
                     'evaluation averages more checkpoints than are kept.')


def check_overrides(config: ml_collections.ConfigDict, overrides: Iterable[str]) -> None:
  """Each --config.key=value override is read by the run: one of a key that the config's choices leave unread
  (`MODE_KEYS`: tokens_per_batch while pipeline.batching is 'packed', a file while data.source is 'builtin') is
  an error saying which choice reads it, not a setting silently dropped."""
  for key in overrides:
    unmet = unmet_condition(config, key)
    if unmet is not None:
      chooser, readers = unmet
      raise ValueError(f'--config.{key} is not read while {chooser}={_value(config, chooser)!r}, only when it is '
                       f'{" or ".join(map(repr, readers))}: drop it, or pass --config.{chooser}={readers[0]} too.')


# What a run's batch sequence depends on: resumed with other values, its checkpoints' place in that sequence would
# mean other batches (`check_resume`). Data paths may move between machines; read threads keep the order.
_BATCH_SEQUENCE_KEYS = ('data', 'tokenizer', 'pipeline')
_NOT_BATCH_SEQUENCE_KEYS = ('data.files', 'data.tfds_data_dir', 'pipeline.read_threads')


def changes_since(saved: Mapping[str, Any], config: ml_collections.ConfigDict) -> dict[str, tuple[Any, Any]]:
  """{dotted key: (saved value, value now)} for each leaf that both `saved` (a run's config.json) and `config` hold,
  that `config`'s run reads (`is_read`) and that differs, the values compared as JSON holds them."""
  def leaves(tree, prefix=''):
    for key, value in tree.items():
      if isinstance(value, Mapping):
        yield from leaves(value, f'{prefix}{key}.')
      else:
        yield f'{prefix}{key}', value

  before, now = dict(leaves(saved)), dict(leaves(json.loads(config.to_json_best_effort())))
  return {key: (value, now[key]) for key, value in before.items()
          if key in now and now[key] != value and is_read(config, key)}


def check_resume(changes: Mapping[str, tuple[Any, Any]], workdir: str) -> None:
  """Refuses, in one line, to resume a run with other values of what its batch sequence depends on (`changes` as
  `changes_since` gives them)."""
  fixed = {key: values for key, values in changes.items()
           if any(_under(key, section) for section in _BATCH_SEQUENCE_KEYS)
           and not any(_under(key, free) for free in _NOT_BATCH_SEQUENCE_KEYS)}
  if fixed:
    listed = ', '.join(f'{key}={old!r} (now {new!r})' for key, (old, new) in fixed.items())
    raise ValueError(f'{workdir} was trained with {listed}: its checkpoints continue the batches those values make; '
                     'pass the run\'s values to resume it, or train in a new --workdir.')


def is_read(config: ml_collections.ConfigDict, key: str) -> bool:
  """Whether a run of `config` reads the dotted `key` (or the keys under it): false only for `MODE_KEYS` that the
  config's choices leave unread."""
  return unmet_condition(config, key) is None


def unmet_condition(config: ml_collections.ConfigDict, key: str) -> tuple[str, tuple[str, ...]] | None:
  """The first of the dotted `key`'s `MODE_KEYS` conditions (chooser, the choices that read it) that `config` does
  not meet; None when the run reads the key."""
  return next(((chooser, readers) for chooser, readers in mode_rule(key) if _value(config, chooser) not in readers),
              None)


def mode_rule(key: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
  """The `MODE_KEYS` conditions of the dotted `key` or of a key above it; () for a key every run reads."""
  return next((rule for path, rule in MODE_KEYS.items() if _under(key, path)), ())


def _under(key: str, path: str) -> bool:
  """Whether the dotted `key` is `path` or a key below it (at a dot: train.learning_rate is not under
  train.learning_rate_scale, nor the other way round)."""
  return key == path or key.startswith(path + '.')


def _value(config: ml_collections.ConfigDict, dotted: str) -> Any:
  for name in dotted.split('.'):
    config = config[name]
  return config


def load_file(spec: str) -> ml_collections.ConfigDict:
  """The locked config of 'path/to/config.py[:arguments]': the file's `get_config(arguments)`. Every failure
  (no such file, a syntax error, no get_config, an argument it does not take, an error inside it, no
  ConfigDict returned) is one ValueError line naming the file. train.py's --config reads files with this too."""
  path, _, arg = spec.partition(':')
  module = files.load_python(path, 'get_config', 'config file')
  takes_argument = bool(inspect.signature(module.get_config).parameters)
  if arg and not takes_argument:
    raise ValueError(f'{path}: get_config() takes no argument, but {spec} passes {arg!r}.')
  try:
    config = module.get_config(arg or None) if takes_argument else module.get_config()
  except ValueError:  # the file's own check of its argument or values, worded for the user
    raise
  except Exception as e:  # pylint: disable=broad-except  # the file's own code failed
    raise ValueError(f'{path}: get_config() failed: {type(e).__name__}: {one_line(e)}') from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(f'{path}: get_config() returned {type(config).__name__}, not an ml_collections.ConfigDict '
                     '(a missing return statement?).')
  config.lock()
  return config


def load(spec: str, overrides: Mapping[str, Any] | None = None) -> ml_collections.ConfigDict:
  """The config of 'path/to/config.py[:arguments]', loaded as train.py's --config loads it (locked), with
  `overrides` ({dotted key: value}) applied as --config.key=value would be; validated without data paths."""
  config = load_file(spec)
  _apply(config, overrides or {})
  validate(config, data_splits=(), overrides=overrides or {})
  return config


def of_run(workdir: str) -> ml_collections.ConfigDict:
  """A training run's saved config (`Workdir.config_file`) on today's defaults: keys added since the run was
  written get their default values, so older workdirs still evaluate."""
  config = base_config()
  config.update(Workdir(workdir).load_config())
  return config


def for_evaluation(workdir: str, overrides: Mapping[str, Any], split: str) -> ml_collections.ConfigDict:
  """A run's saved config (`of_run`) with evaluation's overrides (`EVALUATION_KEYS` only), validated for
  `split`."""
  config = of_run(workdir)
  config.lock()
  for key in overrides:
    if not any(_under(key, allowed) for allowed in EVALUATION_KEYS):
      raise ValueError(f'--config.{key}: evaluation cannot change {key}, which the training run fixed (see the '
                       f'workdir\'s config.json); it may change {", ".join(EVALUATION_KEYS)}.')
  _apply(config, overrides, flag='--config.')
  validate(config, data_splits=(split,), overrides=overrides)
  return config


def _apply(config: ml_collections.ConfigDict, overrides: Mapping[str, Any], flag: str = '') -> None:
  """Sets each dotted key as --config.key=value does; a key the config lacks is one line with the closest keys."""
  for key, value in overrides.items():
    problem = unknown_key(config, key)
    if problem:
      raise ValueError(f'{flag}{key}: {problem}')
    try:
      config.update_from_flattened_dict({key: value})
    except (TypeError, ValueError) as e:
      raise ValueError(f'{flag}{key}={value!r}: {one_line(e)}') from None


def unknown_key(config: ml_collections.ConfigDict, path: str) -> str | None:
  """None if the dotted `path` names a field of `config`, else one line with the closest valid keys."""
  node, parts = config, path.split('.')
  for depth, name in enumerate(parts):
    parent = '.'.join(parts[:depth])
    if not isinstance(node, (ml_collections.ConfigDict, dict)):
      return f'{parent} is a value ({type(node).__name__}), not a section with keys.'
    if name in node:
      node = node[name]
      continue
    full = lambda key: f'{parent}.{key}' if parent else key
    valid = sorted(node.keys())
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f'did you mean {" or ".join(full(k) for k in close)}? ' if close else ''
    return (f'the config has no key {full(name)}; {hint}valid keys of {parent or "the config"}: '
            f'{", ".join(valid) or "none"}.')
  return None
