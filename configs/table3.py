"""The paper's Table 3 variants as config overrides of the base model, and their parameter counts.

One source of truth: `configs/wmt14_ende_base.py` builds its named variants from `VARIANTS`,
`configs/sweeps/table3_runlocal.py` sweeps them, and `python -m configs.table3` prints the parameter table
kept in docs/model.md.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config.model import ModelConfig
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime import backends

PAPER_VOCAB_SIZE = 37000  # shared BPE vocabulary of the EN-DE experiments (§5.1)


@dataclasses.dataclass(frozen=True)
class Variant:
  overrides: dict  # dotted config keys -> values, exactly what the paper changes
  paper_params_m: float | None  # Table 3 "params ×10^6", None where the paper lists none


def _layers(n):
  return {'model.num_encoder_layers': n, 'model.num_decoder_layers': n}


VARIANTS = {
    'base': Variant({}, 65),
    'A_h1': Variant({'model.num_heads': 1, 'model.d_k': 512, 'model.d_v': 512}, None),
    'A_h4': Variant({'model.num_heads': 4, 'model.d_k': 128, 'model.d_v': 128}, None),
    'A_h16': Variant({'model.num_heads': 16, 'model.d_k': 32, 'model.d_v': 32}, None),
    'A_h32': Variant({'model.num_heads': 32, 'model.d_k': 16, 'model.d_v': 16}, None),
    'B_dk16': Variant({'model.d_k': 16}, 58),
    'B_dk32': Variant({'model.d_k': 32}, 60),
    'C_N2': Variant(_layers(2), 36),
    'C_N4': Variant(_layers(4), 50),
    'C_N8': Variant(_layers(8), 80),
    'C_dmodel256': Variant({'model.d_model': 256, 'model.d_k': 32, 'model.d_v': 32}, 28),
    'C_dmodel1024': Variant({'model.d_model': 1024, 'model.d_k': 128, 'model.d_v': 128}, 168),
    'C_dff1024': Variant({'model.d_ff': 1024}, 53),
    'C_dff4096': Variant({'model.d_ff': 4096}, 90),
    'D_drop0': Variant({'model.dropout': 0.0}, None),
    'D_drop02': Variant({'model.dropout': 0.2}, None),
    'D_ls0': Variant({'train.label_smoothing': 0.0}, None),
    'D_ls02': Variant({'train.label_smoothing': 0.2}, None),
    'E_learned': Variant({'model.positional': 'learned'}, None),
    'big': Variant({'model.d_model': 1024, 'model.d_ff': 4096, 'model.num_heads': 16, 'model.dropout': 0.3,
                    'train.num_steps': 300_000}, 213),
}


def model_config_for(variant: Variant, base: ModelConfig) -> ModelConfig:
  """Applies a variant's `model.*` overrides to a model config."""
  changes = {k.split('.', 1)[1]: v for k, v in variant.overrides.items() if k.startswith('model.')}
  return base.replace(**changes)


@functools.lru_cache(maxsize=None)
def count_params(config: ModelConfig) -> int:
  """Number of parameters, from shapes only (nothing is allocated)."""
  tokens = jnp.ones((1, 2), jnp.int32)
  shapes = jax.eval_shape(lambda: Transformer(config).init(jax.random.key(0), tokens, tokens))
  return int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(nn.unbox(shapes['params']))))


def param_table(vocab_size: int = PAPER_VOCAB_SIZE) -> list[tuple[str, float, float | None]]:
  """(variant, our params in millions, paper's params in millions) for every variant the paper counts."""
  base = ModelConfig(vocab_size=vocab_size)
  return [(name, count_params(model_config_for(v, base)) / 1e6, v.paper_params_m)
          for name, v in VARIANTS.items() if v.paper_params_m is not None]


def main():
  print(f'| variant | params (M), vocab {PAPER_VOCAB_SIZE} | paper (M) | difference |')
  print('|---|---:|---:|---:|')
  for name, ours, paper in param_table():
    print(f'| {name} | {ours:.1f} | {paper:g} | {100 * (ours - paper) / paper:+.1f}% |')


if __name__ == '__main__':
  backends.skip_absent_accelerators()  # an installed CUDA plugin or libtpu without its hardware stays quiet
  main()
