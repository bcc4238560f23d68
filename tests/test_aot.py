"""Compiling for a TPU slice or a GPU without them (libtpu's and the CUDA plugin's compile-only devices), on
this CPU-only machine.

The train step is the base config shrunk by `runlocal` to one layer per side (the full base model takes ~4-9
minutes per compile on 2 cores; see docs/fits.md for it and the big model on every mesh).
"""

import dataclasses
import json
import logging
import re
import threading

import jax
import jax.numpy as jnp
import pytest

import helpers
from bench import fits
from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax.compile import aot
from transformer_jax.compile import hlo_costs
from transformer_jax.compile import step_parts
from transformer_jax.compile import topologies
from transformer_jax.kernels import attention_masks
from transformer_jax.model import attention
from transformer_jax.runtime import progress
from transformer_jax.runtime import sharding
from transformer_jax.training import steps

TOPOLOGY = 'v4-8'  # 4 chips


def small_config(mesh: str, topology: str = TOPOLOGY, **model):
  config = config_lib.load('configs/wmt14_ende_base.py:runlocal')
  config.model.update({'num_encoder_layers': 1, 'num_decoder_layers': 1, 'dtype': 'bfloat16', **model})
  aot.set_mesh_shape(config, aot.mesh_presets(topologies.get_topology(topology).num_devices)[mesh])
  return config


@pytest.fixture(scope='module')
def programs():
  """The v4-8 train step per mesh and model overrides, built on first use and shared by the tests below: jax compiles
  each once, however many tests analyse or compile it."""
  cache = {}

  def get(mesh, **model):
    key = (mesh, tuple(sorted(model.items())))
    if key not in cache:
      cache[key] = aot.longest_train_step(small_config(mesh, **model), TOPOLOGY)
    return cache[key]

  return get


@pytest.fixture(scope='module')
def analyses(programs):
  """One compiled analysis per mesh, made on first use and shared by the tests below."""
  cache = {}

  def get(mesh):
    if mesh not in cache:
      cache[mesh] = aot.analyze_program(programs(mesh), TOPOLOGY)
    return cache[mesh]

  return get


def _param_bytes(program: aot.Program) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(program.args[0].params))


@pytest.mark.slow
@pytest.mark.parametrize('mesh', ['data', 'fsdp', 'fsdp_tensor'])
def test_train_step_compiles_for_v4_8(programs, analyses, mesh):
  analysis = analyses(mesh)
  assert analysis.num_devices == 4 and analysis.fits
  assert analysis.flops * analysis.num_devices >= analysis.model_flops  # the analytic count is matmuls only
  assert 0 < analysis.step_seconds and 0 < analysis.mfu_bound < 1
  # The TPU compiler keeps part of the traffic in on-chip memory: HBM's share is a looser bound.
  assert 0 < analysis.hbm_bytes < analysis.bytes_accessed and analysis.mfu_bound < analysis.hbm_mfu_bound
  collectives = analysis.collectives
  assert collectives['all-reduce'].count > 0  # gradients (data) or partial sums (fsdp, tensor)
  if mesh == 'data':  # mesh.shard_optimizer: each chip updates a quarter of the parameters, then gathers them all
    assert collectives['all-gather'].bytes >= 0.9 * _param_bytes(programs(mesh))
  else:
    assert collectives['all-gather'].count > 0 and collectives['all-gather'].bytes > 0  # sharded parameters


@pytest.mark.slow
def test_train_step_compiles_for_the_newest_tpu():
  """TPU7x, the newest generation libtpu describes: 4 chips of two devices (TensorCores) each, a mesh over the
  8, each device with half its chip's HBM and bf16 peak."""
  analysis = aot.analyze_train_step(small_config('fsdp', 'tpu7x-8'), 'tpu7x-8')
  assert analysis.num_devices == 8 and analysis.hbm_capacity == 96 * aot.GiB and analysis.peak_flops == 2307e12 / 2
  assert analysis.fits and analysis.flops * analysis.num_devices >= analysis.model_flops
  assert analysis.collectives['all-gather'].count > 0  # FSDP's parameters, over all 8 devices


