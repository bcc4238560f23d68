"""Tiny configs, synthetic batches and run helpers shared by the training tests.

Everything here is small enough that a training step compiles in a few seconds on a laptop CPU:
one encoder and one decoder layer of width 16, a vocabulary of 200 pieces, and a
built-in corpus of a few thousand pairs.
"""

import contextlib
import glob
import hashlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from absl import flags

from transformer_jax import config as config_lib
from transformer_jax.config import platform as platform_lib
from transformer_jax.config.model import ModelConfig
from transformer_jax.core.workdir import Workdir
from transformer_jax.model.transformer import init_inputs, make_model
from transformer_jax.runtime import sharding
from transformer_jax.training import run_builder, steps

import xla_test_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(REPO, 'train.py')
DEFAULT_CONFIG = os.path.join(REPO, 'configs', 'default.py')
LM_CONFIG = os.path.join(REPO, 'configs', 'lm_default.py')
VOCAB = 200

# Overrides that turn configs/default.py into a run of a few seconds (also passed to train.py).
TINY = {
    'data.builtin_train_size': 2000,
    'data.builtin_eval_size': 16,
    'model.vocab_size': VOCAB,  # tied to tokenizer.vocab_size by a FieldReference
    'model.d_model': 16,
    'model.d_ff': 32,
    'model.num_heads': 2,
    'model.num_encoder_layers': 1,
    'model.num_decoder_layers': 1,
    'model.max_len': 32,  # tied to pipeline.max_length
    'tokenizer.sample_size': 1000,
    'pipeline.packed_length': 32,
    'pipeline.batch_size': 8,
    'pipeline.batch_multiple': 8,
    'pipeline.tokens_per_batch': 256,
    'pipeline.bucket_boundaries': (8, 16, 24, 32),
    'mesh.shape': {'data': -1, 'fsdp': 1, 'tensor': 1},
    'train.num_steps': 8,
    'train.warmup_steps': 4,
    'train.log_every': 1,
    'train.eval_every': 1000,
    'train.eval_batches': 1,
    'train.checkpoint_every': 4,
    'train.keep_checkpoints': 3,
    'eval.batch_size': 16,
    'eval.average_last': 1,
    'eval.num_samples': 1,
    'decode.batch_size': 16,
    'decode.beam_size': 1,
    'decode.max_len_offset': 4,
}

# Overrides that make TINY the decoder-only language model (documents: the built-in corpus's English side).
LM = {'model__architecture': 'decoder_only', 'model__num_encoder_layers': 0}
ARCHITECTURES = {'encoder_decoder': {}, 'decoder_only': LM}

# Step-level tests share these settings (and batch shapes), so they share compiled programs via the cache.
DROPOUT_STEP = {'model__dropout': 0.1, 'train__warmup_steps': 2, 'train__learning_rate_scale': 4.0}
NO_DROPOUT_STEP = {'model__dropout': 0.0, 'train__schedule': 'constant', 'train__learning_rate': 3e-3}
STEP_ROWS, STEP_LENGTH = 8, 12


def default_config() -> ml_collections.ConfigDict:
  """configs/default.py's get_config(), loaded the way train.py's --config flag loads it."""
  return config_lib.load(DEFAULT_CONFIG)


def set_path(config: ml_collections.ConfigDict, path: str, value):
  *parents, leaf = path.split('.')
  for name in parents:
    config = config[name]
  config[leaf] = value


def tiny_config(**overrides) -> ml_collections.ConfigDict:
  """The default config shrunk by TINY; overrides use '__' for '.' (train__num_steps=4)."""
  config = default_config()
  for path, value in {**TINY, **{k.replace('__', '.'): v for k, v in overrides.items()}}.items():
    set_path(config, path, value)
  return config


def flag_args(config: str = DEFAULT_CONFIG, **overrides) -> list[str]:
  """train.py --config.* flags of the config file `config` for TINY plus overrides (same '__' convention as
  tiny_config); TINY's keys the run does not read (the other batching's sizes, translation's beam for a language
  model) are left out, as train.py refuses an override it would not read."""
  given = {k.replace('__', '.'): v for k, v in overrides.items()}
  run = config_lib.load_file(config)
  choosers = {chooser for rule in config_lib.MODE_KEYS.values() for chooser, _ in rule}
  run.update_from_flattened_dict({key: value for key, value in given.items() if key in choosers})
  values = {**{key: value for key, value in TINY.items() if config_lib.is_read(run, key)}, **given}
  args = []
  for path, value in values.items():
    if isinstance(value, dict):
      args += [f'--config.{path}.{k}={v}' for k, v in value.items()]
    elif isinstance(value, tuple):
      args.append(f'--config.{path}=({",".join(map(str, value))},)')
    else:
      args.append(f'--config.{path}={value}')
  return args


