"""The part of the model each op of a compiled step comes from (read from its `op_name` metadata: the Flax module
path, the attention einsums, and the steps' `loss` and `optimizer` scopes), the ops' costs summed by part, and the
roofline op by op."""

import dataclasses
import re
from collections.abc import Callable

from transformer_jax.compile import hlo_costs

PARTS = ('embeddings', 'attention: scores', 'attention: mask', 'attention: softmax', 'attention: weighted sum',
         'attention: kernels (custom calls)', 'attention projections', 'FFN', 'layer norm + dropout + residual',
         'pre-softmax layer + loss', 'optimizer update', 'collectives', 'other (no model scope)')
_SCORES, _WEIGHTED_SUM = 'bqhd,bkhd->bhqk', 'bhqk,bkhd->bqhd'  # attention.reference_attention's einsums
_MASK_PRIMITIVES = ('select_n', 'and', 'eq', 'ne', 'le', 'lt', 'ge', 'gt', 'iota', 'any', 'reduce_or')
_PROJECTIONS = ('/query/', '/key/', '/value/', '/out/', '/key_value/', '/key_value_query/')  # fused on a GPU


def part_of(op: hlo_costs.OpCost) -> str:
  """The model part an op comes from, read from its op_name (Flax module path and the steps' named scopes)."""
  name = op.op_name
  if op.opcode in hlo_costs.COLLECTIVES:
    return 'collectives'
  if hlo_costs.attention_kernel(name)[0]:
    return 'attention: kernels (custom calls)'
  if '/optimizer/' in name:
    return 'optimizer update'
  if re.search(r'[/(]loss[)/]|/decoder/logits/|\.attend/|/decoder/[^/]*->|/decoder/dot_general', name):
    return 'pre-softmax layer + loss'
  if '/embedder/' in name:
    return 'embeddings'
  if re.search(r'attention/', name):
    if any(p in name for p in _PROJECTIONS):
      return 'attention projections'
    if op.opcode == 'custom-call' and not op.borrowed or name.endswith('/pallas_call'):  # a kernel, or its moves
      return 'attention: kernels (custom calls)'
    if _SCORES in name:
      return 'attention: scores'
    if _WEIGHTED_SUM in name:
      return 'attention: weighted sum'
    primitive = name.rsplit('/', 1)[-1]
    return 'attention: mask' if primitive in _MASK_PRIMITIVES or '/jit(_where)' in name else 'attention: softmax'
  if '/ffn/' in name:
    return 'FFN'
  if '_block/' in name or '/final_norm/' in name:
    return 'layer norm + dropout + residual'
  return 'other (no model scope)'


def is_backward(op: hlo_costs.OpCost) -> bool:
  return 'transpose(' in op.op_name or hlo_costs.attention_kernel(op.op_name)[1]


def serial_seconds(costs: list[hlo_costs.OpCost], peak_flops: float, hbm_bandwidth: float) -> float:
  """The ops' time run one after another, each at max(its FLOPs / peak, its HBM bytes / bandwidth), asynchronous
  copies and collectives beside them: the roofline op by op. The whole program's roofline lets any op's FLOPs hide
  any other's bytes, so it cannot see a change that trades bytes for FLOPs within compute-bound ops; this can."""
  return sum(serial_seconds_by_part(costs, peak_flops, hbm_bandwidth, lambda op: '').values())


def serial_seconds_by_part(costs: list[hlo_costs.OpCost], peak_flops: float, hbm_bandwidth: float,
                           part: Callable[[hlo_costs.OpCost], str] = part_of) -> dict[str, float]:
  """`serial_seconds` of each part's ops, in one pass."""
  seconds = {}
  for op in costs:
    if not op.asynchronous:
      name = part(op)
      seconds[name] = seconds.get(name, 0.0) + op.count * max(op.flops / peak_flops, op.hbm_bytes / hbm_bandwidth)
  return seconds


@dataclasses.dataclass(frozen=True)
class Part:
  name: str
  bytes: float
  flops: float
  backward_bytes: float
  backward_flops: float
  borrowed_bytes: float  # of ops without op_name of their own (memory moves, layout copies): see `hlo_costs.op_costs`
  ops: int
  hbm_bytes: float  # read from or written to HBM; the rest stays in on-chip memory (a TPU's CMEM or VMEM)
  integer_ops: float  # of the FLOPs, element-wise ops on integers (`hlo_costs.OpCost.integer_ops`)


def breakdown(costs: list[hlo_costs.OpCost], part: Callable[[hlo_costs.OpCost], str] = part_of) -> list[Part]:
  """Per-part sums of the ops' bytes and FLOPs (loop trip counts included), in `PARTS` order."""
  sums = {}
  for op in costs:
    name = part(op)
    b, f, bb, bf, mb, n, hb, io = sums.get(name, (0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0.0))
    back = is_backward(op)
    sums[name] = (b + op.total_bytes, f + op.total_flops, bb + back * op.total_bytes, bf + back * op.total_flops,
                  mb + op.borrowed * op.total_bytes, n + 1, hb + op.total_hbm_bytes, io + op.total_integer_ops)
  order = {name: i for i, name in enumerate(PARTS)}
  return [Part(name, *values) for name, values in sorted(sums.items(), key=lambda kv: order.get(kv[0], len(order)))]
