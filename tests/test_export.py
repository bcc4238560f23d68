"""CTranslate2 export: the exported model computes what ours computes, and refuses what CT2 cannot represent."""

import copy
import json
import os

import ctranslate2
import flax.linen as nn
import jax
import numpy as np
import pytest
import sentencepiece as spm

from transformer_jax import config as config_lib
from transformer_jax.config.model import ModelConfig
from transformer_jax.core.tokens import EOS_ID
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import sources
from transformer_jax.evaluation import scores
from transformer_jax.inference import generation
from transformer_jax.inference import restoring
from transformer_jax.interop import ctranslate2 as export
from transformer_jax.interop import marian
from transformer_jax.interop import serving
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime import sharding
import helpers

# Every test here trains a model first (or shares one): end-to-end, so slow.
pytestmark = pytest.mark.slow

# The model of the exported-run tests: the first seeded run (conftest: the smoke test, 2+2 layers of width 64, 1000
# pieces, trained far enough that greedy outputs differ from sentence to sentence).
VOCAB = helpers.smoke_config().model.vocab_size
SENTENCES = 32  # test sentences translated by both engines (a multiple of the 8 simulated devices)
# float32 on two engines sums in different orders: log-probabilities agree to a few 1e-6 (measured: at most 8e-6
# on the README main-job model, 3e-6 on these variants). A mapping mistake (a transposed kernel, a head order, a
# missing scale or bias) moves them by more than 1e-2.
LOG_PROB_TOLERANCE = 1e-4


@pytest.fixture(scope='module')
def trained(seeded_runs):
  return config_lib.of_run(seeded_runs[0]), seeded_runs[0]


def _restore(config, workdir):
  """Params, model and tokenizer of the run's final model (the one call into the restore API)."""
  return restoring.restore(config, workdir)


def _ids_until_eos(row) -> list[int]:
  row = [int(t) for t in row]
  return row[:row.index(EOS_ID)] if EOS_ID in row else row


def _padded(rows: list[list[int]]) -> np.ndarray:
  out = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def _test_sources(config, count=SENTENCES) -> list[str]:
  split = sources.load_split(config.data, 'test')
  return [split[i][0] for i in range(count)]


def _our_greedy(restored, inputs: np.ndarray, max_decode_len: int) -> list[list[int]]:
  with restored.on_mesh():
    batch = jax.make_array_from_process_local_data(sharding.batch_sharding(restored.mesh), inputs)
    tokens, _ = generation.generate(restored.members, batch, jax.random.key(0), method='greedy',
                                    max_decode_len=max_decode_len)
  return [_ids_until_eos(row) for row in np.asarray(tokens)[:, 0]]


def _ct2_greedy(out_dir, sp, lines, max_decode_len) -> list[list[int]]:
  """CTranslate2's greedy ids of `lines`, in one batch at most `max_decode_len` tokens long, or with a list of
  limits each line alone with its own."""
  translator = ctranslate2.Translator(str(out_dir), device='cpu', intra_threads=2)
  batches = ([(lines, max_decode_len)] if isinstance(max_decode_len, int)
             else [([line], limit) for line, limit in zip(lines, max_decode_len)])
  return [[sp.piece_to_id(piece) for piece in result.hypotheses[0]]
          for batch, limit in batches
          for result in translator.translate_batch([sp.encode(line, out_type=str) for line in batch], beam_size=1,
                                                   max_decoding_length=limit)]


def test_float32_export_decodes_greedily_as_we_do_token_for_token(trained, tmp_path):
  config, workdir = trained
  restored = _restore(config, workdir)
  export.export_ctranslate2(restored.model.config, restored.params, restored.tokenizer.path, tmp_path / 'ct2')
  sp = spm.SentencePieceProcessor(model_file=restored.tokenizer.path)
  lines = _test_sources(config)
  inputs = _padded([sp.encode(line) + [EOS_ID] for line in lines])
  max_decode_len = inputs.shape[1] + config.decode.max_len_offset  # input length + offset, as eval.py decodes
  ours = _our_greedy(restored, inputs, max_decode_len)
  theirs = _ct2_greedy(tmp_path / 'ct2', sp, lines, max_decode_len)
  assert len({tuple(ids) for ids in ours}) >= SENTENCES // 4  # not one output for every sentence
  assert theirs == ours


def _our_log_probs(cfg, params, sources_ids, target_ids) -> list[np.ndarray]:
  """Teacher-forced log-probability of every target token (and the final EOS)."""
  targets = [t + [EOS_ID] for t in target_ids]
  logits = Transformer(cfg).apply({'params': params}, _padded([s + [EOS_ID] for s in sources_ids]),
                                  _padded(targets))
  log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  return [log_probs[i, np.arange(len(t)), t] for i, t in enumerate(targets)]