def train_args(workdir: str, *extra: str, config: str = DEFAULT_CONFIG, **overrides) -> list[str]:
  """train.py's path and flags for a run of TINY plus overrides (what follows `python`)."""
  return [TRAIN_PY, f'--config={config}', f'--workdir={workdir}', *flag_args(config, **overrides), *extra]


def train_command(workdir: str, *extra: str, config: str = DEFAULT_CONFIG, **overrides) -> list[str]:
  return [sys.executable, *train_args(workdir, *extra, config=config, **overrides)]


def subprocess_env(device_count: int = 8, fast_compile: bool = True) -> dict:
  """The tests' own XLA settings (`xla_test_flags`) with another device count: a subprocess computes what they do.
  `fast_compile=False` keeps XLA's optimisations, for runs long enough that step time outweighs compile time."""
  env = dict(os.environ)
  env['XLA_FLAGS'] = xla_test_flags.xla_flags(device_count, fast_compile)
  env['JAX_PLATFORMS'] = 'cpu'
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  env['PYTHONUNBUFFERED'] = '1'
  return env


# A line of absl's Python log (what our code and the Python libraries log): 'I1201 23:42:11.281338 1406 train.py:74] '.
_PYTHON_LOG_LINE = re.compile(r'[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+\.py:\d+\] ')


def noise(stderr: str) -> list[str]:
  """The lines of `stderr` that are not Python log lines: what C++ libraries and plugins print (libtpu's start-up,
  a CUDA plugin's failed initialisation, their tracebacks)."""
  return [line for line in stderr.splitlines() if not _PYTHON_LOG_LINE.match(line)]


def prepare_workdir(workdir: str, tokenizer_workdir: str) -> str:
  """A fresh workdir holding a copy of an already trained tokenizer (saves training it again)."""
  os.makedirs(workdir, exist_ok=True)
  source, target = Workdir(tokenizer_workdir).tokenizer_model, Workdir(workdir).tokenizer_model
  os.makedirs(os.path.dirname(target))
  shutil.copyfile(source, target)
  return workdir


def read_metrics(workdir: str, split: str = 'train') -> list[dict]:
  with open(Workdir(workdir).metrics_file) as f:
    records = [json.loads(line) for line in f]
  return [r for r in records if r['split'] == split]


def losses_by_step(workdir: str) -> dict[int, float]:
  """Train loss per logged step; a step logged twice (a resumed run) keeps its last value."""
  return {r['step']: r['loss'] for r in read_metrics(workdir)}


def checkpoint_steps(workdir: str) -> list[int]:
  return sorted(int(name) for name in os.listdir(Workdir(workdir).checkpoints) if name.isdigit())


def truncate(path: str) -> None:
  """Cuts a file in half, as a full disk or an interrupted copy would."""
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


# The files of a checkpoint step that damage can hit, by kind (globs inside the step's directory).
CHECKPOINT_FILES = {
    'state': 'state/**/*',  # everything of the state item at once
    'metadata': 'state/_METADATA',
    'manifest': 'state/manifest.ocdbt',
    'data_files': 'state/d/*',  # the OCDBT data files: the root database's
    'process_data_files': 'state/ocdbt.process_0/d/*',  # and this process's
    'iterator': 'data/*.json',
    'step_metadata': '_CHECKPOINT_METADATA',
}


