"""Training throughput of our jitted train step against `torch.nn.Transformer` (eager or compiled), same sizes.

Models (--models): `default` (model of configs/default.py; batch and lengths of its pipeline: 32 rows × 64 tokens),
`base` (6+6 layers, d_model 512, d_ff 2048, 8 heads, dropout 0.1) and `big` (6+6 layers, d_model 1024, d_ff 4096,
16 heads, dropout 0.3), vocab 32000, 32 rows × 64 source and 64 target tokens; float32, Adam(0.9, 0.98, 1e-9),
label smoothing 0.1, a fixed random batch without padding.

Our model's keys change as train.py's do, `--config.model.KEY=VALUE` (e.g. `--config.model.attention=dot_product`),
for every model of --models.

ours:  the run as the trainer builds it (run_builder.build: sharded initial state, jitted train step with donated
       state) on one device; `ours_stock` forces model.cpu_kernels=off, `ours_cpu_kernels` forces it on (the
       default, 'auto', is on only when the device is a CPU); `ours_variant` is ours with the model changes of
       `--variant.model.KEY=VALUE` on top and --variant_xla_options' compiler options, an A/B timed in the same
       rounds as `ours`.
torch: torch.nn.Transformer(batch_first=True, dropout as ours) + a token embedding shared with the output layer
       (×√d_model), sinusoidal positions, causal target mask, cross_entropy(label_smoothing=0.1),
       torch.optim.Adam(betas=(0.9, 0.98), eps=1e-9), eager, torch.set_num_threads(--threads);
       `torch_compile`: the same model through torch.compile.

Both run with glibc keeping freed memory for reuse (`--malloc=reuse`, as train.py does; `--malloc=system` for
glibc's defaults), each step's user/system CPU time and page faults recorded.

After compile/warm-up the runners take turns: `--rounds` rounds of `--steps` steps each, every step timed on its
own (waiting for its results), or with `--pipelined` dispatched back to back as the trainer runs them (one
sample per round: its mean step); we report the median step time, tokens/s (target tokens = rows × target length,
and source + target) and achieved GFLOP/s (metrics.train_flops, the same count for both).

--gpu_paper_batch: the paper's batch (~25k source + 25k target tokens, --paper_rows × --paper_length) in
bfloat16 on the first GPU: ours with bf16 compute (float32 params and Adam state) and 'dot_product' attention
(cuDNN's fused kernel), torch on CUDA under bf16 autocast (float32 params, fused Adam); adds MFU against the
device's dense bf16 peak (metrics.peak_flops_per_device) and peak device memory.

Examples (repository root): python -m bench.train_throughput --models=default,base --rounds=3 --steps=3
  python -m bench.train_throughput --gpu_paper_batch --models=base,big --impls=ours,torch,torch_compile
  python -m bench.train_throughput --models=base --impls=ours,ours_variant --config.model.attention_dropout=0.1 \
      --variant.model.attention=chunked
"""

import math
import os
import resource
import time
import types

from absl import app
from absl import flags
import ml_collections

from bench import common
from transformer_jax import cli
from transformer_jax.config import model as model_section
from transformer_jax.runtime import host_memory

MODELS = ('default', 'base', 'big')


def model_dims(name: str, args):
  """(ModelConfig, batch rows, source length, target length) of a named model, with `args.model_changes`."""
  from transformer_jax.config.model import ModelConfig  # pylint: disable=import-outside-toplevel
  if name == 'default':
    from configs import default  # pylint: disable=import-outside-toplevel
    config = default.get_config()
    cfg = ModelConfig.from_dict(config.model)
    rows, length = config.pipeline.batch_size, config.pipeline.packed_length
  elif name in ('base', 'big'):
    cfg = ModelConfig(vocab_size=32000, d_model=512, d_ff=2048, num_heads=8, num_encoder_layers=6,
                      num_decoder_layers=6, dropout=0.1)
    if name == 'big':
      cfg = cfg.replace(d_model=1024, d_ff=4096, num_heads=16, dropout=0.3)
    rows, length = 32, 64
  else:
    raise SystemExit(f'--models: unknown {name!r}; use some of {MODELS}')
  rows = args.rows or rows
  source_len, target_len = args.source_len or length, args.target_len or length
  cfg = cfg.replace(max_len=max(cfg.max_len, source_len, target_len), **args.model_changes)
  return cfg, rows, source_len, target_len


