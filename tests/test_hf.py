"""transformers MarianMT interop: an imported checkpoint computes what `MarianMTModel` computes, an exported run loads
in `transformers` and computes what ours computes, and the round trip gives the same parameters back.

The MarianMT models are built here: a `MarianConfig` with random weights, and source and target SentencePiece models
trained on the built-in corpus with a Marian-style vocab.json (eos 0, unk 1, pad last). Nothing is downloaded.
"""

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import sentencepiece as spm
import torch
import transformers

from transformer_jax import config as config_lib
from transformer_jax.config.model import ModelConfig
from transformer_jax.core.tokens import EOS_ID, PAD_ID
from transformer_jax.data import sources
from transformer_jax.inference import generation
from transformer_jax.inference import restoring
from transformer_jax.interop import card
from transformer_jax.interop import ctranslate2 as export
from transformer_jax.interop import hf
from transformer_jax.interop import marian
from transformer_jax.interop import marian_import as convert
from transformer_jax.interop import serving
from transformer_jax.jobs import scoring
from transformer_jax.model import loss
from transformer_jax.model.transformer import MASKED_LOGIT, Transformer
from transformer_jax.runtime import sharding
import helpers

# Two float32 engines sum in different orders; a mapping mistake (a transposed kernel, a permuted row, a missing
# bias or scale) moves logits by far more.
LOGITS_TOLERANCE = 1e-4
# Log-probabilities and their sums, float32: the issue's bound. A token counted twice in the softmax (the pad and
# decoder start row imported as both PAD and BOS) moves them by log(1 + p(pad)), orders of magnitude more.
PROBABILITY_TOLERANCE = 1e-5
SENTENCES = 8


def _train_spm(texts, path, vocab_size):
  spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(path), vocab_size=vocab_size,
                                 model_type='unigram', character_coverage=1.0, minloglevel=2, num_threads=1)
  return f'{path}.model'


def _pieces(model_file):
  sp = spm.SentencePieceProcessor(model_file=model_file)
  return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)]


def _corpus(count=2000):
  split = sources.load_split(helpers.tiny_config().data, 'train')
  return [split[i] for i in range(count)]


def build_marian(directory, *, seed=0, tokenizer_from=None, pad_row='zero', **config):
  """A MarianMT checkpoint in `directory`: random weights (every tensor, biases and LayerNorms included; the pad
  token's embedding row zero, as in Marian's checkpoints, or random with pad_row='random'), its own source (EN) and
  target (DE) SentencePiece models and a vocab.json in Marian's layout (or those of the checkpoint in
  `tokenizer_from`)."""
  os.makedirs(directory, exist_ok=True)
  if tokenizer_from:
    for name in hf.TOKENIZER_FILES:
      shutil.copyfile(os.path.join(tokenizer_from, name), os.path.join(directory, name))
    with open(os.path.join(directory, hf.VOCAB), encoding='utf-8') as f:
      vocab = json.load(f)
  else:
    pairs = _corpus()
    source = _train_spm([s for s, _ in pairs], os.path.join(directory, 'src'), 120)
    target = _train_spm([t for _, t in pairs], os.path.join(directory, 'tgt'), 140)
    pieces = list(dict.fromkeys(_pieces(source) + _pieces(target)))
    vocab = {'</s>': 0, '<unk>': 1, **{piece: i + 2 for i, piece in enumerate(pieces)}}
    vocab['<pad>'] = len(vocab)
  settings = dict(vocab_size=len(vocab), d_model=16, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=32,
                  decoder_ffn_dim=32, encoder_attention_heads=2, decoder_attention_heads=2,
                  max_position_embeddings=64, activation_function='swish', scale_embedding=True,
                  pad_token_id=len(vocab) - 1, eos_token_id=0, decoder_start_token_id=len(vocab) - 1,
                  forced_eos_token_id=None, dropout=0.1)
  settings.update(config)
  torch.manual_seed(seed)
  model = transformers.MarianMTModel(transformers.MarianConfig(**settings)).eval()
  with torch.no_grad():
    for name, tensor in model.named_parameters():
      if 'embed_positions' in name:  # the sinusoid table, not a weight
        continue
      tensor.copy_(torch.randn_like(tensor) * 0.3 + (1.0 if 'layer_norm.weight' in name else 0.0))
    model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias) * 0.3)
    if pad_row == 'zero':
      embeddings = (model.model.encoder.embed_tokens, model.model.decoder.embed_tokens)
      for embedding in {id(e): e for e in embeddings}.values():  # one table when they are shared
        embedding.weight[settings['pad_token_id']] = 0.0
  model.save_pretrained(directory)
  if not tokenizer_from:
    shutil.move(source, os.path.join(directory, hf.SOURCE_SPM))
    shutil.move(target, os.path.join(directory, hf.TARGET_SPM))
    with open(os.path.join(directory, hf.VOCAB), 'w', encoding='utf-8') as f:
      json.dump(vocab, f, ensure_ascii=False)
  return model


@pytest.fixture(scope='module')
def imported(tmp_path_factory):
  """A MarianMT checkpoint (zero pad row), its transformers model and tokenizer, and the workdir `convert` made of
  it."""
  root = tmp_path_factory.mktemp('marian')
  model = build_marian(root / 'hf')
  convert.import_checkpoint(str(root / 'hf'), str(root / 'run'))
  tokenizer = transformers.MarianTokenizer.from_pretrained(str(root / 'hf'))
  return model, tokenizer, str(root / 'hf'), str(root / 'run')


def _test_pairs(count=SENTENCES, workdir=None):
  """The first test pairs of the built-in corpus (of a run's config, else of the tiny one)."""
  data = config_lib.of_run(workdir).data if workdir else helpers.tiny_config().data
  split = sources.load_split(data, 'test')
  return [split[i] for i in range(count)]


