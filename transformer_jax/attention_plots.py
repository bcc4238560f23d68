"""Heatmaps of attention weights (encoder self, decoder self, cross) for one sentence, tokens on the axes.

python -m transformer_jax.attention_plots --workdir=DIR --sentence="The dog sees the cat." [--target=...]
    [--kind=cross] [--layer=0] [--head=all] --out=DIR

Weights come from a teacher-forced pass over the sentence and its translation (the model's own, unless
--target is given), computed by the reference attention and collected through flax's 'intermediates'.
"""

import os

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from transformer_jax import cli  # noqa: E402
from transformer_jax import config as config_lib  # noqa: E402
from transformer_jax.config.model import ModelConfig  # noqa: E402
from transformer_jax.data import text_input  # noqa: E402
from transformer_jax.inference import generation  # noqa: E402
from transformer_jax.inference import restoring  # noqa: E402
from transformer_jax.model import layer_layout  # noqa: E402

KINDS = {'encoder': ('encoder', 'self_attention'), 'decoder': ('decoder', 'self_attention'),
         'cross': ('decoder', 'cross_attention')}


def attention_maps(restored: restoring.Restored, source_ids: list[int], target_ids: list[int]) -> dict:
  """{kind: [layers, heads, query, key] weights} for one example (ids include EOS)."""
  inputs = jnp.asarray([source_ids], jnp.int32)
  targets = jnp.asarray([target_ids], jnp.int32)

  @jax.jit  # one program: op by op, each of the pass's operations would be compiled on its own
  def intermediates(params):
    return restored.model.apply({'params': params}, inputs, targets, mutable=['intermediates'])[1]['intermediates']

  inter = layer_layout.convert(intermediates(restored.params), scan_layers=False)  # layer_i even when scanned
  cfg = restored.model.config
  maps = {}
  for kind, (stack, module) in KINDS.items():
    layers = cfg.num_encoder_layers if stack == 'encoder' else cfg.num_decoder_layers
    maps[kind] = np.stack([np.asarray(inter[stack][f'layer_{i}'][module]['attention_weights'][0][0])
                           for i in range(layers)])
  return maps


def plot_heads(weights: np.ndarray, query_tokens: list[str], key_tokens: list[str], title: str, path: str,
               heads=None) -> str:
  """Saves a grid of heatmaps (one per head, [heads, query, key] weights) with tokens on both axes."""
  heads = list(range(weights.shape[0])) if heads is None else list(heads)
  cols = min(4, len(heads))
  rows = -(-len(heads) // cols)
  size = 0.28 * max(len(query_tokens), len(key_tokens)) + 1.5
  fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size), squeeze=False)
  for ax in axes.flat[len(heads):]:
    ax.axis('off')
  for ax, head in zip(axes.flat, heads):
    ax.imshow(weights[head], cmap='viridis', vmin=0.0, vmax=1.0, aspect='auto')
    ax.set_title(f'head {head}', fontsize=9)
    ax.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=7)
    ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=7)
  fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _check_request(cfg: ModelConfig, sentence: str, target: str | None, out_dir: str, layers, head) -> None:
  """Everything a plot needs, checked before any work (the tool checks before restoring the checkpoint): one line
  naming the flag that is wrong."""
  if not text_input.flag_text(sentence, 'sentence').strip():
    raise ValueError('--sentence is blank: pass the source sentence to plot.')
  if target is not None and not text_input.flag_text(target, 'target').strip():
    raise ValueError('--target is blank: pass a translation, or leave --target out to use the model\'s own.')
  layer_count = min(cfg.num_encoder_layers, cfg.num_decoder_layers)
  for layer in layers or ():
    if not 0 <= layer < layer_count:
      raise ValueError(f'--layer={layer} is out of range: the model has layers 0..{layer_count - 1}.')
  if head is not None and not 0 <= head < cfg.num_heads:
    raise ValueError(f'--head={head} is out of range: the model has heads 0..{cfg.num_heads - 1}.')
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise ValueError(f'--out={out_dir} is a file: pass a directory for the PNG files.')


def plot_sentence(restored, sentence: str, out_dir: str, *, target: str | None = None, kinds=tuple(KINDS),
                  layers=None, head=None) -> list[str]:
  """Writes one PNG per (kind, layer) for `sentence`; returns the paths."""
  _check_request(restored.model.config, sentence, target, out_dir, layers, head)
  tok, max_len = restored.tokenizer, restored.model.config.max_len
  (source_ids,) = text_input.encode_lines([sentence], tok, max_len, False, what='--sentence', fix='shorten it')
  if target is None:
    target = generation.translate_lines(restored, [sentence])[0]
  (target_ids,) = text_input.encode_lines([target], tok, max_len, False, what='the target', fix='shorten it',
                                          target=True)
  maps = attention_maps(restored, source_ids, target_ids)
  src_tokens = [tok.id_to_piece(i) for i in source_ids]
  tgt_tokens = [tok.id_to_piece(i) for i in target_ids]
  axes = {'encoder': (src_tokens, src_tokens), 'decoder': (tgt_tokens, tgt_tokens), 'cross': (tgt_tokens, src_tokens)}
  paths = []
  for kind in kinds:
    for layer in (range(maps[kind].shape[0]) if layers is None else layers):
      queries, keys = axes[kind]
      title = f'{kind} attention, layer {layer}'
      path = os.path.join(out_dir, f'{kind}_layer{layer}.png')
      paths.append(plot_heads(maps[kind][layer], queries, keys, title, path,
                              heads=None if head is None else [head]))
  return paths


_WORKDIR = flags.DEFINE_string('workdir', None, 'The training run\'s workdir.')
_SENTENCE = flags.DEFINE_string('sentence', None, 'Source sentence.')
_TARGET = flags.DEFINE_string('target', None, 'Target sentence (default: the model\'s translation).')
_KIND = flags.DEFINE_enum('kind', 'all', ['all', *KINDS], 'Which attention.')
_LAYER = flags.DEFINE_integer('layer', None, 'Layer (default: all).', lower_bound=0)
_HEAD = flags.DEFINE_integer('head', None, 'Head (default: all heads in a grid).', lower_bound=0)
_OUT = flags.DEFINE_string('out', 'attention_maps', 'Output directory for the PNG files.')


def main(argv):
  if len(argv) > 1 or not _WORKDIR.value or _SENTENCE.value is None:
    raise app.UsageError('usage: python -m transformer_jax.attention_plots --workdir=DIR --sentence="..."')
  config = config_lib.of_run(_WORKDIR.value)
  model_config = ModelConfig.from_dict(config.model)
  generation.check_translation_model(model_config, _WORKDIR.value)
  kinds = tuple(KINDS) if _KIND.value == 'all' else (_KIND.value,)
  layers = None if _LAYER.value is None else [_LAYER.value]
  _check_request(model_config, _SENTENCE.value, _TARGET.value, _OUT.value, layers, _HEAD.value)
  restored = restoring.restore(config, _WORKDIR.value)
  for path in plot_sentence(restored, _SENTENCE.value, _OUT.value, target=_TARGET.value, kinds=kinds, layers=layers,
                            head=_HEAD.value):
    print(path)


if __name__ == '__main__':
  cli.run(main)
