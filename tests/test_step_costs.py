"""hlo_costs, bench.step_costs and bench.step_profile: per-op bytes and FLOPs read from optimized HLO, their
model parts, and a GPU profile's kernel times joined with them.

A hand-written module checks the costing rules exactly (no compile); one small model compiled for a TPU slice
checks the breakdown of a real train step against XLA's totals and the analytic FLOP count.
"""

import contextlib
import dataclasses
import gzip
import json
import re

import jax
import pytest

import helpers
from bench import kernel_registers
from bench import step_costs
from bench import step_profile
from transformer_jax import config as config_lib
from transformer_jax.compile import hlo_costs
from transformer_jax.compile import step_parts
from transformer_jax.compile import topologies
from transformer_jax.config.model import ModelConfig
from transformer_jax.runtime import pallas_mode

_MODULE = """HloModule m, is_scheduled=true

%fused_dot (param_0: f32[8,16], param_1: f32[16,4]) -> f32[8,4] {
  %param_0 = f32[8,16]{1,0} parameter(0)
  %param_1 = f32[16,4]{1,0} parameter(1)
  %dot.1 = f32[8,4]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %exp.1 = f32[8,4]{1,0} exponential(%dot.1)
}

%fused_slice (param_0.1: bf16[64,16], param_1.1: s32[]) -> bf16[8,16] {
  %param_0.1 = bf16[64,16]{1,0} parameter(0)
  %param_1.1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  ROOT %ds = bf16[8,16]{1,0} dynamic-slice(%param_0.1, %param_1.1, %zero), dynamic_slice_sizes={8,16}
}

%body (p: (s32[], f32[8,16], f32[16,4])) -> (s32[], f32[8,16], f32[16,4]) {
  %p = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %w = f32[16,4]{1,0} get-tuple-element(%p), index=2
  %fusion.1 = f32[8,4]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(f)/while/body/loss/dot_general" stack_frame_id=1}
  ROOT %t = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}) tuple(%i, %x, %w)
}

%cond (p.1: (s32[], f32[8,16], f32[16,4])) -> pred[] {
  %p.1 = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}) parameter(0)
  ROOT %true = pred[] constant(true)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

ENTRY %main (a.1: f32[8,16], b.1: f32[16,4], c.1: bf16[64,16], i.1: s32[], q.1: bf16[2,3,16,8], k.1: bf16[2,3,32,8]) -> f32[8,4] {
  %a.1 = f32[8,16]{1,0} parameter(0)
  %b.1 = f32[16,4]{1,0} parameter(1)
  %c.1 = bf16[64,16]{1,0} parameter(2)
  %i.1 = s32[] parameter(3)
  %q.1 = bf16[2,3,16,8]{3,2,1,0} parameter(4)
  %k.1 = bf16[2,3,32,8]{3,2,1,0} parameter(5)
  %splash_mha_dq_segmented.1 = bf16[2,3,16,8]{3,2,1,0} custom-call(%i.1, %q.1, %k.1, %k.1), custom_call_target="tpu_custom_call", backend_config={"custom_call_config": {"body": "eA=="}}
  %zero.1 = s32[] constant(0)
  %t.1 = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}) tuple(%zero.1, %a.1, %b.1)
  %while.1 = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}) while(%t.1), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %x.1 = f32[8,16]{1,0} get-tuple-element(%while.1), index=1
  %sliced = bf16[8,16]{1,0} fusion(%c.1, %i.1), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(f)/Transformer/encoder/embedder/gather" stack_frame_id=2}
  %cc = f32[8,4]{1,0} custom-call(%x.1, %b.1), custom_call_target="tpu_custom_call", backend_config={"custom_call_config": {"body": "eA==", "cost_estimate": {"flops": 1000, "transcendentals": 10, "bytes_accessed": 640}}}, metadata={op_name="jit(f)/Transformer/encoder/layer_0/self_attention/flash" stack_frame_id=3}
  %plain = f32[8,4]{1,0} custom-call(%cc), custom_call_target="Sharding"
  ROOT %ar = f32[8,4]{1,0} all-reduce(%plain), replica_groups={}, to_apply=%add, metadata={op_name="jit(f)/transpose(jvp(Transformer))/encoder/layer_0/ffn/wi/dot_general" stack_frame_id=4}
}
"""


