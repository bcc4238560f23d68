"""Scoring and reports: teacher-forced loss over a split, BLEU and chrF of its translations (or, for a language model,
perplexity, bits per byte, the unigram baseline and sampled continuations) by one model or an ensemble, a paired
test against a baseline, results files and the printed report. Used by training (in-run validation, the final
report) and by `eval.py`."""

import hashlib
import json
import os

import jax
import numpy as np
from absl import logging

from transformer_jax import config as config_lib
from transformer_jax.core import files
from transformer_jax.core import stops
from transformer_jax.core.tokens import EOS_ID
from transformer_jax.core.workdir import Workdir, params_tag
from transformer_jax.data import pipeline
from transformer_jax.data import sources
from transformer_jax.evaluation import scores
from transformer_jax.evaluation import significance
from transformer_jax.inference import generation
from transformer_jax.inference import restoring
from transformer_jax.runtime import progress
from transformer_jax.runtime import sharding
from transformer_jax.training import metrics as metrics_lib
from transformer_jax.training import steps

# The unigram baseline of a language model counts tokens of at most this many training documents (a seeded sample).
UNIGRAM_DOCUMENTS = 200_000


def teacher_forced(members, eval_fn, pairs, tok, mesh, batch_size: int, max_batches: int | None = None,
                   max_length: int | None = None, what: str = 'teacher-forced scoring') -> dict:
  """Per-token loss (label-smoothed as in training), NLL, perplexity and accuracy over (a prefix of) a split of
  pairs or documents, and the number of target tokens, by `eval_fn` (`steps.jit_eval_step`) of `members` (one
  model or an ensemble); sentences longer than `max_length` (`ModelConfig.position_limit`) are cut to it. A long
  pass reports its progress as `what`."""
  totals = {k: 0.0 for k in metrics_lib.SUM_KEYS}
  batches = pipeline.make_eval_batches(pairs, tok, batch_size, process_index=jax.process_index(),
                                       process_count=jax.process_count(), max_length=max_length)
  count = len(pairs) if max_batches is None else min(len(pairs), max_batches * batch_size)
  with progress.Progress(what, total=count, unit='sentences') as scored:
    for i, batch in enumerate(batches):
      if max_batches is not None and i >= max_batches:
        break
      stops.here()
      batch = sharding.place_batch({k: v for k, v in batch.items() if k in pipeline.BATCH_KEYS}, mesh)
      sums = jax.device_get(eval_fn(members, batch))
      totals = {k: totals[k] + float(sums[k]) for k in totals}
      scored.advance(min(batch_size, count - scored.done))
  return dict(metrics_lib.normalize(totals), tokens=int(totals['tokens']))


def teacher_forced_metrics(restored: restoring.Restored, pairs, split: str) -> dict:
  """`teacher_forced` over every pair (or document) of `split`, with the restored model or ensemble."""
  shardings = jax.tree.map(lambda x: x.sharding, restored.members)
  eval_fn = steps.jit_eval_step(restored.config.train.label_smoothing, shardings, restored.mesh)
  with restored.on_mesh():
    return teacher_forced(restored.members, eval_fn, pairs, restored.tokenizer, restored.mesh,
                          restored.config.eval.batch_size, max_length=restored.position_limit,
                          what=f'scoring {split} (teacher-forced)')


def write_translations(run_dir: Workdir, split: str, texts: dict[str, list[str]],
                       tag: str | None = None) -> dict[str, str]:
  """Writes {'src'|'hyp'|'ref': lines} one sentence per line (UTF-8), to inspect or re-score with other tools;
  `tag` as in `Workdir.translation_file`."""
  lengths = {kind: len(lines) for kind, lines in texts.items()}
  if len(set(lengths.values())) != 1:
    raise ValueError(f'sources, hypotheses and references differ in length: {lengths}')
  paths = {}
  for kind, lines in texts.items():
    if any('\n' in line or '\r' in line for line in lines):
      raise ValueError(f'a {kind} sentence contains a line break, which would misalign the files')
    paths[kind] = run_dir.translation_file(split, kind, tag)
    os.makedirs(os.path.dirname(paths[kind]), exist_ok=True)
    with open(paths[kind], 'w', encoding='utf-8') as f:
      f.write(''.join(line + '\n' for line in lines))
  return paths