def model_changes(overrides: dict) -> dict:
  """ModelConfig changes from the `model.KEY` overrides of an overrides flag (`cli.overrides`)."""
  return {key.removeprefix('model.'): value for key, value in overrides.items()}


def parse_xla_options(text: str) -> dict:
  """'xla_gpu_dot_merger_threshold_mb=0,xla_llvm_disable_expensive_passes=True' -> compiler options (ints, floats
  and True/False parsed): XLA's names, not config keys."""
  out = {}
  for item in filter(None, (x.strip() for x in text.split(','))):
    key, value = item.split('=', 1)
    for cast in ({'True': True, 'False': False}.__getitem__, int, float):
      try:
        value = cast(value)
        break
      except (KeyError, ValueError):
        pass
    out[key] = value
  return out


def random_batch(rows, source_len, target_len, vocab, seed=0):
  """Token ids in [3, vocab): no padding (0) and none of the reserved ids."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  return {'inputs': rng.integers(3, vocab, (rows, source_len), dtype=np.int32),
          'targets': rng.integers(3, vocab, (rows, target_len), dtype=np.int32)}


# ------------------------------------------------------------------------------------------------ ours (JAX)

class Ours:
  """Our train step; `cpu_kernels` ('on'/'off') overrides the config's choice of the XLA:CPU backward passes
  (`kernels/cpu/projections.py`; 'off': the stock pieces that run on a GPU or TPU)."""

  NAMES = {None: 'ours', 'off': 'ours_stock', 'on': 'ours_cpu_kernels'}

  def __init__(self, cfg, host_batch, seed=0, cpu_kernels=None, name=None, compiler_options=None):
    self.name = name or self.NAMES[cpu_kernels]
    cfg = cfg.replace(cpu_kernels=cpu_kernels) if cpu_kernels else cfg
    self.cfg = cfg  # the model it trains (its record's attention, remat, dtype and FLOPs)
    import jax  # pylint: disable=import-outside-toplevel
    from transformer_jax import config as config_lib  # pylint: disable=import-outside-toplevel
    from transformer_jax.training import run_builder  # pylint: disable=import-outside-toplevel
    from transformer_jax.runtime import sharding, xla_options  # pylint: disable=import-outside-toplevel

    config = config_lib.base_config()  # the paper's schedule, Adam(0.9, 0.98, 1e-9) and smoothing 0.1
    config.model.update(cfg.section())
    config.train.seed = seed
    run = run_builder.build(config, jax.devices()[:1])  # as the trainer builds it, on one device
    # what the step is compiled with: the mesh's (steps.train_step), then `compiler_options` added
    self.xla_options = {**xla_options.for_mesh(run.mesh), **(compiler_options or {})}
    self.state, self.batch = run.initial_state(), sharding.place_batch(host_batch, run.mesh)
    self._context = run.activate
    start = time.perf_counter()
    with self._context():
      self.compiled = run.train_step.lower(self.state, self.batch).compile(compiler_options or None)
    self.compile_s = time.perf_counter() - start
    self._jax = jax

  def step(self):
    """Dispatches one training step; returns its loss sum, a device value (`float` of it waits for the step)."""
    with self._context():
      self.state, metrics = self.compiled(self.state, self.batch)
    return metrics['loss']

  def reset_peak(self):
    pass  # memory() is the compiled program's, not a reading

  def memory(self) -> dict:
    m = self.compiled.memory_analysis()
    return {'temp_bytes': m.temp_size_in_bytes, 'argument_bytes': m.argument_size_in_bytes,
            'output_bytes': m.output_size_in_bytes, 'alias_bytes': m.alias_size_in_bytes}

  def profile(self, folder: str, steps: int):
    """The compiled step's optimized HLO (`step.hlo.txt`) and a jax.profiler trace of `steps` steps (with a
    Perfetto trace), under `folder`: bench.step_profile joins the two into time per part of the model."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'step.hlo.txt'), 'w') as f:
      f.write(self.compiled.as_text())
    options = self._jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # device kernels and XLA's host ops only: a small trace
    with self._jax.profiler.trace(folder, create_perfetto_trace=True, profiler_options=options):
      for _ in range(steps):
        float(self.step())

  def release(self):
    self.state = self.batch = self.compiled = None


