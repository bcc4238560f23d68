"""The decoder-only language model: causality by perturbation, packed documents that never see each other,
cached generation (ragged prompts through one prefill) equal to the uncached forward pass, its documents from
every source packed as 'targets' only, its evaluation (perplexity, bits per byte, the unigram baseline), the
generate command, and one-line errors for configs that mix up the two architectures."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from transformer_jax import config as config_lib
from transformer_jax.config import data as data_section
from transformer_jax.config import pipeline as pipeline_section
from transformer_jax.config import tokenizer as tokenizer_section
from transformer_jax.config.model import ModelConfig
from transformer_jax.core.tokens import EOS_ID
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import pipeline
from transformer_jax.data import sources
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.inference import generation
from transformer_jax.inference import restoring
from transformer_jax.jobs import scoring
from transformer_jax.model import ensemble
from transformer_jax.training import metrics

TINY = ModelConfig(architecture='decoder_only', vocab_size=40, d_model=32, d_ff=64, num_heads=4, num_encoder_layers=0,
                   num_decoder_layers=2, dropout=0.0, max_len=64)
VARIANTS = helpers.model_variants(TINY)


def _init(cfg, targets):
  return helpers.init_model(cfg, targets=targets)


def test_decoder_only_model_has_no_encoder_and_its_own_output_layer():
  targets = helpers.tokens(0, (2, 6))
  _, tied = _init(TINY, targets)
  assert set(tied) == {'shared_embedding', 'decoder'}
  assert 'cross_attention' not in tied['decoder']['layer_0'] and 'logits' not in tied['decoder']
  _, untied = _init(VARIANTS['pre_learned_unshared'], targets)
  assert set(untied) == {'target_embedding', 'decoder'}
  assert untied['decoder']['logits']['kernel'].shape == (32, 40)


@pytest.mark.parametrize('name', helpers.fast_tier(list(VARIANTS), fast=['dot_product']))
def test_changing_token_t_changes_no_logit_before_it(name):
  targets = helpers.tokens(1, (2, 10))
  model, params = _init(VARIANTS[name], targets)
  t = 5
  changed = targets.at[:, t].set((targets[:, t] + 1) % 36 + 4)
  a, b = (model.apply({'params': params}, x) for x in (targets, changed))
  # logits at position i predict targets[i] from targets[:i]: a change at t shows from position t + 1 on
  np.testing.assert_allclose(a[:, :t + 1], b[:, :t + 1], atol=1e-5)
  assert np.min(np.max(np.abs(np.asarray(a[:, t + 1:] - b[:, t + 1:])), axis=-1)) > 1e-4


@pytest.mark.parametrize('name', helpers.fast_tier(list(VARIANTS), fast=['scanned']))
def test_packed_documents_do_not_see_each_other(name):
  docs = [helpers.tokens(10, (1, 4))[0], helpers.tokens(11, (1, 6))[0]]
  packed = {'targets': jnp.concatenate(docs + [jnp.zeros(2, jnp.int32)])[None],
            'targets_segment_ids': jnp.array([[1] * 4 + [2] * 6 + [0] * 2]),
            'targets_positions': jnp.array([list(range(4)) + list(range(6)) + [0] * 2])}
  model, params = _init(VARIANTS[name], packed['targets'])
  logits = model.apply({'params': params}, **packed)
  first, second = (model.apply({'params': params}, doc[None]) for doc in docs)
  np.testing.assert_allclose(logits[0, :4], first[0], atol=1e-5)
  np.testing.assert_allclose(logits[0, 4:10], second[0], atol=1e-5)
  changed = model.apply({'params': params}, **dict(packed, targets=packed['targets'].at[0, 1].set(9)))
  np.testing.assert_allclose(changed[0, 4:10], logits[0, 4:10], atol=1e-5)  # the second document saw nothing
  assert np.max(np.abs(np.asarray(changed[0, 2:4] - logits[0, 2:4]))) > 1e-4


PROMPTS = [[5, 6, 7, 8, 9], [10, 11], []]  # ragged: right-padded to the batch's width


def _prompt_batch(prompts, width):
  batch = np.zeros((len(prompts), width), np.int32)
  for row, ids in enumerate(prompts):
    batch[row, :len(ids)] = ids
  return jnp.asarray(batch)


def _greedy_by_forward_passes(model, params, prompt, steps):
  """Greedy continuation recomputed with the plain teacher-forced forward pass of the row alone, one token at a
  time: the position after the prompt is the prompt's length, whatever the batch's padding."""
  ids = list(prompt)
  for _ in range(steps):
    row = np.zeros((1, len(prompt) + steps + 1), np.int32)  # one width for every call: one compilation
    row[0, :len(ids) + 1] = ids + [4]  # position len(ids) predicts the next token (the 4 is not seen there)
    ids.append(int(np.argmax(model.apply({'params': params}, jnp.asarray(row))[0, len(ids)])))
    if ids[-1] == EOS_ID:
      break
  return ids[len(prompt):]


@pytest.mark.parametrize('name', helpers.fast_tier(['post_sinusoidal', 'pre_learned_unshared', 'chunked', 'scanned'],
                                                   fast=['chunked']))
def test_cached_generation_equals_the_uncached_forward_pass(name):
  cfg = VARIANTS[name]
  model, params = _init(cfg, helpers.tokens(0, (1, 4)))
  prompts, steps = _prompt_batch(PROMPTS, 8), 6
  members, kw = (ensemble.Member(model.module, params),), dict(max_decode_len=steps)
  greedy, _ = generation.generate(members, prompts, jax.random.key(0), method='greedy', **kw)
  uncached, _ = generation.generate(members, prompts, jax.random.key(0), method='greedy', use_cache=False, **kw)
  np.testing.assert_array_equal(greedy, uncached)
  for row, prompt in enumerate(PROMPTS):
    expected = _greedy_by_forward_passes(model, params, prompt, steps)
    np.testing.assert_array_equal(np.asarray(greedy)[row, 0, :len(expected)], expected)
  # Beam scores are sums of log-probabilities: the cached and uncached logits agree in value, not only in argmax.
  beams = [generation.generate(members, prompts, jax.random.key(0), method='beam', beam_size=3, use_cache=use, **kw)
           for use in (True, False)]
  np.testing.assert_array_equal(beams[0][0], beams[1][0])
  np.testing.assert_allclose(beams[0][1], beams[1][1], rtol=1e-4, atol=1e-4)
  sampled = [generation.generate(members, prompts, jax.random.key(3), method='sample', use_cache=use, **kw)[0]
             for use in (True, False)]
  np.testing.assert_array_equal(*sampled)


# --- data


def _data(**fields):
  config = data_section.default_config()
  config.update(fields)
  return config


def test_documents_from_a_text_file_by_line_or_paragraph(tmp_path):
  path = tmp_path / 'train.txt'
  path.write_text(' First line. \n\nSecond line\nstill second.\n\n\n  \nThird.\n', encoding='utf-8')
  config = _data(source='files', files={'train': {'text': str(path)}})
  assert list(sources.load_documents(config, 'train')) == ['First line.', 'Second line', 'still second.', 'Third.']
  config.documents = 'paragraphs'
  assert list(sources.load_documents(config, 'train')) == ['First line.', 'Second line still second.', 'Third.']
  (tmp_path / 'blank.txt').write_text('\n \n', encoding='utf-8')
  with pytest.raises(ValueError, match=r"split 'train' from .*blank.txt has no documents"):
    sources.load_documents(_data(source='files', files={'train': {'text': str(tmp_path / 'blank.txt')}}), 'train')


def test_documents_of_the_builtin_corpus_are_its_english_side():
  config = _data(builtin_train_size=300, builtin_eval_size=20)
  documents = sources.load_documents(config, 'test')
  assert list(documents) == [source for source, _ in sources.load_split(config, 'test')]
  assert len(documents) == 20 and all(isinstance(d, str) and d for d in documents)


def test_documents_from_a_tfds_text_feature():
  tfds = sources.import_tfds()
  with tfds.testing.mock_data(num_examples=5, policy=tfds.testing.MockPolicy.USE_CODE):
    raw = tfds.data_source('lm1b', split='train', download=False)
    expected = [str(raw[i]['text']) for i in range(5)]
    documents = sources.load_documents(_data(source='tfds', tfds_name='lm1b'), 'train')
    assert [documents[i] for i in range(5)] == expected and all(type(d) is str for d in documents)
    with pytest.raises(ValueError, match=r"lm1b has no text feature 'body' \(its features: \['text'\]\); set data "
                                         'config key text_key'):
      sources.load_documents(_data(source='tfds', tfds_name='lm1b', text_key='body'), 'train')


DOCUMENTS = [' '.join(f'w{(i * 7 + j) % 23}' for j in range(i % 9 + 1)) for i in range(120)]


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
  config = tokenizer_section.default_config()
  config.vocab_size = 28
  return tokenizer_lib.load_or_train_tokenizer(config, str(tmp_path_factory.mktemp('tok') / 'spm.model'), DOCUMENTS)


def test_packed_documents_fill_only_the_targets_and_resume(tokenizer):
  config = pipeline_section.default_config()
  config.update(max_length=16, packed_length=32, batch_size=4, batch_multiple=4)
  dataset = pipeline.make_train_dataset(DOCUMENTS, tokenizer, config)
  iterator = iter(dataset)
  batch = next(iterator)
  assert set(batch) == {'targets', 'targets_segment_ids', 'targets_positions'}
  encoded = {tuple(tokenizer.encode(d) + [EOS_ID]) for d in DOCUMENTS}
  for row in range(4):
    segments = batch['targets_segment_ids'][row]
    for segment in set(segments) - {0}:
      document = tuple(batch['targets'][row][segments == segment])
      assert document in encoded  # a whole document ending in EOS, positions restarting at 0
      np.testing.assert_array_equal(batch['targets_positions'][row][segments == segment], np.arange(len(document)))
  state = iterator.get_state()
  expected = next(iterator)
  resumed = iter(dataset)
  resumed.set_state(state)
  for key, value in next(resumed).items():
    np.testing.assert_array_equal(value, expected[key])


# --- evaluation


def test_bits_per_byte_and_unigram_perplexity_by_hand():
  assert metrics.bits_per_byte(8 * math.log(2), 4) == pytest.approx(2.0)
  # Training counts over a vocabulary of 5: token 4 three times, token 1 once; add-one: p = (c + 1) / (4 + 5).
  train, heldout = [[4, 4, 1], [4]], [[4, 1], [3]]
  p = {4: 4 / 9, 1: 2 / 9, 3: 1 / 9}
  expected = math.exp(-(math.log(p[4]) + math.log(p[1]) + math.log(p[3])) / 3)
  assert metrics.unigram_perplexity(train, heldout, 5) == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow
def test_evaluation_reports_perplexity_bits_per_byte_and_the_unigram_baseline(trained_lm):
  config, workdir = trained_lm
  restored = restoring.restore(config, workdir)
  results = scoring.evaluate_split(restored, workdir, 'test')
  with open(Workdir(workdir).final_results_file) as f:
    saved = json.load(f)
  documents = sources.load_documents(config.data, 'test')
  tokens = sum(len(restored.tokenizer.encode(d)) + 1 for d in documents)
  assert saved['num_documents'] == len(documents) == config.data.builtin_eval_size
  assert saved['num_tokens'] == tokens
  assert saved['perplexity'] == pytest.approx(math.exp(saved['test_nll']), rel=1e-6)
  num_bytes = sum(len(d.encode('utf-8')) + 1 for d in documents)
  assert saved['bits_per_byte'] == pytest.approx(saved['test_nll'] * tokens / math.log(2) / num_bytes, rel=1e-6)
  assert saved['unigram_perplexity'] > 1 and 'bleu' not in saved
  text = scoring.describe(results, 1)
  assert f'perplexity {saved["perplexity"]:.3f} against {saved["unigram_perplexity"]:.1f}' in text
  prompt, sample, document = results['samples'][0]
  assert document.startswith(prompt) and f'  sample:    {sample}' in text


@pytest.mark.slow
def test_prompts_longer_than_the_model_are_refused_or_fitted(trained_lm):
  config, workdir = trained_lm
  restored = restoring.restore(config, workdir)
  long_prompt = next(text for n in range(1, 64) if len(restored.tokenizer.encode(text := ' '.join(['dog'] * n))) >= 28)
  prompts = ['The cat sees', long_prompt]  # 28 or 29 tokens: room for 3 or 4 more in the model's 32
  with pytest.raises(ValueError, match=r"prompt 2 has \d+ tokens, which with max_new_tokens=8 is more than the "
                                       r"model's max length 32: shorten the prompt"):
    generation.continue_prompts(restored, prompts, max_new_tokens=8)
  # With fit, each prompt gets as many new tokens as it has room for: the short one as many as alone.
  (short,), (long,) = generation.continue_prompts(restored, prompts, max_new_tokens=8, temperature=0, fit=True)
  (alone,), = generation.continue_prompts(restored, prompts[:1], max_new_tokens=8, temperature=0)
  encode = restored.tokenizer.encode
  assert short == alone and len(encode(alone)) - len(encode(prompts[0])) > 32 - len(encode(long_prompt))
  assert long.startswith(long_prompt)
  full = next(text for n in range(1, 64) if len(encode(text := ' '.join(['dog'] * n))) >= 32)
  with pytest.raises(ValueError, match=rf"prompt 1 has {len(encode(full))} tokens, which leaves no room for more "
                                       r"within the model's max length 32: shorten the prompt."):
    generation.continue_prompts(restored, [full], max_new_tokens=8, fit=True)


@pytest.mark.slow
def test_generate_command(entry_points, trained_lm):
  _, workdir = trained_lm
  result = entry_points.run(['-m', 'transformer_jax.generate', f'--workdir={workdir}', '--prompt=The dog',
                             '--num_samples=2', '--temperature=0', '--max_new_tokens=5'], text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert len(lines) == 2 and lines[0] == lines[1] and lines[0].startswith('The dog')  # greedy: twice the same
  result = entry_points.run(['-m', 'transformer_jax.generate', f'--workdir={workdir}', '--top_k=5', '--seed=1'],
                            'The cat\n\nA friend sees\n', text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()  # the empty line is a prompt too: a document from its start, in its place
  assert len(lines) == 3 and lines[0].startswith('The cat') and lines[2].startswith('A friend sees')
  result = entry_points.run(['-m', 'transformer_jax.generate', f'--workdir={workdir}', '--prompt=x', '--top_p=1.5'],
                            text=True)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == 'error: decode.top_p must be in (0, 1] (1.0 = off), got 1.5.'


@pytest.mark.slow
@pytest.mark.parametrize('tool', [['-m', 'transformer_jax.translate'],
                                  ['-m', 'transformer_jax.attention_plots', '--sentence=The dog']])
def test_the_translation_tools_refuse_a_language_model_in_one_line(entry_points, trained_lm, tool):
  _, workdir = trained_lm
  result = entry_points.run([*tool, f'--workdir={workdir}'], 'The dog sees the cat.\n', text=True)
  assert result.returncode == 1 and result.stdout == ''
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: {workdir} holds a language model (model.architecture='decoder_only'), which continues text rather "
      'than translating it: use python -m transformer_jax.generate.')


@pytest.mark.slow
def test_train_py_ends_with_perplexity_against_the_unigram_baseline_and_a_sample(entry_points, tmp_path):
  result = entry_points.run(helpers.train_args(str(tmp_path), config=helpers.LM_CONFIG, **helpers.LM), text=True,
                            timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'test: perplexity ' in result.stdout and ' of the unigram model ' in result.stdout
  assert result.stdout.count('  prompt:    ') == 1 and result.stdout.count('  sample:    ') == 1


# --- configs


def test_configs_that_mix_up_the_architectures_are_one_line_errors():
  with pytest.raises(ValueError, match="model.architecture='decoder_only' has no encoder: set "
                                       'model.num_encoder_layers=0'):
    TINY.replace(num_encoder_layers=2)
  config = helpers.tiny_config(**helpers.LM, data__source='files')
  config.data.files.train.source, config.data.files.train.target = 'a.en', 'a.de'
  with pytest.raises(ValueError, match=r"data.source='files' for a decoder-only model needs data.files.train.text "
                                       r"\(documents\), got \['source', 'target'\]: pass "
                                       r'--config.data.files.train.text=PATH') as error:
    config_lib.validate(config, data_splits=('train',))
  assert '\n' not in str(error.value)
  config = helpers.tiny_config(data__source='files')
  config.data.files.train.text = 'a.txt'
  with pytest.raises(ValueError, match=r"needs data.files.train.source and .target \(or .tsv\), got \['text'\].*"
                                       r'.text is for decoder-only models'):
    config_lib.validate(config, data_splits=('train',))
