"""Hashes of the programs a run compiles, lowered (StableHLO, no debug info) for the fits rows' TPU slices and GPU
hosts, one H100 and this machine's CPU: the check that a refactor left every compiled program as it was.

Equal lowered programs compile to equal executables, so equal hashes before and after a change mean every bytes,
FLOPs and memory figure of docs/fits.md and docs/step_costs.md still holds, without compiling anything. A Pallas
kernel's payload (`ir`, `backend_config`) embeds its source file's path, so a moved kernel file would change the hash:
payloads are left out (a kernel's own code shows in `git diff`).

python -m bench.program_hashes > before.jsonl      # at the base commit
python -m bench.program_hashes > after.jsonl       # after the change
diff before.jsonl after.jsonl                      # nothing: the same programs

--rows=cpu,h100-1 checks a part; every program of a row with --programs=all (the fits rows: the shortest and longest
train steps and the eval step by default).
"""

import argparse
import hashlib
import re

import jax

from bench import common
from bench import fits
from transformer_jax import config as config_lib
from transformer_jax.compile import aot
from transformer_jax.compile import topologies

# (row, config file, topology or None for this machine's devices, mesh preset or None, compute dtype or None)
EXTRA_ROWS = (('default', 'configs/default.py', None, None, None),
              ('lm_default', 'configs/lm_default.py', None, None, None),
              ('default_bf16', 'configs/default.py', None, None, 'bfloat16'),
              ('lm1b', 'configs/lm1b.py', 'v4-8', 'data', None))
_PAYLOAD = re.compile(r'\b(ir|backend_config) = "(?:[^"\\]|\\.)*"')


def normalized(stablehlo: str) -> str:
  """The lowered program without its kernels' payloads, which embed their source files' paths."""
  return _PAYLOAD.sub(r'\1 = "<kernel>"', stablehlo)


def program_hash(program: aot.Program) -> str:
  """The hash of `program` lowered under its mesh, without debug info or kernel payloads."""
  return hashlib.sha256(normalized(aot.lower(program).as_text(debug_info=False)).encode()).hexdigest()[:16]


def row_hashes(config, devices, every: bool) -> list[dict]:
  """{program, hash} of each program of `config` on `devices`: all, or the shortest and longest train steps and
  the eval step."""
  programs = aot.run_programs(config, devices)
  if not every and len(programs) > 3:
    programs = [programs[0], programs[-2], programs[-1]]
  with aot.compiling_for(list(devices)):
    return [{'program': p.what, 'hash': program_hash(p)} for p in programs]


def rows(names: set[str] | None):
  """(row name, config, devices, every program) of the chosen rows (None: all)."""
  for name, path, topology, mesh, dtype in EXTRA_ROWS:
    if names is None or name in names or 'cpu' in names and topology is None:
      config = config_lib.load(path)
      if mesh:
        aot.set_mesh_shape(config, aot.mesh_presets(topologies.get_topology(topology).num_chips)[mesh])
      if dtype:
        config.model.dtype = dtype
      yield name, config, topologies.topology_devices(topology) if topology else jax.devices(), True
  one_gpu = {'data': {'data': 1, 'fsdp': 1, 'tensor': 1}}
  for topology in ('h100-1',) + fits.TOPOLOGIES:
    if names is not None and topology not in names:
      continue
    meshes = fits.MESHES if topology != 'h100-1' else tuple(one_gpu)
    for model in fits.MODELS:
      for mesh in meshes:
        config = fits.config_for(model, topology, mesh) if topology != 'h100-1' else _one_gpu(model)
        yield f'{model} {topology} {mesh}', config, topologies.topology_devices(topology), topology == 'h100-1'


def _one_gpu(model: str):
  config = config_lib.load(fits.MODELS[model])
  aot.set_mesh_shape(config, {'data': 1, 'fsdp': 1, 'tensor': 1})
  config.model.dtype = fits.DTYPE
  return config


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--rows', default=None,
                 help='comma-separated: cpu (this machine\'s configs), default, lm_default, default_bf16, lm1b, h100-1, '
                 f'or a fits topology ({", ".join(fits.TOPOLOGIES)}); default: all')
  p.add_argument('--programs', choices=('ends', 'all'), default='ends',
                 help='the fits rows\' programs: the shortest and longest train steps and the eval step, or all')
  args = p.parse_args(argv)
  names = set(args.rows.split(',')) if args.rows else None
  for name, config, devices, every in rows(names):
    for record in row_hashes(config, devices, every or args.programs == 'all'):
      common.emit({'row': name, **record})


if __name__ == '__main__':
  main()
