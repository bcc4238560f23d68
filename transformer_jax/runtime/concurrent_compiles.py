"""A run's programs compiled several at once, as many as the host's memory and cores allow: the trainer's batch
shapes and `--compile_only`'s programs. The first program (the caller's largest) compiles alone, the others are
lowered beside it (XLA compiles outside the GIL), and the memory its compile took sizes how many compile at once
after it (a TPU compile of the paper's base model holds gigabytes: bench/RESULTS.md, "Compile time")."""

import concurrent.futures
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from transformer_jax.runtime import host_resources

Item = TypeVar('Item')
Compiled = TypeVar('Compiled')


def how_many(peak_bytes: int, available_bytes: int | None, cores: int, programs: int) -> int:
  """How many programs to compile at once: as many compiles of `peak_bytes` each as the host's available memory
  holds, no more than its cores or the programs, at least one; one where the OS does not say what is available."""
  if available_bytes is None:
    return 1
  return max(1, min(cores, programs, available_bytes // max(peak_bytes, 1)))


def _compile(compile_lowered: Callable[[Item, object], Compiled], item: Item, lowered) -> Compiled:
  """One compile, the memory it freed handed back to the OS (kept, it would add up over a run's programs)."""
  try:
    return compile_lowered(item, lowered)
  finally:
    host_resources.release_freed_memory()


def compile_all(items: Sequence[Item], lower: Callable[[Item], object],
                compile_lowered: Callable[[Item, object], Compiled]) -> Iterator[tuple[Item, Compiled]]:
  """Each item with its compiled program, given as soon as it is compiled (the order of finishing).

  `lower(item)` runs in the caller's thread (tracing reads the caller's mesh and options), `compile_lowered(item,
  lowered)` in a compile thread. The first item compiles alone while the others are lowered; once it is done, the
  resident memory its compile took (`host_resources`: the peak since it began, against the resident set before)
  sizes how many compile at once (`how_many`). Each compile hands the memory it freed back to the OS. A compile's
  error is raised when its turn to be given comes, and no further compile starts after it.
  """
  items = list(items)
  if not items:
    return
  host_resources.reset_peak()
  before = host_resources.resident_bytes()
  alone = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='compile')
  first = alone.submit(_compile, compile_lowered, items[0], lower(items[0]))
  compiling, lowered, pool = {first: items[0]}, [], None
  try:
    for index, item in enumerate(items[1:], start=2):
      lowered.append((item, lower(item)))
      if pool is None and (first.done() or index == len(items)):
        first.result()  # the first compile's error, raised before any other compile starts
        pool = concurrent.futures.ThreadPoolExecutor(
            how_many(host_resources.peak_resident_bytes() - before, host_resources.available_bytes(),
                     host_resources.usable_cores(), len(items) - 1), thread_name_prefix='compile')
      if pool is not None:
        compiling.update({pool.submit(_compile, compile_lowered, *pair): pair[0] for pair in lowered})
        lowered.clear()
      for future in [f for f in compiling if f.done()]:
        yield compiling.pop(future), future.result()
    for future in concurrent.futures.as_completed(list(compiling)):
      yield compiling.pop(future), future.result()
  finally:  # an error or an early stop: no compile starts after it
    alone.shutdown(cancel_futures=True)
    if pool is not None:
      pool.shutdown(cancel_futures=True)
