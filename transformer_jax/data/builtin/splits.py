"""`build_corpus`: fixed, distinct, disjoint train/validation/test splits drawn from a seed."""

from __future__ import annotations

import functools
import random

from transformer_jax.data.builtin.families import generate_pair

SPLITS = ('train', 'validation', 'test')


@functools.lru_cache(maxsize=4)
def build_corpus(seed: int, train_size: int,
                 eval_size: int) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
  """{split: (sources, targets)}, generated once per arguments and cached.

  Pairs are drawn from `random.Random(seed)` and kept only if their source is new, so every pair
  is distinct and no validation or test source occurs in train. Test takes the first eval_size
  new pairs, validation the next eval_size, train the rest.
  """
  if train_size < 1 or eval_size < 1:
    raise ValueError(f'builtin_train_size ({train_size}) and builtin_eval_size ({eval_size}) '
                     'must be at least 1')
  rng = random.Random(seed)
  total = train_size + 2 * eval_size
  seen: set[str] = set()
  sources: list[str] = []
  targets: list[str] = []
  for _ in range(4 * total):
    source, target = generate_pair(rng)
    if source not in seen:
      seen.add(source)
      sources.append(source)
      targets.append(target)
      if len(sources) == total:
        break
  else:
    raise ValueError(f'only {len(sources)} distinct pairs after {4 * total} draws; lower '
                     'builtin_train_size / builtin_eval_size')
  bounds = {'test': (0, eval_size), 'validation': (eval_size, 2 * eval_size),
            'train': (2 * eval_size, total)}
  return {split: (tuple(sources[start:stop]), tuple(targets[start:stop]))
          for split, (start, stop) in bounds.items()}