def _padded(rows, width=None):
  out = np.zeros((len(rows), width or max(len(r) for r in rows)), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def _hf_inputs(source_ids, target_ids, pad_id):
  """MarianMTModel's teacher-forced inputs: sources right-padded with its pad, their mask, the targets (labels)."""
  width = max(len(s) for s in source_ids)
  inputs = torch.tensor([s + [pad_id] * (width - len(s)) for s in source_ids])
  mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in source_ids])
  t_width = max(len(t) for t in target_ids)
  labels = torch.tensor([t + [pad_id] * (t_width - len(t)) for t in target_ids])
  return dict(input_ids=inputs, attention_mask=mask, labels=labels)


def _hf_logits(model, source_ids, target_ids, pad_id):
  """MarianMTModel's teacher-forced logits (targets shifted right after its decoder start token)."""
  with torch.no_grad():
    return model(**_hf_inputs(source_ids, target_ids, pad_id)).logits.numpy()


def _restore(workdir):
  return restoring.restore(config_lib.of_run(workdir), workdir)


# Our passes jitted, a program per model (op by op, each of a pass's operations would be compiled on its own).
@functools.partial(jax.jit, static_argnums=0)
def _logits(model, params, src, tgt):
  """Our teacher-forced logits of the targets `tgt` given the sources `src`."""
  return model.apply({'params': params}, src, tgt)


def _training_nll(model, params, src, tgt):
  """Training's summed NLL of the targets `tgt` (label smoothing off, the loss in chunks of 4 positions)."""
  hidden, weights, bias = model.apply({'params': params}, src, tgt, return_hidden=True)
  return loss.token_sums(hidden, weights, bias, tgt, 0.0, 4, model.config.kernels, model.config.first_output_id)['nll']


_TRAINING_NLL = jax.jit(_training_nll, static_argnums=0)
_TRAINING_NLL_GRAD = jax.jit(jax.grad(_training_nll, argnums=1), static_argnums=0)


def _order(model):
  return marian.import_order(model.config.pad_token_id, 0, model.config.decoder_start_token_id, 1,
                             model.config.vocab_size)


class _Pairs:
  """Test pairs as both tokenizers make them: Marian's ids (theirs) and ours, checked to be the same pieces."""

  def __init__(self, model, tokenizer, restored, count=SENTENCES):
    self.order = _order(model)
    self.text = _test_pairs(count)
    self.theirs_src = [tokenizer(s)['input_ids'] for s, _ in self.text]
    self.theirs_tgt = [tokenizer(text_target=t)['input_ids'] for _, t in self.text]
    self.ours_src = [restored.tokenizer.encode(s) + [EOS_ID] for s, _ in self.text]
    self.ours_tgt = [restored.tokenizer.encode_target(t) + [EOS_ID] for _, t in self.text]
    assert [[self.order[i] for i in row] for row in self.ours_src] == self.theirs_src  # the same pieces, our ids
    assert [[self.order[i] for i in row] for row in self.ours_tgt] == self.theirs_tgt
    assert any(s != t for s, t in zip(self.theirs_src, self.theirs_tgt))  # two SentencePiece models


def test_imported_model_scores_targets_as_marian_does(imported):
  model, tokenizer, _, workdir = imported
  cfg = _assert_same_logits(model, tokenizer, workdir)
  assert (cfg.activation, cfg.sinusoids, cfg.scale_embeddings, cfg.attention_bias, cfg.logits_bias, cfg.pad_is_bos) == (
      'swish', 'split', True, True, True, True)


OPTIONS = {
    'gelu, unscaled embeddings, no biases': dict(activation_function='gelu', scale_embedding=False),
    'relu, separate embeddings and output layer': dict(activation_function='relu',
                                                       share_encoder_decoder_embeddings=False,
                                                       tie_word_embeddings=False),
}


@pytest.mark.parametrize('options', OPTIONS)
def test_marian_options_import_as_our_options(imported, tmp_path, options):
  _, tokenizer, directory, _ = imported
  model = build_marian(tmp_path / 'hf', seed=len(options), tokenizer_from=directory, **OPTIONS[options])
  if 'no biases' in options:  # a checkpoint whose attention and logits biases are zero: imported without them
    with torch.no_grad():
      for name, tensor in model.named_parameters():
        if '_proj.bias' in name:
          tensor.zero_()
      model.final_logits_bias.zero_()
    model.save_pretrained(tmp_path / 'hf')
  convert.import_checkpoint(str(tmp_path / 'hf'), str(tmp_path / 'run'))
  cfg = _assert_same_logits(model, tokenizer, str(tmp_path / 'run'))
  assert cfg.activation == OPTIONS[options]['activation_function']
  assert cfg.scale_embeddings == OPTIONS[options].get('scale_embedding', True)
  assert cfg.share_embeddings == OPTIONS[options].get('tie_word_embeddings', True)
  assert cfg.attention_bias == cfg.logits_bias == ('no biases' not in options)


def _assert_same_logits(model, tokenizer, workdir) -> ModelConfig:
  """Our teacher-forced logits of the imported `workdir` are MarianMTModel's (on the same pieces, in our ids), but
  for PAD's, which is Marian's decoder start token again (our BOS) and is masked out of the softmax."""
  restored = _restore(workdir)
  pairs = _Pairs(model, tokenizer, restored)
  ours = np.asarray(_logits(restored.model, restored.params, _padded(pairs.ours_src), _padded(pairs.ours_tgt)))
  theirs = _hf_logits(model, pairs.theirs_src, pairs.theirs_tgt, model.config.pad_token_id)[..., pairs.order]
  for i, row in enumerate(pairs.ours_tgt):
    np.testing.assert_allclose(ours[i, :len(row), PAD_ID + 1:], theirs[i, :len(row), PAD_ID + 1:], rtol=0,
                               atol=LOGITS_TOLERANCE)
  assert np.all(ours[..., PAD_ID] == MASKED_LOGIT)
  return restored.model.config