def test_each_op_is_costed_from_its_shapes_and_loops_count_their_trips():
  ops = {op.name: op for op in hlo_costs.op_costs(_MODULE)}
  assert set(ops) == {'fusion.1', 'sliced', 'cc', 'plain', 'ar', 'splash_mha_dq_segmented.1'}  # views, tuples,
  # parameters and loops are free
  dot = ops['fusion.1']
  assert dot.count == 5  # the loop body, by its known trip count
  assert dot.flops == 2 * 8 * 4 * 16 and dot.transcendentals == 8 * 4
  assert dot.bytes == 4 * (8 * 16 + 16 * 4 + 8 * 4)  # both operands read, the result written
  assert ops['sliced'].bytes == 2 * (8 * 16 + 8 * 16) + 4  # only the slice of the table is read, and the index
  assert (ops['cc'].flops, ops['cc'].bytes, ops['cc'].transcendentals) == (1000, 640, 10)  # its cost estimate
  assert ops['cc'].estimated and not ops['plain'].estimated and ops['plain'].flops == 0
  # An attention kernel without an estimate: its matmuls' FLOPs from q [2, 3, 16, 8] and k [2, 3, 32, 8] (the dq
  # kernel: q·kᵀ, do·vᵀ and ds·k), its operands and result as bytes.
  splash = ops['splash_mha_dq_segmented.1']
  assert not splash.estimated and splash.flops == 3 * 2 * (2 * 3 * 16 * 32 * 8)
  assert splash.bytes == 4 + 2 * (2 * 3 * 16 * 8) * 2 + 2 * (2 * 2 * 3 * 32 * 8)
  assert ops['ar'].bytes == 2 * 4 * 8 * 4


def test_a_fused_backward_kernel_counts_its_dq_products_too():
  operands = ['bf16[2,3,16,8]{3,2,1,0}', 'bf16[2,3,32,8]{3,2,1,0}']  # q, k
  dk_dv = 'bf16[2,3,32,8]{3,2,1,0}, bf16[2,3,32,8]{3,2,1,0}'
  block = 2 * (2 * 3 * 16 * 32 * 8)  # one matmul over every block
  assert hlo_costs.attention_kernel_flops('splash_mha_dkv_segmented.1', operands, f'({dk_dv})') == 4 * block
  # With the dq parts (one per key block, a rank-5 result) it also forms ds·k.
  fused = f'(bf16[2,1,3,16,8]{{4,3,2,1,0}}, {dk_dv})'
  assert hlo_costs.attention_kernel_flops('splash_mha_dkv_segmented.1', operands, fused) == 5 * block


def test_a_splash_kernel_of_one_row_per_chip_counts_its_products_without_the_batch_axis():
  """With one row per chip the TPU compiler calls the kernels on q [heads, length, head dim], after the mask's
  int8 block tables; the dkv kernel's fused dq parts are then of rank 4. (An operand list TPU v5e compiled.)"""
  tables = ['s8[1,1,1]{2,1,0}', 's8[1,1,1]{2,1,0}']
  q_k_v = ['f32[2,128,8]{2,1,0}'] * 3
  ids = ['s32[8,128]{1,0}', 's32[128,128]{1,0}']
  block = 2 * (2 * 128 * 128 * 8)
  assert hlo_costs.attention_kernel_flops('splash_mha_fwd_segmented_residuals.2', tables + q_k_v + ids,
                                          '(f32[2,128,8]{2,1,0}, f32[2,128,128]{2,1,0})') == 2 * block
  dk_dv = 'f32[2,128,8]{2,1,0}, f32[2,128,8]{2,1,0}'
  assert hlo_costs.attention_kernel_flops('splash_mha_dkv_segmented.1', tables + q_k_v, f'({dk_dv})') == 4 * block
  fused = f'(f32[1,2,128,8]{{3,2,1,0}}, {dk_dv})'
  assert hlo_costs.attention_kernel_flops('splash_mha_dkv_segmented.1', tables + q_k_v, fused) == 5 * block


def test_flash_gpus_triton_kernels_count_their_products_by_op_name():
  """A Triton call keeps no cost estimate and is named only in its op_name; q [2, 16, 3, 8] and k [2, 32, 3, 8]
  are [batch, length, heads, head dim] there."""
  operands = ['s32[4]{0}', 'bf16[2,16,3,8]{3,2,1,0}', 'bf16[2,32,3,8]{3,2,1,0}']
  block = 2 * (2 * 3 * 16 * 32 * 8)
  name = 'jit(train_step)/transpose(jvp(Transformer))/decoder/layer_0/self_attention/{}/pallas_call'
  flops = [hlo_costs.attention_kernel_flops('pallas_call.7', operands, 'bf16[2,16,3,8]{3,2,1,0}', name.format(k))
           for k in ('attention_gpu_fwd', 'attention_gpu_dq', 'attention_gpu_dkv', 'attention_gpu_other')]
  assert flops == [2 * block, 3 * block, 4 * block, 0]