def evaluate_split(restored: restoring.Restored, workdir: str, split: str,
                   compare_to: significance.Comparison | None = None, final_steps: list[int] | None = None) -> dict:
  """Loss, perplexity, accuracy, BLEU (sacrebleu and the paper's tokenized BLEU), chrF and chrF++ on a split of the
  restored model or ensemble, and with `compare_to` a paired test against a baseline ('comparison'); a language
  model's numbers instead (`evaluate_documents`).

  Writes the translations and references and the numbers (`Workdir.results_file`) into the workdir, with what they
  scored: the split, the params (steps, or an ensemble's members) and the settings (`scored_settings`). Only the
  run's own final evaluation is results.json; any other is named for what differs (`results_tag`), so that an
  evaluation of other params, data or settings never replaces it. `final_steps`: the steps of the run's final model
  (`restoring.final_model_steps`); None: the restored params are the final model's.
  """
  own = config_lib.of_run(workdir)
  tag = results_tag(restored, own, final_steps)
  if restored.members[0].model.config.decoder_only:
    if compare_to:
      raise ValueError('--compare_to compares translations; a language model\'s evaluation has none: drop it.')
    return evaluate_documents(restored, workdir, split, own.eval.test_split, tag)
  config, run_dir = restored.config, Workdir(workdir)
  for key in ('eval.batch_size', 'decode.batch_size'):
    section, name = key.split('.')
    sharding.check_batch_divisible(config[section][name], restored.mesh, key)
  pairs = sources.load_split(config.data, split)
  if compare_to:
    compare_to.check([target for _, target in pairs])  # before anything is decoded
  limit = restored.position_limit
  cut = pipeline.count_over(pairs, restored.tokenizer, limit)
  if cut:
    logging.warning('%d sentences of %s are longer than the %d tokens learned positions cover: cut to %d for '
                    'scoring (results.json: cut_sentences)', cut, split, limit, limit)
  losses = {f'{split}_{k}': v for k, v in teacher_forced_metrics(restored, pairs, split).items()}
  hypotheses = generation.translate_pairs(restored, pairs, config.decode, what=f'translating {split}')
  sources_text = [src for src, _ in pairs]
  references = [tgt for _, tgt in pairs]
  lang = config.data.target_lang
  tokenized = scores.tokenized_bleu(hypotheses, references, lang=lang, split_compounds=lang == 'de')
  results = {**_provenance(restored), 'split': split, **scores.corpus_scores(hypotheses, references),
             'tokenized_bleu': tokenized, 'num_sentences': len(pairs), 'params': _count_params(restored.members),
             'beam_size': config.decode.beam_size, 'alpha': config.decode.alpha, 'cut_sentences': cut, **losses,
             'settings': scored_settings(config)}
  if compare_to:
    results['comparison'] = compare_to.run(hypotheses, references)
  stops.here()  # the last safe point: the files are written whole
  if jax.process_index() == 0:
    results['translations'] = write_translations(
        run_dir, split, {'src': sources_text, 'hyp': hypotheses, 'ref': references}, tag)
    results['results_file'] = _write_results(run_dir.results_file(split, own.eval.test_split, tag), results)
  results['samples'] = list(zip(sources_text, hypotheses, references))
  return results


# The config sections an evaluation's numbers depend on, besides the params and the split, less their keys that do
# not change them.
_SCORED_SECTIONS = {'data': (), 'decode': ('batch_size',), 'model': ()}


def scored_settings(config) -> dict:
  """What an evaluation scored with (`_SCORED_SECTIONS`), as JSON values: recorded in its results, compared with
  the run's own to name them."""
  sections = {}
  for name, ignored in _SCORED_SECTIONS.items():
    values = json.loads(config[name].to_json_best_effort())
    sections[name] = {key: value for key, value in values.items() if key not in ignored}
  return sections


def _digest(value) -> str:
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:8]