@pytest.fixture(scope='module', params=['zero', 'random'])
def pad_rows(request, imported, tmp_path_factory):
  """The imported checkpoint (a zero pad row) and one like it whose pad row is random, with their workdirs."""
  if request.param == 'zero':
    return imported
  model, tokenizer, directory, _ = imported
  root = tmp_path_factory.mktemp('random_pad_row')
  model = build_marian(root / 'hf', seed=5, tokenizer_from=directory, pad_row='random')
  convert.import_checkpoint(str(root / 'hf'), str(root / 'run'))
  return model, tokenizer, str(root / 'hf'), str(root / 'run')


def _their_log_probs(model, pairs):
  """MarianMTModel's log-probability of each target token (a list per sentence) and their total."""
  logits = torch.from_numpy(_hf_logits(model, pairs.theirs_src, pairs.theirs_tgt, model.config.pad_token_id))
  log_probs = torch.log_softmax(logits.double(), dim=-1).numpy()
  return [log_probs[i, np.arange(len(row)), row] for i, row in enumerate(pairs.theirs_tgt)]


def test_an_imported_model_gives_every_target_token_the_probability_marian_gives_it(pad_rows):
  """Per-token log-probabilities, and the NLL of eval.py's scoring and of training's chunked loss, are
  MarianMTModel's to float32 rounding: the pad/decoder-start token counts once in every softmax."""
  model, tokenizer, _, workdir = pad_rows
  restored = _restore(workdir)
  pairs = _Pairs(model, tokenizer, restored)
  theirs = _their_log_probs(model, pairs)
  src, tgt = _padded(pairs.ours_src), jnp.asarray(_padded(pairs.ours_tgt))
  log_probs = np.asarray(jax.nn.log_softmax(_logits(restored.model, restored.params, src, tgt), axis=-1))
  for i, row in enumerate(pairs.ours_tgt):
    np.testing.assert_allclose(log_probs[i, np.arange(len(row)), row], theirs[i], rtol=0, atol=PROBABILITY_TOLERANCE)
  tokens = sum(len(row) for row in theirs)
  their_nll = -sum(row.sum() for row in theirs) / tokens
  scored = scoring.teacher_forced_metrics(restored, pairs.text, 'test')  # eval.py's teacher-forced scoring
  assert scored['tokens'] == tokens
  assert abs(scored['nll'] - their_nll) < PROBABILITY_TOLERANCE
  nll = _TRAINING_NLL(restored.model, restored.params, src, tgt)  # training's loss, in chunks of 4 positions
  assert abs(float(nll) / tokens - their_nll) < PROBABILITY_TOLERANCE


def test_fine_tuning_an_imported_model_follows_marians_gradients(pad_rows):
  """The gradient of training's loss (label smoothing off) with respect to every parameter is that of
  MarianMTModel's summed NLL, mapped onto our params as the import maps the weights; our PAD row, which the model
  never reads, gets none."""
  model, tokenizer, directory, workdir = pad_rows
  restored = _restore(workdir)
  pairs = _Pairs(model, tokenizer, restored)
  cfg, src, tgt = restored.model.config, _padded(pairs.ours_src), jnp.asarray(_padded(pairs.ours_tgt))
  ours = jax.tree.map(np.array, jax.device_get(_TRAINING_NLL_GRAD(restored.model, jax.device_get(restored.params),
                                                                  src, tgt)))
  model.zero_grad()
  model.final_logits_bias.requires_grad_(True)  # a buffer of theirs, a parameter of ours
  logits = model(**_hf_inputs(pairs.theirs_src, pairs.theirs_tgt, model.config.pad_token_id)).logits
  log_probs = torch.log_softmax(logits, dim=-1)
  nll = -sum(log_probs[i, torch.arange(len(row)), torch.tensor(row)].sum() for i, row in enumerate(pairs.theirs_tgt))
  nll.backward()
  theirs = {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}
  theirs['final_logits_bias'] = model.final_logits_bias.grad.numpy()
  model.final_logits_bias.requires_grad_(False)
  theirs = marian.from_state_dict(cfg, theirs, pairs.order, directory)
  for vocabulary in (ours['shared_embedding']['embedding'], ours['decoder']['logits_bias']):
    assert not np.any(vocabulary[PAD_ID])  # PAD's row and bias: no softmax and no input reads them
  for name, key in (('shared_embedding', 'embedding'), ('decoder', 'logits_bias')):
    ours[name][key][PAD_ID] = theirs[name][key][PAD_ID]  # the import's copy of BOS's: their gradient is BOS's
  # float32 rounding is relative to the largest gradients (some, e.g. a key bias's, are zero up to rounding); a
  # mapping mistake moves a gradient by as much as itself
  atol = 1e-5 * max(float(np.max(np.abs(b))) for b in jax.tree.leaves(theirs))
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(ours)[0], jax.tree.leaves(theirs)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=atol, err_msg=jax.tree_util.keystr(path))


def _our_decode(restored, source_ids, max_decode_len, **kwargs):
  """Our ids [batch, max_decode_len] and scores [batch] of `generation.generate` (the best hypothesis)."""
  with restored.on_mesh():
    batch = jax.make_array_from_process_local_data(sharding.batch_sharding(restored.mesh), _padded(source_ids))
    tokens, scores = generation.generate(restored.members, batch, jax.random.key(0), max_decode_len=max_decode_len,
                                         **kwargs)
  return np.asarray(tokens)[:, 0], np.asarray(scores)[:, 0]


def _until_eos(row, eos):
  row = [int(t) for t in row]
  return row[:row.index(eos) + 1] if eos in row else row


def test_imported_model_decodes_greedily_as_marian_generate(imported):
  model, tokenizer, _, workdir = imported
  restored = _restore(workdir)
  order = _order(model)
  lines = [s for s, _ in _test_pairs()]
  max_decode_len = 20
  ours, _ = _our_decode(restored, [restored.tokenizer.encode(s) + [EOS_ID] for s in lines], max_decode_len,
                        method='greedy')
  batch = tokenizer(lines, return_tensors='pt', padding=True)
  with torch.no_grad():
    theirs = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=max_decode_len).numpy()[:, 1:]
  ours = [[order[i] for i in _until_eos(row, EOS_ID)] for row in ours]
  theirs = [_until_eos(row, 0) for row in theirs]
  assert len({tuple(row) for row in theirs}) > 1
  assert ours == theirs