# flash_gpu's backward kernels on a stack of self-attention's keys, values and queries [2, 16, 3, 4, 8] (bf16,
# 1,024 elements a slot): passed once per slot, dq's kernel writing the queries' slot of the stack's gradient and
# each query's delta = rowsum(o ⊙ do), dkv's kernel the other two slots into the same array (its operand 9, which
# it does not read).
_STACKED_KERNELS = """HloModule s, is_scheduled=true

ENTRY %main (s.1: s32[4], kvq.1: bf16[2,16,3,4,8], qi.1: s32[2,16], ki.1: s32[2,16], lse.1: f32[2,4,16], o.1: bf16[2,16,4,8], do.1: bf16[2,16,4,8]) -> bf16[2,16,3,4,8] {
  %s.1 = s32[4]{0} parameter(0)
  %kvq.1 = bf16[2,16,3,4,8]{4,3,2,1,0} parameter(1)
  %qi.1 = s32[2,16]{1,0} parameter(2)
  %ki.1 = s32[2,16]{1,0} parameter(3)
  %lse.1 = f32[2,4,16]{2,1,0} parameter(4)
  %o.1 = bf16[2,16,4,8]{3,2,1,0} parameter(5)
  %do.1 = bf16[2,16,4,8]{3,2,1,0} parameter(6)
  %dq.1 = (bf16[2,16,3,4,8]{4,3,2,1,0}, f32[2,4,16]{2,1,0}) custom-call(%s.1, %kvq.1, %kvq.1, %kvq.1, %qi.1, %ki.1, %lse.1, %o.1, %do.1), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(f)/transpose(jvp(T))/encoder/layer_0/self_attention/attention_gpu_dq/pallas_call"}
  %stack.1 = bf16[2,16,3,4,8]{4,3,2,1,0} get-tuple-element(%dq.1), index=0
  %delta.1 = f32[2,4,16]{2,1,0} get-tuple-element(%dq.1), index=1
  ROOT %dkv.1 = bf16[2,16,3,4,8]{4,3,2,1,0} custom-call(%s.1, %kvq.1, %kvq.1, %kvq.1, %qi.1, %ki.1, %lse.1, %delta.1, %do.1, %stack.1), custom_call_target="__gpu$xla.gpu.triton", output_to_operand_aliasing={{}: (9, {})}, metadata={op_name="jit(f)/transpose(jvp(T))/encoder/layer_0/self_attention/attention_gpu_dkv/pallas_call"}
}
"""


def test_flash_gpus_kernels_on_a_stack_count_what_they_read_and_write():
  dq, dkv = (op for op in hlo_costs.op_costs(_STACKED_KERNELS) if op.opcode == 'custom-call')
  slot, rows = 2 * 16 * 4 * 8 * 2, 2 * 4 * 16 * 4  # bytes of a slot (and of o, do); of lse (and of delta)
  read = 4 * 4 + 3 * slot + 2 * (2 * 16 * 4) + rows  # the scalars, the stack once, ids, lse
  assert dq.bytes == read + 2 * slot + slot + rows  # o and do; the queries' slot and delta
  assert dkv.bytes == read + rows + slot + 2 * slot  # delta and do; the keys' and values' slots
  block = 2 * (2 * 4 * 16 * 16 * 8)  # q and k from the stack: batch 2, 16 positions, 4 heads of 8
  assert (dq.flops, dkv.flops) == (3 * block, 4 * block)


def test_ops_are_attributed_to_model_parts_by_their_op_names():
  parts = {p.name: p for p in step_parts.breakdown(hlo_costs.op_costs(_MODULE))}
  assert parts['pre-softmax layer + loss'].flops == 5 * 2 * 8 * 4 * 16
  assert parts['embeddings'].ops == 1
  # The kernels by their cost estimate or by their shapes; the splash kernel, which has no op_name (as the TPU
  # compiler leaves them), by its instruction's name, and in the backward pass as a dq kernel.
  kernels = parts['attention: kernels (custom calls)']
  assert kernels.flops == 1000 + 6 * (2 * 3 * 16 * 32 * 8) and kernels.ops == 2
  assert kernels.backward_bytes == hlo_costs.op_costs(_MODULE)[0].bytes  # the splash kernel (no loop, first)
  assert parts['collectives'].bytes == parts['collectives'].backward_bytes == 2 * 4 * 8 * 4  # a collective first
  # The custom call without metadata (as the compiler's memory moves) counts with the all-reduce it feeds.
  assert parts['FFN'].ops == 1 and parts['FFN'].bytes == parts['FFN'].borrowed_bytes == 2 * 4 * 8 * 4
  assert 'other (no model scope)' not in parts


