"""Attention implementations compared: forward+backward time and peak memory per sequence length.

For each length L the implementations of `transformer_jax.model.attention.attend` (by default 'reference',
'dot_product', 'chunked'; the flash kernels on their platform) get q, k, v of shape [batch, L, heads, d_k]
(`--dtype`) with a causal + padding mask (the last L/8 positions are padding; with `--packed=N` the rest holds
N packed segments), and we jit value_and_grad of sum(sin(attend(q, k, v))) w.r.t. q, k, v, with attention
dropout at `--dropout_rate` (0: none).

Peak memory is XLA's compiled memory analysis of that jitted function — temp buffers + arguments + outputs
(− aliased bytes): the buffer assignment's worst case, deterministic and independent of the machine and its
load (it is what XLA will allocate; it does not include the Python process or the runtime). Time is the
median of a few calls after a warm-up call, the implementations taking turns within each length.

Example (repository root):  python -m bench.attention --lengths=512,1024,2048,4096,8192
On a GPU, packed bf16 rows:
  python -m bench.attention --lengths=128,512,2048 --dtype=bfloat16 --packed=4 --implementations=flash_gpu,dot_product
One attention call of the paper's base batch with attention dropout:
  python -m bench.attention --lengths=128 --batch=196 --dtype=bfloat16 --dropout_rate=0.1 --implementations=flash_gpu
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench import common
from transformer_jax.config.model import ModelConfig
from transformer_jax.kernels import attention_masks
from transformer_jax.model import attention
from transformer_jax.runtime import sharding

IMPLEMENTATIONS = ('reference', 'dot_product', 'chunked')


def make_inputs(length, batch, heads, d_k, dtype='float32', packed=0, seed=0):
  """q, k, v and a causal mask: the last L/8 positions padding, the rest one row or `packed` equal segments."""
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=(batch, length, heads, d_k)), dtype) for _ in range(3))
  real = length - length // 8
  valid = jnp.broadcast_to(jnp.arange(length)[None] < real, (batch, length))
  segment = None
  if packed:
    per_segment = max(1, real // packed)
    segment = jnp.broadcast_to(jnp.where(valid[0], jnp.minimum(jnp.arange(length) // per_segment, packed - 1) + 1, 0),
                               (batch, length)).astype(jnp.int32)
  return q, k, v, attention_masks.MaskSpec.self_attention(valid, segment, causal=True)


def kernels_for(implementation: str):
  """The kernels of a model with `model.attention=implementation` on this machine's devices."""
  return ModelConfig(attention=implementation, platform=sharding.devices_platform(jax.devices())).kernels


def forward_backward(implementation, spec, chunk_size, dropout_rate=0.0):
  def loss(q, k, v):
    out = attention.attend(q, k, v, spec, kernels=kernels_for(implementation), chunk_size=chunk_size,
                           dropout_rate=dropout_rate, dropout_rng=jax.random.key(0) if dropout_rate else None)
    return jnp.sum(jnp.sin(out))

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def peak_bytes(compiled) -> dict:
  m = compiled.memory_analysis()
  parts = {'temp': m.temp_size_in_bytes, 'argument': m.argument_size_in_bytes, 'output': m.output_size_in_bytes,
           'alias': m.alias_size_in_bytes}
  parts['peak'] = parts['temp'] + parts['argument'] + parts['output'] - parts['alias']
  return parts