@pytest.mark.slow
def test_a_tpu_program_compiled_on_a_cpu_host_makes_the_tpus_choices(programs):
  """model.cpu_kernels='auto' is decided by the devices the step is compiled for: the TPU program is the one
  with the CPU kernels off, as on a TPU host, not the host's choice."""
  lowered = lambda **model: aot.lower(programs('data', **model)).as_text()
  assert small_config('data').model.cpu_kernels == 'auto'  # the default: the data mesh's analysed program is it
  auto = lowered()
  assert auto == lowered(cpu_kernels='off')
  assert auto != lowered(cpu_kernels='on')


@pytest.mark.slow
def test_fsdp_holds_a_quarter_of_the_state_per_chip_and_data_parallel_a_quarter_of_adams(programs, analyses):
  total = _param_bytes(programs('data'))
  data, fsdp = analyses('data').arguments, analyses('fsdp').arguments
  assert data['params'] == total
  # Everything with an 'embed' axis is split 4 ways; only the FFN's hidden biases (d_ff per layer) and the
  # scalar-free rest stay whole: well under a tenth of a quarter here.
  assert total / 4 <= fsdp['params'] <= 1.1 * total / 4
  # Adam's two moments, split like FSDP's parameters on both meshes (mesh.shard_optimizer on the data mesh).
  assert data['optimizer'] == fsdp['optimizer'] <= 1.1 * 2 * total / 4


def test_zero1_keeps_the_backward_pass_in_the_parameters_layout():
  """With Adam's moments split over `data` (ZeRO-1), the gradients take the parameters' layout before the update,
  so the split does not spread into the backward pass: on v5e-8 the step all-gathers no more than the updated
  parameters and moves nothing all-to-all (unconstrained, it gathered 3.4× the parameters' bytes)."""
  program = aot.longest_train_step(small_config('data', topology='v5e-8'), 'v5e-8')
  collectives = aot.analyze_program(program, 'v5e-8').collectives
  assert 0 < collectives['all-gather'].bytes <= _param_bytes(program)
  assert collectives['all-to-all'].count == 0


def test_the_parameters_are_donated_unless_zero1_gathers_them_on_a_tpu():
  def mesh(preset, devices):
    return sharding.mesh_and_rules(small_config(preset).mesh, devices)[0]

  tpu = topologies.topology_devices(TOPOLOGY)
  assert not steps.donates_params(mesh('data', tpu), shard_optimizer=True)
  assert steps.donates_params(mesh('data', tpu), shard_optimizer=False)  # replicated, updated where they lie
  assert steps.donates_params(mesh('fsdp', tpu), shard_optimizer=True)  # FSDP: each chip updates its own shard
  assert steps.donates_params(mesh('data', jax.devices('cpu')[:4]), shard_optimizer=True)


@pytest.mark.slow
@pytest.mark.parametrize('mesh', ['data', 'fsdp'])
def test_zero1_on_a_tpu_keeps_the_parameters_buffers(programs, mesh):
  """The v4-8 data mesh's step (ZeRO-1) writes the new parameters to buffers of their own and the rest of the state
  to the donated ones (`steps.donates_params`); the FSDP mesh's donates all of it."""
  program = programs(mesh)
  state = program.args[0]
  params = range(1, 1 + len(jax.tree.leaves(state.params)))  # the step's arguments: the state's fields, then batch
  arguments = range(len(jax.tree.leaves(state)))
  text = aot.compile_program(program).as_text()
  donated = {int(number) for number in re.findall(r'\{\d+\}: \((\d+), \{\}, may-alias\)', text)}  # input_output_alias
  assert donated == (set(arguments) if mesh == 'fsdp' else set(arguments) - set(params))


@pytest.mark.slow
def test_a_scanned_stack_counts_every_layer():
  """XLA's cost analysis counts a loop body once, and the TPU program of a scan keeps no trip count: the analysis
  counts each layer's run, so two scanned layers per side cost about what two unrolled ones do."""
  # Without dropout (its random bits change nothing of how a loop is counted) both programs compile a quarter faster.
  analyses = {scan: aot.analyze_train_step(small_config('data', num_encoder_layers=2, num_decoder_layers=2, dropout=0.0,
                                                        scan_layers=scan), TOPOLOGY) for scan in (False, True)}
  scanned, unrolled = analyses[True], analyses[False]
  assert scanned.flops * scanned.num_devices >= scanned.model_flops
  assert scanned.flops == pytest.approx(unrolled.flops, rel=0.05)  # without the second layer's run: 55%
  assert scanned.bytes_accessed >= 0.8 * unrolled.bytes_accessed