def test_a_pallas_kernels_memory_moves_count_with_the_kernel():
  """The TPU compiler's moves of a Pallas kernel's operands borrow the kernel's op_name, as the splash kernels'
  borrow their names: both count as the kernels' part, not as the softmax around them."""
  scope = 'jit(train_step)/transpose(jvp(Transformer))/Transformer.encode/encoder/layer_0/self_attention_block/'
  kernel = hlo_costs.OpCost('custom-call.3', 'custom-call', scope + 'self_attention/shard_map/'
                            'attention_dropout_bwd/pallas_call', 100.0, 10.0, 0.0, 1, 'tpu_custom_call')
  move = dataclasses.replace(kernel, name='slice-done.7', opcode='slice', target='', borrowed=True)
  softmax = dataclasses.replace(kernel, name='fusion.2', opcode='fusion', op_name=scope + 'self_attention/exp')
  assert [step_parts.part_of(op) for op in (kernel, move, softmax)] == [
      'attention: kernels (custom calls)', 'attention: kernels (custom calls)', 'attention: softmax']


@contextlib.contextmanager
def _op_names_in_the_cache_key():
  """Op names read from an executable are its own: the persistent compilation cache keys a program without its op
  names by default, and would serve an equal program's executable compiled from other code (other names)."""
  jax.config.update('jax_compilation_cache_include_metadata_in_key', True)
  try:
    yield
  finally:
    jax.config.update('jax_compilation_cache_include_metadata_in_key', False)


def test_projections_fused_for_a_gpu_count_as_attention_projections():
  # A GPU program's self-attention projects query, key and value in one product, cross-attention key and value.
  cfg = ModelConfig(vocab_size=40, d_model=32, d_ff=64, num_heads=4, num_encoder_layers=1, num_decoder_layers=1,
                    dropout=0.0, max_len=64, attention='reference', platform='gpu')
  inputs, targets = helpers.tokens(0, (2, 7), [7, 5]), helpers.tokens(1, (2, 9), [9, 4])
  model, params = helpers.init_model(cfg, inputs=inputs, targets=targets)
  with pallas_mode.interpret_kernels(), _op_names_in_the_cache_key():  # the residual blocks' kernels a GPU runs
    hlo = jax.jit(lambda p: model.apply({'params': p}, inputs, targets)).lower(params).compile().as_text()
  scope = re.compile(r'_attention/(query|key|value|key_value|key_value_query)/')
  projected = [op for op in hlo_costs.op_costs(hlo) if scope.search(op.op_name)]
  assert {scope.search(op.op_name)[1] for op in projected} == {'key_value_query', 'query', 'key_value'}
  assert {step_parts.part_of(op) for op in projected} == {'attention projections'}


# A loop as the TPU compiler prints one: no known_trip_count, the counter starts at a copied constant 2 and runs
# while below 7 in steps of 2 (as XLA's windowed matmuls count; a scan counts by 1), and the body writes one row
# of a stacked [7, 16] buffer in place.
_TPU_LOOP_MODULE = """HloModule t, is_scheduled=true

%fused_update (param_0: f32[7,16], param_1: f32[16], param_2: s32[]) -> f32[7,16] {
  %param_0 = f32[7,16]{1,0} parameter(0)
  %param_1 = f32[16]{0} parameter(1)
  %row = f32[1,16]{1,0} bitcast(%param_1)
  %param_2 = s32[] parameter(2)
  %zero = s32[] constant(0)
  ROOT %dus = f32[7,16]{1,0} dynamic-update-slice(%param_0, %row, %param_2, %zero)
}

%body (p: (s32[], f32[16], f32[7,16])) -> (s32[], f32[16], f32[7,16]) {
  %p = (s32[], f32[16]{0}, f32[7,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[16]{0} get-tuple-element(%p), index=1
  %stack = f32[7,16]{1,0} get-tuple-element(%p), index=2
  %updated = f32[7,16]{1,0} fusion(%stack, %x, %i), kind=kLoop, calls=%fused_update, metadata={op_name="jit(f)/while/body/layers/ffn/dynamic_update_slice"}
  %two.1 = s32[] constant(2)
  %next = s32[] add(%two.1, %i)
  ROOT %t = (s32[], f32[16]{0}, f32[7,16]{1,0}) tuple(%next, %x, %updated)
}

%cond (p.1: (s32[], f32[16], f32[7,16])) -> pred[] {
  %p.1 = (s32[], f32[16]{0}, f32[7,16]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %limit = s32[] constant(7)
  ROOT %lt = pred[] compare(%i.1, %limit), direction=LT
}

ENTRY %main (x.1: f32[16], s.1: f32[7,16]) -> f32[7,16] {
  %x.1 = f32[16]{0} parameter(0)
  %s.1 = f32[7,16]{1,0} parameter(1)
  %two = s32[] constant(2)
  %start = s32[] copy(%two)
  %t.1 = (s32[], f32[16]{0}, f32[7,16]{1,0}) tuple(%start, %x.1, %s.1)
  %while.1 = (s32[], f32[16]{0}, f32[7,16]{1,0}) while(%t.1), condition=%cond, body=%body
  ROOT %out = f32[7,16]{1,0} get-tuple-element(%while.1), index=2
}
"""


