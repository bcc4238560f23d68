"""The `pipeline` section: how training batches are made (`transformer_jax.data.pipeline`), and the batch sizes
its keys imply for a number of hosts."""

import math

import ml_collections

BATCHINGS = ('packed', 'token_budget')
AUTO_WORKERS = -1  # pipeline.num_workers: as many worker processes as `worker_count` finds right for the host
# Keys only one batching reads: key -> its conditions, each (the dotted key that chooses, the choices that read it);
# `config.MODE_KEYS`.
MODE_KEYS = {
    **{key: (('pipeline.batching', ('packed',)),) for key in ('packed_length', 'batch_size')},
    **{key: (('pipeline.batching', ('token_budget',)),) for key in ('tokens_per_batch', 'bucket_boundaries')},
}


def default_config() -> ml_collections.ConfigDict:
  """Packed rows of 256 tokens, 128 rows (~25k real tokens per side, like the paper)."""
  return ml_collections.ConfigDict({
      'batching': 'packed',  # 'packed' or 'token_budget'
      'max_length': 256,  # longest sentence kept for training, in tokens incl. EOS
      'packed_length': 256,  # row length in packed mode (>= max_length)
      'batch_size': 128,  # packed mode: rows per GLOBAL batch
      'tokens_per_batch': 25000,  # token_budget mode: GLOBAL rows * bucket length, per side
      'bucket_boundaries': (8, 16, 24, 32, 48, 64, 96, 128, 192, 256),  # token_budget lengths
      'batch_multiple': 8,  # global rows per batch are a multiple of this (e.g. device count)
      'shuffle_seed': 0,  # reshuffled differently (and reproducibly) every epoch
      'read_threads': 0,  # encoding threads (grain ReadOptions); 0 = inline, least CPU (GIL)
      'num_workers': AUTO_WORKERS,  # processes each running the pipeline on a slice (grain mp_prefetch); 0: none
  })


def validate(config: ml_collections.ConfigDict, process_count: int = 1) -> None:
  """Batching mode, lengths and batch sizes for `process_count` hosts."""
  if config.batching not in BATCHINGS:
    raise ValueError(f'pipeline.batching={config.batching!r}; set it to one of {BATCHINGS}.')
  if config.max_length < 2:
    raise ValueError(f'pipeline.max_length={config.max_length}; set it to >= 2 (a token + EOS).')
  if config.num_workers < AUTO_WORKERS:
    raise ValueError(f'pipeline.num_workers={config.num_workers}; set it to a number of worker processes, 0 (none: '
                     f'the training process reads) or {AUTO_WORKERS} (as many as the host suits).')
  if config.batching == 'packed':
    packed_rows(config, process_count)
  else:
    bucket_batch_sizes(config, process_count)


def worker_count(num_workers: int, platform: str, host_cores: int) -> int:
  """`pipeline.num_workers` as a count of worker processes. AUTO_WORKERS: none when the run's devices are CPUs
  (workers would take cores from the training step), else every host core but two (the training process and its
  dispatch), at least one: an accelerator's step outruns one process that decodes, packs and batches."""
  if num_workers != AUTO_WORKERS:
    return num_workers
  return 0 if platform == 'cpu' else max(1, host_cores - 2)


def _row_multiple(config: ml_collections.ConfigDict, process_count: int) -> int:
  """Global rows per batch must split over the devices (batch_multiple) and over the hosts."""
  if config.batch_multiple < 1:
    raise ValueError(f'pipeline.batch_multiple={config.batch_multiple}; set it to >= 1 (e.g. the'
                     ' number of data-parallel devices).')
  return math.lcm(config.batch_multiple, process_count)


def bucket_batch_sizes(config: ml_collections.ConfigDict, process_count: int = 1) -> list[int]:
  """Global rows per batch of each bucket: the most within the token budget, a row multiple."""
  boundaries = list(config.bucket_boundaries)
  if not boundaries or boundaries != sorted(set(boundaries)) or boundaries[0] < 1:
    raise ValueError(f'pipeline.bucket_boundaries={boundaries}; set them to increasing positive'
                     ' lengths.')
  if boundaries[-1] < config.max_length:
    raise ValueError(f'pipeline.bucket_boundaries end at {boundaries[-1]} <'
                     f' pipeline.max_length={config.max_length}; add a bucket >= max_length.')
  multiple = _row_multiple(config, process_count)
  sizes = [config.tokens_per_batch // length // multiple * multiple for length in boundaries]
  if sizes[-1] == 0:
    raise ValueError(f'pipeline.tokens_per_batch={config.tokens_per_batch} cannot hold {multiple}'
                     f' rows of the longest bucket ({boundaries[-1]}); set it to >='
                     f' {multiple * boundaries[-1]}.')
  return sizes


def packed_rows(config: ml_collections.ConfigDict, process_count: int) -> int:
  """Rows per host batch in packed mode."""
  multiple = _row_multiple(config, process_count)
  if config.batch_size < 1 or config.batch_size % multiple:
    raise ValueError(f'pipeline.batch_size={config.batch_size} must be a positive multiple of'
                     f' {multiple} (batch_multiple={config.batch_multiple}, {process_count}'
                     ' hosts); change pipeline.batch_size.')
  if config.packed_length < config.max_length:
    raise ValueError(f'pipeline.packed_length={config.packed_length} <'
                     f' pipeline.max_length={config.max_length}; set packed_length >= max_length.')
  return config.batch_size // process_count