# ---------------------------------------------------------------------------------------------------- torch

class Torch:
  """torch.nn.Transformer's train step; on CUDA under bf16 autocast (float32 params) with fused Adam, and
  `compiled` through torch.compile (compile_s: its first step, taken when it is made)."""

  def __init__(self, cfg, host_batch, threads, seed=0, device='cpu', compiled=False):
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel
    self.name = 'torch_compile' if compiled else 'torch'
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    d, vocab = cfg.d_model, cfg.vocab_size

    class Model(nn.Module):
      def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        nn.init.normal_(self.embedding.weight, std=d ** -0.5)
        self.transformer = nn.Transformer(d, cfg.num_heads, cfg.num_encoder_layers, cfg.num_decoder_layers,
                                          cfg.d_ff, dropout=cfg.dropout, batch_first=True)
        self.dropout = nn.Dropout(cfg.dropout)
        length = max(host_batch['inputs'].shape[1], host_batch['targets'].shape[1])
        position = torch.arange(length, dtype=torch.float32)[:, None]
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        pe = torch.stack([torch.sin(position * inv_freq), torch.cos(position * inv_freq)], -1).reshape(length, d)
        self.register_buffer('pe', pe)

      def embed(self, tokens):
        return self.dropout(self.embedding(tokens) * math.sqrt(d) + self.pe[:tokens.shape[1]])

      def forward(self, src, tgt_in, tgt_mask):
        y = self.transformer(self.embed(src), self.embed(tgt_in), tgt_mask=tgt_mask, tgt_is_causal=True)
        return nn.functional.linear(y, self.embedding.weight)

    self.torch = torch
    self.device = torch.device(device)
    self.model = Model().to(self.device).train()
    self.forward = torch.compile(self.model) if compiled else self.model
    self.src = torch.from_numpy(host_batch['inputs']).long().to(self.device)
    self.tgt = torch.from_numpy(host_batch['targets']).long().to(self.device)
    self.tgt_in = torch.cat([torch.ones_like(self.tgt[:, :1]), self.tgt[:, :-1]], 1)  # BOS = 1, shifted right
    self.tgt_mask = nn.Transformer.generate_square_subsequent_mask(self.tgt.shape[1], device=self.device)
    on_gpu = self.device.type == 'cuda'
    self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=on_gpu)
    self.autocast = lambda: torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=on_gpu)
    self.vocab = vocab
    self.compile_s = 0.0
    if compiled:  # torch.compile compiles on the first call
      start = time.perf_counter()
      float(self.step())
      self.compile_s = time.perf_counter() - start

  def step(self):
    """Queues one training step; returns its loss, a device tensor (`float` of it waits for the step)."""
    self.opt.zero_grad(set_to_none=True)
    with self.autocast():
      logits = self.forward(self.src, self.tgt_in, self.tgt_mask)
      loss = self.torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab).float(), self.tgt.reshape(-1),
                                                    label_smoothing=0.1)
    loss.backward()
    self.opt.step()
    return loss.detach()

  def reset_peak(self):
    if self.device.type == 'cuda':
      self.torch.cuda.reset_peak_memory_stats(self.device)

  def memory(self) -> dict:
    """Peak CUDA memory since `reset_peak` (the other torch runner's resident state included); nothing on a CPU."""
    if self.device.type != 'cuda':
      return {}
    return {'peak_device_bytes': self.torch.cuda.max_memory_allocated(self.device)}

  def release(self):
    self.model = self.forward = self.opt = None


# ----------------------------------------------------------------------------------------------------- main

