"""The house's layers (README, "Layout"): every module has a floor, and imports point down or across, never up."""

import ast
import pathlib
import subprocess
import sys

import helpers

REPO = pathlib.Path(helpers.REPO)

# Floor of every module, top (1) to bottom (6), as the README's layout picture draws them.
LAYERS = {
    1: ('train', 'eval', 'sweep', 'transformer_jax.cli', 'transformer_jax.translate', 'transformer_jax.generate',
        'transformer_jax.attention_plots', 'transformer_jax.prepare_tfds', 'transformer_jax.export.__main__',
        'transformer_jax.convert.__main__'),
    2: ('transformer_jax.trainer', 'transformer_jax.reporting', 'transformer_jax.scoring', 'transformer_jax.scores',
        'transformer_jax.significance', 'transformer_jax.sweep', 'transformer_jax.aot', 'transformer_jax.export',
        'transformer_jax.export.serving', 'transformer_jax.export.hf', 'transformer_jax.export.marian',
        'transformer_jax.export.card', 'transformer_jax.hlo_costs', 'transformer_jax.step_parts',
        'transformer_jax.convert'),
    3: ('transformer_jax.restoring', 'transformer_jax.generation'),
    4: ('transformer_jax.run_builder', 'transformer_jax.steps', 'transformer_jax.optim', 'transformer_jax.checkpoint',
        'transformer_jax.preemption', 'transformer_jax.ensemble', 'transformer_jax.decoding', 'transformer_jax.layer_layout'),
    5: ('transformer_jax.model', 'transformer_jax.attention', 'transformer_jax.flash_tpu', 'transformer_jax.flash_gpu',
        'transformer_jax.flash_attention', 'transformer_jax.attention_masks', 'transformer_jax.cpu_backend', 'transformer_jax.dropout_masks',
        'transformer_jax.residual_norm',
        'transformer_jax.metrics',
        'transformer_jax.loss', 'transformer_jax.loss_kernel',
        'transformer_jax.data.sources', 'transformer_jax.data.builtin', 'transformer_jax.data.tokenizer',
        'transformer_jax.data.pipeline', 'transformer_jax.data.device_feed', 'transformer_jax.text_input',
        'transformer_jax.topologies'),
    6: ('transformer_jax', 'transformer_jax.data', 'transformer_jax.config', 'transformer_jax.model_config',
        'transformer_jax.sections', 'transformer_jax.tokens', 'transformer_jax.workdir', 'transformer_jax.sharding',
        'transformer_jax.distributed', 'transformer_jax.files', 'transformer_jax.errors',
        'transformer_jax.xla_options', 'transformer_jax.pallas_mode', 'transformer_jax.host_resources',
        'transformer_jax.concurrent_compiles'),
}
FLOOR = {module: floor for floor, modules in LAYERS.items() for module in modules}


def _module_name(path: pathlib.Path) -> str:
  name = '.'.join(path.relative_to(REPO).with_suffix('').parts)
  return name.removesuffix('.__init__')


SHARED_FLOORS = ('transformer_jax.data.builtin', 'transformer_jax.sections')  # packages whose modules share its floor


def _floor(module: str) -> int:
  """A module's floor (a module of a SHARED_FLOORS package: its package's); a module not placed is an error."""
  package = next((p for p in SHARED_FLOORS if module.startswith(p + '.')), module)
  assert package in FLOOR, f'{module} has no floor: place it in LAYERS (and in the README\'s picture)'
  return FLOOR[package]


def _imports(path: pathlib.Path, modules: set[str]) -> set[str]:
  """The project modules `path` imports, at any depth of the file (deferred imports count too)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith('transformer_jax'):
      for alias in node.names:
        name = f'{node.module}.{alias.name}'
        found.add(name if name in modules else node.module)
    elif isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names if alias.name.startswith('transformer_jax'))
  return found


def _project_files() -> list[pathlib.Path]:
  return sorted((REPO / 'transformer_jax').rglob('*.py')) + [REPO / f'{main}.py' for main in ('train', 'eval', 'sweep')]


def test_every_module_has_a_floor_and_imports_only_its_own_or_lower_floors():
  files = _project_files()
  modules = {_module_name(path) for path in files}
  upward = []
  for path in files:
    module = _module_name(path)
    for imported in _imports(path, modules) - {module}:
      if _floor(imported) < _floor(module):
        upward.append(f'{module} (floor {_floor(module)}) imports {imported} (floor {_floor(imported)})')
  assert not upward, upward
  named = {module for modules_ in LAYERS.values() for module in modules_}
  assert named <= modules | {'transformer_jax.data.builtin'}, named - modules  # no stale names in the table


def test_reading_and_checking_a_config_loads_no_backend_loop_or_inference():
  probe = ('import sys\n'
           'from transformer_jax import config\n'
           'config.validate(config.base_config())\n'
           'print(" ".join(sorted(sys.modules)))\n')
  loaded = set(subprocess.run([sys.executable, '-c', probe], cwd=helpers.REPO, capture_output=True, text=True,
                              check=True).stdout.split())
  assert 'transformer_jax.config' in loaded  # the probe ran
  heavy = {'jax', 'flax', 'optax', 'orbax', 'grain', 'sentencepiece', 'transformer_jax.trainer',
           'transformer_jax.restoring', 'transformer_jax.generation', 'transformer_jax.cpu_backend'}
  assert not heavy & loaded, heavy & loaded


def test_the_trainer_loads_without_torch_and_leaves_it_importable():
  # torch is installed here (the Hugging Face tests'); tensorboardX would import it at every start of train.py.
  code = ('import importlib.util, sys\n'
          'assert importlib.util.find_spec("torch") is not None\n'
          'from transformer_jax import trainer\n'
          'assert "torch" not in sys.modules\n'
          'import torch\n'
          'from tensorboardX import SummaryWriter\n'
          'print(torch.ones(3).sum().item())\n')
  result = subprocess.run([sys.executable, '-c', code], cwd=helpers.REPO, env=helpers.subprocess_env(),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == '3.0'