@pytest.mark.slow
def test_oversized_config_does_not_fit_and_says_what_to_change():
  # 1M-piece vocabulary × d_model 2048: 2.1G parameters, 24 GiB with Adam's moments, replicated on 16 GiB chips.
  config = small_config('data', topology='v5e-8', vocab_size=1 << 20, d_model=2048, d_ff=256)
  analysis = aot.analyze_train_step(config, 'v5e-8')
  # XLA refuses the program (its buffers exceed HBM); the analysis keeps its figure for the temporaries.
  assert analysis.compile_error.startswith('RESOURCE_EXHAUSTED') and analysis.temp_bytes > 16 * aot.GiB
  assert not analysis.fits and analysis.arguments['params'] > 8 * aot.GiB
  advice = aot.advice(analysis, config)
  assert '\n' not in advice and 'FSDP' in advice and 'fsdp=8' in advice


def _analysis(params, optimizer, temps, capacity=16 * aot.GiB):
  """A synthetic analysis: the advice depends only on these figures and the config."""
  return aot.Analysis(
      topology='v5e-8', num_devices=8, hbm_capacity=capacity, peak_flops=1e12, hbm_bandwidth=1e12,
      arguments={'params': params, 'optimizer': optimizer, 'other': 0}, argument_bytes=params + optimizer,
      output_bytes=0, temp_bytes=temps, code_bytes=0, flops=1.0, bytes_accessed=1.0, hbm_bytes=1.0, collectives={},
      model_flops=None, compile_seconds=0.0)


@pytest.mark.parametrize('mesh,remat,params,temps,expected', [
    ({'data': 1, 'fsdp': 8, 'tensor': 1}, 'none', 8, 2, 'tensor parallelism'),
    ({'data': 8, 'fsdp': 1, 'tensor': 1}, 'none', 1, 20, 'model.remat=full'),
    ({'data': 8, 'fsdp': 1, 'tensor': 1}, 'full', 1, 20, 'pipeline.tokens_per_batch'),
])
def test_advice_names_the_dominant_cost(mesh, remat, params, temps, expected):
  config = small_config('data', topology='v5e-8')
  config.mesh.shape.update(mesh)
  config.model.remat = remat
  advice = aot.advice(_analysis(params * aot.GiB, 2 * params * aot.GiB, temps * aot.GiB), config)
  assert expected in advice and '\n' not in advice
  assert aot.advice(_analysis(1, 1, 1), config) is None  # fits: nothing to change


@pytest.mark.slow
@pytest.mark.parametrize('attention_dropout,kernel', [(0.0, 'splash_mha'), (0.1, 'attention_dropout')])
def test_flash_tpu_kernel_compiles_inside_the_train_step(programs, attention_dropout, kernel):
  """`auto` attention on a TPU: jax's splash kernel, or with attention dropout our own
  (`flash_tpu._flash_tpu_dropout`), compiled by Mosaic for a TPU, with heads split over the tensor axis."""
  model = {'attention_dropout': attention_dropout} if attention_dropout else {}  # without: the analysed program
  hlo = aot.compile_program(programs('fsdp_tensor', **model)).as_text()
  # 1 encoder + 2 decoder attentions, forward and backward (one backward kernel each): Mosaic custom calls.
  calls = [line for line in hlo.splitlines() if 'custom_call_target="tpu_custom_call"' in line]
  assert len(calls) == 6 and all(kernel in line for line in calls)


def test_flash_tpu_dropout_kernel_compiles_for_several_key_blocks():
  """Our dropout kernel with 1100 causal keys (9 blocks of 128: a float32 dq per block, delta from the saved
  output, tiles above the diagonal skipped), forward and backward, compiled by Mosaic for a TPU."""
  key_type = jax.random.key(0).dtype
  mesh = helpers.data_mesh(topologies.topology_devices(TOPOLOGY))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  qkv = jax.ShapeDtypeStruct((4, 1100, 2, 64), jnp.bfloat16, sharding=rows)

  def loss(q, k, v, valid, rng):
    spec = attention_masks.MaskSpec.self_attention(valid, causal=True)
    out = attention.attend(q, k, v, spec, kernels=helpers.kernels('flash_tpu'), dropout_rate=0.1, dropout_rng=rng)
    return jnp.sum(out.astype(jnp.float32))

  with jax.set_mesh(mesh), aot.compiling_for(mesh.devices.flat):
    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
        qkv, qkv, qkv, jax.ShapeDtypeStruct((4, 1100), jnp.bool_, sharding=rows),
        jax.ShapeDtypeStruct((), key_type)).compile().as_text()
  calls = [line for line in hlo.splitlines() if 'custom_call_target="tpu_custom_call"' in line]
  assert [('attention_dropout_fwd' in c, 'attention_dropout_bwd' in c) for c in calls] == [(True, False),
                                                                                           (False, True)]