VARIANTS = {
    'post-LN, sinusoidal, shared embeddings': {},
    'pre-LN': {'norm': 'pre'},
    'learned positions': {'positional': 'learned'},
    'separate embeddings and output layer': {'share_embeddings': False},
    'd_k = d_v = 12 (not d_model / h = 8)': {'d_k': 12, 'd_v': 12},
}


@pytest.mark.parametrize('variant', VARIANTS)
def test_exported_model_scores_targets_as_ours_does(trained, tmp_path, variant):
  config, workdir = trained
  spm_path = Workdir(workdir).tokenizer_model
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  cfg = ModelConfig(vocab_size=VOCAB, d_model=32, d_ff=64, num_heads=4, num_encoder_layers=2,
                    num_decoder_layers=2, max_len=32, **VARIANTS[variant])
  params = helpers.perturbed_params(cfg, seed=len(variant))
  split = sources.load_split(config.data, 'test')
  pairs = [(sp.encode(s), sp.encode(t)) for s, t in (split[i] for i in range(40))]
  pairs = [(s, t) for s, t in pairs if max(len(s), len(t)) < cfg.max_len][:8]  # learned positions: max_len
  export.export_ctranslate2(cfg, params, spm_path, tmp_path / 'ct2')
  translator = ctranslate2.Translator(str(tmp_path / 'ct2'), device='cpu', intra_threads=2)
  theirs = translator.score_batch([[sp.id_to_piece(i) for i in s] for s, _ in pairs],
                                  [[sp.id_to_piece(i) for i in t] for _, t in pairs])
  ours = _our_log_probs(cfg, params, [s for s, _ in pairs], [t for _, t in pairs])
  assert len(pairs) == 8
  for mine, result in zip(ours, theirs):
    np.testing.assert_allclose(result.log_probs, mine, rtol=0, atol=LOG_PROB_TOLERANCE)


def test_directory_holds_the_vocabulary_in_id_order_and_the_sentencepiece_model(trained, tmp_path):
  config, workdir = trained
  restored = _restore(config, workdir)
  out = export.export_ctranslate2(config.model, restored.params, restored.tokenizer.path, tmp_path / 'm')
  assert sorted(os.listdir(out)) == ['config.json', 'model.bin', 'shared_vocabulary.json', 'spm.model',
                                     export.SETTINGS_FILE]
  assert sorted(os.listdir(tmp_path)) == ['m']  # no staging directory left behind
  umask = os.umask(0)
  os.umask(umask)
  assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # readable as a directory os.mkdir would make
  sp = spm.SentencePieceProcessor(model_file=restored.tokenizer.path)
  with open(out / 'shared_vocabulary.json', encoding='utf-8') as f:
    vocabulary = json.load(f)
  assert vocabulary == [sp.id_to_piece(i) for i in range(VOCAB)]
  assert vocabulary[:4] == ['<pad>', '</s>', '<s>', '<unk>']  # our PAD, EOS, BOS, UNK ids
  with open(out / 'config.json', encoding='utf-8') as f:
    ct2_config = json.load(f)
  assert ct2_config['decoder_start_token'] == '<s>' and ct2_config['eos_token'] == '</s>'
  assert ct2_config['add_source_eos'] is True and ct2_config['add_source_bos'] is False
  assert ct2_config['layer_norm_epsilon'] == pytest.approx(1e-6)
  with open(restored.tokenizer.path, 'rb') as a, open(out / 'spm.model', 'rb') as b:
    assert a.read() == b.read()


@pytest.mark.parametrize('quantization, compute_type', [
    ('int8', 'int8_float32'),
    ('int8_float16', 'int8_float32'),  # the GPU type: on a CPU without float16 arithmetic CT2 computes in float32
    ('float16', 'float32'),
])
def test_quantized_exports_load_on_cpu(trained, tmp_path, quantization, compute_type):
  config, workdir = trained
  restored = _restore(config, workdir)
  export.export_ctranslate2(restored.model.config, restored.params, restored.tokenizer.path, tmp_path / 'q',
                            quantization=quantization)
  translator = ctranslate2.Translator(str(tmp_path / 'q'), device='cpu')
  assert translator.compute_type == compute_type
  sp = spm.SentencePieceProcessor(model_file=restored.tokenizer.path)
  results = translator.translate_batch([sp.encode(line, out_type=str) for line in _test_sources(config, 4)])
  assert len(results) == 4


def _spec_variables(spec) -> dict:
  """The spec's variables by name as numpy arrays (aliases, which name another variable, left out)."""
  return {name: value.numpy() for name, value in spec.variables().items() if not isinstance(value, str)}