# The counter copied before its update (into another memory space), as v6e's FSDP programs do it.
_COPIED_COUNTER = ('%next = s32[] add(%two.1, %i)',
                   '%i.copied = s32[]{:S(6)} copy(%i)\n  %next = s32[] add(%two.1, %i.copied)')


@pytest.mark.parametrize('counter', ['read', 'copied'])
def test_a_loop_without_a_known_trip_count_counts_from_its_condition_and_updates_in_place(counter):
  module = _TPU_LOOP_MODULE if counter == 'read' else _TPU_LOOP_MODULE.replace(*_COPIED_COUNTER)
  assert module.count('%next = ') == 1
  ops = {op.name: op for op in hlo_costs.op_costs(module)}
  assert ops['updated'].count == ops['next'].count == 3  # the counter at 2, 4 and 6
  # The update reads the row and the index and writes the row; the [7, 16] buffer it writes into is not read.
  assert ops['updated'].bytes == 4 * 16 + 4 + 4 * 16


# Buffers in on-chip memory, as the TPU compiler lays them out (S(3): CMEM on v4): a fusion reading one operand
# from HBM and one from on-chip memory into an on-chip result, which an asynchronous copy then evicts to HBM.
_ON_CHIP_MODULE = """HloModule c, is_scheduled=true

%fused_add (param_0: f32[64], param_1: f32[64]) -> f32[64] {
  %param_0 = f32[64]{0} parameter(0)
  %param_1 = f32[64]{0:S(3)} parameter(1)
  ROOT %sum = f32[64]{0:S(3)} add(%param_0, %param_1)
}

ENTRY %main (a: f32[64], b: f32[64]) -> f32[64] {
  %a = f32[64]{0} parameter(0)
  %b = f32[64]{0:S(3)} parameter(1)
  %added = f32[64]{0:S(3)} fusion(%a, %b), kind=kLoop, calls=%fused_add, metadata={op_name="jit(f)/ffn/add"}
  %copy-start = (f32[64]{0}, f32[64]{0:S(3)}, u32[]{:S(2)}) copy-start(%added)
  ROOT %copy-done = f32[64]{0} copy-done(%copy-start)
}
"""


def test_bytes_in_on_chip_memory_are_not_hbm_traffic():
  ops = {op.name: op for op in hlo_costs.op_costs(_ON_CHIP_MODULE)}
  assert (ops['added'].bytes, ops['added'].hbm_bytes) == (3 * 4 * 64, 4 * 64)  # only `a` is read from HBM
  assert (ops['copy-done'].bytes, ops['copy-done'].hbm_bytes) == (2 * 4 * 64, 4 * 64)  # the eviction's write
  parts = {p.name: p for p in step_parts.breakdown(list(ops.values()))}
  assert parts['FFN'].hbm_bytes == 2 * 4 * 64  # the eviction counts with the fusion it moves


def test_op_by_op_each_op_takes_its_own_roofline_beside_the_asynchronous_copies():
  ops = hlo_costs.op_costs(_ON_CHIP_MODULE)
  assert [op.asynchronous for op in ops] == [False, True]
  # The fusion: 64 adds, 256 bytes from HBM. Memory-bound at 100 B/s (2.56 s against 0.064 s of compute), compute-
  # bound at 10 FLOP/s (6.4 s against 0.256 s); the eviction's 256 HBM bytes run beside it either way.
  assert step_parts.serial_seconds(ops, peak_flops=1e3, hbm_bandwidth=100) == pytest.approx(2.56)
  assert step_parts.serial_seconds(ops, peak_flops=10, hbm_bandwidth=1e3) == pytest.approx(6.4)