@pytest.mark.parametrize('topology, mesh', helpers.fast_tier([('h100-1', 'data'), ('a100-8', 'fsdp')],
                                                        fast=[('h100-1', 'data')]))
def test_train_step_compiles_for_a_gpu_without_one(topology, mesh):
  """The CUDA plugin compiles for a described GPU on this CPU: the program the GPU would run, with the GPU's
  choices (our Triton kernels for attention dropout, cuBLAS for every product), and costs from hlo_costs, since
  such a compile has no cost analysis of XLA's."""
  config = small_config(mesh, topology, attention_dropout=0.1)
  programs = aot.run_programs(config, topologies.topology_devices(topology))
  program = [p for p in programs if p.what.startswith('train')][-1]
  text = aot.compile_program(program).as_text()
  kernels = re.findall(r'op_name="[^"]*/(attention_gpu_\w+)/pallas_call"', text)
  assert set(kernels) == {'attention_gpu_fwd', 'attention_gpu_dq', 'attention_gpu_dkv'}
  # The 3 kernels of each of the 3 attention calls read the fused projections' products (rank 5) in place and write
  # their gradients whole: no q, k or v gradients joined (add_any), which the program had while they took slices.
  calls = [line for line in text.splitlines() if 'custom-call(' in line and '/attention_gpu_' in line]
  assert len(calls) == 3 * 3 and all(re.search(r'bf16\[\d+(,\d+){4}\]', line) for line in calls)
  ops = hlo_costs.op_costs(text)
  scope = re.compile(r'_attention/(query|key|value|key_value|key_value_query)/')
  projections = {op.op_name.rsplit('/', 1)[1] for op in ops if scope.search(op.op_name)}
  assert 'dot_general' in projections and 'add_any' not in projections
  # The backward's delta = rowsum(o ⊙ do) comes from the dq kernel's own tiles: no reduction around the kernels
  assert not [op for op in ops if step_parts.part_of(op) == 'attention: softmax' and op.opcode in ('fusion', 'reduce')
              and op.op_name.endswith('reduce_sum')]
  assert 'custom_call_target="__cublas$lt$matmul"' in text and 'gemm_fusion' not in text  # xla_options
  # Without ReLU dropout the FFN's ReLU is the one user of its first product (`model.relu_dropout`), so cuBLAS
  # adds the bias and takes the ReLU as it writes the product.
  assert re.search(r'op_name="[^"]*/ffn/wi/dot_general".*"epilogue":"BIAS_RELU"', text)
  # Each post-LN residual block: one kernel a pass (kernels/gpu/residual_norm.py)
  assert set(re.findall(r'op_name="[^"]*_block/(?:shard_map/)?(residual_norm_\w+)/pallas_call"', text)) == {
      'residual_norm_fwd', 'residual_norm_bwd'}
  assert not re.search(r'u32\[\d+,\d+,\d+', text)  # dropout's masks hashed where they are used: no random bits kept
  # The loss's maximum, log-sum-exp and gradient: one kernel, its gradient over the logits' buffer
  # (kernels/gpu/softmax_gradient.py)
  assert re.search(r'output_to_operand_aliasing=\{\{2\}: \(1, \{\}\)\}.*/loss_softmax_gradient/pallas_call', text)
  analysis = aot.analyze_program(program, topology)
  assert analysis.fits and analysis.hbm_capacity > 79 * aot.GiB
  assert analysis.flops * analysis.num_devices >= analysis.model_flops > 0
  assert analysis.hbm_bytes == analysis.bytes_accessed > 0  # no on-chip memory spaces on a GPU
  assert (analysis.collectives['all-reduce'].count > 0) == (analysis.num_devices > 1)


