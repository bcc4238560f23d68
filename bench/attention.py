"""Attention implementations compared: forward+backward time and peak memory per sequence length.

For each length L the implementations of `transformer_jax.model.attention.attend` (by default 'reference',
'dot_product', 'chunked'; the flash kernels on their platform) get q, k, v of shape [batch, L, heads, d_k] with a
causal + padding mask (the last L/8 positions are padding; with `--packed=N` the rest holds N packed segments), and
we jit value_and_grad of sum(sin(attend(q, k, v))) w.r.t. q, k, v. The attention's settings are the model's keys,
changed as train.py takes them: `--config.model.num_heads` (8), `.d_k` (64), `.dtype` (float32),
`.attention_chunk_size` (512, `chunked`'s blocks) and `.attention_dropout` (0: none).

Peak memory is XLA's compiled memory analysis of that jitted function — temp buffers + arguments + outputs
(− aliased bytes): the buffer assignment's worst case, deterministic and independent of the machine and its
load (it is what XLA will allocate; it does not include the Python process or the runtime). Time is the
median of a few calls after a warm-up call, the implementations taking turns within each length.

Example (repository root):  python -m bench.attention --lengths=512,1024,2048,4096,8192
On a GPU, packed bf16 rows:
  python -m bench.attention --lengths=128,512,2048 --config.model.dtype=bfloat16 --packed=4 \
      --implementations=flash_gpu,dot_product
One attention call of the paper's base batch with attention dropout:
  python -m bench.attention --lengths=128 --batch=196 --config.model.dtype=bfloat16 \
      --config.model.attention_dropout=0.1 --implementations=flash_gpu
"""

import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bench import common
from transformer_jax import cli
from transformer_jax.config.model import ModelConfig
from transformer_jax.kernels import attention_masks
from transformer_jax.model import attention
from transformer_jax.runtime import sharding

IMPLEMENTATIONS = ('reference', 'dot_product', 'chunked')
# The model keys the attention reads, with the bench's defaults: what --config.model.KEY=VALUE may change.
SETTINGS = {'num_heads': 8, 'd_k': 64, 'dtype': 'float32', 'attention_chunk_size': 512, 'attention_dropout': 0.0}


def settings(changes: dict) -> ModelConfig:
  """The attention's settings with `changes` (model keys), checked as a model's: one line for a bad one."""
  values = {**SETTINGS, **changes}
  for name in ('num_heads', 'd_k'):
    if values[name] <= 0:
      raise ValueError(f'model.{name} must be positive, got {values[name]}.')
  return ModelConfig(d_model=values['num_heads'] * values['d_k'], d_v=values['d_k'], **values)


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


def main():
  """The command: its flags are defined here, when it runs (not when a test imports the module)."""
  config = cli.define_config_overrides_flag(ml_collections.ConfigDict({'model': SETTINGS}),
                                   "The attention's model keys, as train.py takes them: --config.model.KEY=VALUE.")
  lengths = flags.DEFINE_list('lengths', '512,1024,2048,4096,8192', 'Sequence lengths.')
  implementations = flags.DEFINE_list('implementations', ','.join(IMPLEMENTATIONS),
                                      f'Some of {sorted(attention.IMPLEMENTATIONS)}.')
  batch = flags.DEFINE_integer('batch', 1, 'Rows.', lower_bound=1)
  packed = flags.DEFINE_integer('packed', 0, 'Packed segments per row (0: one sequence per row).', lower_bound=0)
  repeats = flags.DEFINE_integer('repeats', 5, 'Timed calls per implementation (after one warm-up).', lower_bound=1)
  seconds_per_length = flags.DEFINE_float(
      'seconds_per_length', 60.0, 'Fewer repeats (at least 2) when the warm-up calls say a length would take longer.')
  max_run_gib = flags.DEFINE_float(
      'max_run_gib', 16.0, 'Report memory but do not run a compiled function whose peak exceeds this (GiB).')
  flags.register_validator('lengths', lambda values: values and all(x.isdigit() and int(x) > 0 for x in values),
                           message='give positive integers, comma-separated.')
  flags.register_validator('implementations', lambda names: names and set(names) <= set(attention.IMPLEMENTATIONS),
                           message=f'name some of {sorted(attention.IMPLEMENTATIONS)}, comma-separated.')

  def run(argv):
    if len(argv) > 1:
      raise app.UsageError(f'unexpected arguments {argv[1:]}; settings go in --config.model.KEY=VALUE.')
    model = settings(config.value.model.to_dict())
    measure(model, [int(x) for x in lengths.value], implementations.value, batch.value, packed.value,
            repeats.value, seconds_per_length.value, max_run_gib.value)

  cli.run(run)


def measure(model: ModelConfig, lengths: list[int], impls: list[str], batch: int, packed: int, repeats: int,
            seconds_per_length: float, max_run_gib: float):
  """Every length, the implementations taking turns: a JSON line per measurement, then a table."""
  heads, d_k, chunk_size, dropout_rate = model.num_heads, model.d_k, model.attention_chunk_size, model.attention_dropout
  info = common.machine()
  info.update(backend=jax.default_backend(), jax=jax.__version__)
  mask = 'causal+padding(L/8)' + (f'+{packed} segments' if packed else '')
  common.emit({'bench': 'attention', 'machine': info, 'batch': batch, 'heads': heads, 'd_k': d_k,
               'chunk_size': chunk_size, 'dtype': model.dtype, 'mask': mask, 'dropout_rate': dropout_rate})

  results = {}
  for length in lengths:
    q, k, v, spec = make_inputs(length, batch, heads, d_k, model.dtype, packed)
    compiled, memory, times, warm = {}, {}, {}, {}
    for impl in impls:
      start = time.perf_counter()
      compiled[impl] = forward_backward(impl, spec, chunk_size, dropout_rate).lower(q, k, v).compile()
      compile_s = time.perf_counter() - start
      memory[impl] = peak_bytes(compiled[impl])
      times[impl] = []
      if memory[impl]['peak'] > max_run_gib * 2 ** 30:
        warm[impl] = None
      else:
        warm[impl], _ = common.timed(compiled[impl], q, k, v)
      memory[impl]['compile_s'] = compile_s
    slowest = max([w for w in warm.values() if w is not None], default=0.0)
    rounds = max(2, min(repeats, int(seconds_per_length / max(slowest * len(impls), 1e-9))))
    for _ in range(rounds):  # the implementations take turns, so drifting machine load hits all alike
      for impl in impls:
        if warm[impl] is not None:
          times[impl].append(common.timed(compiled[impl], q, k, v)[0])
    flops = attention_flops(length, batch, heads, d_k)
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
