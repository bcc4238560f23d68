"""Per-op bytes and FLOPs of a compiled XLA program, read from its optimized HLO text (`step_parts` groups them by
the part of the model each op comes from).

XLA's `cost_analysis()` gives only totals, and counts a while loop's body once whatever its trip count. Here
every top-level op (a fusion, a custom call, a collective, a copy) is costed from its shapes: bytes = what it
reads (a fused parameter used only through slices reads only the slices) + what it writes (an in-place
dynamic-update-slice writes only its update); FLOPs = 2 per multiply-add of dots and convolutions plus one per
element of other arithmetic and of reductions' inputs, as XLA's HloCostAnalysis counts them. An op inside a loop
body counts its trip count times (`known_trip_count`, or read from the loop's condition, start and step). A custom call
(Pallas/Mosaic kernel) counts what its `cost_estimate` says. One without an estimate counts its operands and
results as bytes, and FLOPs only when it is an attention kernel whose matmuls its shapes give
(`ATTENTION_KERNELS`) or a GPU program's cuBLAS matmul (`library_gemm_flops`); such calls are marked
`estimated=False`.

One module of ~500 lines: the HLO text's parsing, each opcode's costs, fusions' reads and loops' trip counts are
one cost model over the same instruction records, read together when a count is checked against XLA's.
"""

import dataclasses
import json
import math
import re

_ARRAY_RE = re.compile(r'\b(pred|[sufc]\d+|bf16|f8e\w+)\[([\d,]*)\](\{[^}]*\})?')
_ITEM_BITS = {'pred': 8, 'bf16': 16}
_ON_CHIP_RE = re.compile(r'S\([1-9]\d*\)')  # a layout's memory space other than HBM's (0): CMEM, VMEM, SMEM
_INTEGER_RE = re.compile(r'^\(?[us]\d+\[')  # the type of an array of (un)signed integers


def _arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
  return [(dtype, tuple(int(d) for d in dims.split(',') if d)) for dtype, dims, _ in _ARRAY_RE.findall(type_text)]


def _bits(dtype: str) -> int:
  return _ITEM_BITS.get(dtype) or int(re.sub(r'\D', '', dtype.split('e')[0]) or 8)