def _optimized_spec(cfg: ModelConfig, weights, quantization):
  spec = export.transformer_model_spec(cfg, weights)
  pieces = [f'piece{i}' for i in range(cfg.vocab_size)]
  spec.register_source_vocabulary(pieces)
  spec.register_target_vocabulary(pieces)
  spec.validate()
  export.optimize_spec(spec, quantization)
  return spec


@pytest.mark.parametrize('quantization', ['int8', 'int8_float16'])
def test_int8_weights_keep_seven_bits_so_no_16_bit_pair_sum_of_a_cpu_can_overflow(quantization):
  """CT2's int8 products on an x86 CPU without VNNI add (activation + 128) · weight in pairs of 16 bits: with
  weights within ±63 no pair leaves int16. Each row still spans ±63 (its own scale) and rounds to the nearest."""
  cfg = ModelConfig(vocab_size=64, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                    max_len=32)
  weights = jax.tree.map(lambda x: np.array(x, np.float32),
                         jax.device_get(nn.unbox(helpers.perturbed_params(cfg, seed=0))))
  originals = _spec_variables(_optimized_spec(cfg, copy.deepcopy(weights), None))
  quantized = _spec_variables(_optimized_spec(cfg, weights, quantization))
  int8 = {name: value for name, value in quantized.items() if value.dtype == np.int8 and value.ndim}
  # the encoder layer's fused query/key/value, output projection and two FFN matrices; the decoder layer's fused
  # query/key/value, cross-attention's query and fused key/value, two output projections and two FFN matrices;
  # the shared embedding
  assert len(int8) == (4 + 7) + 1, sorted(int8)
  for name, value in int8.items():
    rows = value.reshape(value.shape[0], -1).astype(np.int32)
    scale = quantized[f'{name}_scale'].astype(np.float64)[:, None]
    assert 2 * 255 * np.abs(rows).max() <= np.iinfo(np.int16).max, name
    assert np.all(np.abs(rows).max(axis=1) == export.INT8_WEIGHT_LIMIT), name
    error = np.abs(rows / scale - originals[name].reshape(rows.shape))
    assert np.all(error <= (0.5 + 1e-4) / scale), name  # 1e-4 of a step: float32 rounding of weight × scale


@pytest.mark.parametrize('change, message', [
    ({'d_k': 8, 'd_v': 16}, 'needs d_k == d_v'),
    ({'vocab_size': VOCAB + 1}, f'has {VOCAB} pieces but the model has vocab_size='),
    ({'quantization': 'int4'}, "quantization='int4': use one of"),
    ({'spm': 'missing.model'}, 'no SentencePiece model at'),
    ({'out': 'not empty'}, 'is not an empty directory'),
    ({'out': 'under a file'}, r'/a_file is a file, so .*/a_file/sub/out cannot be made: pass an export directory '),
    ({'norm': 'pre'}, 'the params have no encoder/final_norm'),  # given post-LN params
])
def test_refused_exports_are_one_line_errors(trained, tmp_path, change, message):
  _, workdir = trained
  change = dict(change)
  quantization = change.pop('quantization', None)
  spm_path = change.pop('spm', Workdir(workdir).tokenizer_model)
  out = tmp_path / 'out'
  out_kind = change.pop('out', None)
  if out_kind == 'not empty':
    out.mkdir()
    (out / 'model.bin').write_text('an earlier export')
  elif out_kind == 'under a file':
    (tmp_path / 'a_file').write_text('not a directory')
    out = tmp_path / 'a_file' / 'sub' / 'out'
  base = dict(vocab_size=VOCAB, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
              max_len=32)
  # Only the last case gets as far as reading params: the others must refuse before looking at them.
  params = helpers.perturbed_params(ModelConfig(**base), seed=0) if change.get('norm') else {}
  with pytest.raises(ValueError, match=message) as error:
    export.export_ctranslate2(ModelConfig(**{**base, **change}), params, spm_path, out, quantization=quantization)
  assert '\n' not in str(error.value)
  assert not (out / 'config.json').exists()


def test_a_language_model_is_refused_by_both_export_formats_without_pointing_at_the_other():
  cfg = ModelConfig(vocab_size=VOCAB, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=0, num_decoder_layers=1,
                    architecture='decoder_only')
  with pytest.raises(ValueError, match='decoder-only language model; neither export format holds one') as error:
    marian.check_exportable(cfg)
  assert 'ctranslate2' not in str(error.value)
  with pytest.raises(ValueError, match='this is a decoder-only language model: export a translation model'):
    export.check_exportable(cfg, None)


