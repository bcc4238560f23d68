"""Compile for a TPU slice or a GPU machine without its chips, and read what the program needs: per-chip HBM,
FLOPs, collectives.

libtpu compiles for a named TPU topology on any machine, and the CUDA plugin (jax-cuda12-plugin; with jax 0.11 also
jax-cuda13-plugin) for a GPU described by a target config (`gpu_target_config`), both through
`jax.experimental.topologies`' compile-only devices. So a config's train step can be checked against a slice or a
GPU box before one is rented: whether it fits in HBM (and what to change when it does not), which collectives XLA
inserted for the mesh, and a roofline step time; and the H100's program, the one a lent H100 runs, can be read on a
CPU (bench.step_costs).

python train.py --config=configs/wmt14_ende_big.py:tpu_v4_32 --workdir=DIR --compile_only --topology=v4-32
"""

import contextlib
import dataclasses
import functools
import importlib.util
import math
import os
import re
import time
from collections.abc import Iterator

import jax
import ml_collections

from transformer_jax import concurrent_compiles
from transformer_jax import hlo_costs
from transformer_jax import metrics as metrics_lib
from transformer_jax import run_builder
from transformer_jax import sharding
from transformer_jax.errors import MissingDependencyError
from transformer_jax.sections import mesh as mesh_section

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class GpuDevice:
  """What XLA's GPU compiler needs to know of a GPU it has not got (GpuTargetConfigProto's gpu_device_info, the
  fields that differ between generations; the rest are the same on every NVIDIA GPU since Volta)."""

  compute_capability: tuple[int, int]
  core_count: int  # streaming multiprocessors
  fpus_per_core: int  # FP32 lanes per SM
  clock_rate_ghz: float  # boost clock
  shared_memory_per_core: int  # bytes per SM
  shared_memory_per_block_optin: int
  l2_cache_size: int


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU or GPU generation's chip, with its maker's published figures (peak FLOP/s: metrics.PEAK_BF16_FLOPS).

  A TPU chip carries libtpu's names for it; a GPU its `GpuDevice`."""

  device_kind: str  # jax's Device.device_kind
  hbm_bytes: int
  hbm_bandwidth: float  # bytes/s
  libtpu_prefix: str = ''  # libtpu's topology names are '<prefix>:<shape>', e.g. 'v4:2x2x1'
  chip_config: str = ''  # libtpu's chip_config_name: 'megacore' makes a two-TensorCore chip one device, as on a VM
  cores_in_name: int = 1  # a TPU's accelerator-type name counts TensorCores: v4-8 is 4 chips, v5e-8 is 8
  gpu: GpuDevice | None = None

  @property
  def peak_flops(self) -> float:
    return metrics_lib.peak_flops_per_device(self)

  @property
  def platform(self) -> str:
    return 'tpu' if self.gpu is None else 'gpu'


CHIPS = {
    'v4': Chip('TPU v4', 32 * GiB, 1.2e12, 'v4', 'megacore', 2),
    'v5e': Chip('TPU v5 lite', 16 * GiB, 8.19e11, 'v5e', 'default', 1),
    'v5p': Chip('TPU v5', 95 * GiB, 2.765e12, 'v5p', 'megacore', 2),
    'v6e': Chip('TPU v6 lite', 32 * GiB, 1.638e12, 'v6e', 'default', 1),
    # SXM parts; HBM as nvidia-smi reports it (bench/RESULTS.md's H100 and H200 visits)
    'a100': Chip('NVIDIA A100-SXM4-80GB', 81_920 << 20, 2.039e12,
                 gpu=GpuDevice((8, 0), 108, 64, 1.41, 167_936, 166_912, 40 << 20)),
    'h100': Chip('NVIDIA H100 80GB HBM3', 81_559 << 20, 3.35e12,
                 gpu=GpuDevice((9, 0), 132, 128, 1.98, 233_472, 232_448, 50 << 20)),
    'h200': Chip('NVIDIA H200', 143_771 << 20, 4.8e12,
                 gpu=GpuDevice((9, 0), 132, 128, 1.98, 233_472, 232_448, 50 << 20)),
}
_SHAPES_3D = ('2x2x1', '2x2x2', '2x2x4', '2x4x4', '4x4x4', '4x4x8')
_SHAPES_2D = ('1x1', '2x2', '2x4', '4x4', '4x8', '8x8', '8x16', '16x16')
_SHAPES_GPU = ('1x1x1', '1x1x2', '1x1x4', '1x1x8')  # one host: (slices, hosts, GPUs per host), as the plugin's
_SHAPES = {'v4': _SHAPES_3D, 'v5p': _SHAPES_3D, 'v5e': _SHAPES_2D, 'v6e': _SHAPES_2D,
           'a100': _SHAPES_GPU, 'h100': _SHAPES_GPU, 'h200': _SHAPES_GPU}
