"""The two layouts of a layer stack's parameters, and exact conversion between them.

Unrolled (`model.scan_layers=False`): one subtree per layer, `layer_0`..`layer_{N-1}`. Scanned: one subtree
`layers` whose leaves hold every layer, stacked on a leading axis. `convert` turns any tree holding layer stacks
(params, an optimizer state that mirrors them, a whole train state) into either layout, bit for bit, so a
checkpoint written in one layout restores into a model of the other (`restoring.restore`).
"""

import functools
import re

import jax
import jax.numpy as jnp

SCANNED = 'layers'
_UNROLLED = re.compile(r'layer_(\d+)')


def is_scanned(tree) -> bool:
  """Whether `tree` (params or their checkpoint metadata) holds a scanned layer stack."""
  if isinstance(tree, dict):
    return SCANNED in tree or any(is_scanned(value) for value in tree.values())
  return False


def convert(tree, scan_layers: bool):
  """`tree` with every layer stack in the scanned (`scan_layers`) or unrolled layout; all else unchanged."""
  if isinstance(tree, dict):
    tree = {key: convert(value, scan_layers) for key, value in tree.items()}
    return _stack(tree) if scan_layers else _unstack(tree)
  if isinstance(tree, (list, tuple)):  # optax states: tuples and NamedTuples of dicts
    items = [convert(value, scan_layers) for value in tree]
    return type(tree)(*items) if hasattr(tree, '_fields') else type(tree)(items)
  return tree


def convert_onto(tree, abstract_target, scan_layers: bool):
  """`convert`, with the result placed on the shardings of `abstract_target` (ShapeDtypeStructs)."""
  shardings = jax.tree.map(lambda x: x.sharding, abstract_target)
  return jax.jit(functools.partial(convert, scan_layers=scan_layers), out_shardings=shardings)(tree)


def _stack(node: dict) -> dict:
  layers = sorted((int(m.group(1)), key) for key in node if (m := _UNROLLED.fullmatch(key)))
  if not layers:
    return node
  if [index for index, _ in layers] != list(range(len(layers))):
    raise ValueError(f'layers {[key for _, key in layers]} are not numbered 0..{len(layers) - 1}; cannot stack them.')
  out = {key: value for key, value in node.items() if not _UNROLLED.fullmatch(key)}
  out[SCANNED] = jax.tree.map(lambda *xs: jnp.stack(xs), *(node[key] for _, key in layers))
  return out


def _unstack(node: dict) -> dict:
  if SCANNED not in node:
    return node
  stacked = node[SCANNED]
  out = {key: value for key, value in node.items() if key != SCANNED}
  for i in range(jax.tree.leaves(stacked)[0].shape[0]):
    out[f'layer_{i}'] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return out