def test_the_export_command_writes_a_model_translate_serves_as_ct2_and_as_our_greedy_search(entry_points, trained,
                                                                                           tmp_path):
  config, workdir = trained
  out = tmp_path / 'ct2'
  result = entry_points.run(['-m', 'transformer_jax.export', f'--workdir={workdir}', '--format=ctranslate2',
                             f'--out={out}'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert ctranslate2.Translator(str(out), device='cpu').compute_type == 'float32'
  with open(out / export.SETTINGS_FILE, encoding='utf-8') as f:
    settings = json.load(f)
  assert settings['decode'] == config.decode.to_dict()
  assert settings['model']['d_model'] == config.model.d_model
  lines = _test_sources(config)
  result = entry_points.run(['-m', 'transformer_jax.translate', '--engine=ctranslate2', f'--model={out}',
                             '--method=greedy'], ''.join(line + '\n' for line in lines[:3] + [''] + lines[3:]),
                            text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  served = result.stdout.split('\n')
  assert len(served) == len(lines) + 2 and served[3] == '' and served[-1] == ''  # one line out per line in
  served = served[:3] + served[4:-1]
  sp = spm.SentencePieceProcessor(model_file=str(out / export.SPM_FILE))
  model = ModelConfig.from_dict(config.model)
  limits = [model.decode_length(len(sp.encode(line)) + 1, config.decode.max_len_offset) for line in lines]  # EOS
  assert served == [sp.decode(ids) for ids in _ct2_greedy(out, sp, lines, limits)]  # each line's own limit
  assert served == generation.translate_lines(_restore(config, workdir), lines, method='greedy')
  assert len(set(served)) >= SENTENCES // 4


def test_the_export_command_refuses_a_model_ct2_cannot_represent_before_restoring_it(entry_points, trained, tmp_path):
  _, workdir = trained
  with open(Workdir(workdir).config_file, encoding='utf-8') as f:
    saved = json.load(f)
  saved['model'].update(d_k=4, d_v=8)
  run = tmp_path / 'run'  # a config and no checkpoints: the refusal comes first
  run.mkdir()
  (run / 'config.json').write_text(json.dumps(saved), encoding='utf-8')
  result = entry_points.run(['-m', 'transformer_jax.export', f'--workdir={run}', f'--out={tmp_path / "out"}'],
                            text=True)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 1 and len(lines) == 1 and 'needs d_k == d_v' in lines[0]
  assert not (tmp_path / 'out').exists()


def _bleu_of(out_dir, sp, lines, references) -> float:
  translator = ctranslate2.Translator(str(out_dir), device='cpu', intra_threads=2)
  results = translator.translate_batch([sp.encode(line, out_type=str) for line in lines], beam_size=4,
                                       max_batch_size=64)
  return scores.sacrebleu_corpus([sp.decode_pieces(r.hypotheses[0]) for r in results], references)[0]


def test_int8_bleu_is_within_one_point_of_float32(trained, tmp_path):
  """The first seeded run's 200 test sentences translated by CT2 with float32 and int8 weights, beam 4."""
  config, workdir = trained
  restored = _restore(config, workdir)
  sp = spm.SentencePieceProcessor(model_file=restored.tokenizer.path)
  split = sources.load_split(config.data, 'test')
  lines, references = [s for s, _ in split], [t for _, t in split]
  bleu = {}
  for quantization in ('float32', 'int8'):
    out = export.export_ctranslate2(restored.model.config, restored.params, restored.tokenizer.path,
                                    tmp_path / quantization, quantization=quantization)
    bleu[quantization] = _bleu_of(out, sp, lines, references)
  print(f'test BLEU on {len(lines)} sentences, beam 4: CTranslate2 {bleu}')
  assert bleu['float32'] > 20  # trained far enough for the comparison to mean something
  assert abs(bleu['int8'] - bleu['float32']) <= 1.0


@pytest.mark.parametrize('name', ['model.bin', 'config.json', 'shared_vocabulary.json'])
def test_an_export_with_a_damaged_file_is_refused_by_translate_in_one_line(trained, tmp_path, name):
  config, workdir = trained
  restored = _restore(config, workdir)
  out = tmp_path / 'ct2'
  export.export_ctranslate2(restored.model.config, restored.params, restored.tokenizer.path, out, decode=config.decode)
  helpers.truncate(str(out / name))
  with pytest.raises(ValueError) as error:
    serving.translate_lines(str(out), ['The dog sees the cat.'])
  assert str(error.value).startswith(f'{out} does not load as a CTranslate2 model (')
  assert str(error.value).endswith('a file of the export is damaged; export it again with python -m '
                                   'transformer_jax.export.')
  assert '\n' not in str(error.value)