# The CUDA plugins that compile for a GPU, each with the CUDA version its programs are compiled for:
# requirements-gpu.txt installs the CUDA 12 one (jax 0.10); jax 0.11 (Python 3.12+) also has a CUDA 13 one. cuDNN:
# a 9 older than the one requirements-gpu.txt installs, so that no newer cuDNN's features are assumed.
_CUDA_PLUGINS = {'jax_cuda12_plugin': (12, 9), 'jax_cuda13_plugin': (13, 0)}
_CUDNN_VERSION = (9, 8)


def _cuda_plugin() -> str | None:
  """The installed CUDA plugin's module (the CUDA 12 one where both are), or None."""
  return next((name for name in _CUDA_PLUGINS if importlib.util.find_spec(name) is not None), None)


@dataclasses.dataclass(frozen=True)
class Topology:
  """A single TPU slice by its accelerator-type name (e.g. 'v4-8') and chip grid (e.g. '2x2x1'), or one GPU
  host by its GPUs' kind and count (e.g. 'h100-8', grid '1x1x8')."""

  name: str
  chip: Chip
  shape: str

  @property
  def num_chips(self) -> int:
    return math.prod(int(n) for n in self.shape.split('x'))

  @property
  def libtpu_name(self) -> str:
    return f'{self.chip.libtpu_prefix}:{self.shape}'

  @property
  def chips_per_host(self) -> tuple[int, int, int]:
    """v4/v5p hosts hold 2x2x1 chips; v5e/v6e hosts up to 2x4 (a v5e-8 or v6e-8 is one host)."""
    dims = [int(n) for n in self.shape.split('x')] + [1]
    bound = (2, 2, 1) if len(self.shape.split('x')) == 3 else (2, 4, 1)
    return tuple(min(b, d) for b, d in zip(bound, dims[:3]))


def _all_topologies() -> dict[str, Topology]:
  out = {}
  for generation, shapes in _SHAPES.items():
    chip = CHIPS[generation]
    for shape in shapes:
      topo = Topology(f'{generation}-{math.prod(int(n) for n in shape.split("x")) * chip.cores_in_name}', chip, shape)
      out[topo.name] = topo
  return out


TOPOLOGIES = _all_topologies()


def get_topology(name: str) -> Topology:
  if name not in TOPOLOGIES:
    raise ValueError(f'unknown topology {name!r}: use one of {", ".join(TOPOLOGIES)}.')
  return TOPOLOGIES[name]


def gpu_target_config(chip: Chip) -> str:
  """The GpuTargetConfigProto (text format) that lets the CUDA plugin compile for `chip` without one."""
  gpu = chip.gpu
  major, minor = gpu.compute_capability
  cuda = _CUDA_PLUGINS[_cuda_plugin() or 'jax_cuda12_plugin']
  return '\n'.join([
      'gpu_device_info {',
      '  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152',
      f'  shared_memory_per_core: {gpu.shared_memory_per_core} threads_per_core_limit: 2048',
      f'  core_count: {gpu.core_count} fpus_per_core: {gpu.fpus_per_core}',
      '  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535',
      f'  memory_bandwidth: {int(chip.hbm_bandwidth)} l2_cache_size: {gpu.l2_cache_size}',
      f'  clock_rate_ghz: {gpu.clock_rate_ghz} device_memory_size: {chip.hbm_bytes}',
      f'  shared_memory_per_block_optin: {gpu.shared_memory_per_block_optin}',
      f'  cuda_compute_capability {{ major: {major} minor: {minor} }}',
      '  registers_per_core_limit: 65536 registers_per_block_limit: 65536',
      '}',
      'platform_name: "CUDA"',
      f'dnn_version_info {{ major: {_CUDNN_VERSION[0]} minor: {_CUDNN_VERSION[1]} }}',
      f'runtime_version {{ major: {cuda[0]} minor: {cuda[1]} }}',
      f'device_description_str: "{chip.device_kind}"'])