def _sizes(type_text: str) -> list[tuple[int, bool]]:
  """For each array of an HLO type: its bytes, and whether its layout leaves it in HBM (no on-chip memory space)."""
  return [(math.prod(int(d) for d in dims.split(',') if d) * _bits(dtype) // 8, not _ON_CHIP_RE.search(layout))
          for dtype, dims, layout in _ARRAY_RE.findall(type_text)]


def _in_hbm(type_text: str) -> list[bool]:
  return [hbm for _, hbm in _sizes(type_text)]


def array_bytes(type_text: str) -> int:
  """Bytes of every array in an HLO type (a tuple's elements summed)."""
  return sum(n for n, _ in _sizes(type_text))


def _traffic(type_texts: list[str]) -> tuple[int, int]:
  """(bytes, of them in HBM) of every array in a list of HLO types."""
  sizes = [size for text in type_texts for size in _sizes(text)]
  return sum(n for n, _ in sizes), sum(n for n, hbm in sizes if hbm)


def _elements(type_text: str) -> int:
  return sum(math.prod(dims) for _, dims in _arrays(type_text))


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  type: str  # the result type as printed, e.g. 'bf16[24,256,512]{2,1,0}' or a tuple
  opcode: str
  operands: tuple[str, ...]  # operand names; a parameter's number is in `arguments`
  arguments: str  # the text between the opcode's parentheses
  attributes: str
  op_name: str  # metadata op_name ('' when absent)


_HEADER_RE = re.compile(r'^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$')
_INSTRUCTION_RE = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*')
_OP_NAME_RE = re.compile(r'op_name="([^"]*)"')
_NAME_RE = re.compile(r'%([\w.\-]+)')


def _balanced(text: str, start: int) -> int:
  """The index just past the bracket group opening at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] in '([{':
      depth += 1
    elif text[i] in ')]}':
      depth -= 1
      if depth == 0:
        return i + 1
  raise ValueError(f'unbalanced HLO text: {text[start:start + 80]!r}')


def _parse_instruction(line: str) -> Instruction | None:
  head = _INSTRUCTION_RE.match(line)
  if not head:
    return None
  rest = line[head.end():]
  if rest.startswith('('):
    end = _balanced(rest, 0)
  else:
    end = rest.index(' ')
    if '{' in rest[:end]:  # a layout: f32[2,3]{1,0:T(8,128)}
      end = _balanced(rest, rest.index('{'))
  type_text, rest = rest[:end], rest[end:].lstrip()
  paren = rest.index('(')
  close = _balanced(rest, paren)
  arguments, attributes = rest[paren + 1:close - 1], rest[close:]
  found = _OP_NAME_RE.search(attributes)
  return Instruction(head[1], type_text, rest[:paren], tuple(_NAME_RE.findall(arguments)), arguments, attributes,
                     found[1] if found else '')


def parse_module(hlo_text: str) -> tuple[dict[str, list[Instruction]], str]:
  """{computation name: its instructions} and the entry computation's name."""
  computations, entry, current = {}, None, None
  for line in hlo_text.splitlines():
    if not line.strip() or line.startswith('HloModule'):
      continue
    if not line[0].isspace() and line.rstrip().endswith('{'):
      header = _HEADER_RE.match(line)
      current = header[2]
      computations[current] = []
      if header[1]:
        entry = current
    elif line.strip() == '}':
      current = None
    elif current is not None:
      instruction = _parse_instruction(line)
      if instruction is not None:
        computations[current].append(instruction)
  return computations, entry


def _called(instruction: Instruction, key: str) -> str | None:
  found = re.search(key + r'=%([\w.\-]+)', instruction.attributes)
  return found[1] if found else None


_BRANCHES_RE = re.compile(r'branch_computations=\{([^}]*)\}')
_TRIP_RE = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_COST_RE = re.compile(r'\\?"cost_estimate\\?":\s*(\{[^}]*\})')  # in a JSON string, its quotes may be escaped
_TARGET_RE = re.compile(r'custom_call_target="([^"]*)"')
_ALIASED_RE = re.compile(r'output_to_operand_aliasing=\{\{\}: \((\d+),')  # a lone result's operand

# Ops that move no data of their own (views, tuples, control) or whose called computations are costed instead.
_FREE = {'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast', 'after-all', 'partition-id',
         'replica-id', 'while', 'conditional', 'call', 'opt-barrier', 'add-dependency', 'domain'}
_TRANSCENDENTAL = {'exponential', 'exponential-minus-one', 'log', 'log-plus-one', 'tanh', 'logistic', 'sqrt',
                   'rsqrt', 'cbrt', 'power', 'sine', 'cosine', 'tan', 'atan2', 'erf'}
_ELEMENTWISE = {'add', 'subtract', 'multiply', 'divide', 'maximum', 'minimum', 'negate', 'abs', 'compare',
                'select', 'and', 'or', 'xor', 'not', 'remainder', 'sign', 'floor', 'ceil', 'round-nearest-even',
                'round-nearest-afz', 'clamp', 'is-finite', 'shift-left', 'shift-right-logical',
                'shift-right-arithmetic', 'popcnt', 'count-leading-zeros'}
_SLICES = {'dynamic-slice', 'slice', 'gather'}
COLLECTIVES = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all', 'collective-permute')


@dataclasses.dataclass(frozen=True)
class OpCost:
  """One top-level op of the program: bytes and FLOPs per execution, and executions per program run."""

  name: str
  opcode: str
  op_name: str  # the op's metadata op_name (a fusion's is its root's)
  bytes: float
  flops: float
  transcendentals: float
  count: int  # executions per run: the product of the enclosing loops' trip counts
  target: str = ''  # a custom call's target
  estimated: bool = True  # False: a custom call without a cost estimate (FLOPs only for ATTENTION_KERNELS, GEMMs)
  borrowed: bool = False  # True: no op_name of its own; the one of the op it feeds (or that feeds it)
  hbm_bytes: float = 0.0  # of `bytes`, those read from or written to HBM (not an on-chip memory space)
  asynchronous: bool = False  # True: the end ('-done') of a copy or collective that runs beside other ops
  integer_ops: float = 0.0  # of `flops`, element-wise ops on integers (random bits): vector-unit work, not matmuls

  @property
  def total_bytes(self) -> float:
    return self.bytes * self.count

  @property
  def total_flops(self) -> float:
    return self.flops * self.count

  @property
  def total_hbm_bytes(self) -> float:
    return self.hbm_bytes * self.count

  @property
  def total_integer_ops(self) -> float:
    return self.integer_ops * self.count


# Attention kernels that carry no cost estimate (jax's splash-attention kernels, `kernels/tpu/flash_attention.py`), by
# the prefix of their instruction's name: FLOPs per batch row × head × query × key × head dim, 2 per multiply-add of
# their matmuls (forward q·kᵀ and p·v; the backward's dq kernel recomputes q·kᵀ and forms do·vᵀ and ds·k, its dkv
# kernel q·kᵀ, do·vᵀ, pᵀ·do and dsᵀ·q), every block counted, masked or not, as jax's flash kernel's forward
# estimate counts them, and whether the kernel belongs to the backward pass. A dkv kernel that also returns dq
# (the fused backward pass: one part per key block, a result of one rank more than q) forms ds·k too:
# `FUSED_DQ_FACTOR` more. The TPU compiler leaves these
# calls no op_name of their own: they take their instruction's name as one, so that the memory moves around them
# count with them.
ATTENTION_KERNELS = {'splash_mha_fwd': (4, False), 'splash_mha_dq': (6, True), 'splash_mha_dkv': (8, True)}
FUSED_DQ_FACTOR = 2
# `flash_gpu`'s Triton kernels: a Triton call keeps no cost estimate, and has a name of its own only in its
# op_name ('.../attention_gpu_fwd/pallas_call'); q and k are its first two operands of rank 4, [batch, length,
# heads, head dim], or 5, a stack of projections with a slot axis before the heads (`_places` of
# `kernels/gpu/flash_attention.py`). The same factors, every block counted.
GPU_ATTENTION_KERNELS = {'attention_gpu_fwd': 4, 'attention_gpu_dq': 6, 'attention_gpu_dkv': 8}
# Of a result that is such a stack, the slots each kernel writes (dq: the queries'; dkv: the keys' and values',
# into the array dq's kernel wrote, which it takes as an operand it does not read).
GPU_KERNEL_SLOTS_WRITTEN = {'attention_gpu_dq': 1, 'attention_gpu_dkv': 2}


def _gpu_kernel(op_name: str) -> str | None:
  return next((kernel for kernel in GPU_ATTENTION_KERNELS if f'/{kernel}/' in op_name), None)


def _gpu_kernel_traffic(instruction: Instruction, types: dict[str, str]) -> tuple[float, float, float, float]:
  """(read, of it HBM, written, of it HBM) of a `GPU_ATTENTION_KERNELS` call: each distinct operand read once
  (a stack is passed once per slot it holds), the operand its result aliases not at all, and of a stacked result
  only the slots `GPU_KERNEL_SLOTS_WRITTEN` says."""
  aliased = _ALIASED_RE.search(instruction.attributes)
  skip = int(aliased[1]) if aliased else -1
  operands = dict.fromkeys(o for j, o in enumerate(instruction.operands) if j != skip)
  read, hbm_read = _traffic([types.get(o, '') for o in operands])
  written = hbm_written = 0.0
  for (_, dims), (size, in_hbm) in zip(_arrays(instruction.type), _sizes(instruction.type)):
    share = GPU_KERNEL_SLOTS_WRITTEN[_gpu_kernel(instruction.op_name)] / dims[2] if len(dims) == 5 else 1.0
    written, hbm_written = written + size * share, hbm_written + size * share * in_hbm
  return read, hbm_read, written, hbm_written


def attention_kernel(name: str) -> tuple[int, bool]:
  """(FLOPs factor, backward) of the `ATTENTION_KERNELS` entry `name` starts with; (0, False) for none."""
  return next((kernel for prefix, kernel in ATTENTION_KERNELS.items() if name.startswith(prefix)), (0, False))


def attention_kernel_flops(name: str, operand_types: list[str], result_type: str, op_name: str = '') -> float:
  """The matmul FLOPs of an `ATTENTION_KERNELS` call from its operands' and result's shapes, or of a
  `GPU_ATTENTION_KERNELS` call (by its `op_name`); 0 for any other custom call."""
  factor, _ = attention_kernel(name)
  gpu_factor = GPU_ATTENTION_KERNELS.get(_gpu_kernel(op_name), 0)
  if not factor and not gpu_factor:
    return 0.0
  if gpu_factor:
    q, k = [dims for t in operand_types for _, dims in _arrays(t) if len(dims) in (4, 5)][:2]
    (batch, q_len, heads, head_dim), k_len = (q[0], q[1], q[-2], q[-1]), k[1]
    return float(gpu_factor * batch * heads * q_len * k_len * head_dim)
  # q and k: the first two floating-point operands of the highest rank, [batch, heads, length, head dim]; with
  # one row per chip the kernel gets them without the batch axis (the integer operands are the mask's block
  # tables and segment ids, the lower-rank floats softmax statistics).
  floats = [dims for t in operand_types for dtype, dims in _arrays(t) if 'f' in dtype]
  q, k = [dims for dims in floats if len(dims) == max(map(len, floats))][:2]
  if name.startswith('splash_mha_dkv') and any(len(dims) == len(q) + 1 for _, dims in _arrays(result_type)):
    factor += FUSED_DQ_FACTOR
  (heads, q_len, head_dim), k_len = q[-3:], k[-2]
  return float(factor * math.prod(q[:-3]) * heads * q_len * k_len * head_dim)


_GEMM_CONTRACTING_RE = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')


def library_gemm_flops(target: str, attributes: str, operand_types: list[str], result_type: str) -> float:
  """The FLOPs of a GPU program's cuBLAS matmul call (2 × output elements × contracted size, from its backend
  config's dot dimensions); 0 for any other custom call."""
  dims = _GEMM_CONTRACTING_RE.search(attributes)
  if not target.startswith('__cublas') or not dims:
    return 0.0
  lhs = _arrays(operand_types[0])[0][1]
  contracted = math.prod(lhs[int(d.strip(' "'))] for d in dims[1].split(',') if d.strip())
  output = _arrays(result_type)[0][1]  # a tuple's first element; the second is cuBLAS's workspace
  return 2.0 * math.prod(output) * contracted


def _contraction(instruction: Instruction, types: dict[str, str]) -> float:
  """Multiply-adds per output element of a dot or convolution."""
  if instruction.opcode == 'dot':
    lhs = _arrays(types[instruction.operands[0]])[0][1]
    dims = re.search(r'lhs_contracting_dims=\{([\d,]*)\}', instruction.attributes)
    return math.prod(lhs[int(d)] for d in dims[1].split(',') if d) if dims else 1
  lhs, rhs = (_arrays(types[o])[0][1] for o in instruction.operands[:2])
  lhs_labels, rhs_labels, out_labels = re.search(r'dim_labels=(\w+)_(\w+)->(\w+)', instruction.attributes).groups()
  out = _arrays(instruction.type)[0][1]
  features = math.prod(n for label, n in zip(rhs_labels, rhs) if label == 'i')
  window = re.search(r'window=\{([^}]*)\}', instruction.attributes)
  if not window:
    return features
  fields = dict(field.split('=') for field in window[1].split())
  per_dim = lambda key, default: [int(n) for n in fields[key].split('x')] if key in fields else default
  sizes = per_dim('size', [])
  ones = [1] * len(sizes)
  strides, lhs_dilate, rhs_dilate = per_dim('stride', ones), per_dim('lhs_dilate', ones), per_dim('rhs_dilate', ones)
  pads = [int(p.split('_')[0]) for p in fields['pad'].split('x')] if 'pad' in fields else [0] * len(sizes)
  # Batch dimensions of a dot often become padded or dilated spatial ones: count only the taps of each window
  # that meet an input element (not padding, not a hole of the dilation), per output element on average.
  taps = 1.0
  for k, size in enumerate(sizes):
    n, out_n = lhs[lhs_labels.index(str(k))], out[out_labels.index(str(k))]
    valid = sum(1 for o in range(out_n) for t in range(size)
                if (p := o * strides[k] + t * rhs_dilate[k] - pads[k]) >= 0 and p <= (n - 1) * lhs_dilate[k]
                and p % lhs_dilate[k] == 0)
    taps *= valid / out_n
  return features * taps


def _flops(computation: list[Instruction], computations: dict) -> tuple[float, float, float]:
  """(FLOPs, transcendentals, of the FLOPs the element-wise ops on integers) of one evaluation of a computation
  (fusions inside it included)."""
  types = {i.name: i.type for i in computation}
  flops = transcendentals = integer = 0.0
  for i in computation:
    if i.opcode in ('dot', 'convolution'):
      flops += 2.0 * _elements(i.type) * _contraction(i, types)
    elif i.opcode in _TRANSCENDENTAL:
      transcendentals += _elements(i.type)
    elif i.opcode in _ELEMENTWISE:
      flops += _elements(i.type)
      integer += _elements(i.type) if _INTEGER_RE.match(i.type) else 0
    elif i.opcode in ('reduce', 'reduce-window'):
      reducer = computations.get(_called(i, 'to_apply'), [])
      per_element = sum(1 for r in reducer if r.opcode in _ELEMENTWISE) or 1
      flops += per_element * sum(_elements(types[o]) for o in i.operands[:len(i.operands) // 2])
    elif i.opcode == 'fusion':
      inner = _flops(computations[_called(i, 'calls')], computations)
      flops, transcendentals, integer = flops + inner[0], transcendentals + inner[1], integer + inner[2]
  return flops, transcendentals, integer


def _fusion_reads(fused: list[Instruction], operand_types: list[str]) -> tuple[float, float]:
  """(bytes, of them from HBM) a fusion reads: each parameter whole, or only the slices taken of it where slicing
  is its only use, or nothing where it is only the buffer a dynamic-update-slice writes into in place."""
  users = {}
  for i in fused:
    for operand in i.operands:
      users.setdefault(operand, []).append(i)
  total = hbm = 0.0
  for i in fused:
    if i.opcode != 'parameter':
      continue
    whole, hbm_whole = _traffic([operand_types[int(i.arguments)]])
    uses = users.get(i.name, [])
    if uses and all(u.opcode == 'dynamic-update-slice' and u.operands[0] == i.name for u in uses):
      continue
    if uses and all(u.opcode in _SLICES and u.operands[0] == i.name for u in uses):
      sliced = sum(array_bytes(u.type) for u in uses)
      total += min(whole, sliced)
      hbm += min(hbm_whole, sliced)
    else:
      total += whole
      hbm += hbm_whole
  return total, hbm


def _written(root: Instruction, by_name: dict[str, Instruction]) -> list[int]:
  """Bytes a fusion writes per array of its result: the whole array, but only the update of a
  dynamic-update-slice (an in-place write into its buffer)."""
  if root.opcode == 'tuple':
    return [n for o in root.operands for n in (_written(by_name[o], by_name) if o in by_name else [0])]
  if root.opcode == 'dynamic-update-slice' and root.operands[1] in by_name:
    return [array_bytes(by_name[root.operands[1]].type)]
  return [array_bytes(root.type)]


def _borrowed_names(body: list[Instruction]) -> dict[str, str]:
  """For each op without op_name metadata (the compiler's memory moves and layout copies), the op_name of the
  nearest op it feeds that has one, else of the nearest op feeding it."""
  users = {}
  for i in body:
    for operand in i.operands:
      users.setdefault(operand, []).append(i.name)
  by_name = {i.name: i for i in body}
  borrowed = {}
  for i in body:
    if i.op_name:
      continue
    for neighbours in (lambda n: users.get(n, []), lambda n: by_name[n].operands if n in by_name else ()):
      frontier, seen = [i.name], {i.name}
      while frontier and i.name not in borrowed:
        frontier = [n for f in frontier for n in neighbours(f) if n not in seen and not seen.add(n)]
        named = [by_name[n].op_name for n in frontier if n in by_name and by_name[n].op_name]
        if named:
          borrowed[i.name] = named[0]
  return borrowed


def _through_copies(name: str, by_name: dict[str, Instruction]) -> Instruction | None:
  """The instruction `name` copies or bitcasts (the TPU compiler copies a loop's counter between memory spaces)."""
  i = by_name.get(name)
  while i is not None and i.opcode in ('copy', 'bitcast') and i.operands:
    i = by_name.get(i.operands[0])
  return i


def _constant_value(name: str, by_name: dict[str, Instruction]) -> int | None:
  """The integer an instruction holds when it is a scalar constant, seen through copies and bitcasts."""
  i = _through_copies(name, by_name)
  if i is None or i.opcode != 'constant':
    return None
  try:
    return int(i.arguments)
  except ValueError:
    return None


def _trip_count(loop: Instruction, by_name: dict[str, Instruction], computations: dict) -> int:
  """How often a while loop's body runs: its backend config's `known_trip_count` (a GPU program's), else read
  from the loop (the TPU compiler keeps no trip count): a condition `counter < N`, the counter's constant start,
  and the constant its body adds each run (XLA's windowed matmuls count up by two); 1 when they do not say."""
  known = _TRIP_RE.search(loop.attributes)
  if known:
    return int(known[1])
  condition = computations.get(_called(loop, 'condition'), [])
  cond_by_name = {i.name: i for i in condition}
  root = condition[-1] if condition else None
  if root is None or root.opcode != 'compare' or 'direction=LT' not in root.attributes or len(root.operands) != 2:
    return 1
  counter = _through_copies(root.operands[0], cond_by_name)
  limit = _constant_value(root.operands[1], cond_by_name)
  if counter is None or counter.opcode != 'get-tuple-element' or limit is None:
    return 1
  index = int(re.search(r'index=(\d+)', counter.attributes)[1])
  init = by_name.get(loop.operands[0]) if loop.operands else None
  start = (_constant_value(init.operands[index], by_name)
           if init is not None and init.opcode == 'tuple' and index < len(init.operands) else None)
  body = computations.get(_called(loop, 'body'), [])
  body_by_name = {i.name: i for i in body}
  root = body[-1] if body else None
  update = (body_by_name.get(root.operands[index])
            if root is not None and root.opcode == 'tuple' and index < len(root.operands) else None)
  step = None
  if update is not None and update.opcode == 'add' and len(update.operands) == 2:
    counters = [_through_copies(o, body_by_name) for o in update.operands]
    for counted, other in ((0, 1), (1, 0)):
      c = counters[counted]
      if c is not None and c.opcode == 'get-tuple-element' and re.search(rf'index={index}\b', c.attributes):
        step = _constant_value(update.operands[other], body_by_name)
  if start is None or not step or step < 0:
    return 1
  return max(-(-(limit - start) // step), 0)


def op_costs(hlo_text: str) -> list[OpCost]:
  """Every top-level op of a compiled module with its costs (fusion bodies are costed inside their fusion)."""
  computations, entry = parse_module(hlo_text)
  costs = []

  def visit(name: str, count: int):
    body = [dataclasses.replace(i, op_name=i.name) if i.opcode == 'custom-call' and not i.op_name
            and attention_kernel(i.name)[0] else i for i in computations[name]]
    types = {i.name: i.type for i in body}
    by_name = {i.name: i for i in body}
    borrowed = _borrowed_names(body)
    for i in body:
      if i.name in borrowed:
        i = dataclasses.replace(i, op_name=borrowed[i.name])
        moves.add(i.name)
      if i.opcode == 'while':
        n = _trip_count(i, by_name, computations)
        visit(_called(i, 'body'), count * n)
        visit(_called(i, 'condition'), count * (n + 1))
        continue
      if i.opcode == 'conditional':
        for branch in _NAME_RE.findall(_BRANCHES_RE.search(i.attributes)[1]):
          visit(branch, count)  # an upper bound: every branch counted
        continue
      if i.opcode == 'call':
        visit(_called(i, 'to_apply'), count)
        continue
      if i.opcode in _FREE or i.opcode.endswith('-start'):  # an asynchronous op is costed at its '-done'
        continue
      operand_types = [types.get(o, '') for o in i.operands]
      written, hbm_written = _traffic([i.type])
      read, hbm_read = _traffic(operand_types)
      if i.opcode == 'fusion':
        fused = computations[_called(i, 'calls')]
        flops, transcendentals, integer = _flops(fused, computations)
        per_array = _written(fused[-1], {f.name: f for f in fused})  # the ROOT: the last line printed
        written = sum(per_array)
        hbm_written = sum(n for n, hbm in zip(per_array, _in_hbm(i.type)) if hbm)
        read, hbm_read = _fusion_reads(fused, operand_types)
        costs.append(OpCost(i.name, 'fusion', i.op_name, read + written, flops, transcendentals, count,
                            hbm_bytes=hbm_read + hbm_written, integer_ops=integer))
      elif i.opcode == 'custom-call':
        estimate = _COST_RE.search(i.attributes)
        target = _TARGET_RE.search(i.attributes)
        if estimate:  # its bytes split between HBM and on-chip memory as its operands and result are
          e = json.loads(estimate[1].replace('\\"', '"'))
          hbm_share = (hbm_read + hbm_written) / max(read + written, 1)
          estimated_bytes = float(e.get('bytes_accessed', 0))
          costs.append(OpCost(i.name, i.opcode, i.op_name, estimated_bytes, float(e.get('flops', 0)),
                              float(e.get('transcendentals', 0)), count, target[1] if target else '',
                              hbm_bytes=estimated_bytes * hbm_share))
        else:
          target = target[1] if target else ''
          flops = (attention_kernel_flops(i.name, operand_types, i.type, i.op_name)
                   or library_gemm_flops(target, i.attributes, operand_types, i.type))
          if _gpu_kernel(i.op_name):
            read, hbm_read, written, hbm_written = _gpu_kernel_traffic(i, types)
          costs.append(OpCost(i.name, i.opcode, i.op_name, read + written, flops, 0.0, count, target,
                              estimated=False, hbm_bytes=hbm_read + hbm_written))
      elif i.opcode.endswith('-done'):  # the end of an asynchronous copy or collective: its result written once,
        # read from where its start's operand is
        start = by_name.get(i.operands[0]) if i.operands else None
        source = types.get(start.operands[0], '') if start is not None and start.operands else i.type
        costs.append(OpCost(i.name, i.opcode.removesuffix('-done'), i.op_name, 2 * written, 0.0, 0.0, count,
                            hbm_bytes=hbm_written + (written if all(_in_hbm(source)) else 0), asynchronous=True))
      else:
        flops, transcendentals, integer = _flops([*(Instruction(o, t, 'parameter', (), '', '', '')
                                                    for o, t in zip(i.operands, operand_types)), i], computations)
        costs.append(OpCost(i.name, i.opcode, i.op_name, read + written, flops, transcendentals, count,
                            hbm_bytes=hbm_read + hbm_written, integer_ops=integer))
  moves = set()
  visit(entry, 1)
  return [dataclasses.replace(c, borrowed=True) if c.name in moves else c for c in costs]
