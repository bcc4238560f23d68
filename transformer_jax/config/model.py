"""The model's hyperparameters as a frozen dataclass, the config's `model` section; derived values (d_k, d_v) are
computed here only. A leaf: it imports no JAX, so reading a config loads no backend."""

import dataclasses
import functools
from typing import Any

import ml_collections
import ml_dtypes
import numpy as np

from transformer_jax.config import platform as platform_lib

ARCHITECTURES = ('encoder_decoder', 'decoder_only')
POSITIONAL = ('sinusoidal', 'learned')
SINUSOIDS = ('interleaved', 'split')  # sin/cos pairs (§3.5), or all sines then all cosines (transformers' Marian)
ACTIVATIONS = ('relu', 'gelu', 'swish')  # the FFN's nonlinearity: the paper's ReLU, exact (erf) GELU, swish = SiLU
NORMS = ('post', 'pre')
ATTENTIONS = ('auto', 'reference', 'dot_product', 'chunked', 'flash_tpu', 'flash_gpu')  # attention.serving
REMATS = ('none', 'full', 'dots', 'dots_no_batch')
DTYPES = {'float32': np.float32, 'bfloat16': ml_dtypes.bfloat16, 'float16': np.float16}
CPU_KERNELS = ('auto', 'on', 'off')  # 'auto': on when the run's devices are CPUs (config/platform.py)
# Keys only some choices read: key -> its conditions, each (the dotted key that chooses, the choices that read it);
# `config.MODE_KEYS`. 'dot_product' runs 'chunked' where it has no attention dropout (`attention.serving`).
MODE_KEYS = {'attention_chunk_size': (('model.attention', ('chunked', 'dot_product')),),
             'sinusoids': (('model.positional', ('sinusoidal',)),)}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Defaults are the paper's base model (§3, Table 3 "base")."""

  architecture: str = 'encoder_decoder'  # 'decoder_only': the decoder stack alone, a language model
  vocab_size: int = 37000
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8
  d_k: int | None = None  # None: d_model // num_heads
  d_v: int | None = None  # None: d_model // num_heads
  num_encoder_layers: int = 6  # 0 for 'decoder_only'
  num_decoder_layers: int = 6  # the layer stack of 'decoder_only'
  dropout: float = 0.1  # P_drop: residual sublayer outputs and embedding+position sums
  attention_dropout: float = 0.0
  relu_dropout: float = 0.0
  positional: str = 'sinusoidal'
  sinusoids: str = 'interleaved'  # the layout of the sinusoidal table's columns
  max_len: int = 256  # longest sentence (tokens incl. EOS) the model accepts
  max_positions: int | None = None  # positions a sequence may use (e.g. a Marian checkpoint's table); None: no limit
  activation: str = 'relu'
  scale_embeddings: bool = True  # token embeddings ×√d_model (§3.4)
  attention_bias: bool = False  # biases on the attention projections (the paper's W matrices have none)
  logits_bias: bool = False  # a bias added to the pre-softmax logits
  # id 0's row copies BOS's (id 2): an imported MarianMT, whose decoder starts with its pad token. PAD is then left
  # out of every softmax (`first_output_id`), so that this token counts once, and BOS's row takes no gradient as an
  # input (as torch's padding_idx): the model computes and trains as the imported one.
  pad_is_bos: bool = False
  share_embeddings: bool = True  # source, target and pre-softmax weights tied (§3.4)
  norm: str = 'post'
  layer_norm_epsilon: float = 1e-6
  attention: str = 'auto'  # the platform's fastest (config/platform.py); attention.serving falls back per call
  attention_chunk_size: int = 512  # query and key block length of 'chunked'
  loss_chunk_length: int = 128  # positions per chunk of the pre-softmax layer and loss in training (loss.py)
  remat: str = 'none'
  scan_layers: bool = False  # each stack as one nn.scan over stacked parameters: compile time independent of depth
  dtype: str = 'float32'  # compute dtype
  param_dtype: str = 'float32'
  cpu_kernels: str = 'auto'  # XLA:CPU's backward passes and dropout masks (kernels/cpu/projections.py): CPU_KERNELS
  residual_norm_kernel: bool = True  # on a GPU, post-LN blocks of a power-of-two d_model: kernels/gpu/residual_norm.py
  # (False: XLA's ops, the same values)
  loss_kernel: bool = True  # on a GPU, the loss's pass over a chunk's logits: kernels/gpu/softmax_gradient.py (False:
  # XLA's two passes, the same values). With it, the above off and attention='dot_product', no Pallas Triton kernel runs
  # Not a config key: the platform the model's steps compile for, which the run builder and restoring set from their
  # devices; its `kernels` follow from it and the settings above.
  platform: str = 'cpu'

  def __post_init__(self):
    _check_choice('architecture', self.architecture, ARCHITECTURES)
    _check_choice('positional', self.positional, POSITIONAL)
    _check_choice('sinusoids', self.sinusoids, SINUSOIDS)
    _check_choice('activation', self.activation, ACTIVATIONS)
    _check_choice('norm', self.norm, NORMS)
    _check_choice('attention', self.attention, ATTENTIONS)
    _check_choice('remat', self.remat, REMATS)
    _check_choice('dtype', self.dtype, tuple(DTYPES))
    _check_choice('param_dtype', self.param_dtype, tuple(DTYPES))
    _check_choice('cpu_kernels', self.cpu_kernels, CPU_KERNELS)
    _check_choice('platform', self.platform, platform_lib.PLATFORMS)
    if (self.d_k is None or self.d_v is None) and self.d_model % self.num_heads:
      raise ValueError(
          f'model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads}: '
          'change one of them or set model.d_k and model.d_v explicitly.')
    for name in ('vocab_size', 'd_model', 'd_ff', 'num_heads', 'num_decoder_layers', 'max_len', 'attention_chunk_size',
                 'loss_chunk_length'):
      if getattr(self, name) <= 0:
        raise ValueError(f'model.{name} must be positive, got {getattr(self, name)}.')
    if self.max_positions is not None and self.max_positions <= 0:
      raise ValueError(f'model.max_positions must be positive (or None: no limit), got {self.max_positions}.')
    if self.decoder_only and self.num_encoder_layers:
      raise ValueError(f"model.architecture='decoder_only' has no encoder: set model.num_encoder_layers=0 (got "
                       f'{self.num_encoder_layers}); model.num_decoder_layers is its depth.')
    for name in ('dropout', 'attention_dropout', 'relu_dropout'):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f'model.{name} must be in [0, 1), got {getattr(self, name)}.')
    if self.attention == 'dot_product' and self.head_dim_k != self.head_dim_v:
      raise ValueError(
          f"model.attention='dot_product' needs d_k == d_v (got {self.head_dim_k} and {self.head_dim_v}): "
          "use model.attention='reference' or 'chunked'.")
    if self.positional == 'sinusoidal' and self.d_model % 2:
      raise ValueError(f'sinusoidal positions need an even model.d_model, got {self.d_model}.')
    if self.attention_dropout > 0 and self.attention == 'dot_product':
      raise ValueError(
          f"model.attention_dropout={self.attention_dropout} needs dropout on attention weights, which "
          "'dot_product' (cuDNN's kernel) has not: use model.attention='auto' or another implementation.")

  @functools.cached_property
  def kernels(self) -> platform_lib.Kernels:
    """What the model's named ops run on `platform` (`config/platform.py`)."""
    return platform_lib.choose(self.platform, attention=self.attention, cpu_kernels=self.cpu_kernels,
                               residual_norm_kernel=self.residual_norm_kernel, loss_kernel=self.loss_kernel)

  def section(self) -> dict:
    """The `model` section's keys and values (every field but `platform`)."""
    values = dataclasses.asdict(self)
    del values['platform']
    return values

  @property
  def decoder_only(self) -> bool:
    return self.architecture == 'decoder_only'

  @property
  def head_dim_k(self) -> int:
    return self.d_k or self.d_model // self.num_heads

  @property
  def head_dim_v(self) -> int:
    return self.d_v or self.d_model // self.num_heads

  @property
  def first_output_id(self) -> int:
    """The lowest id the softmax covers: 1 with `pad_is_bos` (PAD's logit is left out), else 0."""
    return 1 if self.pad_is_bos else 0

  @property
  def position_limit(self) -> int | None:
    """The most tokens a sequence may have: max_len with learned positions (a table of that many rows), and at
    most max_positions if set; else no limit. Training filters longer examples, evaluation cuts longer sentences,
    decoding stops there."""
    limits = ([self.max_len] if self.positional == 'learned' else []) + (
        [self.max_positions] if self.max_positions is not None else [])
    return min(limits, default=None)

  def decode_length(self, input_length: int, max_len_offset: int) -> int:
    """Output tokens allowed for an input of `input_length` tokens: input + offset (§6.1), within the limit."""
    wanted = input_length + max_len_offset
    return wanted if self.position_limit is None else min(wanted, self.position_limit)

  @property
  def compute_dtype(self) -> Any:
    return DTYPES[self.dtype]

  @property
  def weight_dtype(self) -> Any:
    return DTYPES[self.param_dtype]

  def replace(self, **changes) -> 'ModelConfig':
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_dict(cls, values, platform: str = 'cpu') -> 'ModelConfig':
    """Builds from a mapping (e.g. `config.model` of an ml_collections config; unknown keys are errors), for steps
    compiled for `platform`."""
    values = dict(values)
    known = {f.name for f in dataclasses.fields(cls)} - {'platform'}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f'unknown model config keys {unknown}; valid keys: {sorted(known)}.')
    return cls(**values, platform=platform)


def default_config() -> ml_collections.ConfigDict:
  """The `model` section: `ModelConfig`'s fields and defaults (d_k and d_v unset: d_model / num_heads)."""
  config = ml_collections.ConfigDict(ModelConfig().section())
  config.d_k = ml_collections.config_dict.placeholder(int)
  config.d_v = ml_collections.config_dict.placeholder(int)
  config.max_positions = ml_collections.config_dict.placeholder(int)
  return config


def _check_choice(name, value, choices):
  if value not in choices:
    raise ValueError(f'model.{name}={value!r} is not one of {choices}.')