def _missing_compiler_error(name: str) -> MissingDependencyError:
  if get_topology(name).chip.platform == 'gpu':
    return MissingDependencyError(f'compiling for {name} needs the CUDA plugin, which is not installed: '
                                  f'pip install "jax-cuda12-plugin=={jax.__version__}" (or -r requirements-gpu.txt)')
  return MissingDependencyError(f'compiling for {name} needs libtpu, which is not installed: '
                                f'pip install "jax[tpu]=={jax.__version__}"')


@functools.cache
def topology_devices(name: str) -> tuple:
  """The compile-only devices of a named slice or GPU host (one per chip), usable in a Mesh on a machine without
  them."""
  topo = get_topology(name)
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if topo.chip.platform == 'gpu':
    if _cuda_plugin() is None:
      raise _missing_compiler_error(name)
    try:
      desc = topologies.get_topology_desc(platform='cuda', target_config=gpu_target_config(topo.chip),
                                          topology=topo.shape)
    except NotImplementedError:  # the plugin did not register: it checks a GPU's CUDA when JAX may use one
      raise ValueError(f'the CUDA plugin did not start, so nothing compiles for {name}: on a machine without a '
                       'GPU run with JAX_PLATFORMS=cpu') from None
  else:
    if importlib.util.find_spec('libtpu') is None:
      raise _missing_compiler_error(name)
    # libtpu locks /tmp/libtpu_lockfile so that one process owns the chips; compiling opens none, and parallel
    # test workers or a second compile would otherwise be refused.
    os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
    try:
      desc = topologies.get_topology_desc(
          topology_name=topo.libtpu_name, platform='tpu', chip_config_name=topo.chip.chip_config,
          chips_per_host_bounds=topo.chips_per_host, num_slices=1)
    except RuntimeError as e:
      if 'TPU support not installed' in str(e):
        raise _missing_compiler_error(name) from None
      raise
  devices = tuple(desc.devices)
  if len(devices) != topo.num_chips or devices[0].device_kind != topo.chip.device_kind:
    raise RuntimeError(f'the compiler gave {len(devices)} {devices[0].device_kind} devices for {name} '
                       f'({topo.shape}), expected {topo.num_chips} {topo.chip.device_kind}.')
  return devices


# --- analysis of a compiled program

