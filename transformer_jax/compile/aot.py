"""Compile for a TPU slice or a GPU machine without its chips, and read what the program needs: per-chip HBM,
FLOPs, collectives.

The targets and their compile-only devices are `topologies`'. So a config's train step can be checked against a
slice or a GPU box before one is rented: whether it fits in HBM (and what to change when it does not), which
collectives XLA inserted for the mesh, and a roofline step time; and a GPU's program, the one the GPU itself runs,
can be read on a CPU (bench.step_costs).

python train.py --config=configs/wmt14_ende_big.py:tpu_v4_32 --workdir=DIR --compile_only --topology=v4-32
"""

import contextlib
import dataclasses
import math
import re
import time
from collections.abc import Iterator

import jax
import ml_collections

from transformer_jax.compile import hlo_costs
from transformer_jax.compile import topologies
from transformer_jax.compile.topologies import GiB
from transformer_jax.config import mesh as mesh_section
from transformer_jax.config.platform import Kernels
from transformer_jax.core.errors import MissingDependencyError
from transformer_jax.runtime import concurrent_compiles
from transformer_jax.runtime import progress
from transformer_jax.runtime import sharding
from transformer_jax.training import metrics as metrics_lib
from transformer_jax.training import run_builder


# --- analysis of a compiled program

COLLECTIVES = hlo_costs.COLLECTIVES
_COLLECTIVE_RE = re.compile(r'=\s*(?P<type>.+?)\s+(?P<op>' + '|'.join(COLLECTIVES) + r')(?P<suffix>-start|-done)?\(')


@dataclasses.dataclass(frozen=True)
class Collective:
  count: int = 0
  bytes: int = 0  # per device: the size of each op's result, summed


def parse_collectives(hlo_text: str) -> dict[str, Collective]:
  """Count and result bytes of each collective kind in compiled HLO text.

  Asynchronous pairs count once, at their '-done' (whose result is the op's output). The count is static: a
  collective inside a loop body (e.g. gradient accumulation) counts once however often the loop runs.
  """
  found = {kind: Collective() for kind in COLLECTIVES}
  for match in _COLLECTIVE_RE.finditer(hlo_text):
    if match['suffix'] == '-start':
      continue
    old = found[match['op']]
    found[match['op']] = Collective(old.count + 1, old.bytes + hlo_costs.array_bytes(match['type']))
  return found


