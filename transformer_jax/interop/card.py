"""The model card (README.md) of a `transformers` export: what was trained on what, and how well it translates; and
the training config it records, read back when the export is imported (`training_config`)."""

import json
import os
import re

from transformer_jax.config.model import ModelConfig
from transformer_jax.core import files
from transformer_jax.core.workdir import Workdir, params_tag
from transformer_jax.interop import hf
from transformer_jax.interop import marian
from transformer_jax.training import checkpoint


_USAGE = '\n'.join([
    'from transformers import MarianMTModel, MarianTokenizer',
    'model = MarianMTModel.from_pretrained("THIS_DIRECTORY")',
    'tokenizer = MarianTokenizer.from_pretrained("THIS_DIRECTORY")',
    'batch = tokenizer(["A sentence."], return_tensors="pt")',
    'print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))'])


_TRAINING_CONFIG = '## Training config'  # the card's last section: the run's config as JSON


def training_config(directory: str) -> dict | None:
  """The config of the run an export of ours was made from, as its card records it; None for a checkpoint without
  our card (another MarianMT model)."""
  try:
    with open(os.path.join(directory, hf.CARD), encoding='utf-8') as f:
      text = f.read()
  except OSError:
    return None
  found = re.search(rf'^{_TRAINING_CONFIG}\n\n```json\n(.*?)\n```', text, re.MULTILINE | re.DOTALL)
  try:
    config = json.loads(found.group(1)) if found else None
  except ValueError:
    return None
  return config if isinstance(config, dict) else None


def _data(config) -> str:
  data = config.data
  if data.source == 'builtin':
    return (f'the built-in EN→DE corpus of transformer_jax (generated: {data.builtin_train_size} training pairs, '
            f'{data.builtin_eval_size} validation and test pairs)')
  if data.source == 'tfds':
    return f'the tfds dataset `{data.tfds_name}` ({data.source_lang}→{data.target_lang})'
  named = {split: dict(paths) for split, paths in data.files.items() if any(dict(paths).values())}
  return f'local files: {json.dumps(named)}'


def _scores(config, workdir: str, steps, final_steps) -> str:
  """The test scores of the exported params (eval.py's results file for their steps) or, where those were never
  evaluated, of the run's final model, said as such."""
  run_dir, split = Workdir(workdir), config.eval.test_split
  own = run_dir.results_file(split, split, params_tag(steps, final_steps))
  path = own if os.path.isfile(own) else run_dir.final_results_file
  if not os.path.isfile(path):
    return 'No test scores: the run has no results.json (evaluate it with `python eval.py --workdir=...`).\n'
  results = files.read_json(path, 'results file')
  lines = [f'On the `{results.get("split", "test")}` split ({results.get("num_sentences")} sentences), params of '
           f'step(s) {results.get("averaged_steps")}, beam {results.get("beam_size")}:', '']
  if path != own:
    lines[1:1] = ['', f'These are the scores of the run\'s final model, not of the exported params of step(s) '
                  f'{list(steps)}, which were not evaluated.']
  for metric in ('bleu', 'chrf', 'chrf++'):
    if metric in results:
      lines.append(f'- {metric}: {results[metric]:.2f} (sacrebleu `{results.get(metric + "_signature", "")}`)')
  return '\n'.join(lines) + '\n'


def _params(steps, final_steps) -> str:
  """Which params an export holds, beside the run's final model (the one its final evaluation scores)."""
  if list(steps) == list(final_steps):
    return f'the run\'s final model, which its final evaluation scores: {checkpoint.describe_steps(steps)}'
  return f'{checkpoint.describe_steps(steps)}, not the run\'s final model ({checkpoint.describe_steps(final_steps)})'


def model_card(config, workdir: str, steps, final_steps) -> str:
  """README.md for the export of `workdir` (its saved `config`) at `steps`; `final_steps`: those of the run's final
  model (`restoring.final_model_steps`), which name the results files."""
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

Trained on {_data(config)}. The exported params are {_params(steps, final_steps)}.

## Test scores

{_scores(config, workdir, steps, final_steps)}
{_TRAINING_CONFIG}

```json
{config.to_json_best_effort(indent=2)}
```
'''