# Dropout's mask as the TPU program draws it inside the op that uses it: integer bit work, then a float select.
_RANDOM_BITS_MODULE = """HloModule r, is_scheduled=true

%fused_mask (param_0: u32[16], param_1: f32[16]) -> f32[16] {
  %param_0 = u32[16]{0} parameter(0)
  %param_1 = f32[16]{0} parameter(1)
  %nine = u32[] constant(9)
  %nines = u32[16]{0} broadcast(%nine), dimensions={}
  %shifted = u32[16]{0} shift-right-logical(%param_0, %nines)
  %mixed = u32[16]{0} xor(%shifted, %param_0)
  %kept = pred[16]{0} compare(%mixed, %nines), direction=GT
  %zero = f32[] constant(0)
  %zeros = f32[16]{0} broadcast(%zero), dimensions={}
  ROOT %dropped = f32[16]{0} select(%kept, %param_1, %zeros)
}

ENTRY %main (bits: u32[16], x: f32[16]) -> f32[16] {
  %bits = u32[16]{0} parameter(0)
  %x = f32[16]{0} parameter(1)
  ROOT %masked = f32[16]{0} fusion(%bits, %x), kind=kLoop, calls=%fused_mask, metadata={op_name="jit(f)/ffn/Dropout_0/select_n"}
}
"""


def test_element_wise_ops_on_integers_are_counted_apart():
  (op,) = hlo_costs.op_costs(_RANDOM_BITS_MODULE)
  assert op.flops == 4 * 16  # the shift, the xor, the comparison and the select, one per element each
  assert op.integer_ops == 2 * 16  # of them the shift and the xor make integers
  assert step_parts.breakdown([op])[0].integer_ops == 2 * 16


@pytest.mark.slow
def test_a_compiled_train_step_breaks_down_to_its_totals_and_the_analytic_flops():
  """One layer per side of base width for v4-8 (as tests/test_aot.py): the matmul FLOPs attributed equal the
  analytic count, the pre-softmax part carries its three [tokens × d × vocab] matmuls, and the parts sum up."""
  config = step_costs.for_topology(config_lib.load('configs/wmt14_ende_base.py:runlocal', {
      'model.num_encoder_layers': 1, 'model.num_decoder_layers': 1, 'model.cpu_kernels': 'off'}), 'v4-8', 'data')
  record = step_costs.measure(config, 'v4-8')
  parts = {p['name']: p for p in record['parts']}
  assert record['bytes'] == sum(p['bytes'] for p in parts.values())
  assert record['flops'] == sum(p['flops'] for p in parts.values())
  assert record['flops'] >= record['model_flops_per_device']  # never below the analytic count
  # Op by op, no op is faster than its FLOPs at peak, and the parts' times add up to the step's.
  assert record['serial_seconds'] >= record['flops'] / record['peak_flops'] * (1 - 1e-9)
  assert record['serial_seconds'] == pytest.approx(sum(p['serial_seconds'] for p in parts.values()), rel=1e-9)
  # Dropout's random bits (the model's residual dropout, drawn on the TPU inside the ops that use them) are among
  # the FLOPs beyond the matmuls'.
  assert 0 < record['integer_ops'] <= record['flops'] - record['model_flops_per_device']
  # The program has no loops, so XLA's FLOPs count the same ops, except the attention kernels' that carry no
  # cost estimate; only elementwise conventions may differ.
  non_matmul = record['flops'] - record['model_flops_per_device']
  assert record['kernel_flops'] > 0
  assert abs(record['flops'] - (record['xla_flops'] + record['kernel_flops'])) <= non_matmul
  tokens = record['batch_rows'] * record['batch_length'] / record['num_devices']  # per device: data parallel
  d_model, vocab = config.model.d_model, config.model.vocab_size
  matmuls = 3 * 2 * tokens * d_model * vocab  # forward, and the two gradients
  # Besides them, a few dozen elementwise FLOPs per [token, vocab] element (softmax, smoothed target, masks).
  assert matmuls <= parts['pre-softmax layer + loss']['flops'] <= matmuls + 32 * tokens * vocab


# --- bench.step_profile: a GPU profile's kernel times joined with the program's ops

