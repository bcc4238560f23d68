"""The targets a run can be compiled for without their chips: TPU slices and GPU hosts by name ('v4-8', 'h100-8'),
their chips' published figures, and their compile-only devices (libtpu's for a TPU topology, the CUDA plugin's for
a GPU described by a target config), which `aot` compiles a config's programs for."""

import dataclasses
import functools
import importlib.util
import math
import os

import jax

from transformer_jax.core.errors import MissingDependencyError
from transformer_jax.runtime import backends
from transformer_jax.training import metrics as metrics_lib

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
  hbm_bytes: int  # of one JAX device: the chip's, divided among its `devices_per_chip`
  hbm_bandwidth: float  # bytes/s, of one JAX device as hbm_bytes
  libtpu_prefix: str = ''  # libtpu's topology names are '<prefix>:<shape>', e.g. 'v4:2x2x1'
  chip_config: str = ''  # libtpu's chip_config_name: 'megacore' makes a two-TensorCore chip one device, as on a VM
  cores_in_name: int = 1  # a TPU's accelerator-type name counts TensorCores: v4-8 is 4 chips, v5e-8 is 8
  devices_per_chip: int = 1  # JAX devices a chip is: a TPU7x chip's two TensorCores are two (each with half its HBM)
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
    # Ironwood: per chip 192 GiB HBM at 7,380 GB/s and 2,307 bf16 TFLOP/s (Cloud TPU's "TPU7x (Ironwood)" page,
    # system architecture table), two TensorCores that libtpu (0.0.42.1 and 0.0.50.1 alike) makes two devices
    'tpu7x': Chip('TPU7x', 192 * GiB // 2, 7.38e12 / 2, 'tpu7x', 'default', 2, devices_per_chip=2),
    # SXM parts; HBM as nvidia-smi reports it (the H100 and H200: on the GPUs bench/RESULTS.md was measured on)
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
_SHAPES = {'v4': _SHAPES_3D, 'v5p': _SHAPES_3D, 'v5e': _SHAPES_2D, 'v6e': _SHAPES_2D, 'tpu7x': _SHAPES_3D,
           'a100': _SHAPES_GPU, 'h100': _SHAPES_GPU, 'h200': _SHAPES_GPU}
# The CUDA plugins that compile for a GPU, each with the CUDA version its programs are compiled for:
# requirements-gpu.txt installs the CUDA 12 one (jax 0.10); jax 0.11 (Python 3.12+) also has a CUDA 13 one. cuDNN:
# a 9 older than the one requirements-gpu.txt installs, so that no newer cuDNN's features are assumed.
_CUDA_PLUGINS = {'jax_cuda12_plugin': (12, 9), 'jax_cuda13_plugin': (13, 0)}
_CUDNN_VERSION = (9, 8)


def cuda_plugin() -> str | None:
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
  def num_devices(self) -> int:
    """The JAX devices of the slice or host: what a mesh over it spans."""
    return self.num_chips * self.chip.devices_per_chip

  @property
  def libtpu_name(self) -> str:
    return f'{self.chip.libtpu_prefix}:{self.shape}'

  @property
  def chips_per_host(self) -> tuple[int, int, int]:
    """v4/v5p/TPU7x hosts hold 2x2x1 chips; v5e/v6e hosts up to 2x4 (a v5e-8 or v6e-8 is one host)."""
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
  cuda = _CUDA_PLUGINS[cuda_plugin() or 'jax_cuda12_plugin']
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
  """The compile-only devices of a named slice or GPU host (`Topology.num_devices`), usable in a Mesh on a machine
  without them."""
  topo = get_topology(name)
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if topo.chip.platform == 'gpu':
    if cuda_plugin() is None:
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
      with backends.libtpu_loading():
        desc = topologies.get_topology_desc(
            topology_name=topo.libtpu_name, platform='tpu', chip_config_name=topo.chip.chip_config,
            chips_per_host_bounds=topo.chips_per_host, num_slices=1)
    except RuntimeError as e:
      if 'TPU support not installed' in str(e):
        raise _missing_compiler_error(name) from None
      raise
  devices = tuple(desc.devices)
  if len(devices) != topo.num_devices or devices[0].device_kind != topo.chip.device_kind:
    raise RuntimeError(f'the compiler gave {len(devices)} {devices[0].device_kind} devices for {name} '
                       f'({topo.shape}), expected {topo.num_devices} {topo.chip.device_kind}.')
  return devices