@pytest.mark.slow
def test_a_gpu_step_runs_no_pallas_triton_kernel_with_the_maintained_paths_chosen():
  """jax 0.11 deprecated Pallas's Triton backend (kernels/gpu): with `dot_product` attention (cuDNN's where it
  serves, else XLA's: training batches carry segment ids), XLA's residual blocks and XLA's passes over the logits,
  the GPU step has no Pallas kernel left, its products still in cuBLAS."""
  config = small_config('data', 'h100-1', attention='dot_product', residual_norm_kernel=False, loss_kernel=False)
  programs = aot.run_programs(config, topologies.topology_devices('h100-1'))
  text = aot.compile_program([p for p in programs if p.what.startswith('train')][-1]).as_text()
  assert 'pallas_call' not in text and '__gpu$xla.gpu.triton' not in text
  assert 'custom_call_target="__cublas$lt$matmul"' in text


@pytest.mark.parametrize('plugin, install', [('jax_cuda12_plugin', r'pip install -r requirements-gpu\.txt'),
                                             ('jax_cuda13_plugin', 'pip install nvidia-cudnn-cu13')])
def test_cudnn_missing_for_cudnns_attention_says_what_to_do(monkeypatch, plugin, install):
  """`auto` without attention dropout lowers cuDNN's fused attention on a GPU, and jax then reads cuDNN's version
  from the library, which the CUDA plugin alone does not bring (absent here, or made so)."""
  from jax._src.cudnn import fused_attention_stablehlo  # pylint: disable=import-outside-toplevel

  def absent():
    raise RuntimeError('cuDNN not found.')

  devices = topologies.topology_devices('h100-1')
  monkeypatch.setattr(fused_attention_stablehlo, 'check_cudnn_version', absent)
  monkeypatch.setattr(topologies, 'cuda_plugin', lambda: plugin)
  with pytest.raises(cli.USER_ERRORS, match=rf'needs cuDNN, .*: {install}, or set model.attention=flash_gpu'):
    aot.run_programs(small_config('data', 'h100-1', d_k=64, d_v=64), devices)  # cuDNN's


def test_parse_collectives_counts_each_op_once_with_its_result_bytes():
  hlo = '\n'.join([
      '  %all-reduce.1 = (f32[512]{0:T(512)}, bf16[8,64]{1,0}) all-reduce(%a, %b), to_apply=%add',
      '  %ag-start = (bf16[4,8]{1,0}, bf16[16,8]{1,0}) all-gather-start(%c), dimensions={0}',
      '  %ag-done = bf16[16,8]{1,0:T(8,128)(2,1)} all-gather-done(%ag-start)',
      '  %rs = f32[2,3]{1,0} reduce-scatter(f32[8,3]{1,0} %d), dimensions={0}',
      '  %gte = f32[512]{0} get-tuple-element(%all-reduce.1), index=0',
      '  ROOT %cp = s32[10]{0} collective-permute(%e), source_target_pairs={{0,1}}',
  ])
  found = aot.parse_collectives(hlo)
  assert found['all-reduce'] == aot.Collective(1, 512 * 4 + 8 * 64 * 2)
  assert found['all-gather'] == aot.Collective(1, 16 * 8 * 2)
  assert found['reduce-scatter'] == aot.Collective(1, 2 * 3 * 4)
  assert found['collective-permute'] == aot.Collective(1, 10 * 4)
  assert found['all-to-all'] == aot.Collective(0, 0)