_GPU_MODULE = """HloModule g, is_scheduled=true

%fused_relu (param_0: bf16[6,4]) -> bf16[6,4] {
  %param_0 = bf16[6,4]{1,0} parameter(0)
  %zero = bf16[] constant(0)
  %zeros = bf16[6,4]{1,0} broadcast(%zero), dimensions={}
  ROOT %max = bf16[6,4]{1,0} maximum(%param_0, %zeros)
}

ENTRY %main (x: bf16[6,5], w: bf16[4,5]) -> bf16[6,4] {
  %x = bf16[6,5]{1,0} parameter(0)
  %w = bf16[4,5]{1,0} parameter(1)
  %custom-call.1 = (bf16[6,4]{1,0}, s8[1024]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/jvp(loss)/bcd,vd->bcv/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_batch_dimensions":[],"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],"rhs_contracting_dimensions":["1"]}}}
  %get-tuple-element.1 = bf16[6,4]{1,0} get-tuple-element(%custom-call.1), index=0
  ROOT %loop_maximum_fusion = bf16[6,4]{1,0} fusion(%get-tuple-element.1), kind=kLoop, calls=%fused_relu, metadata={op_name="jit(train_step)/jvp(Transformer)/decoder/layer_0/ffn/max"}
}
"""


def _profile_folder(tmp_path, kernels):
  """What train_throughput --profile_dir writes: the HLO and a Perfetto trace of (hlo_op, µs) device kernels."""
  (tmp_path / 'step.hlo.txt').write_text(_GPU_MODULE)
  trace = tmp_path / 'plugins' / 'profile' / '2026_01_01_00_00_00'
  trace.mkdir(parents=True)
  events = [{'ph': 'M', 'pid': 1, 'name': 'process_name', 'args': {'name': '/device:GPU:0'}},
            {'ph': 'M', 'pid': 7, 'name': 'process_name', 'args': {'name': '/host:CPU'}},
            {'ph': 'X', 'pid': 7, 'tid': 1, 'ts': 0, 'dur': 500.0, 'name': 'host work'}]
  events += [{'ph': 'X', 'pid': 1, 'tid': 14, 'ts': 0, 'dur': us, 'name': 'kernel',
              'args': {'hlo_module': 'jit_train_step', 'hlo_op': op}} for op, us in kernels]
  with gzip.open(trace / 'perfetto_trace.json.gz', 'wt') as f:
    json.dump({'traceEvents': events}, f)
  return str(tmp_path)


def test_a_cublas_matmul_is_costed_from_its_dot_dimensions():
  ops = {op.name: op for op in hlo_costs.op_costs(_GPU_MODULE)}
  gemm = ops['custom-call.1']
  assert not gemm.estimated and gemm.flops == 2 * 6 * 4 * 5  # [6, 5] × [4, 5]ᵀ
  assert ops['loop_maximum_fusion'].flops == 6 * 4


def test_step_profile_sums_each_parts_kernel_time_per_step(tmp_path):
  folder = _profile_folder(tmp_path, [('custom-call.1', 30.0), ('loop_maximum_fusion', 10.0), ('memcpy', 4.0),
                                      ('custom-call.1', 50.0), ('loop_maximum_fusion', 6.0)])
  parts = {r['part']: r for r in step_profile.profile_parts(folder, steps=2)}  # host events are not counted
  loss, ffn = parts['pre-softmax layer + loss'], parts['FFN']
  assert loss['ms_per_step'] == pytest.approx(0.040) and ffn['ms_per_step'] == pytest.approx(0.008)
  assert loss['flops'] == 2 * 6 * 4 * 5 and loss['kernel_ops'] == 1
  assert parts[step_profile.UNKNOWN]['ms_per_step'] == pytest.approx(0.002)  # kept, not dropped
  assert sum(r['share'] for r in parts.values()) == pytest.approx(1.0)
  # Beside each part, its ops' rooflines on the chip named: the matmul's 240 FLOPs at the H100's peak or its bytes
  # (operands, product and cuBLAS's 1 KiB workspace) at its bandwidth, whichever takes longer (the bytes); an op no
  # part holds has none.
  gemm_bytes = 2 * (6 * 5 + 4 * 5 + 6 * 4) + 1024
  assert loss['bound_ms'] == pytest.approx(1e3 * gemm_bytes / topologies.CHIPS['h100'].hbm_bandwidth)
  assert parts[step_profile.UNKNOWN]['bound_ms'] is None
  on_an_h200 = {r['part']: r for r in step_profile.profile_parts(folder, steps=2, chip='h200')}
  assert on_an_h200['pre-softmax layer + loss']['bound_ms'] < loss['bound_ms']  # 4.8 TB/s against 3.35


