"""bench.program_hashes: equal programs hash equal, whatever file their kernels live in, and a change to a program
changes its hash."""

import jax

import helpers
from bench import program_hashes


def test_kernel_payloads_are_left_out_and_the_rest_is_kept():
  text = ('%0 = stablehlo.custom_call @tpu_custom_call(%a) {backend_config = "\\22/old/place/kernel.py\\22 x"} : f32\n'
          '%1 = stablehlo.custom_call @__gpu$xla.gpu.triton(%0) {mhlo.backend_config = {ir = "ML\\EF/new/k.py"}} : f32')
  moved = text.replace('/old/place/kernel.py', '/new/place/kernels/tpu/kernel.py').replace('/new/k.py', '/b/k.py')
  assert program_hashes.normalized(moved) == program_hashes.normalized(text)
  assert '@tpu_custom_call(%a)' in program_hashes.normalized(text) and 'old/place' not in program_hashes.normalized(text)
  assert program_hashes.normalized(text.replace('f32', 'bf16')) != program_hashes.normalized(text)


def test_a_change_to_training_changes_the_train_steps_hash_and_not_the_eval_steps():
  devices = jax.devices()[:1]
  hashes = lambda **model: {r['program']: r['hash'] for r in program_hashes.row_hashes(
      helpers.tiny_config(**{f'model__{k}': v for k, v in model.items()}), devices, every=True)}
  base, again, more_dropout = hashes(), hashes(), hashes(dropout=0.3)
  assert base == again and len(base) >= 2
  train = [name for name in base if name.startswith('train')]
  evaluation = [name for name in base if name.startswith('eval')]
  assert train and all(more_dropout[name] != base[name] for name in train)
  assert evaluation and all(more_dropout[name] == base[name] for name in evaluation)  # dropout is off there