def damage_checkpoint(step_directory: str, kind: str = 'state', size: int | None = None) -> None:
  """Truncates the files of one kind (`CHECKPOINT_FILES`) of a checkpoint step: in half, or to `size` bytes."""
  paths = [p for p in glob.glob(os.path.join(step_directory, CHECKPOINT_FILES[kind]), recursive=True)
           if os.path.isfile(p)]
  assert paths, f'no {kind} files in {step_directory}'
  for path in paths:
    with open(path, 'r+b') as f:
      f.truncate(os.path.getsize(path) // 2 if size is None else size)


def tree_digest(directory: str) -> dict[str, str]:
  """sha256 of every file under a directory, by relative path (to show that nothing changed)."""
  digest = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        digest[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return digest


def synthetic_batches(count: int, rows: int, length: int, vocab: int = VOCAB, seed: int = 0,
                      sides=('inputs', 'targets')) -> list[dict]:
  """Random unpacked batches in the pipeline's layout: tokens in [4, vocab), a random pad tail per row; a
  language model's batches have only the 'targets' side."""
  rng = np.random.default_rng(seed)
  batches = []
  for _ in range(count):
    batch = {}
    for key in sides:
      lengths = rng.integers(length // 2, length + 1, size=rows)
      positions = np.arange(length)[None, :]
      real = positions < lengths[:, None]
      batch[key] = np.where(real, rng.integers(4, vocab, size=(rows, length)), 0).astype(np.int32)
      batch[f'{key}_segment_ids'] = real.astype(np.int32)
      batch[f'{key}_positions'] = np.where(real, positions, 0).astype(np.int32)
    batches.append(batch)
  return batches


def perturbed_params(cfg, seed: int, scale: float = 0.1):
  """Random params of the model of `cfg` (a ModelConfig) with every leaf perturbed by `scale` × N(0, 1), so
  biases and LayerNorm parameters are not 0 and 1 and different seeds give clearly different models."""
  params = nn.unbox(make_model(cfg).init(jax.random.key(seed), **init_inputs(cfg, (1, 4)))['params'])
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def data_mesh(devices) -> jax.sharding.Mesh:
  """A one-axis ('data') mesh of `devices` with Auto axes: this CPU's, or a TPU's or GPU's compile-only ones."""
  return jax.sharding.Mesh(np.asarray(devices).reshape(-1), ('data',), axis_types=(jax.sharding.AxisType.Auto,))


def one_device_mesh(config: ml_collections.ConfigDict):
  """A 1-device mesh (the reference of the parallel runs) and the config's rules."""
  mesh_cfg = config.mesh.copy_and_resolve_references()
  mesh_cfg.shape = {'data': 1, 'fsdp': 1, 'tensor': 1}
  return sharding.mesh_and_rules(mesh_cfg, jax.devices()[:1])


def train_objects(config: ml_collections.ConfigDict, platform: str = 'cpu'):
  """(model, tx, schedule) of a config, as the trainer builds them for devices of `platform`."""
  return steps.training_objects(config, platform)


def kernels(attention: str = 'auto', platform: str | None = None, **settings) -> platform_lib.Kernels:
  """The kernels a model with `model.attention=attention` (and other model `settings`) runs when compiled for
  `platform`: by default the flash kernel's own platform (run in interpret mode on this CPU), else the CPU's."""
  platform = platform or platform_lib.FLASH_KERNELS.get(attention, 'cpu')
  return ModelConfig(attention=attention, platform=platform, **settings).kernels


def jitted_train_step(config, model, tx, schedule, state_shardings, mesh):
  """The trainer's jitted train step (same in/out shardings), without donation (tests reuse their states)."""
  return steps.jit_train_step(model, tx, schedule, config.train, state_shardings, mesh, donate=False)


@contextlib.contextmanager
def absl_flags_parsed(parsed: bool):
  """grain's worker processes read absl flags, which an absl app would have parsed."""
  was_parsed = flags.FLAGS.is_parsed()
  _set_absl_flags_parsed(parsed)
  try:
    yield
  finally:
    _set_absl_flags_parsed(was_parsed)


def _set_absl_flags_parsed(parsed: bool):
  if parsed:
    flags.FLAGS.mark_as_parsed()
  else:
    flags.FLAGS.unparse_flags()


def tokens(seed, shape, lengths=None, vocab=40):
  """Random token ids in [4, vocab), [batch, length]; row i is padding (0) from lengths[i] on."""
  rng = np.random.default_rng(seed)
  x = rng.integers(4, vocab, size=shape).astype(np.int32)
  if lengths is not None:
    x[np.arange(shape[1])[None] >= np.array(lengths)[:, None]] = 0
  return jnp.asarray(x)


class JitModel:
  """The model of a ModelConfig with `apply` jitted: tests then compile once instead of dispatching op by op."""

  def __init__(self, cfg):
    self.module = make_model(cfg)
    self.apply = jax.jit(self.module.apply, static_argnames=('method', 'mutable', 'deterministic', 'decode'))


def equations(jaxpr):
  """Every equation of a jaxpr, those of its inner jaxprs (jit, custom_vjp, scan bodies) included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from equations(sub)


def init_model(cfg, **inputs):
  """(JitModel, unboxed params) of a ModelConfig, initialised on `inputs` (the model's keyword arguments)."""
  model = JitModel(cfg)
  params = nn.unbox(jax.jit(model.module.init)(jax.random.key(0), **inputs)['params'])
  return model, params


def fast_tier(cases, fast) -> list:
  """`cases` as pytest parameters, each one not in `fast` marked slow: the fast tier (`-m "not slow"`, which CI also
  runs on the newer jax line) checks a test on the cases it names, the whole suite on every case. A case is a value,
  or a tuple of values for several argument names."""
  fast = set(fast)
  unknown = fast - set(cases)
  assert not unknown, f'fast-tier cases {sorted(unknown)} are not among {list(cases)}'
  return [case if case in fast else pytest.param(*(case if isinstance(case, tuple) else (case,)),
                                                 marks=pytest.mark.slow) for case in cases]


def model_variants(base) -> dict:
  """The decoder options every model test runs over, applied to a ModelConfig: norm and positions, untied
  embeddings, the three attention implementations, scanned layers."""
  return {
      'post_sinusoidal': base,
      'pre_learned_unshared': base.replace(norm='pre', positional='learned', share_embeddings=False),
      'chunked': base.replace(attention='chunked', attention_chunk_size=4),
      'dot_product': base.replace(attention='dot_product'),
      'scanned': base.replace(scan_layers=True),
  }


# The seeded runs (conftest's `seeded_runs`) train as the README's smoke test, `train.py --config=SMOKE_CONFIG`: 2+2
# layers of width 64, 300 steps, the final model the average of the last two checkpoints. Their final reports decode
# as the tests that use them do, greedily up to 4 tokens past each input (SEEDED_DECODE): test BLEU far from both 0
# and 100 on 200 sentences.
SMOKE_CONFIG = f'{DEFAULT_CONFIG}:smoke'
SEEDED_DECODE = ('--config.decode.beam_size=1', '--config.decode.max_len_offset=4')


def smoke_config() -> ml_collections.ConfigDict:
  return config_lib.load(SMOKE_CONFIG)


# The fork server of `EntryPoints`: imports what every entry point imports, then forks a child per request that
# runs the entry point as `python ARGS` would (argv, sys.path, __main__, standard streams on the given files, exit
# status), `python -c CODE ARGS` included, under a file-size limit if the request gives one.
_FORK_SERVER = r'''
import json, os, resource, runpy, signal, sys
from absl import app  # noqa: F401  (the libraries the entry points import, loaded once for every fork)
from transformer_jax import cli, config  # noqa: F401
from transformer_jax.config import mesh as mesh_section
from transformer_jax.evaluation import scores  # noqa: F401
from transformer_jax.inference import restoring  # noqa: F401
from transformer_jax.jobs import scoring, trainer  # noqa: F401
scores.moses_tokenize('Warm.', 'de')  # sacremoses compiles its regexes on first use: once here, not per run
def requests():
  pending = b''
  while chunk := os.read(0, 1 << 16):
    pending += chunk
    while b'\n' in pending:
      line, pending = pending.split(b'\n', 1)
      yield json.loads(line)
for request in requests():
  pid = os.fork()
  if pid:
    os.write(1, b'%d\n' % pid)
    os.write(1, b'%d\n' % os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    continue
  if request.get('limit_file_size') is not None:  # writes past it fail (EFBIG) instead of killing the process
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (request['limit_file_size'],) * 2)
  for fd, (path, mode) in enumerate(request['files']):
    opened = os.open(path, mode)
    os.dup2(opened, fd)
    os.close(opened)
  sys.stdin = sys.__stdin__ = open(0, encoding='utf-8', closefd=False)
  args = request['args']
  if args[0] == '-m':
    sys.argv = args[1:]
    runpy.run_module(args[1], run_name='__main__', alter_sys=True)
  elif args[0] == '-c':
    sys.argv, sys.path[0] = ['-c', *args[2:]], ''
    exec(compile(args[1], '<string>', 'exec'), {'__name__': '__main__'})
  else:
    sys.argv, sys.path[0] = args, os.path.dirname(os.path.abspath(args[0]))
    runpy.run_path(args[0], run_name='__main__')
  sys.exit(0)
'''


class EntryPoints:
  """Runs entry points (`python ARGS` in the repository) in processes forked from one that has imported their
  libraries: each run is a fresh process as far as the entry point can tell, without its seconds of imports."""

  def __init__(self, directory: str):
    self._directory, self._count, self._running = directory, 0, None
    self._server = subprocess.Popen([sys.executable, '-c', _FORK_SERVER], cwd=REPO, env=subprocess_env(),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)

  def run(self, args: list[str], stdin=None, text: bool = False, timeout: float = 300):
    """`subprocess.run([python, *args], input=stdin, capture_output=True, text=text, timeout=timeout)`'s result,
    from a fork (a run past the timeout is killed and fails the test)."""
    self._count += 1
    paths = [os.path.join(self._directory, f'{self._count}.{name}') for name in ('in', 'out', 'err')]
    with open(paths[0], 'w' if text else 'wb') as f:
      f.write(stdin or ('' if text else b''))
    files = [(paths[0], os.O_RDONLY)] + [(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) for path in paths[1:]]
    self.start(args, files)
    finished = self.wait(timeout)
    if finished is None:
      self._kill_running()
      raise AssertionError(f'python {" ".join(args)} ran past {timeout} s')
    outputs = []
    for path in paths[1:]:
      with open(path, 'r' if text else 'rb') as f:
        outputs.append(f.read())
    return subprocess.CompletedProcess([sys.executable, *args], finished, *outputs)

  def start(self, args: list[str], files: list[tuple[str, int]], limit_file_size: int | None = None) -> int:
    """The pid of `python ARGS` forked with its standard streams on `files` ((path, os.open flags) for 0, 1, 2),
    running until `wait`: one run at a time per server."""
    if self._running is not None:  # left running by a failed test: killed, so that the server takes requests again
      self._kill_running()
    request = {'args': args, 'files': files, 'limit_file_size': limit_file_size}
    self._server.stdin.write(json.dumps(request).encode() + b'\n')
    self._running = int(self._line(60))
    return self._running

  def wait(self, timeout: float) -> int | None:
    """The started run's exit status (negative: the signal that ended it), None if it has not ended in `timeout` s."""
    if not (finished := self._line(timeout)):
      return None
    self._running = None
    return int(finished)

  def _kill_running(self) -> None:
    """Kills the started run and reads its exit status, so that the server takes the next request."""
    os.kill(self._running, signal.SIGKILL)
    self.wait(60)

  def _line(self, timeout: float) -> bytes:
    """The server's next line, b'' if none came within `timeout` seconds."""
    ready, _, _ = select.select([self._server.stdout], [], [], timeout)
    if ready and not (line := self._server.stdout.readline()):
      raise AssertionError(f'the entry-point fork server stopped (exit status {self._server.wait()})')
    return line if ready else b''

  def close(self):
    self._server.stdin.close()
    self._server.wait(timeout=60)


def small_step_loss_and_grad_norm(**model) -> np.ndarray:
  """[loss, gradient norm] of one train step as the trainer runs it (`run_builder`, lowered, compiled and called on
  one device) for a 1+1-layer model of width 32 with the `model` settings, on a fixed random batch of 4 × 24."""
  rng = np.random.default_rng(3)
  host_batch = {'inputs': rng.integers(3, 64, (4, 24), dtype=np.int32),
                'targets': rng.integers(3, 64, (4, 24), dtype=np.int32)}
  config = config_lib.base_config()
  config.model.update(vocab_size=64, d_model=32, d_ff=64, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                      max_len=32, **model)
  run = run_builder.build(config, jax.devices()[:1])
  state, batch = run.initial_state(), sharding.place_batch(host_batch, run.mesh)
  with run.activate():
    _, metrics = run.train_step.lower(state, batch).compile()(state, batch)
  return np.array([metrics['loss'], metrics['grad_norm']])