def test_an_imported_model_beam_searches_as_marian_generate_with_its_scores(pad_rows):
  """generate(num_beams=4) and our beam search of 4, both without length normalisation (transformers'
  length_penalty=0, our alpha=0: transformers divides a score by length^length_penalty, ours by the GNMT
  ((5 + length) / 6)^alpha, the same only at 0), find the same hypotheses, token for token, with the same
  scores (their summed log-probabilities). A random model seldom ends a sentence: the hypotheses run to the length
  limit, where both return the best (transformers counts a hypothesis at its max length as finished, ours returns
  the best live one), and 10 tokens keep a float32 sum's rounding within the bound."""
  model, tokenizer, _, workdir = pad_rows
  restored = _restore(workdir)
  order = _order(model)
  lines = [s for s, _ in _test_pairs(16)]
  max_decode_len = 10
  ours, our_scores = _our_decode(restored, [restored.tokenizer.encode(s) + [EOS_ID] for s in lines], max_decode_len,
                                 method='beam', beam_size=4, alpha=0.0)
  with torch.no_grad():
    out = model.generate(**tokenizer(lines, return_tensors='pt', padding=True), num_beams=4, length_penalty=0.0,
                         do_sample=False, max_new_tokens=max_decode_len, output_scores=True,
                         return_dict_in_generate=True)
  theirs = [_until_eos(row, 0) for row in out.sequences.numpy()[:, 1:]]
  assert [[order[i] for i in _until_eos(row, EOS_ID)] for row in ours] == theirs
  assert len({tuple(row) for row in theirs}) > 1
  np.testing.assert_allclose(our_scores, out.sequences_scores.numpy(), rtol=0, atol=PROBABILITY_TOLERANCE)


# --- export: a run trained by train.py (conftest's first seeded run) as a MarianMT directory