def results_tag(restored: restoring.Restored, own, final_steps: list[int] | None = None) -> str | None:
  """How an evaluation's files are named (`Workdir.results_file`, `Workdir.translation_file`): None (results.json)
  only for the run's own final evaluation, the final model's params (`final_steps`; None: they are) with the run's
  own settings (`scored_settings` of its config, `own`); otherwise what differs, joined by '_': the params
  (`workdir.params_tag`: step<N>, average<K>_step<N>; an ensemble: ensemble-<digest of its members>) and each
  section of the settings that differs from the run's (data-<digest>, decode-<digest>, model-<digest>), so that
  other evaluations keep files of their own."""
  if restored.is_ensemble:
    parts = [f'ensemble-{_digest([[os.path.abspath(o["workdir"]), o["steps"]] for o in restored.origins])}']
  else:
    parts = [tag for tag in [params_tag(restored.steps, final_steps)] if tag]
  run, scored = scored_settings(own), scored_settings(restored.config)
  parts += [f'{name}-{_digest(values)}' for name, values in scored.items() if values != run[name]]
  return '_'.join(parts) or None


def _provenance(restored: restoring.Restored) -> dict:
  """Where the params come from, as results.json records it: the step(s) of one model, an ensemble's members."""
  if restored.is_ensemble:
    return {'ensemble': list(restored.origins)}
  return {'step': restored.steps[-1], 'averaged_steps': restored.steps}


def _write_results(path: str, results: dict) -> str:
  files.write_atomically(path, json.dumps(results, indent=2))
  return path


def evaluate_documents(restored: restoring.Restored, workdir: str, split: str, test_split: str,
                       tag: str | None = None) -> dict:
  """A language model on a split of documents: teacher-forced loss, perplexity and accuracy per token, bits per
  byte, the unigram baseline's perplexity, and sampled continuations of the first documents' first halves (of
  those whose half leaves the model room to continue).

  Bits per byte: the total NLL in bits over the UTF-8 bytes of the documents, each counted with one byte more
  for its end (the EOS the model predicts, a line end in a file). Writes the numbers into the workdir, under a
  name with `tag` (`results_tag`) if given.
  """
  config = restored.config
  documents = sources.load_documents(config.data, split)
  losses = teacher_forced_metrics(restored, documents, split)
  num_bytes = sum(len(document.encode('utf-8')) + 1 for document in documents)
  examples = [documents[i] for i in range(min(config.eval.num_samples, len(documents)))]
  fits = lambda document: len(restored.tokenizer.encode(_first_half(document))) < restored.max_len
  examples = [document for document in examples if fits(document)]
  prompts = [_first_half(document) for document in examples]
  samples = generation.continue_prompts(restored, prompts, max_new_tokens=config.decode.max_new_tokens,
                                       temperature=config.decode.temperature, top_k=config.decode.top_k,
                                       top_p=config.decode.top_p, batch_size=config.decode.batch_size, fit=True)
  results = {**_provenance(restored), 'split': split, 'perplexity': losses['perplexity'],
             'bits_per_byte': metrics_lib.bits_per_byte(losses['nll'] * losses['tokens'], num_bytes),
             'unigram_perplexity': unigram_baseline(restored.tokenizer, config.data, documents),
             'num_documents': len(documents), 'num_tokens': losses['tokens'], 'num_bytes': num_bytes,
             'params': _count_params(restored.members), **{f'{split}_{k}': v for k, v in losses.items()},
             'settings': scored_settings(config)}
  stops.here()  # the last safe point: the file is written whole
  if jax.process_index() == 0:
    results['results_file'] = _write_results(Workdir(workdir).results_file(split, test_split, tag), results)
  results['samples'] = [(prompt, texts[0], document) for prompt, texts, document in zip(prompts, samples, examples)]
  return results


def unigram_baseline(tokenizer, data_config, documents) -> float:
  """The perplexity on `documents` (their tokens and EOS, as the model is scored) of the add-one smoothed unigram
  model of the training split's tokens (a seeded sample of at most UNIGRAM_DOCUMENTS documents)."""
  train = sources.load_documents(data_config, 'train')
  chosen = np.random.default_rng(0).choice(len(train), min(len(train), UNIGRAM_DOCUMENTS), replace=False)

  def ids(texts):
    for text in texts:
      stops.here()
      yield tokenizer.encode(text) + [EOS_ID]

  return metrics_lib.unigram_perplexity(ids(train[int(i)] for i in chosen), ids(documents), tokenizer.vocab_size)


