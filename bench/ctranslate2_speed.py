"""CTranslate2 (float32 and int8 weights) against our jitted decoding, greedy and beam 4, on a trained model.

python -m bench.ctranslate2_speed --workdir=runs/default [--sentences=256] [--batch_size=64] [--rounds=3]

Exports the workdir's final model (the tools' default params) to CTranslate2 twice (float32, int8) in a temporary
directory, then translates the first --sentences source sentences of the built-in test split in batches of
--batch_size with every setting, in interleaved rounds in one process. Both engines get the same batches
(SentencePiece ids, EOS appended) and the same length limit (padded batch width + decode.max_len_offset, as eval.py
decodes); the timings cover decoding only, not SentencePiece. Output tokens are counted up to and including EOS.

Beam search is not the same search in both engines: ours divides by the length penalty ((5 + len) / 6)^α (GNMT,
tensor2tensor), CTranslate2 by len^α; both run with α = decode.alpha. Greedy decoding is the same algorithm, and
the last column counts the sentences whose output equals ours token for token.
"""

import json
import os
import statistics
import tempfile
import time

import ctranslate2
import jax
import numpy as np
import sentencepiece as spm
from absl import app
from absl import flags

from bench import common
from transformer_jax import config as config_lib
from transformer_jax.core.tokens import EOS_ID, PAD_ID
from transformer_jax.data import pipeline
from transformer_jax.data import sources
from transformer_jax.evaluation import scores
from transformer_jax.inference import generation
from transformer_jax.inference import restoring
from transformer_jax.interop import ctranslate2 as export

_WORKDIR = flags.DEFINE_string('workdir', None, 'A trained workdir (e.g. the README main job).', required=True)
_SENTENCES = flags.DEFINE_integer('sentences', 256, 'Test sentences translated per measurement.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 64, 'Sentences per batch, for both engines.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Interleaved rounds.')
_THREADS = flags.DEFINE_integer('threads', os.cpu_count(), "CTranslate2's intra_threads (ours: XLA's default).")

SETTINGS = (('ours', 'float32', 'greedy'), ('ct2', 'float32', 'greedy'), ('ct2', 'int8', 'greedy'),
            ('ours', 'float32', 'beam 4'), ('ct2', 'float32', 'beam 4'), ('ct2', 'int8', 'beam 4'))


def _until_eos(ids) -> list[int]:
  """Token ids up to and including the first EOS (all of them when there is none)."""
  ids = [int(i) for i in ids if i != PAD_ID]
  return ids[:ids.index(EOS_ID) + 1] if EOS_ID in ids else ids


def main(argv):
  del argv
  config = config_lib.of_run(_WORKDIR.value)
  restored = restoring.restore(config, _WORKDIR.value)
  tok = restored.tokenizer
  sp = spm.SentencePieceProcessor(model_file=tok.path)
  split = sources.load_split(config.data, config.eval.test_split)
  pairs = [split[i] for i in range(min(_SENTENCES.value, len(split)))]
  batches = list(pipeline.make_eval_batches(pairs, tok, _BATCH_SIZE.value))
  offset, alpha = config.decode.max_len_offset, config.decode.alpha
  rows = [[(b['inputs'][r], int(b['example_index'][r])) for r in range(len(b['inputs'])) if b['example_index'][r] >= 0]
          for b in batches]
  device_inputs = [jax.device_put(b['inputs']) for b in batches]
  with tempfile.TemporaryDirectory() as tmp:
    translators = {}
    for weights in ('float32', 'int8'):
      path = export.export_ctranslate2(restored.model.config, restored.params, tok.path, os.path.join(tmp, weights),
                                       quantization=weights)
      translators[weights] = ctranslate2.Translator(str(path), device='cpu', inter_threads=1,
                                                    intra_threads=_THREADS.value)

    def ours(decoding):
      method, beam = ('greedy', 1) if decoding == 'greedy' else ('beam', 4)
      out = {}
      for inputs, batch_rows in zip(device_inputs, rows):
        tokens, _ = generation.generate(restored.members, inputs, jax.random.key(0), method=method, beam_size=beam,
                                       alpha=alpha, max_decode_len=inputs.shape[1] + offset)
        tokens = np.asarray(jax.block_until_ready(tokens))[:, 0]
        out.update((index, _until_eos(tokens[r])) for r, (_, index) in enumerate(batch_rows))
      return out

    def ct2(weights, decoding):
      beam = 1 if decoding == 'greedy' else 4
      out = {}
      for batch, batch_rows in zip(batches, rows):
        source = [[sp.id_to_piece(int(i)) for i in ids if i not in (PAD_ID, EOS_ID)] for ids, _ in batch_rows]
        results = translators[weights].translate_batch(
            source, beam_size=beam, length_penalty=alpha, max_batch_size=0,
            max_decoding_length=batch['inputs'].shape[1] + offset, return_end_token=True)
        out.update((index, [sp.piece_to_id(p) for p in r.hypotheses[0]])
                   for r, (_, index) in zip(results, batch_rows))
      return out

    run = {s: (lambda s=s: ours(s[2]) if s[0] == 'ours' else ct2(s[1], s[2])) for s in SETTINGS}
    with restored.on_mesh():
      for setting in SETTINGS:  # compile / warm up
        run[setting]()
      times, outputs = {s: [] for s in SETTINGS}, {}
      for _ in range(_ROUNDS.value):
        for setting in SETTINGS:
          start = time.perf_counter()
          outputs[setting] = run[setting]()
          times[setting].append(time.perf_counter() - start)
          tokens = sum(len(ids) for ids in outputs[setting].values())
          common.emit({'engine': setting[0], 'weights': setting[1], 'decoding': setting[2], 'sentences': len(pairs),
                       'batch_size': _BATCH_SIZE.value, 'seconds': times[setting][-1], 'generated_tokens': tokens,
                       'tokens_per_second': tokens / times[setting][-1],
                       'sentences_per_second': len(pairs) / times[setting][-1]})

  references = [tgt for _, tgt in pairs]
  greedy = outputs[('ours', 'float32', 'greedy')]
  table = []
  for setting in SETTINGS:
    seconds = statistics.median(times[setting])
    ours_seconds = statistics.median(times[('ours', 'float32', setting[2])])
    hypotheses = [tok.decode(outputs[setting][i]) for i in range(len(pairs))]
    same = sum(outputs[setting][i] == greedy[i] for i in range(len(pairs))) if setting[2] == 'greedy' else '–'
    tokens = sum(len(ids) for ids in outputs[setting].values())
    table.append([{'ours': 'ours (jit)', 'ct2': 'CTranslate2'}[setting[0]], setting[1], setting[2],
                  len(pairs) / seconds, tokens / seconds, ours_seconds / seconds,
                  scores.sacrebleu_corpus(hypotheses, references)[0], same])
  print(f'\n{len(pairs)} test sentences in batches of {_BATCH_SIZE.value}; max output length: batch width + '
        f'{offset}; CTranslate2 {ctranslate2.__version__}, intra_threads={_THREADS.value}; jax {jax.__version__}; '
        f'{json.dumps({**common.machine(), "vnni": common.cpu_has_vnni()})}\n')
  print(common.markdown_table(['engine', 'weights', 'decoding', 'sentences/s', 'generated tokens/s',
                               '× ours (same decoding)', 'BLEU', 'greedy = ours'], table))


if __name__ == '__main__':
  app.run(main)