@pytest.fixture(scope='module')
def exported(entry_points, seeded_runs, tmp_path_factory):
  workdir = seeded_runs[0]
  out = tmp_path_factory.mktemp('export') / 'marian'
  result = entry_points.run(['-m', 'transformer_jax.export', f'--workdir={workdir}', '--format=transformers',
                             f'--out={out}'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  return workdir, str(out)


def _load(exported):
  """Our restored run, the export's MarianMTModel and its tokenizer (by AutoTokenizer), and 32 test pairs."""
  workdir, out = exported
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  assert isinstance(tokenizer, transformers.MarianTokenizer)
  return (_restore(workdir), transformers.MarianMTModel.from_pretrained(out).eval(), tokenizer,
          _test_pairs(32, workdir))


@pytest.mark.slow
def test_exported_run_scores_targets_as_ours_does(exported):
  restored, model, tokenizer, pairs = _load(exported)
  ours_src = [restored.tokenizer.encode(s) + [EOS_ID] for s, _ in pairs]
  ours_tgt = [restored.tokenizer.encode_target(t) + [EOS_ID] for _, t in pairs]
  assert [tokenizer(s)['input_ids'] for s, _ in pairs] == ours_src  # our ids, kept
  assert [tokenizer(text_target=t)['input_ids'] for _, t in pairs] == ours_tgt
  ours = np.asarray(_logits(restored.model, restored.params, _padded(ours_src), _padded(ours_tgt)))
  theirs = _hf_logits(model, ours_src, ours_tgt, model.config.pad_token_id)
  for i, row in enumerate(ours_tgt):
    np.testing.assert_allclose(theirs[i, :len(row)], ours[i, :len(row)], rtol=0, atol=LOGITS_TOLERANCE)


@pytest.mark.slow
def test_exported_run_generates_and_translates_as_our_greedy_search(exported):
  restored, model, tokenizer, pairs = _load(exported)
  lines = [s for s, _ in pairs]
  # translate_lines decodes each line up to its input length (EOS included) + decode.max_len_offset tokens: both
  # engines search greedily up to the longest of those limits, and translate_lines' outputs are theirs cut there.
  limits = [restored.decode_length(len(restored.tokenizer.encode(s)) + 1, restored.config.decode.max_len_offset)
            for s in lines]
  max_decode_len = max(limits)
  ours, _ = _our_decode(restored, [restored.tokenizer.encode(s) + [EOS_ID] for s in lines], max_decode_len,
                        method='greedy')
  with torch.no_grad():
    theirs = model.generate(**tokenizer(lines, return_tensors='pt', padding=True), num_beams=1, do_sample=False,
                            max_new_tokens=max_decode_len).numpy()[:, 1:]
  assert [_until_eos(row, EOS_ID) for row in theirs] == [_until_eos(row, EOS_ID) for row in ours]
  assert len({tuple(row) for row in ours}) >= len(lines) // 4  # not one output for every sentence
  # transformers 5 removed pipeline('translation'); generate + batch_decode is what it ran.
  texts = tokenizer.batch_decode(torch.tensor(theirs), skip_special_tokens=True)
  assert texts == [restored.tokenizer.decode(row) for row in ours]  # both tokenizers read the same ids alike
  translated = generation.translate_lines(restored, lines, method='greedy')
  assert translated == [restored.tokenizer.decode(row[:limit]) for row, limit in zip(ours, limits)]
  assert sum(EOS_ID in row[:limit] for row, limit in zip(ours, limits)) >= len(lines) // 2  # most end on their own


@pytest.mark.slow
def test_exported_directory_holds_a_model_card_with_config_data_and_scores(exported):
  workdir, out = exported
  with open(os.path.join(out, 'README.md'), encoding='utf-8') as f:
    card = f.read()
  with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
    results = json.load(f)
  assert f'- bleu: {results["bleu"]:.2f} (sacrebleu `{results["bleu_signature"]}`)' in card
  assert f'- chrf: {results["chrf"]:.2f} (sacrebleu `{results["chrf_signature"]}`)' in card
  assert 'the built-in EN→DE corpus' in card and '"d_model": 64' in card
  assert sorted(os.listdir(out)) == ['README.md', 'config.json', 'generation_config.json', 'model.safetensors',
                                     'source.spm', 'target.spm', 'tokenizer_config.json', 'vocab.json']


@pytest.mark.slow
def test_a_converted_export_of_ours_evaluates_what_its_run_evaluated(entry_points, exported, tmp_path):
  """The card carries the run's config: the workdir converted from the export keeps the run's data, eval and decode
  settings (here the built-in corpus's 200 test sentences, not the default 2,000) and evaluates them."""
  workdir, out = exported
  converted = str(tmp_path / 'converted')
  result = entry_points.run(['-m', 'transformer_jax.convert', f'--from_hf={out}', f'--workdir={converted}'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  original, imported_config = config_lib.of_run(workdir), config_lib.of_run(converted)
  for section in ('data', 'eval', 'decode'):
    assert imported_config[section].to_dict() == original[section].to_dict(), section
  result = entry_points.run(['eval.py', f'--workdir={converted}'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  with open(os.path.join(converted, 'results.json'), encoding='utf-8') as f:
    evaluated = json.load(f)
  assert (evaluated['split'], evaluated['num_sentences']) == ('test', original.data.builtin_eval_size) == ('test', 200)
  assert card.training_config(str(tmp_path)) is None  # a directory without our card: nothing to bring back


def test_the_model_card_gives_the_exported_params_scores_or_says_whose_they_are(tmp_path):
  """The card reads eval.py's results file for the exported steps; without one, the final model's, said as such."""
  config = config_lib.base_config()
  final = {'split': 'test', 'num_sentences': 8, 'averaged_steps': [2, 4], 'bleu': 31.0, 'bleu_signature': 's'}
  (tmp_path / 'results.json').write_text(json.dumps(final))
  (tmp_path / 'results_step4.json').write_text(json.dumps(final | {'averaged_steps': [4], 'bleu': 29.5}))
  assert '- bleu: 31.00' in card.model_card(config, str(tmp_path), [2, 4], [2, 4])
  own = card.model_card(config, str(tmp_path), [4], [2, 4])
  assert '- bleu: 29.50' in own and 'params of step(s) [4]' in own and 'not of the exported' not in own
  other = card.model_card(config, str(tmp_path), [3], [2, 4])
  assert '- bleu: 31.00' in other
  assert "the scores of the run's final model, not of the exported params of step(s) [3]" in other


# --- the imported workdir with our other tools


def test_the_imported_workdir_exports_to_ctranslate2_and_decodes_as_we_do(imported, tmp_path):
  """CTranslate2 holds Marian's options too (swish, biases, the logits bias, split sinusoids, two SentencePiece
  models): its greedy outputs are ours, token for token."""
  _, _, _, workdir = imported
  restored = _restore(workdir)
  out = export.export_ctranslate2(restored.model.config, restored.params, restored.tokenizer, tmp_path / 'ct2')
  served = serving.translate_lines(str(out), [s for s, _ in _test_pairs()], beam_size=1)
  assert served == generation.translate_lines(restored, [s for s, _ in _test_pairs()], method='greedy')
  assert len(set(served)) > 1


@pytest.mark.slow
def test_each_sentence_is_decoded_up_to_its_own_input_length_plus_the_offset(imported, tmp_path):
  """The output limit is per sentence, its input tokens (EOS included) + decode.max_len_offset, whatever else is in
  its batch, in both engines: a random model seldom ends a sentence, so its outputs run to their limits, and a short
  sentence translated beside a long one is what it is alone."""
  _, _, _, workdir = imported
  restored = _restore(workdir)
  restored.config.decode.max_len_offset = 3
  lines = [s for s, _ in _test_pairs(16)]
  short, long = min(lines, key=len), max(lines, key=len)
  lengths = [len(restored.tokenizer.encode(line)) + 1 for line in (short, long)]
  assert lengths[1] > lengths[0] + 3
  rows = sharding.data_parallel_size(restored.mesh)
  sources_ids = [restored.tokenizer.encode(line) + [EOS_ID] for line in (short, long)]
  batch = {'inputs': _padded(sources_ids + [[]] * (rows - 2)),
           'example_index': np.asarray([0, 1] + [-1] * (rows - 2), np.int32)}
  with restored.on_mesh():
    decoded = dict(generation.translate_batches(restored, [batch], restored.config.decode, method='greedy'))
  assert EOS_ID not in decoded[0] and EOS_ID not in decoded[1]  # each ran to its limit: as many tokens as that
  assert [np.count_nonzero(decoded[i]) for i in (0, 1)] == [length + 3 for length in lengths]
  assert generation.translate_lines(restored, [short, long], method='greedy')[0] == generation.translate_lines(
      restored, [short], method='greedy')[0]
  out = export.export_ctranslate2(restored.model.config, restored.params, restored.tokenizer, tmp_path / 'ct2',
                                  decode=restored.config.decode)
  assert serving.translate_lines(str(out), [short, long], beam_size=1)[0] == serving.translate_lines(
      str(out), [short], beam_size=1)[0] == generation.translate_lines(restored, [short], method='greedy')[0]


@pytest.mark.slow
def test_eval_translate_and_attention_plots_read_the_imported_workdir(entry_points, imported, tmp_path):
  _, _, _, workdir = imported
  result = entry_points.run(['eval.py', f'--workdir={workdir}', '--config.data.builtin_eval_size=16',
                             '--config.decode.beam_size=1', '--config.eval.num_samples=0'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  (written,) = [line.split('results written to ')[1] for line in result.stdout.splitlines()
                if line.startswith('results written to ')]
  assert os.path.basename(written).startswith('results_data-')  # other data than the run's: a file of its own
  with open(written, encoding='utf-8') as f:
    assert json.load(f)['num_sentences'] == 16
  lines = [s for s, _ in _test_pairs()]
  result = entry_points.run(['-m', 'transformer_jax.translate', f'--workdir={workdir}', '--method=greedy'],
                            ''.join(line + '\n' for line in lines), text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines() == generation.translate_lines(_restore(workdir), lines, method='greedy')
  result = entry_points.run(['-m', 'transformer_jax.attention_plots', f'--workdir={workdir}', f'--sentence={lines[0]}',
                             f'--target={_test_pairs()[0][1]}', '--layer=1', f'--out={tmp_path / "maps"}'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert sorted(os.listdir(tmp_path / 'maps')) == ['cross_layer1.png', 'decoder_layer1.png', 'encoder_layer1.png']


# --- the round trip


def test_export_then_import_gives_back_the_same_parameters(imported, tmp_path):
  """An imported model (Marian's layout, swish, biases) exported is the checkpoint it came from, bit for bit, up to
  the order of the vocabulary (its pad and decoder start row once, as there), with a tokenizer that gives the
  export's ids; imported again, it is the same workdir, bit for bit."""
  model, tokenizer, directory, workdir = imported
  restored = _restore(workdir)
  params = jax.tree.map(np.asarray, jax.device_get(restored.params))
  cfg = restored.model.config
  hf.write(cfg, params, restored.tokenizer, tmp_path / 'marian', decode=restored.config.decode, card='')
  original = safetensors.numpy.load_file(os.path.join(directory, hf.SAFETENSORS))
  exported = safetensors.numpy.load_file(tmp_path / 'marian' / hf.SAFETENSORS)
  assert sorted(exported) == sorted(original)
  rows = _order(model)[1:]  # the original's row of each exported id: our ids less PAD
  for name, value in original.items():
    vocabulary = {'final_logits_bias': lambda x: x[..., rows], 'model.shared.weight': lambda x: x[rows]}
    expected = vocabulary.get(name, lambda x: x)(value)
    assert np.array_equal(exported[name], expected), name
  assert len(exported['model.shared.weight']) == len(original['model.shared.weight'])
  ours = [restored.tokenizer.encode(s) + [EOS_ID] for s, _ in _test_pairs()]
  assert [transformers.MarianTokenizer.from_pretrained(tmp_path / 'marian')(s)['input_ids']
          for s, _ in _test_pairs()] == [[i - 1 for i in row] for row in ours]
  again = convert.import_checkpoint(str(tmp_path / 'marian'), str(tmp_path / 'run'))
  assert again == cfg
  back = _restore(str(tmp_path / 'run'))
  assert jax.tree.structure(back.params) == jax.tree.structure(params)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(jax.device_get(back.params)),
                                                  jax.tree.leaves(params)))
  assert back.tokenizer.pieces == restored.tokenizer.pieces


@pytest.mark.slow
def test_a_paper_model_exports_with_its_features_permuted_and_scores_as_before(imported, tmp_path):
  """The paper's interleaved sinusoids, ReLU, no biases: the import of its export holds the same weights with the
  d_model features permuted (even, then odd) and computes the same logits."""
  _, _, _, workdir = imported
  tok = _restore(workdir).tokenizer
  cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=2,
                    num_decoder_layers=2, max_len=32)
  params = jax.tree.map(np.asarray, helpers.perturbed_params(cfg, seed=3))
  hf.write(cfg, params, tok, tmp_path / 'marian', decode=helpers.tiny_config().decode, card='')
  imported_cfg = convert.import_checkpoint(str(tmp_path / 'marian'), str(tmp_path / 'run'))
  assert imported_cfg.sinusoids == 'split' and not imported_cfg.attention_bias and not imported_cfg.logits_bias
  back = jax.device_get(_restore(str(tmp_path / 'run')).params)
  perm = marian.feature_permutation(cfg)
  embedding = params['shared_embedding']['embedding']
  np.testing.assert_array_equal(back['shared_embedding']['embedding'], embedding[:, perm])
  wi = params['encoder']['layer_1']['ffn']['wi']['kernel']
  np.testing.assert_array_equal(back['encoder']['layer_1']['ffn']['wi']['kernel'], wi[perm])
  pairs = _test_pairs()
  src = _padded([tok.encode(s) + [EOS_ID] for s, _ in pairs])
  tgt = _padded([tok.encode_target(t) + [EOS_ID] for _, t in pairs])
  ours = _logits(Transformer(cfg.replace(layer_norm_epsilon=marian.MARIAN_EPSILON)), params, src, tgt)
  theirs = _logits(Transformer(imported_cfg), back, src, tgt)
  np.testing.assert_allclose(np.asarray(theirs)[tgt > 0], np.asarray(ours)[tgt > 0], rtol=0, atol=LOGITS_TOLERANCE)


# --- bad inputs: one line naming the file and what to do, nothing written


def _edit(directory, config=None, tensors=None):
  """Changes a copy of a MarianMT checkpoint: config.json's keys (None: removed) and tensors (None: removed)."""
  if config:
    config_file = os.path.join(directory, hf.CONFIG)
    with open(config_file, encoding='utf-8') as f:
      values = json.load(f)
    values.update(config)
    with open(config_file, 'w', encoding='utf-8') as f:
      json.dump({k: v for k, v in values.items() if v is not None}, f)
  if tensors:
    path = os.path.join(directory, hf.SAFETENSORS)
    values = safetensors.numpy.load_file(path)
    values.update(tensors)
    safetensors.numpy.save_file({k: v for k, v in values.items() if v is not None}, path)


def _final_norms(d_model=16):
  """The LayerNorms after each stack of a pre-LN checkpoint (which MarianMT's post-LN layers have not)."""
  return {f'model.{side}.layer_norm.{name}': np.full(d_model, value, np.float32)
          for side in ('encoder', 'decoder') for name, value in (('weight', 1.0), ('bias', 0.0))}


# What a MarianMT checkpoint may hold that our model cannot: (config.json changes, tensor changes, what the one line
# names). Each is refused before anything is written.
REFUSED = {
    'pre_ln': ({'normalize_before': True, 'add_final_layer_norm': True}, _final_norms(),
               'normalize_before=True (pre-LN layers); add_final_layer_norm=True (a LayerNorm after each stack)'),
    'learned_positions': ({'static_position_embeddings': False}, None,
                          'static_position_embeddings=False (learned positions)'),
    'embedding_norm': ({'normalize_embedding': True}, None, 'normalize_embedding=True (a LayerNorm on the embeddings)'),
    'scale_not_a_bool': ({'scale_embedding': 'yes'}, None, "scale_embedding='yes' (true or false)"),
    'alias_mismatch': ({'num_hidden_layers': 3}, None, 'num_hidden_layers=3 != encoder_layers=2'),
    'unknown_option': ({'layernorm_embedding': True}, None,
                       'layernorm_embedding=True (an option our import does not know)'),
    'unsupported': ({'activation_function': 'tanh'}, None, "activation_function='tanh'"),
    'extra_tensors': (None, _final_norms(), 'holds tensors our model of its config.json has no place for: '
                      'model.decoder.layer_norm.bias, model.decoder.layer_norm.weight, model.encoder.layer_norm.bias '
                      'and 1 more'),
    'untied_output_layer': (None, {'lm_head.weight': np.ones((204, 16), np.float32)},
                            'lm_head.weight is not model.shared.weight (the embeddings and output layer are tied)'),
    'learned_position_table': (None, {'model.encoder.embed_positions.weight': np.zeros((64, 16), np.float32)},
                               "model.encoder.embed_positions.weight is not Marian's sinusoid table"),
}


def _damage(directory, case):
  """Turns a copy of a MarianMT checkpoint into one bad input; returns the name the error must give."""
  config_file = os.path.join(directory, hf.CONFIG)
  if case in REFUSED:
    _edit(directory, *REFUSED[case][:2])
    return config_file if REFUSED[case][0] else os.path.join(directory, hf.SAFETENSORS)
  if case == 'not_marian':
    _edit(directory, {'model_type': 'bert'})
    return config_file
  if case == 'no_config':
    os.remove(config_file)
    return directory
  if case == 'missing_tokenizer':
    os.remove(os.path.join(directory, hf.TARGET_SPM))
    return os.path.join(directory, hf.TARGET_SPM)
  helpers.truncate(os.path.join(directory, hf.SAFETENSORS))
  return os.path.join(directory, hf.SAFETENSORS)


@pytest.mark.parametrize('case', REFUSED)
def test_what_our_model_cannot_hold_is_refused_in_one_line_naming_it(imported, tmp_path, case):
  """Every config.json option is mapped exactly or refused, every tensor used or refused: nothing is dropped."""
  _, _, directory, _ = imported
  bad = tmp_path / 'hf'
  shutil.copytree(directory, bad)
  named = _damage(str(bad), case)
  with pytest.raises(ValueError) as refused:
    convert.import_checkpoint(str(bad), str(tmp_path / 'run'))
  message = str(refused.value)
  assert '\n' not in message and message.startswith(named) and REFUSED[case][2] in message, message
  assert not (tmp_path / 'run').exists()


def test_a_config_json_read_as_marian_config_reads_it(imported, tmp_path):
  """A key config.json lacks is MarianConfig's default, or its other name (attribute_map) where that is there."""
  _, _, directory, _ = imported
  checkpoint = tmp_path / 'hf'
  shutil.copytree(directory, checkpoint)
  _edit(str(checkpoint), {'encoder_layers': None, 'num_hidden_layers': 2, 'scale_embedding': None})
  cfg = convert.import_checkpoint(str(checkpoint), str(tmp_path / 'run'))
  theirs = transformers.MarianConfig.from_pretrained(checkpoint)
  assert (cfg.num_encoder_layers, cfg.scale_embeddings) == (theirs.encoder_layers, theirs.scale_embedding) == (
      2, False)  # the test's checkpoint scales its embeddings; MarianConfig's default does not


@pytest.mark.slow
def test_a_real_opus_mt_config_json_imports_and_names_its_generation_settings(imported, tmp_path, entry_points):
  """OPUS-MT's config.json keys of earlier transformers versions (BART-era options at the values MarianMT computes,
  bookkeeping, generate's settings) import; convert names the generation settings it does not carry."""
  _, _, directory, _ = imported
  checkpoint = tmp_path / 'hf'
  shutil.copytree(directory, checkpoint)
  _edit(str(checkpoint), {
      '_name_or_path': '/tmp/Helsinki-NLP/opus-mt-en-de', '_num_labels': 3, 'add_bias_logits': False,
      'add_final_layer_norm': False, 'bad_words_ids': [[203]], 'bos_token_id': 0, 'classif_dropout': 0.0,
      'classifier_dropout': 0.0, 'extra_pos_embeddings': 204, 'gradient_checkpointing': False, 'id2label': {'0': 'A'},
      'label2id': {'A': 0}, 'init_std': 0.02, 'is_encoder_decoder': True, 'max_length': 512, 'normalize_before': False,
      'normalize_embedding': False, 'num_beams': 4, 'num_hidden_layers': 2, 'static_position_embeddings': True,
      'torch_dtype': 'float32', 'transformers_version': '4.22.0.dev0', 'use_cache': True})
  result = entry_points.run(['-m', 'transformer_jax.convert', f'--from_hf={checkpoint}',
                             f'--workdir={tmp_path / "run"}'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines()[-1] == (
      "not carried: config.json's settings of transformers' generate (bad_words_ids=[[203]], max_length=512, "
      "num_beams=4), which are not the model; our tools decode with the run's decode section "
      '(--config.decode.beam_size=..., alpha, max_len_offset)')
  assert config_lib.of_run(str(tmp_path / 'run')).model.pad_is_bos


BAD_CHECKPOINTS = {
    'not_marian': "not a MarianMT one",
    'no_config': 'it is not a transformers checkpoint',
    'pre_ln': REFUSED['pre_ln'][2],
    'extra_tensors': REFUSED['extra_tensors'][2],
    'missing_tokenizer': 'copy them from where the model came from',
    'truncated': 'truncated or damaged; download it again',
}


@pytest.mark.slow
@pytest.mark.parametrize('case', BAD_CHECKPOINTS)
def test_a_bad_checkpoint_is_one_line_naming_the_file(entry_points, imported, tmp_path, case):
  _, _, directory, _ = imported
  bad = tmp_path / 'hf'
  shutil.copytree(directory, bad)
  named = _damage(str(bad), case)
  result = entry_points.run(['-m', 'transformer_jax.convert', f'--from_hf={bad}', f'--workdir={tmp_path / "run"}'],
                            text=True)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 1 and len(lines) == 1, result.stderr
  assert named in lines[0] and BAD_CHECKPOINTS[case] in lines[0]
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_a_hub_id_not_in_the_local_cache_says_how_to_fetch_it(entry_points, tmp_path):
  result = entry_points.run(['-m', 'transformer_jax.convert', '--from_hf=nobody-here/no-such-model',
                             f'--workdir={tmp_path / "run"}'], text=True)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 1 and len(lines) == 1, result.stderr
  assert 'hf download nobody-here/no-such-model' in lines[0]


@pytest.mark.slow
def test_the_export_help_names_what_loads_the_directory(entry_points):
  """transformers 5 has no pipeline('translation'): the help names the classes that load the export."""
  result = entry_points.run(['-m', 'transformer_jax.export', '--helpshort'], text=True)  # absl: help, then exit 1
  assert '--format: <ctranslate2|transformers>' in result.stdout, result.stderr[-2000:]
  assert 'MarianTokenizer' in result.stdout and 'pipeline' not in result.stdout


@pytest.mark.slow
def test_the_export_refuses_what_marian_cannot_hold_before_restoring(entry_points, seeded_runs, tmp_path):
  with open(os.path.join(seeded_runs[0], 'config.json'), encoding='utf-8') as f:
    saved = json.load(f)
  saved['model'].update(norm='pre', positional='learned')
  run = tmp_path / 'run'  # a config and no checkpoints: the refusal comes first
  run.mkdir()
  (run / 'config.json').write_text(json.dumps(saved), encoding='utf-8')
  result = entry_points.run(['-m', 'transformer_jax.export', f'--workdir={run}', '--format=transformers',
                             f'--out={tmp_path / "out"}'], text=True)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 1 and len(lines) == 1, result.stderr
  assert 'MarianMT cannot hold pre-LN layers' in lines[0] and 'learned positions' in lines[0]
  assert not (tmp_path / 'out').exists()


# --- fine-tuning the imported workdir with train.py


FINE_TUNE = ['--config.data.builtin_train_size=2000', '--config.data.builtin_eval_size=16', '--config.model.max_len=32',
             '--config.pipeline.packed_length=32', '--config.pipeline.batch_size=8',
             '--config.mesh.shape.data=-1', '--config.mesh.shape.fsdp=1', '--config.mesh.shape.tensor=1',
             '--config.train.warmup_steps=2', '--config.train.log_every=1', '--config.train.eval_every=1000',
             '--config.train.eval_batches=1', '--config.train.checkpoint_every=2', '--config.eval.batch_size=16',
             '--config.eval.average_last=2', '--config.eval.num_samples=1', '--config.decode.batch_size=16',
             '--config.decode.beam_size=1', '--config.decode.max_len_offset=4']


@pytest.mark.slow
def test_the_imported_workdir_fine_tunes_resumes_exactly_and_evaluates(entry_points, imported, tmp_path):
  _, _, _, workdir = imported
  runs = {name: str(tmp_path / name) for name in ('straight', 'resumed')}
  for run in runs.values():
    shutil.copytree(workdir, run)

  def train(run, steps):
    args = [helpers.TRAIN_PY, f'--config={os.path.join(helpers.REPO, "configs", "fine_tune.py")}:{run}',
            f'--workdir={run}', f'--config.train.num_steps={steps}', *FINE_TUNE]
    result = entry_points.run(args, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    tokenizer = os.path.join(run, 'tokenizer')  # the files it reads, not the spm.model a trained run would have
    assert (f'Loaded tokenizer {tokenizer}/source.spm, {tokenizer}/target.spm, {tokenizer}/pieces.json ('
            in result.stderr), result.stderr[-3000:]

  train(runs['straight'], 4)
  train(runs['resumed'], 2)
  train(runs['resumed'], 4)
  straight, resumed = helpers.losses_by_step(runs['straight']), helpers.losses_by_step(runs['resumed'])
  assert sorted(straight) == [1, 2, 3, 4] and straight == resumed
  assert helpers.checkpoint_steps(runs['resumed']) == [0, 2, 4]
  with open(os.path.join(runs['straight'], 'results.json'), encoding='utf-8') as f:
    results = json.load(f)
  assert results['averaged_steps'] == [2, 4] and results['num_sentences'] == 16  # the final report's test split
  config = config_lib.of_run(runs['resumed'])
  config.eval.average_last = 3
  assert restoring.final_model_steps(config, runs['resumed']) == [2, 4]  # not the imported params of step 0
  # Another --workdir would train from scratch: refused before anything is written.
  elsewhere = tmp_path / 'elsewhere'
  result = entry_points.run([helpers.TRAIN_PY, f'--config={os.path.join(helpers.REPO, "configs", "fine_tune.py")}:'
                             f'{workdir}', f'--workdir={elsewhere}', *FINE_TUNE], text=True)
  assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
      f'error: configs/fine_tune.py:{workdir} starts from the params imported into {workdir} (its step 0) and trains '
      f'there: pass --workdir={workdir}, or copy {workdir} to a new directory and pass that to both.')
  assert not elsewhere.exists()
  imported_params = jax.device_get(_restore(workdir).params)
  tuned = jax.device_get(_restore(runs['straight']).params)
  assert not np.array_equal(tuned['shared_embedding']['embedding'], imported_params['shared_embedding']['embedding'])
