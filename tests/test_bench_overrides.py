"""The bench tools change config keys as train.py does, `--config.KEY=VALUE` (cli's flag: a key the tool's sections
lack is named in full in one line), and refuse in one line what they would not read."""

import json

import pytest

from bench import compile_depth


def test_compile_depths_model_changes_reach_every_depth_but_the_layer_counts_are_the_benchs():
  model = compile_depth.narrow_model()
  model.update(architecture='encoder_decoder', d_k=8)
  for depth, scan in ((1, True), (3, False)):
    config = compile_depth.train_step_config(model, depth, scan)
    assert (config.model.architecture, config.model.d_k, config.model.d_v) == ('encoder_decoder', 8, None)
    assert (config.model.num_encoder_layers, config.model.num_decoder_layers, config.model.scan_layers) == (
        depth, depth, scan)
  decoder_only = compile_depth.train_step_config(compile_depth.narrow_model(), 2, False)
  assert (decoder_only.model.num_encoder_layers, decoder_only.model.num_decoder_layers) == (0, 2)


@pytest.mark.slow
def test_data_throughput_measures_the_pipeline_its_overrides_describe(entry_points):
  """One batching named: that one alone, with the given budget and buckets and the given vocabulary."""
  result = entry_points.run(
      ['-m', 'bench.data_throughput', '--num_pairs=2000', '--seconds=0.2', '--warmup_batches=1',
       '--config.tokenizer.vocab_size=300', '--config.tokenizer.sample_size=2000',
       '--config.pipeline.batching=token_budget', '--config.pipeline.max_length=32',
       '--config.pipeline.tokens_per_batch=512', '--config.pipeline.bucket_boundaries=(16,32)'], text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{')]
  assert [r['vocab_size'] for r in records if 'vocab_size' in r] == [300]
  measured = [r for r in records if 'batching' in r]
  assert [r['batching'] for r in measured] == ['token_budget']
  rows, length = measured[0]['batch_shape_last']
  assert length in (16, 32) and rows * length <= 512, measured[0]


@pytest.mark.slow
@pytest.mark.parametrize('args, error', [
    (['-m', 'bench.data_throughput', '--config.pipeline.read_thread=2'],
     'FATAL Flags parsing error: --config.pipeline.read_thread: the config has no key pipeline.read_thread; did you '
     'mean pipeline.read_threads?'),
    (['-m', 'bench.data_throughput', '--config.pipeline.batching=token_budget', '--config.pipeline.batch_size=16'],
     "error: --config.pipeline.batch_size is not read while pipeline.batching='token_budget', only when it is "
     "'packed': drop it, or pass --config.pipeline.batching=packed too."),
    (['-m', 'bench.data_throughput', '--against_training', '--config.pipeline.read_threads=2'],
     "error: --against_training measures configs/default.py as it is: drop ['pipeline.read_threads']."),
    (['-m', 'bench.compile_depth', '--config.model.architectur=encoder_decoder'],
     'FATAL Flags parsing error: --config.model.architectur: the config has no key model.architectur; did you mean '
     'model.architecture?'),
    (['-m', 'bench.compile_depth', '--config.model.scan_layers=True'],
     "error: the bench sets ['model.scan_layers'] itself (--depths; scanned and unrolled): drop them."),
    (['-m', 'bench.compile_depth', '--config.model.architecture=lm'],
     "error: model.architecture='lm' is not one of ('encoder_decoder', 'decoder_only')."),
], ids=['data_unknown_key', 'data_unread_key', 'data_against_training', 'depth_unknown_key', 'depth_owned_key',
        'depth_bad_value'])
def test_a_bench_tools_bad_override_is_one_line(entry_points, args, error):
  result = entry_points.run(args, text=True)
  assert result.returncode == 1 and not result.stdout, result.stdout
  lines = result.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith(error), result.stderr[-2000:]