@pytest.mark.slow
def test_train_py_compile_only_reports_and_refuses_what_does_not_fit(entry_points, tmp_path):
  """train.py --compile_only compiles the run's train and eval steps for the slice (no TPU, no data, no workdir
  written), each report saying which program of how many it is; a config that does not fit exits 1 with one line
  saying what to change."""
  args = ['train.py', f'--workdir={tmp_path / "w"}', '--compile_only', '--topology=v5e-8',
          '--config=configs/wmt14_ende_base.py:runlocal', '--config.model.dtype=bfloat16',
          '--config.mesh.shape.data=8', '--config.model.num_encoder_layers=1',
          '--config.model.num_decoder_layers=1']  # one layer a side: what is tested is the command, not the depth
  ok = entry_points.run(args, text=True, timeout=600)
  assert ok.returncode == 0, ok.stderr[-3000:]
  assert not helpers.noise(ok.stderr), ok.stderr  # libtpu, loaded to compile for the slice, says nothing of this host
  assert 'train step, batch 32×64 (program 1 of 2):' in ok.stdout
  assert 'eval step, batch 64×64 (program 2 of 2):' in ok.stdout
  assert ok.stdout.startswith('TPU kernels: attention flash_tpu, bernoulli dropout masks\n')  # chosen for the slice
  assert ok.stdout.count('of HBM: fits') == 2
  # 2M pieces × d_model 2048: the parameters alone outgrow a chip, so XLA refuses both programs at once (with 1M
  # pieces the eval step fits, and compiling it was most of that run's time); one line still, the first's.
  big = entry_points.run(args + ['--config.model.vocab_size=2097152', '--config.model.d_model=2048'], text=True,
                         timeout=600)
  errors = [line for line in big.stderr.splitlines() if line.startswith('error:')]
  assert big.returncode == 1 and len(errors) == 1 and big.stdout.count('of HBM: does NOT fit') == 2
  assert errors[0].startswith('error: train step, batch 32×64 does not fit on v5e-8: ') and 'FSDP' in errors[0]
  assert not (tmp_path / 'w').exists()


def _two_bucket_config():
  """small_config with two length buckets: two train steps and the eval step to compile."""
  config = small_config('data')
  config.pipeline.bucket_boundaries = (32, 64)
  return config


def test_compile_only_gives_each_program_as_soon_as_it_is_compiled(monkeypatch, caplog):
  """train.py --compile_only prints each program's report as soon as it is compiled (a TPU compile of the paper's
  models takes minutes): the longest train step first. The others' compiles wait here until its report is out, so
  a report held back for the others would time out. Meanwhile the log says how many are compiled, for how long,
  and the host's peak memory (here from the start: the progress threshold set to 0)."""
  monkeypatch.setattr(progress, 'AFTER', 0.0)
  caplog.set_level(logging.INFO, logger='absl')
  first_given = threading.Event()

  def analysis(program, lowered, topology):
    if program.what != 'train step, batch 32×64':
      assert first_given.wait(timeout=120)
    return topology

  monkeypatch.setattr(aot, '_analysis', analysis)
  reports = aot.compile_run(aot.run_programs(_two_bucket_config(), topologies.topology_devices(TOPOLOGY)), TOPOLOGY)
  assert next(reports) == ('train step, batch 32×64', TOPOLOGY)
  first_given.set()
  assert sorted(reports) == [('eval step, batch 64×64', TOPOLOGY), ('train step, batch 64×32', TOPOLOGY)]
  said = [message for message in caplog.messages if message.startswith(f'compiling for {TOPOLOGY}: ')]
  assert re.fullmatch(rf'compiling for {TOPOLOGY}: [0-3] of 3 programs, .*\d+s so far, peak host memory \d+\.\d GiB',
                      said[0]), said
  assert said[-1].startswith(f'compiling for {TOPOLOGY}: 3 programs done in ')


def test_fits_refuses_a_row_whose_compiled_flops_fall_below_the_models(monkeypatch):
  """A compiled step always does at least the model's FLOPs: fewer means a loop's runs went uncounted."""
  below = dataclasses.replace(_analysis(1, 1, 1), model_flops=8.5)  # 8 chips at 1 FLOP each
  monkeypatch.setattr(aot, 'analyze_train_step', lambda config, topology: below)
  with pytest.raises(ValueError, match=r'^base on v5e-8, data: the compiled step counts 0 GFLOP per device, below'):
    fits.measure('base', 'v5e-8', 'data')
  monkeypatch.setattr(aot, 'analyze_train_step', lambda config, topology: dataclasses.replace(below, model_flops=8.0))
  assert fits.measure('base', 'v5e-8', 'data')['flops'] == 1.0


def test_fits_cache_compiles_again_a_row_cached_before_the_analysis_gained_a_field(tmp_path):
  row = dict(_analysis(1, 1, 1).as_dict(), model='base', topology='v5e-8', mesh='data')
  old = {k: v for k, v in row.items() if k != 'hbm_bytes'} | {'mesh': 'fsdp'}
  cache = tmp_path / 'fits.jsonl'
  cache.write_text(json.dumps(row) + '\n' + json.dumps(old) + '\n')
  assert list(fits.cached_rows(str(cache))) == [('base', 'v5e-8', 'data')]