COLLECTIVES = hlo_costs.COLLECTIVES
_COLLECTIVE_RE = re.compile(r'=\s*(?P<type>.+?)\s+(?P<op>' + '|'.join(COLLECTIVES) + r')(?P<suffix>-start|-done)?\(')
@dataclasses.dataclass(frozen=True)
class Collective:
  count: int = 0
  bytes: int = 0  # per chip: the size of each op's result, summed


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
  num_chips: int
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
    return self.model_flops / (self.num_chips * self.peak_flops * self.step_seconds)

  @property
  def hbm_mfu_bound(self) -> float | None:
    if self.model_flops is None or self.flops is None or self.hbm_bytes is None:
      return None
    seconds = max(self.compute_seconds, self.hbm_bytes / self.hbm_bandwidth)
    return self.model_flops / (self.num_chips * self.peak_flops * seconds)

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
    install = ('pip install nvidia-cudnn-cu13' if _cuda_plugin() == 'jax_cuda13_plugin'
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
  topo = get_topology(topology)
  arguments = {name: bytes_per_chip(tree) for name, tree in (groups or {}).items()}
  common = dict(topology=topology, num_chips=topo.num_chips, hbm_capacity=topo.chip.hbm_bytes,
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

def mesh_presets(num_chips: int) -> dict[str, dict]:
  """Data parallel, FSDP and FSDP × tensor meshes for a chip count (tensor 4 from 16 chips, as tpu_v4_32_fsdp_tp)."""
  tensor = 4 if num_chips >= 16 else 2
  return {'data': {'data': num_chips, 'fsdp': 1, 'tensor': 1},
          'fsdp': {'data': 1, 'fsdp': num_chips, 'tensor': 1},
          'fsdp_tensor': {'data': 1, 'fsdp': num_chips // tensor, 'tensor': tensor}}


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
                            f'train step, batch {rows}×{length}'))
  rows, width = next(iter(run.eval_batch_shape.values()))
  programs.append(Program(run.eval_step, (run.eval_members, run.abstract_batch(run.eval_batch_shape)),
                          {'params': run.abstract_state.params},
                          metrics_lib.train_flops(run.model.config, rows, width, width) / 3, run.mesh, run.rules,
                          f'eval step, batch {rows}×{width}'))
  return programs


def _lowered(program: Program):
  with sharding.activate(program.mesh, program.rules):
    return program.jitted.lower(*program.args)


def _analysis(program: Program, lowered, topology: str) -> Analysis:
  return analyze(lowered, program.args, topology=topology, groups=program.groups, model_flops=program.model_flops)


def analyze_program(program: Program, topology: str) -> Analysis:
  """`program` lowered, compiled for `topology` and analysed."""
  with compiling_for(program.mesh.devices.flat):
    return _analysis(program, _lowered(program), topology)


def longest_train_step(config: ml_collections.ConfigDict, topology: str) -> Program:
  """The train step of `config` for its longest batch shape (token budget: the most attention memory) on
  `topology`'s devices (the config's mesh must use its chips)."""
  return _longest_train_step(run_programs(config, topology_devices(topology)))


def _longest_train_step(programs: list[Program]) -> Program:
  return [p for p in programs if p.what.startswith('train')][-1]


def analyze_train_step(config: ml_collections.ConfigDict, topology: str) -> Analysis:
  """`longest_train_step` compiled for `topology` and analysed."""
  return analyze_program(longest_train_step(config, topology), topology)


def compile_program(program: Program, compiler_options: dict | None = None):
  """The compiled executable of a program, lowered under its mesh and rules (for reading its HLO); XLA's
  `compiler_options` (e.g. xla_dump_to) if given."""
  with compiling_for(program.mesh.devices.flat):
    return _lowered(program).compile(compiler_options)


def compile_run(config: ml_collections.ConfigDict, topology: str) -> Iterator[tuple[str, Analysis]]:
  """Every program a run of `config` compiles (`run_programs`), compiled for `topology` and each given as soon as it
  is compiled; for train.py's --compile_only. The longest train step compiles first, alone, and the others as many
  at once as the memory its compile took allows (`concurrent_compiles`), as the trainer compiles its batch shapes."""
  programs = run_programs(config, topology_devices(topology))
  first = _longest_train_step(programs)
  ordered = [first] + [p for p in programs if p is not first]
  with compiling_for(first.mesh.devices.flat):
    for program, analysis in concurrent_compiles.compile_all(
        ordered, _lowered, lambda program, lowered: _analysis(program, lowered, topology)):
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
  lines = [f'{a.topology}: {a.num_chips} chips, {_gib(a.hbm_capacity)} GiB HBM each; compiled in '
           f'{a.compile_seconds:.0f}s',
           'per chip (GiB): ' + ', '.join(f'{k} {_gib(v)}' for k, v in a.arguments.items()) + '; '
           + ', '.join(f'{k} {_gib(v)}' for k, v in parts if v is not None)
           + f'; total {_gib(a.total_bytes)} = {100 * a.total_bytes / a.hbm_capacity:.0f}% of HBM: '
           + ('fits' if a.fits else 'does NOT fit')]
  if a.compile_error:
    lines.append(f'XLA: {a.compile_error}')
  else:
    lines += ['collectives per step: ' + (', '.join(f'{k} ×{c.count} ({c.bytes / 2**20:.0f} MiB)'
                                                   for k, c in a.collectives.items() if c.count) or 'none'),
              f'{a.flops / 1e12:.2f} TFLOP and {a.bytes_accessed / 1e9:.1f} GB accessed per chip: roofline step '
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