def attention_flops(length, batch, heads, d_k):
  """Matmul FLOPs of forward+backward over the full L×L square: QK^T and PV forward, four products backward."""
  return 6 * 2.0 * batch * heads * length * length * d_k


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--lengths', default='512,1024,2048,4096,8192', help='comma-separated sequence lengths')
  p.add_argument('--implementations', default=','.join(IMPLEMENTATIONS))
  p.add_argument('--batch', type=int, default=1)
  p.add_argument('--heads', type=int, default=8)
  p.add_argument('--d_k', type=int, default=64)
  p.add_argument('--chunk_size', type=int, default=512)
  p.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32')
  p.add_argument('--dropout_rate', type=float, default=0.0, help='attention dropout (0: none)')
  p.add_argument('--packed', type=int, default=0, help='packed segments per row (0: one sequence per row)')
  p.add_argument('--repeats', type=int, default=5, help='timed calls per implementation (after one warm-up)')
  p.add_argument('--seconds_per_length', type=float, default=60.0,
                 help='fewer repeats (at least 2) when the warm-up calls say a length would take longer')
  p.add_argument('--max_run_gib', type=float, default=16.0,
                 help='report memory but do not run a compiled function whose peak exceeds this (GiB)')
  args = p.parse_args(argv)
  if not 0.0 <= args.dropout_rate < 1.0:
    p.error(f'--dropout_rate={args.dropout_rate}: give a rate in [0, 1)')
  impls = [x for x in args.implementations.split(',') if x]
  unknown = [x for x in impls if x not in attention.IMPLEMENTATIONS]
  if unknown:
    p.error(f'unknown implementations {unknown}: choose from {sorted(attention.IMPLEMENTATIONS)}')
  info = common.machine()
  info.update(backend=jax.default_backend(), jax=jax.__version__)
  mask = 'causal+padding(L/8)' + (f'+{args.packed} segments' if args.packed else '')
  common.emit({'bench': 'attention', 'machine': info, 'batch': args.batch, 'heads': args.heads, 'd_k': args.d_k,
               'chunk_size': args.chunk_size, 'dtype': args.dtype, 'mask': mask, 'dropout_rate': args.dropout_rate})

  results = {}
  for length in common.parse_ints(args.lengths):
    q, k, v, spec = make_inputs(length, args.batch, args.heads, args.d_k, args.dtype, args.packed)
    compiled, memory, times, warm = {}, {}, {}, {}
    for impl in impls:
      start = time.perf_counter()
      compiled[impl] = forward_backward(impl, spec, args.chunk_size, args.dropout_rate).lower(q, k, v).compile()
      compile_s = time.perf_counter() - start
      memory[impl] = peak_bytes(compiled[impl])
      times[impl] = []
      if memory[impl]['peak'] > args.max_run_gib * 2 ** 30:
        warm[impl] = None
      else:
        warm[impl], _ = common.timed(compiled[impl], q, k, v)
      memory[impl]['compile_s'] = compile_s
    slowest = max([w for w in warm.values() if w is not None], default=0.0)
    repeats = max(2, min(args.repeats, int(args.seconds_per_length / max(slowest * len(impls), 1e-9))))
    for _ in range(repeats):  # the implementations take turns, so drifting machine load hits all alike
      for impl in impls:
        if warm[impl] is not None:
          times[impl].append(common.timed(compiled[impl], q, k, v)[0])
    flops = attention_flops(length, args.batch, args.heads, args.d_k)
    for impl in impls:
      t = common.median(times[impl])
      mem = memory[impl]
      record = {'length': length, 'implementation': impl, 'time_s': t, 'times_s': times[impl],
                'repeats': len(times[impl]), 'gflops_per_s': flops / t / 1e9 if times[impl] else None,
                'peak_bytes': mem['peak'], 'temp_bytes': mem['temp'], 'argument_bytes': mem['argument'],
                'output_bytes': mem['output'], 'alias_bytes': mem['alias'], 'compile_s': mem['compile_s'],
                'ran': warm[impl] is not None}
      results[(length, impl)] = record
      common.emit(record)
    del compiled

  lengths = common.parse_ints(args.lengths)
  header = ['length'] + [f'{i} ms' for i in impls] + [f'{i} peak MiB' for i in impls]
  if 'reference' in impls and 'chunked' in impls:
    header.append('chunked / reference memory')
  rows = []
  for length in lengths:
    row = [length] + [results[(length, i)]['time_s'] * 1e3 for i in impls]
    row += [results[(length, i)]['peak_bytes'] / 2 ** 20 for i in impls]
    if 'reference' in impls and 'chunked' in impls:
      row.append(results[(length, 'chunked')]['peak_bytes'] / results[(length, 'reference')]['peak_bytes'])
    rows.append(row)
  print()
  print(common.markdown_table(header, rows))


if __name__ == '__main__':
  main()