def measure(runners, rounds, steps, warmup, pipelined=False):
  """Warm-up steps (each runner's memory read after its own), then rounds in which every runner takes `steps`
  steps in turn, each timed on its own, or (`pipelined`) dispatched back to back and timed together, one sample
  per round of the round's mean step. Returns step times, CPU times and memory by runner name."""
  times = {r.name: [] for r in runners}
  cpu_times = {r.name: [] for r in runners}  # user + system seconds of all threads
  memory = {}
  for r in runners:
    r.reset_peak()
    for _ in range(warmup):
      float(r.step())
    memory[r.name] = r.memory()
  count = steps if pipelined else 1  # steps per timing
  for _ in range(rounds):
    for r in runners:
      for _ in range(steps // count):
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        float([r.step() for _ in range(count)][-1])  # waits for the last step, and so for all before it
        times[r.name].append((time.perf_counter() - start) / count)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu_times[r.name].append({'user': (after.ru_utime - before.ru_utime) / count,
                                  'sys': (after.ru_stime - before.ru_stime) / count,
                                  'faults': (after.ru_minflt - before.ru_minflt) / count})
  return times, cpu_times, memory


def throughput_record(name, model_name, cfg, rows, source_len, target_len, step_times, cpu_times, extra=None):
  from transformer_jax.training import metrics  # pylint: disable=import-outside-toplevel
  t = common.median(step_times)
  flops = metrics.train_flops(cfg, rows, source_len, target_len)
  record = {'model': model_name, 'impl': name, 'rows': rows, 'source_len': source_len, 'target_len': target_len,
            'step_s': t, 'step_times_s': [round(x, 4) for x in step_times],
            # process CPU time (all threads): less load-sensitive; sys time and page faults show fresh memory
            'cpu_s_per_step': common.median([c['user'] + c['sys'] for c in cpu_times]),
            'sys_s_per_step': common.median([c['sys'] for c in cpu_times]),
            'page_faults_per_step': common.median([c['faults'] for c in cpu_times]),
            'target_tokens_per_s': rows * target_len / t, 'all_tokens_per_s': rows * (source_len + target_len) / t,
            'train_gflops_per_step': flops / 1e9, 'gflops_per_s': flops / t / 1e9}
  record.update(extra or {})
  return record


def make_runners(impls, cfg, host_batch, args, device):
  """The runners `impls` names, in that order."""
  makers = {'ours': lambda: Ours(cfg, host_batch),
            'ours_stock': lambda: Ours(cfg, host_batch, cpu_kernels='off'),
            'ours_cpu_kernels': lambda: Ours(cfg, host_batch, cpu_kernels='on'),
            'ours_variant': lambda: Ours(cfg.replace(**args.variant_changes), host_batch, name='ours_variant',
                                         compiler_options=args.variant_xla_options),
            'torch': lambda: Torch(cfg, host_batch, args.threads, device=device),
            'torch_compile': lambda: Torch(cfg, host_batch, args.threads, device=device, compiled=True)}
  unknown = [name for name in impls if name not in makers]
  if unknown:
    raise SystemExit(f'--impls: unknown {unknown}; use some of {sorted(makers)}')
  return [makers[name]() for name in impls]


def run(args):
  """Every model: the implementations side by side (alternating rounds), a JSON line each, then one table."""
  import jax  # pylint: disable=import-outside-toplevel
  from transformer_jax.training import metrics  # pylint: disable=import-outside-toplevel
  impls = args.impls
  if (args.variant_changes or args.variant_xla_options) and 'ours_variant' not in impls:
    raise SystemExit('--variant.model.* / --variant_xla_options change ours_variant only: add it to --impls')
  if args.gpu_paper_batch and jax.default_backend() != 'gpu':
    raise SystemExit(f'--gpu_paper_batch needs a GPU; JAX runs on {jax.default_backend()!r} here')
  device = jax.devices()[0]
  peak = metrics.peak_flops_per_device(device) if args.gpu_paper_batch else None
  info = common.machine()
  info.update(backend=jax.default_backend(), device=device.device_kind, jax=jax.__version__,
              xla_flags=os.environ.get('XLA_FLAGS', ''), prng_impl=str(jax.config.jax_default_prng_impl))
  if any(name.startswith('torch') for name in impls):
    import torch  # pylint: disable=import-outside-toplevel
    info.update(torch=torch.__version__, torch_threads=args.threads)
  if args.gpu_paper_batch:
    args.rows, args.source_len, args.target_len = args.paper_rows, args.paper_length, args.paper_length
    args.model_changes = {'dtype': 'bfloat16', 'attention': 'dot_product', **args.model_changes}
  common.emit({'bench': 'train_throughput', 'gpu_paper_batch': args.gpu_paper_batch, 'machine': info,
               'model_changes': args.model_changes, 'malloc': args.malloc, 'pipelined': args.pipelined})
  baseline = next((name for name in ('torch_compile', 'torch') if name in impls), None)  # of '× torch'
  table, variants = [], []
  for model_name in args.models:
    cfg, rows, source_len, target_len = model_dims(model_name, args)
    host_batch = random_batch(rows, source_len, target_len, cfg.vocab_size)
    runners = make_runners(impls, cfg, host_batch, args, 'cuda' if args.gpu_paper_batch else 'cpu')
    times, cpu_times, memory = measure(runners, args.rounds, args.steps, args.warmup, args.pipelined)
    if args.profile_dir:
      for r in runners:
        if isinstance(r, Ours):
          r.profile(os.path.join(args.profile_dir, f'{model_name}_{r.name}'), args.profile_steps)
    records = {}
    for r in runners:
      model = r.cfg if isinstance(r, Ours) else cfg
      extra = {'compile_s': r.compile_s, 'attention': model.attention, 'remat': model.remat, 'dtype': model.dtype,
               **memory[r.name], **({'xla_options': r.xla_options} if isinstance(r, Ours) else {})}
      records[r.name] = record = throughput_record(r.name, model_name, model, rows, source_len, target_len,
                                                   times[r.name], cpu_times[r.name], extra)
      if peak:
        record['mfu'] = record['gflops_per_s'] * 1e9 / peak
      common.emit(record)
      r.release()
    ratios = {}
    for name in records:
      if baseline and not name.startswith('torch'):
        ratios[name] = records[name]['target_tokens_per_s'] / records[baseline]['target_tokens_per_s']
        common.emit({'model': model_name, f'{name}_over_{baseline}_tokens_per_s': ratios[name]})
    if 'ours' in records and 'ours_variant' in records:  # the A/B, from the same rounds
      variant = records['ours_variant']['target_tokens_per_s'] / records['ours']['target_tokens_per_s']
      common.emit({'model': model_name, 'ours_variant_over_ours_tokens_per_s': variant,
                   'variant_changes': args.variant_changes, 'variant_xla_options': args.variant_xla_options})
      changes = ', '.join(f'{k}={v}' for k, v in {**args.variant_changes, **args.variant_xla_options}.items())
      variants.append(f'{model_name}: ours_variant {variant:.3f}× ours (tokens/s; {changes})')
    for name, rec in records.items():
      table.append([model_name, name, f'{rows}×{source_len}+{target_len}', rec['step_s'] * 1e3,
                    rec['cpu_s_per_step'], rec['target_tokens_per_s'], rec['all_tokens_per_s'],
                    rec['gflops_per_s'], f"{100 * rec['mfu']:.1f}%" if 'mfu' in rec else '',
                    f'{ratios[name]:.2f}' if name in ratios else ''])
    del runners
  print()
  print(common.markdown_table(['model', 'impl', 'batch (rows×src+tgt)', 'step ms', 'CPU s/step', 'target tok/s',
                               'src+tgt tok/s', 'GFLOP/s', 'MFU', '× torch tok/s'], table))
  if baseline:
    print(f'× torch: target tokens/s against {baseline}')
  for line in variants:
    print(line)


def main():
  """The command: its flags are defined here, when it runs (not when a test imports the module)."""
  template = ml_collections.ConfigDict({'model': model_section.default_config()})
  cli.define_config_overrides_flag(template, "Our model's changes, as train.py takes them: --config.model.KEY=VALUE.")
  cli.define_config_overrides_flag(template, "ours_variant's model changes on top of ours': --variant.model.KEY=VALUE.",
                                   name='variant')
  models = flags.DEFINE_list('models', 'default,base', f'Some of {MODELS}.')
  impls = flags.DEFINE_list(
      'impls', 'ours,torch', "Some of 'ours', 'ours_stock' / 'ours_cpu_kernels' (model.cpu_kernels off / on), "
      "'ours_variant' (--variant.model.*, --variant_xla_options), 'torch', 'torch_compile'.")
  rounds = flags.DEFINE_integer('rounds', 3, 'Rounds in which every implementation takes its steps in turn.',
                                lower_bound=1)
  steps = flags.DEFINE_integer('steps', 3, 'Timed steps per implementation per round.', lower_bound=1)
  warmup = flags.DEFINE_integer('warmup', 2, 'Untimed steps per implementation after compiling.', lower_bound=0)
  pipelined = flags.DEFINE_bool(
      'pipelined', False, "Dispatch each round's steps back to back and wait once, as the trainer keeps steps in "
      "flight (train.max_steps_ahead): the host's dispatch overlaps the device's work.")
  threads = flags.DEFINE_integer('threads', 2, 'torch.set_num_threads.', lower_bound=1)
  rows = flags.DEFINE_integer('rows', 0, "Batch rows (0: the model's).", lower_bound=0)
  source_len = flags.DEFINE_integer('source_len', 0, "Source tokens per row (0: the model's).", lower_bound=0)
  target_len = flags.DEFINE_integer('target_len', 0, "Target tokens per row (0: the model's).", lower_bound=0)
  xla_flags = flags.DEFINE_string('xla_flags', None, 'XLA_FLAGS for this run (set before JAX starts).')
  variant_xla_options = flags.DEFINE_string(
      'variant_xla_options', '', "Compiler options ours_variant's step adds to ours' (XLA's names, comma-separated), "
      'e.g. xla_gpu_dot_merger_threshold_mb=0.')
  malloc = flags.DEFINE_enum(
      'malloc', 'reuse', ['system', 'reuse'], "'reuse' (what train.py --host_memory=auto does on a CPU): glibc keeps "
      "freed memory (host_memory.reuse_host_memory), for ours and torch alike; 'system': glibc's defaults.")
  gpu_paper_batch = flags.DEFINE_bool(
      'gpu_paper_batch', False, "On the first GPU: the paper's batch, bf16 (ours: bf16 compute; torch: CUDA, bf16 "
      'autocast), MFU.')
  paper_rows = flags.DEFINE_integer('paper_rows', 196, '--gpu_paper_batch rows (196 × 128 ≈ 25k tokens).',
                                    lower_bound=1)
  paper_length = flags.DEFINE_integer('paper_length', 128, '--gpu_paper_batch source and target length.',
                                      lower_bound=1)
  profile_dir = flags.DEFINE_string(
      'profile_dir', '', "After the timed rounds, each of our runners' optimized HLO and a profile of "
      '--profile_steps steps under <this>/<model>_<impl> (read it with bench.step_profile).')
  profile_steps = flags.DEFINE_integer('profile_steps', 3, 'Steps in the profile.', lower_bound=1)
  flags.register_validator('models', lambda names: names and set(names) <= set(MODELS),
                           message=f'name some of {MODELS}, comma-separated.')

  def start(argv):
    if len(argv) > 1:
      raise app.UsageError(f'unexpected arguments {argv[1:]}; model changes go in --config.model.KEY=VALUE.')
    if xla_flags.value is not None:
      os.environ['XLA_FLAGS'] = xla_flags.value
    if malloc.value == 'reuse' and not host_memory.reuse_host_memory():
      raise SystemExit('--malloc=reuse needs glibc (mallopt)')
    if gpu_paper_batch.value:  # torch shares the GPU: JAX takes memory as it needs it instead of 75% up front
      os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
    run(types.SimpleNamespace(
        models=models.value, impls=impls.value, rounds=rounds.value, steps=steps.value, warmup=warmup.value,
        pipelined=pipelined.value, threads=threads.value, rows=rows.value, source_len=source_len.value,
        target_len=target_len.value, model_changes=model_changes(cli.overrides()),
        variant_changes=model_changes(cli.overrides('variant')),
        variant_xla_options=parse_xla_options(variant_xla_options.value), malloc=malloc.value,
        gpu_paper_batch=gpu_paper_batch.value, paper_rows=paper_rows.value, paper_length=paper_length.value,
        profile_dir=profile_dir.value, profile_steps=profile_steps.value))

  cli.run(start)


if __name__ == '__main__':
  main()