def bytes_per_chip(tree) -> int:
  """Bytes one device holds of a tree of ShapeDtypeStructs (or arrays) placed with shardings."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shard = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += math.prod(shard) * jax.numpy.dtype(leaf.dtype).itemsize
  return total


_OOM_RE = re.compile(r'temporaries \(([\d.]+)([KMGT]?)\)')
_UNITS = {'': 1, 'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}


@dataclasses.dataclass(frozen=True)
class Analysis:
  """What one compiled step needs per chip, and a roofline estimate of its time.

  HBM total = arguments + outputs that do not reuse a donated argument + temporaries + generated code (XLA's
  buffer assignment, the same accounting as `memory_analysis()`). `flops` and `bytes_accessed` are XLA's cost
  analysis of the per-chip program, `flops` plus those of the attention kernels that carry no cost estimate
  (`hlo_costs.attention_kernel_flops`; XLA counts them as none); XLA counts a loop's body once, so each further
  run of it (`model.scan_layers`, `train.grad_accum_steps`, XLA's windowed matmuls under FSDP) adds its ops as
  `hlo_costs` costs them (a GPU program compiled without its GPU has no cost analysis: both are then `hlo_costs`'
  sums over its ops). The step time is max(flops / peak, bytes_accessed / HBM bandwidth), a lower bound that
  ignores communication and assumes perfect overlap, and `mfu_bound` the MFU it would allow.

  XLA's bytes count every read and write wherever the buffer lives; a TPU compiler keeps many in on-chip memory
  (CMEM, VMEM), so `hbm_bytes` (`hlo_costs`: only those of arrays laid out in HBM) and `hbm_mfu_bound` (the MFU of
  max(flops / peak, hbm_bytes / HBM bandwidth)) give the HBM side alone, a looser bound for want of the on-chip
  memories' bandwidths.

  XLA refuses to compile a TPU program whose buffers exceed HBM: then `compile_error` holds its message, the
  temporaries are the figure it names, the arguments come from shapes and shardings, and the rest is None.
  """

  topology: str
  num_devices: int  # JAX devices: chips, or a TPU7x's TensorCores (two a chip)
  hbm_capacity: int
  peak_flops: float
  hbm_bandwidth: float
  arguments: dict  # group name -> bytes per chip from shapes and shardings (the last group, 'other', takes the rest)
  argument_bytes: int  # XLA's, layout padding included (from shapes when the compile failed)
  output_bytes: int | None  # outputs not aliased to donated arguments
  temp_bytes: int | None
  code_bytes: int | None
  flops: float | None
  bytes_accessed: float | None
  hbm_bytes: float | None
  collectives: dict | None
  model_flops: float | None
  compile_seconds: float
  compile_error: str | None = None

  @property
  def total_bytes(self) -> int:
    return self.argument_bytes + sum(n or 0 for n in (self.output_bytes, self.temp_bytes, self.code_bytes))

  @property
  def fits(self) -> bool:
    return self.compile_error is None and self.total_bytes <= self.hbm_capacity

  @property
  def compute_seconds(self) -> float | None:
    return None if self.flops is None else self.flops / self.peak_flops

  @property
  def memory_seconds(self) -> float | None:
    return None if self.bytes_accessed is None else self.bytes_accessed / self.hbm_bandwidth

  @property
  def step_seconds(self) -> float | None:
    return None if self.flops is None else max(self.compute_seconds, self.memory_seconds)

  @property
  def bound(self) -> str | None:
    if self.flops is None:
      return None
    return 'compute' if self.compute_seconds >= self.memory_seconds else 'HBM bandwidth'

  @property
  def mfu_bound(self) -> float | None:
    if self.model_flops is None or self.step_seconds is None:
      return None
    return self.model_flops / (self.num_devices * self.peak_flops * self.step_seconds)

  @property
  def hbm_mfu_bound(self) -> float | None:
    if self.model_flops is None or self.flops is None or self.hbm_bytes is None:
      return None
    seconds = max(self.compute_seconds, self.hbm_bytes / self.hbm_bandwidth)
    return self.model_flops / (self.num_devices * self.peak_flops * seconds)

  def as_dict(self) -> dict:
    out = dataclasses.asdict(self)
    if self.collectives is not None:
      out['collectives'] = {k: dataclasses.asdict(v) for k, v in self.collectives.items()}
    out.update(total_bytes=self.total_bytes, fits=self.fits, step_seconds=self.step_seconds, bound=self.bound,
               mfu_bound=self.mfu_bound, hbm_mfu_bound=self.hbm_mfu_bound)
    return out


@contextlib.contextmanager
def compiling_for(devices):
  """Compiles for `devices` (compile-only ones, of a TPU slice or GPU host). Their executables cannot be loaded
  from jax's persistent cache (there is no client to load them into), so none is written to it. On a GPU, jax reads
  cuDNN's version from the library when it lowers cuDNN's fused attention (what `auto` runs without attention
  dropout), which the CUDA plugin alone does not bring: that error says what to do in one line."""
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update('jax_persistent_cache_min_compile_time_secs', math.inf)
  try:
    yield
  except RuntimeError as e:
    if devices[0].platform != 'gpu' or 'cuDNN not found' not in str(e):
      raise
    install = ('pip install nvidia-cudnn-cu13' if topologies.cuda_plugin() == 'jax_cuda13_plugin'
               else 'pip install -r requirements-gpu.txt')
    raise MissingDependencyError(
        f"compiling cuDNN's fused attention for {devices[0].device_kind} needs cuDNN, which is not installed: "
        f'{install}, or set model.attention=flash_gpu') from None
  finally:
    jax.config.update('jax_persistent_cache_min_compile_time_secs', before)


def analyze(lowered, args: tuple, *, topology: str, groups: dict | None = None,
            model_flops: float | None = None) -> Analysis:
  """Compiles `lowered` (a jitted function lowered for `args`, ShapeDtypeStructs with shardings on the topology's
  devices) and reads what it needs; the caller holds `compiling_for` the topology's devices.

  groups: name -> a subtree of `args` whose per-chip bytes to report (e.g. params, optimizer state); whatever
  the groups leave of the argument bytes is reported as 'other'.
  """
  topo = topologies.get_topology(topology)
  arguments = {name: bytes_per_chip(tree) for name, tree in (groups or {}).items()}
  common = dict(topology=topology, num_devices=topo.num_devices, hbm_capacity=topo.chip.hbm_bytes,
                peak_flops=topo.chip.peak_flops, hbm_bandwidth=topo.chip.hbm_bandwidth, model_flops=model_flops)
  start = time.perf_counter()
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    found = _OOM_RE.search(str(e))
    if not str(e).startswith('RESOURCE_EXHAUSTED') or not found:
      raise
    total = bytes_per_chip(args)
    return Analysis(
        **common, arguments=dict(arguments, other=total - sum(arguments.values())), argument_bytes=total,
        output_bytes=None, temp_bytes=int(float(found[1]) * _UNITS[found[2]]), code_bytes=None, flops=None,
        bytes_accessed=None, hbm_bytes=None, collectives=None, compile_seconds=time.perf_counter() - start,
        compile_error=str(e).split('\n')[0])
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  arguments['other'] = memory.argument_size_in_bytes - sum(arguments.values())
  text = compiled.as_text()
  ops = hlo_costs.op_costs(text)
  if cost is None:  # the CUDA plugin's compile-only executables have none: hlo_costs' count of every op and run
    flops, bytes_accessed = sum(op.total_flops for op in ops), sum(op.total_bytes for op in ops)
  else:
    # XLA counts neither custom calls without a cost estimate nor a loop body's further runs (a scan over layers,
    # gradient accumulation, a windowed matmul): those from hlo_costs
    repeats = [op for op in ops if op.count > 1]
    flops = (float(cost.get('flops', 0.0)) + sum(op.total_flops for op in ops if not op.estimated)
             + sum((op.count - 1) * op.flops for op in repeats if op.estimated))
    bytes_accessed = float(cost.get('bytes accessed', 0.0)) + sum((op.count - 1) * op.bytes for op in repeats)
  return Analysis(
      **common, arguments=arguments, argument_bytes=memory.argument_size_in_bytes,
      output_bytes=memory.output_size_in_bytes - memory.alias_size_in_bytes, temp_bytes=memory.temp_size_in_bytes,
      code_bytes=memory.generated_code_size_in_bytes,
      flops=flops, bytes_accessed=bytes_accessed,
      hbm_bytes=sum(op.total_hbm_bytes for op in ops), collectives=parse_collectives(text), compile_seconds=seconds)


# --- the project's train step on a topology

def mesh_presets(num_devices: int) -> dict[str, dict]:
  """Data parallel, FSDP and FSDP × tensor meshes for a device count (tensor 4 from 16, as tpu_v4_32_fsdp_tp)."""
  tensor = 4 if num_devices >= 16 else 2
  return {'data': {'data': num_devices, 'fsdp': 1, 'tensor': 1},
          'fsdp': {'data': 1, 'fsdp': num_devices, 'tensor': 1},
          'fsdp_tensor': {'data': 1, 'fsdp': num_devices // tensor, 'tensor': tensor}}


def set_mesh_shape(config: ml_collections.ConfigDict, shape: dict) -> None:
  """A single-slice mesh; global batches then come in multiples of the data-parallel size (as configs/presets)."""
  config.mesh.shape.update(shape)
  config.mesh.dcn_shape.update({axis: 1 for axis in mesh_section.MESH_AXES})
  config.pipeline.batch_multiple = shape['data'] * shape['fsdp']


@dataclasses.dataclass(frozen=True)
class Program:
  jitted: object
  args: tuple
  groups: dict
  model_flops: float
  mesh: jax.sharding.Mesh
  rules: tuple
  what: str
  kernels: Kernels  # what the model's named ops run in it (`ModelConfig.kernels`)


def run_programs(config: ml_collections.ConfigDict, devices) -> list[Program]:
  """What a run of `config` compiles, with abstract sharded arguments on `devices`, built as the trainer builds
  them (`run_builder.build`): the train step for every batch shape (one per token-budget bucket) and the eval step
  for the widest evaluation batch."""
  with compiling_for(devices):  # tracing the model's initialisation lowers its attention too
    run = run_builder.build(config, devices)
  groups = {'params': run.abstract_state.params, 'optimizer': run.abstract_state.opt_state}
  programs = []
  for shapes in run.train_batch_shapes:
    rows, length = next(iter(shapes.values()))
    programs.append(Program(run.train_step, (run.abstract_state, run.abstract_batch(shapes)), groups,
                            metrics_lib.train_flops(run.model.config, rows, length, length), run.mesh, run.rules,
                            f'train step, batch {rows}×{length}', run.model.config.kernels))
  rows, width = next(iter(run.eval_batch_shape.values()))
  programs.append(Program(run.eval_step, (run.eval_members, run.abstract_batch(run.eval_batch_shape)),
                          {'params': run.abstract_state.params},
                          metrics_lib.train_flops(run.model.config, rows, width, width) / 3, run.mesh, run.rules,
                          f'eval step, batch {rows}×{width}', run.model.config.kernels))
  return programs


def lower(program: Program):
  """`program` lowered under its mesh and logical-axis rules."""
  with sharding.activate(program.mesh, program.rules):
    return program.jitted.lower(*program.args)


def _analysis(program: Program, lowered, topology: str) -> Analysis:
  return analyze(lowered, program.args, topology=topology, groups=program.groups, model_flops=program.model_flops)


def analyze_program(program: Program, topology: str) -> Analysis:
  """`program` lowered, compiled for `topology` and analysed."""
  with compiling_for(program.mesh.devices.flat):
    return _analysis(program, lower(program), topology)


def longest_train_step(config: ml_collections.ConfigDict, topology: str) -> Program:
  """The train step of `config` for its longest batch shape (token budget: the most attention memory) on
  `topology`'s devices (the config's mesh must use its chips)."""
  return _longest_train_step(run_programs(config, topologies.topology_devices(topology)))


def _longest_train_step(programs: list[Program]) -> Program:
  return [p for p in programs if p.what.startswith('train')][-1]


def analyze_train_step(config: ml_collections.ConfigDict, topology: str) -> Analysis:
  """`longest_train_step` compiled for `topology` and analysed."""
  return analyze_program(longest_train_step(config, topology), topology)


def compile_program(program: Program, compiler_options: dict | None = None):
  """The compiled executable of a program, lowered under its mesh and rules (for reading its HLO); XLA's
  `compiler_options` (e.g. xla_dump_to) if given."""
  with compiling_for(program.mesh.devices.flat):
    return lower(program).compile(compiler_options)


def compile_run(programs: list[Program], topology: str) -> Iterator[tuple[str, Analysis]]:
  """Every program of a run (`run_programs` for `topology`'s devices), compiled and each given as soon as it is
  compiled; for train.py's --compile_only. The longest train step compiles first, alone, and the others as many at
  once as the memory its compile took allows (`concurrent_compiles`), as the trainer compiles its batch shapes."""
  first = _longest_train_step(programs)
  ordered = [first] + [p for p in programs if p is not first]
  with compiling_for(first.mesh.devices.flat), progress.Progress(
      f'compiling for {topology}', total=len(programs), unit='programs', memory=True) as compiled:
    for program, analysis in concurrent_compiles.compile_all(
        ordered, lower, lambda program, lowered: _analysis(program, lowered, topology)):
      compiled.advance()
      yield program.what, analysis


def advice(analysis: Analysis, config: ml_collections.ConfigDict) -> str | None:
  """One line naming what to change when the step does not fit; None when it fits.

  Parameters and Adam state taking half the chip or more come first: their gradients and updates (part of the
  temporaries) scale with them, so sharding them is the fix. Otherwise the temporaries are activations.
  """
  if analysis.fits:
    return None
  state = analysis.arguments.get('params', 0) + analysis.arguments.get('optimizer', 0)
  mesh = config.mesh.shape
  sharded = mesh.get('fsdp', 1) * mesh.get('tensor', 1)
  need = f'{analysis.total_bytes / GiB:.1f} GiB per chip > {analysis.hbm_capacity / GiB:.0f} GiB'
  if state >= analysis.hbm_capacity / 2:
    if sharded == 1:
      return (f'{need}, {state / GiB:.1f} GiB of it parameters and optimizer state: shard them with FSDP '
              f'(mesh.shape fsdp={mesh.get("data", 1)}, data=1) instead of replicating them (data parallel).')
    return (f'{need}, {state / GiB:.1f} GiB of it parameters and optimizer state already sharded {sharded} ways: '
            'add tensor parallelism (mesh.shape.tensor) for the wide layers, or use a larger slice.')
  temps = f'{need}, {(analysis.temp_bytes or 0) / GiB:.1f} GiB of it temporaries (activations)'
  if config.model.remat == 'none':
    return f'{temps}: set model.remat=full to recompute activations in the backward pass.'
  budget = 'pipeline.batch_size' if config.pipeline.batching == 'packed' else 'pipeline.tokens_per_batch'
  return (f'{temps} even with model.remat={config.model.remat}: lower {budget} (with train.grad_accum_steps to '
          'keep the batch), or add tensor parallelism (mesh.shape.tensor) to split the wide layers.')


# --- report

def _gib(n: float) -> str:
  return f'{n / GiB:.2f}'


def summary(analysis: Analysis, config: ml_collections.ConfigDict | None = None) -> str:
  """A human-readable report of one analysis."""
  a = analysis
  parts = [('outputs', a.output_bytes), ('temporaries', a.temp_bytes), ('code', a.code_bytes)]
  lines = [f'{a.topology}: {a.num_devices} devices, {_gib(a.hbm_capacity)} GiB HBM each; compiled in '
           f'{a.compile_seconds:.0f}s',
           'per device (GiB): ' + ', '.join(f'{k} {_gib(v)}' for k, v in a.arguments.items()) + '; '
           + ', '.join(f'{k} {_gib(v)}' for k, v in parts if v is not None)
           + f'; total {_gib(a.total_bytes)} = {100 * a.total_bytes / a.hbm_capacity:.0f}% of HBM: '
           + ('fits' if a.fits else 'does NOT fit')]
  if a.compile_error:
    lines.append(f'XLA: {a.compile_error}')
  else:
    lines += ['collectives per step: ' + (', '.join(f'{k} ×{c.count} ({c.bytes / 2**20:.0f} MiB)'
                                                   for k, c in a.collectives.items() if c.count) or 'none'),
              f'{a.flops / 1e12:.2f} TFLOP and {a.bytes_accessed / 1e9:.1f} GB accessed per device: roofline step '
              f'{1e3 * a.step_seconds:.1f} ms ({a.bound} bound)'
              + (f', MFU at most {100 * a.mfu_bound:.0f}%' if a.mfu_bound is not None else '')]
    if a.hbm_bytes < a.bytes_accessed:  # a TPU's on-chip memories (a GPU program's arrays are all in HBM)
      lines.append(f'{a.hbm_bytes / 1e9:.1f} GB of them to and from HBM (the rest in on-chip memory)'
                   + (f': MFU at most {100 * a.hbm_mfu_bound:.0f}% by HBM traffic alone'
                      if a.hbm_mfu_bound is not None else ''))
  hint = advice(a, config) if config is not None else None
  if hint:
    lines.append('advice: ' + hint)
  return '\n'.join(lines)
