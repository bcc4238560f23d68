"""Decoding speed of the default model: greedy and beam 4, with and without the key/value cache.

python -m bench.decode_speed --workdir=runs/default [--sentences=64] [--rounds=3]

Translates the first --sentences source sentences of the built-in test split with a trained model (its final model,
the tools' default params). The four settings are measured in interleaved rounds in one process; prints one JSON
line per measurement and a Markdown table of medians. Generated tokens count every output token up to and including EOS.
"""

import json
import statistics
import time

import jax
import numpy as np
from absl import app
from absl import flags

from bench import common  # noqa: F401  (no plugin noise on a machine without accelerators)
from transformer_jax import config as config_lib
from transformer_jax.core.tokens import EOS_ID, PAD_ID
from transformer_jax.data import pipeline
from transformer_jax.data import sources
from transformer_jax.inference import generation
from transformer_jax.inference import restoring

_WORKDIR = flags.DEFINE_string('workdir', None, 'A trained workdir (e.g. the README main job).', required=True)
_SENTENCES = flags.DEFINE_integer('sentences', 64, 'Test sentences translated per measurement (one batch).')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Interleaved rounds.')

SETTINGS = (('greedy', 1, True), ('greedy', 1, False), ('beam', 4, True), ('beam', 4, False))


def generated_tokens(tokens: np.ndarray) -> int:
  """Output tokens up to and including each row's EOS (PAD after it is not counted)."""
  return int(np.sum(tokens != PAD_ID))


def main(argv):
  del argv
  config = config_lib.of_run(_WORKDIR.value)
  restored = restoring.restore(config, _WORKDIR.value)
  pairs = sources.load_split(config.data, config.eval.test_split)
  pairs = [pairs[i] for i in range(min(_SENTENCES.value, len(pairs)))]
  batch = next(pipeline.make_eval_batches(pairs, restored.tokenizer, len(pairs)))
  inputs = jax.device_put(batch['inputs'])
  max_len = batch['inputs'].shape[1] + config.decode.max_len_offset

  def run(method, beam, use_cache):
    tokens, _ = generation.generate(restored.members, inputs, jax.random.key(0), method=method, beam_size=beam,
                                    alpha=config.decode.alpha, max_decode_len=max_len, use_cache=use_cache)
    return np.asarray(jax.block_until_ready(tokens))[:, 0]

  with restored.on_mesh():
    for setting in SETTINGS:  # compile
      run(*setting)
    times = {s: [] for s in SETTINGS}
    counts = {}
    for _ in range(_ROUNDS.value):
      for setting in SETTINGS:
        start = time.perf_counter()
        tokens = run(*setting)
        times[setting].append(time.perf_counter() - start)
        counts[setting] = generated_tokens(tokens)
        assert np.all((tokens == EOS_ID).sum(axis=1) <= 1)
        print(json.dumps({'method': setting[0], 'beam_size': setting[1], 'cache': setting[2],
                          'sentences': len(pairs), 'seconds': times[setting][-1],
                          'generated_tokens': counts[setting],
                          'tokens_per_second': counts[setting] / times[setting][-1]}), flush=True)
  print(f'\n{len(pairs)} sentences, max output length {max_len}, device {jax.devices()[0].device_kind}\n')
  print('| decoding | KV cache | seconds (median) | generated tokens/s | sentences/s |')
  print('|---|---|---:|---:|---:|')
  for setting in SETTINGS:
    seconds = statistics.median(times[setting])
    name = 'greedy' if setting[0] == 'greedy' else f'beam {setting[1]}'
    print(f'| {name} | {"yes" if setting[2] else "no"} | {seconds:.2f} | {counts[setting] / seconds:,.0f} | '
          f'{len(pairs) / seconds:.1f} |')


if __name__ == '__main__':
  app.run(main)
