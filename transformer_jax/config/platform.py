"""The platform choices of a model: which implementation each of its named ops runs (`Kernels`), chosen once
(`choose`) from the platform of the devices its steps are compiled for and the model's settings. The run builder
and restoring choose them from their devices (`runtime.sharding.mesh_platform`); nothing that traces the model
asks which devices it runs on, so the same model config traces to the same program inside a mesh or outside one.
A leaf: no JAX import."""

import dataclasses

PLATFORMS = ('cpu', 'gpu', 'tpu')
FLASH_KERNELS = {'flash_tpu': 'tpu', 'flash_gpu': 'gpu'}  # each Pallas attention kernel and its platform
_AUTO_ATTENTION = {'tpu': 'flash_tpu', 'gpu': 'flash_gpu', 'cpu': 'reference'}


@dataclasses.dataclass(frozen=True)
class Kernels:
  """What the model's named ops run on one platform (`kernels/ops.py`, `model/attention.py`, `model/loss.py`)."""

  platform: str  # 'cpu', 'gpu' or 'tpu': what the steps are compiled for
  attention: str  # the implementation attention calls ask for (`attention.serving` may fall back per call)
  cudnn_attention: bool  # cuDNN's fused attention serves the calls it can ('auto' and 'dot_product' on a GPU)
  fused_projections: bool  # attention's projections of one shape as one matrix product (a GPU)
  residual_norm_kernel: bool  # post-LN residual blocks as one Pallas kernel a pass (kernels/gpu/residual_norm.py)
  gpu_loss: bool  # the loss's GPU pass: gold logits from the weights, one-pass log-sum-exp
  loss_kernel: bool  # its maximum, log-sum-exp and gradient as one Pallas kernel (kernels/gpu/softmax_gradient.py)
  relu_output_barrier: bool  # ReLU's backward pass kept apart from its product (a GPU's cuBLAS epilogue)
  dropout_masks: str  # 'bernoulli' (nn.Dropout's), 'hashed' (an element's index hashed) or 'sixteen_bit'
  cpu_projections: bool  # the projections' hand-written XLA:CPU backward pass (kernels/cpu/projections.py)
  float32_products: bool  # float32-result products from float32 operands: XLA:CPU has none from bf16 ones

  def describe(self) -> str:
    """One line for a run's log: what runs where it matters."""
    fused = [name for name, on in (('fused projections', self.fused_projections),
                                   ('residual-block kernel', self.residual_norm_kernel),
                                   ('loss kernel', self.loss_kernel),
                                   ('CPU backward passes', self.cpu_projections)) if on]
    cudnn = ' (cuDNN where it serves)' if self.cudnn_attention else ''
    return (f'{self.platform.upper()} kernels: attention {self.attention}{cudnn}, {self.dropout_masks} dropout masks'
            + ''.join(f', {name}' for name in fused))


def choose(platform: str, *, attention: str, cpu_kernels: str, residual_norm_kernel: bool,
           loss_kernel: bool) -> Kernels:
  """The kernels for steps compiled for `platform` given the model's settings `model.attention` ('auto': the
  platform's fastest; a flash kernel of another platform is refused when it is traced, `attention.serving`, unless
  Pallas interprets it), `model.cpu_kernels` ('auto': on a CPU), `model.residual_norm_kernel` and
  `model.loss_kernel` (a GPU's)."""
  if platform not in PLATFORMS:
    raise ValueError(f'no kernels for platform {platform!r}: the steps compile for one of {PLATFORMS}.')
  gpu = platform == 'gpu'
  cpu_projections = cpu_kernels == 'on' or (cpu_kernels == 'auto' and platform == 'cpu')
  return Kernels(
      platform=platform,
      attention=_AUTO_ATTENTION[platform] if attention == 'auto' else attention,
      cudnn_attention=gpu and attention in ('auto', 'dot_product'),
      fused_projections=gpu,
      residual_norm_kernel=gpu and residual_norm_kernel,
      gpu_loss=gpu,
      loss_kernel=gpu and loss_kernel,
      relu_output_barrier=gpu,
      dropout_masks='sixteen_bit' if cpu_projections else 'hashed' if gpu else 'bernoulli',
      cpu_projections=cpu_projections,
      float32_products=platform == 'cpu')