def test_step_profile_refuses_cuda_graph_traces_and_a_folder_without_its_hlo(tmp_path):
  folder = _profile_folder(tmp_path, [('command_buffer_1', 30.0)])
  with pytest.raises(SystemExit, match='xla_gpu_enable_command_buffer='):
    step_profile.profile_parts(folder, steps=1)
  (tmp_path / 'step.hlo.txt').unlink()
  with pytest.raises(SystemExit, match='step.hlo.txt: missing'):
    step_profile.profile_parts(folder, steps=1)


@pytest.mark.slow
def test_the_command_takes_and_checks_overrides_as_train_py_does(entry_points):
  """--config.KEY=VALUE, as every tool takes it: a key the config lacks, and a value train.py refuses, are one line
  each, before anything compiles."""
  command = ['-m', 'bench.step_costs', '--config=configs/wmt14_ende_base.py:runlocal']
  unknown = entry_points.run([*command, '--config.model.num_encoder_layer=1'], text=True)
  assert unknown.returncode == 1 and unknown.stderr.splitlines()[-1].startswith(
      'FATAL Flags parsing error: --config.model.num_encoder_layer: the config has no key model.num_encoder_layer; '
      'did you mean model.num_encoder_layers')
  refused = entry_points.run([*command, '--config.train.warmup_steps=100000'], text=True)
  assert refused.returncode == 1
  assert refused.stderr.splitlines()[-1] == ('error: train.warmup_steps=100000 > train.num_steps=200: lower the warmup '
                                             'or train longer.')
  assert not refused.stdout


def test_registers_are_read_for_a_gpu_program_only():
  config = step_costs.for_topology(config_lib.load('configs/wmt14_ende_base.py:runlocal'), 'v4-8', 'data')
  with pytest.raises(SystemExit, match='--registers reads the PTX of a GPU program: v4-8 is a TPU topology'):
    step_costs.measure(config, 'v4-8', registers=True)


@pytest.mark.slow
def test_every_pallas_kernel_of_a_gpu_step_fits_its_registers():
  """A one-layer step of big's width (d_model 1024, where the residual blocks' kernels once spilled: bench/RESULTS.md)
  with attention and ReLU dropout, compiled for an H100: ptxas reports each of our Pallas kernels, and no kernel
  spills registers to local memory."""
  config = step_costs.for_topology(config_lib.load('configs/wmt14_ende_base.py:runlocal', {
      'model.num_encoder_layers': 1, 'model.num_decoder_layers': 1, 'model.d_model': 1024, 'model.num_heads': 16,
      'model.attention_dropout': 0.1, 'model.relu_dropout': 0.1,
      'model.attention': 'flash_gpu'}), 'h100-1', 'data')  # what `auto` trains with; no cuDNN here
  found = step_costs.measure(config, 'h100-1', registers=True)['kernel_registers']
  kernels = {k['name']: k for k in found['kernels']}
  assert set(kernels) == {'attention_gpu_fwd', 'attention_gpu_dq', 'attention_gpu_dkv', 'residual_norm_fwd',
                          'residual_norm_bwd', 'loss_softmax_gradient'}  # Pallas kernels; a spilling one would join
  assert not [k for k in kernels.values() if k['stack'] or k['spill_stores'] or k['spill_loads']]
  assert all(k['pallas'] and 0 < k['registers'] <= 255 for k in kernels.values())
  assert found['other_kernels'] > 0 and 0 < found['other_most_registers'] <= 255


def test_registers_refuse_a_dump_without_ptx(tmp_path):
  (tmp_path / 'module_0001.jit_train_step.sm_9.0a_gpu_after_optimizations.txt').write_text('HloModule m')
  with pytest.raises(SystemExit, match=f'XLA wrote no PTX to {tmp_path}: --registers needs the CUDA 12 plugin'):
    kernel_registers.kernels(str(tmp_path), '', kernel_registers.ptxas())


def test_registers_refuse_ptx_that_ptxas_cannot_read_in_one_line(tmp_path):
  (tmp_path / 'module_0001.jit_f.1.ptx').write_text('.version 8.8\n.target sm_90a\n.visible .entry broken(\n')
  with pytest.raises(SystemExit, match=r'ptxas could not read module_0001\.jit_f\.1\.ptx \(.+\): install the nvcc'):
    kernel_registers.kernels(str(tmp_path), '', kernel_registers.ptxas())
