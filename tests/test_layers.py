"""The house's layers (docs/architecture.md, "Layers"): every module is on a layer, and imports point down or stay on
their own layer, never up. The table is read from the document, so the picture and the code cannot drift apart."""

import ast
import pathlib
import re
import subprocess
import sys

import helpers

REPO = pathlib.Path(helpers.REPO)
ARCHITECTURE = REPO / 'docs' / 'architecture.md'
MAINS = ('train', 'eval', 'sweep')


def _layers() -> list[tuple[str, tuple[str, ...]]]:
  """(layer, the module-name prefixes it holds), top to bottom, from the document's table. The tools' row names
  the package's own modules; every other row its folder (or, for the mains, its files)."""
  layers = []
  for line in ARCHITECTURE.read_text().split('## Layers', 1)[1].split('\n'):
    cells = [cell.strip() for cell in line.strip().strip('|').split('|')]
    if len(cells) != 3 or cells[0] in ('layer', '') or set(cells[0]) <= {'-'}:
      continue
    names = re.findall(r'`([^`]+)`', cells[1])
    if cells[0] == 'tools':
      prefixes = tuple(f'transformer_jax.{name}' for name in names[1:])
    else:
      prefixes = tuple(name.removesuffix('.py').removesuffix('/').replace('/', '.') for name in names)
    layers.append((cells[0], prefixes))
  return layers


LAYERS = _layers()


def _module_name(path: pathlib.Path) -> str:
  name = '.'.join(path.relative_to(REPO).with_suffix('').parts)
  return name.removesuffix('.__init__')


def _layer(module: str) -> int:
  """The index (0: the top) of the layer whose longest prefix holds `module`; a module on none is an error."""
  matches = [(len(prefix), index) for index, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + '.')]
  assert matches, f'{module} is on no layer: place it in docs/architecture.md\'s table'
  return max(matches)[1]


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
  return sorted((REPO / 'transformer_jax').rglob('*.py')) + [REPO / f'{main}.py' for main in MAINS]


def test_the_table_names_every_layer_once_and_every_folder_of_the_package():
  names = [name for name, _ in LAYERS]
  assert names[0] == 'mains' and names[-1] == 'core' and len(set(names)) == len(names), names
  folders = {f'transformer_jax.{p.name}' for p in (REPO / 'transformer_jax').iterdir()
             if p.is_dir() and (p / '__init__.py').exists()}
  top_modules = {f'transformer_jax.{p.stem}' for p in (REPO / 'transformer_jax').glob('*.py') if p.stem != '__init__'}
  placed = {prefix for _, prefixes in LAYERS for prefix in prefixes}
  assert folders | top_modules | set(MAINS) == placed, (folders | top_modules | set(MAINS)) ^ placed


def test_every_module_imports_only_its_own_or_lower_layers():
  files = _project_files()
  modules = {_module_name(path) for path in files}
  upward = []
  for path in files:
    module = _module_name(path)
    for imported in _imports(path, modules) - {module}:
      if _layer(imported) < _layer(module):
        upward.append(f'{module} ({LAYERS[_layer(module)][0]}) imports {imported} ({LAYERS[_layer(imported)][0]})')
  assert not upward, upward


def test_reading_and_checking_a_config_loads_no_backend_loop_or_inference():
  probe = ('import sys\n'
           'from transformer_jax import config\n'
           'config.validate(config.base_config())\n'
           'print(" ".join(sorted(sys.modules)))\n')
  loaded = set(subprocess.run([sys.executable, '-c', probe], cwd=helpers.REPO, capture_output=True, text=True,
                              check=True).stdout.split())
  assert 'transformer_jax.config' in loaded  # the probe ran
  heavy = {'jax', 'flax', 'optax', 'orbax', 'grain', 'sentencepiece', 'transformer_jax.jobs.trainer',
           'transformer_jax.inference.restoring', 'transformer_jax.inference.generation', 'transformer_jax.kernels'}
  assert not heavy & loaded, heavy & loaded


def test_the_trainer_loads_without_torch_and_leaves_it_importable():
  # torch is installed here (the Hugging Face tests'); tensorboardX would import it at every start of train.py.
  code = ('import importlib.util, sys\n'
          'assert importlib.util.find_spec("torch") is not None\n'
          'from transformer_jax.jobs import trainer\n'
          'assert "torch" not in sys.modules\n'
          'import torch\n'
          'from tensorboardX import SummaryWriter\n'
          'print(torch.ones(3).sum().item())\n')
  result = subprocess.run([sys.executable, '-c', code], cwd=helpers.REPO, env=helpers.subprocess_env(),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == '3.0'