def _first_half(document: str) -> str:
  """A prompt from a held-out document: its first half of words (at least one)."""
  words = document.split()
  return ' '.join(words[:max(1, len(words) // 2)])


def _count_params(members) -> int:
  return int(sum(np.prod(p.shape) for p in jax.tree.leaves(members)))


def _saved_samples(run_dir: Workdir, split: str, count: int) -> list[tuple[str, str, str]]:
  """The first `count` (source, output, reference) of the final evaluation's translations files; none where they
  are missing (a language model's evaluation writes none)."""
  try:
    texts = [files.read_text_lines(run_dir.translation_file(split, kind), 'the run\'s translations')[:count]
             for kind in ('src', 'hyp', 'ref')]
  except (OSError, ValueError):
    return []
  return list(zip(*texts))


def describe(results: dict, num_samples: int) -> str:
  """A short human-readable report of `evaluate_split`'s results, with `num_samples` of its samples."""
  split = results['split']
  if 'bits_per_byte' in results:
    labels = ('prompt', 'sample', 'reference')
    headline = (f'{split}: perplexity {results["perplexity"]:.3f} against {results["unigram_perplexity"]:.1f} of '
                'the unigram model (add-one smoothed token counts of the training split), bits per byte '
                f'{results["bits_per_byte"]:.4f}, nll {results[f"{split}_nll"]:.4f}, accuracy '
                f'{results[f"{split}_accuracy"]:.3f} on {results["num_documents"]} documents '
                f'({results["num_tokens"]} tokens)')
  else:
    labels = ('source', 'output', 'reference')
    headline = (f'{split}: BLEU {results["bleu"]:.2f} (sacrebleu {results["bleu_signature"]}), '
                f'chrF {results["chrf"]:.2f} ({results["chrf_signature"]}), '
                f'chrF++ {results["chrf++"]:.2f} ({results["chrf++_signature"]}), '
                f'tokenized BLEU {results["tokenized_bleu"]:.2f}, loss {results[f"{split}_loss"]:.4f}, '
                f'nll {results[f"{split}_nll"]:.4f}, perplexity {results[f"{split}_perplexity"]:.3f}, '
                f'accuracy {results[f"{split}_accuracy"]:.3f} on {results["num_sentences"]} sentences')
  if 'ensemble' in results:
    provenance = 'ensemble of ' + ', '.join(f'{m["workdir"]} step(s) {m["steps"]}' for m in results['ensemble'])
  else:
    provenance = f'params of step(s) {results["averaged_steps"]}'
  lines = [f'{headline}; {provenance}']
  if 'results_file' in results:
    lines.append(f'results written to {results["results_file"]}')
  for sample in results['samples'][:num_samples]:
    lines += [f'  {label + ":":<11}{text}' for label, text in zip(labels, sample)]
  if 'comparison' in results:
    lines.append(significance.describe(results['comparison']))
  return '\n'.join(lines)


def final_report(config, workdir: str) -> dict:
  """End of training: the run's final model (`restoring.final_model_steps`) on the test split, reported: BLEU (a
  language model: perplexity against the unigram baseline, and samples). A run evaluated before (its results.json,
  `Workdir.finished_results`) is reported from that file, with samples from its translations, and not evaluated
  again."""
  run_dir = Workdir(workdir)
  results = run_dir.finished_results(config.train.num_steps)
  if results is not None:
    results['samples'] = _saved_samples(run_dir, results.get('split'), config.eval.num_samples)
    if jax.process_index() == 0:
      print(f'{workdir} is finished: trained to step {config.train.num_steps}, its final model evaluated '
            f'({run_dir.final_results_file}); nothing was run again.', flush=True)
      print(describe(results, config.eval.num_samples), flush=True)
    return results
  restored = restoring.restore(config, workdir)
  results = evaluate_split(restored, workdir, config.eval.test_split)
  if jax.process_index() == 0:
    print(describe(results, config.eval.num_samples), flush=True)
  return results
