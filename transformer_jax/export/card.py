"""The model card (README.md) of a `transformers` export: what was trained on what, and how well it translates."""

import json
import os

from transformer_jax import files
from transformer_jax.export import marian
from transformer_jax.model_config import ModelConfig
from transformer_jax.workdir import Workdir


_USAGE = '\n'.join([
    'from transformers import MarianMTModel, MarianTokenizer',
    'model = MarianMTModel.from_pretrained("THIS_DIRECTORY")',
    'tokenizer = MarianTokenizer.from_pretrained("THIS_DIRECTORY")',
    'batch = tokenizer(["A sentence."], return_tensors="pt")',
    'print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))'])


def _data(config) -> str:
  data = config.data
  if data.source == 'builtin':
    return (f'the built-in EN→DE corpus of transformer_jax (generated: {data.builtin_train_size} training pairs, '
            f'{data.builtin_eval_size} validation and test pairs)')
  if data.source == 'tfds':
    return f'the tfds dataset `{data.tfds_name}` ({data.source_lang}→{data.target_lang})'
  named = {split: dict(paths) for split, paths in data.files.items() if any(dict(paths).values())}
  return f'local files: {json.dumps(named)}'


def _scores(workdir: str) -> str:
  path = Workdir(workdir).final_results_file
  if not os.path.isfile(path):
    return 'No test scores: the run has no results.json (evaluate it with `python eval.py --workdir=...`).\n'
  results = files.read_json(path, 'results file')
  lines = [f'On the `{results.get("split", "test")}` split ({results.get("num_sentences")} sentences), params of '
           f'step(s) {results.get("averaged_steps")}, beam {results.get("beam_size")}:', '']
  for metric in ('bleu', 'chrf', 'chrf++'):
    if metric in results:
      lines.append(f'- {metric}: {results[metric]:.2f} (sacrebleu `{results.get(metric + "_signature", "")}`)')
  return '\n'.join(lines) + '\n'


def model_card(config, workdir: str, steps) -> str:
  """README.md for the export of `workdir` (its saved `config`) at `steps`."""
  cfg = ModelConfig.from_dict(config.model)
  notes = []
  if cfg.sinusoids == 'interleaved':
    notes.append('the d_model features are permuted so that the paper\'s interleaved sinusoids are Marian\'s '
                 'sines-then-cosines table (the same network)')
  if cfg.layer_norm_epsilon != marian.MARIAN_EPSILON:
    notes.append(f'trained with LayerNorm epsilon {cfg.layer_norm_epsilon:g}; Marian\'s layers use '
                 f'{marian.MARIAN_EPSILON:g}')
  return f'''---
library_name: transformers
pipeline_tag: translation
tags: [marian, transformer_jax]
---

# A Transformer trained with transformer_jax

An encoder-decoder Transformer ("Attention Is All You Need") trained with transformer_jax and exported as a
`MarianMTModel`: {cfg.num_encoder_layers}+{cfg.num_decoder_layers} layers, d_model {cfg.d_model}, {cfg.num_heads} heads,
d_ff {cfg.d_ff}, {cfg.vocab_size} SentencePiece pieces.
{('Export notes: ' + '; '.join(notes) + '.') if notes else ''}

```python
{_USAGE}
```

## Data

Trained on {_data(config)}. The exported params are those of step(s) {steps}.

## Test scores

{_scores(workdir)}
## Training config

```json
{config.to_json_best_effort(indent=2)}
```
'''
