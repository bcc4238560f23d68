"""Downloads and prepares a tfds translation dataset in ArrayRecord format, for `data.source='tfds'`.

Run it once on a machine with internet (the training machine may have none), then copy the data directory over
if needed:

  python -m transformer_jax.prepare_tfds --name=wmt14_translate/de-en --data_dir=DIR

It is the Python form of `tfds build NAME --file_format=array_record --data_dir=DIR`. A build that fails leaves
the data directory as it found it, except for the downloads that finished, which the next build reuses.
"""

import contextlib
import logging
import pathlib
import shutil

from absl import app
from absl import flags
import requests
from urllib3.util import retry as urllib3_retry

from transformer_jax import cli
from transformer_jax.data import sources
from transformer_jax.runtime import progress

_NAME = flags.DEFINE_string('name', None, "tfds dataset with config, e.g. 'wmt14_translate/de-en'.", required=True)
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'tfds data directory (default: $TFDS_DATA_DIR or '
                                '~/tensorflow_datasets).')

_PARTIAL_DOWNLOAD = '.tmp.'  # in the name of a download tfds has not finished (it never resumes one)


def prepare(name: str, data_dir: str | None) -> str:
  """Builds `name` as ArrayRecord into data_dir (a no-op if already there); returns its folder.

  Raises OSError with what to do when the dataset's source cannot be reached.
  """
  builder = sources.tfds_builder(name, data_dir)
  root = pathlib.Path(builder.data_dir_root)
  dataset, downloads = root / builder.name, root / 'downloads'
  made_root = not root.exists()
  before = _paths_under(dataset) | _paths_under(downloads)
  try:
    with _retries_said(name):
      builder.download_and_prepare()
  except BaseException as error:
    _remove_new(dataset, before, lambda path: True)
    _remove_new(downloads, before, lambda path: _PARTIAL_DOWNLOAD in path.name)
    if made_root and root.exists() and not any(root.iterdir()):
      root.rmdir()
    if isinstance(error, requests.exceptions.ConnectionError):
      url = error.request.url if error.request is not None else 'its source'
      cause = getattr(error.args[0], 'reason', error) if error.args else error
      raise OSError(f'cannot download {name}: {url} is out of reach ({type(cause).__name__}). Run this on a '
                    f'machine with internet, then copy {root} to this one: '
                    f'{sources.prepare_command(name, str(root))}') from error
    raise
  return str(builder.data_dir)


class _SayRetries(logging.Filter):
  """urllib3's retry lines ('Retrying (Retry(total=9, ...)) after connection broken by ...') said plainly: which
  retry of how many this is, and how long tfds goes on trying: the backoff sleeps before the retries still to come,
  by urllib3's own formula (it logs a retry after its sleep; time spent waiting for connections comes on top)."""

  def __init__(self, name: str):
    super().__init__()
    self._name = name

  def filter(self, record):
    if record.args and isinstance(record.args[0], urllib3_retry.Retry):
      retry, error, url = record.args
      history, waits = list(retry.history), []
      for _ in range(max(retry.total, 0)):  # the sleep before each later retry
        history.append(history[-1])
        waits.append(retry.new(history=tuple(history)).get_backoff_time())
      done = len(retry.history)
      record.msg = '%s: downloading %s failed (%s): retry %d of %d; tfds gives up after about %s more'
      record.args = (self._name, url, type(error).__name__, done, done + max(retry.total, 0),
                     progress.duration(sum(waits)))
    return True


@contextlib.contextmanager
def _retries_said(name: str):
  """Inside, urllib3's retries of `name`'s downloads are logged by `_SayRetries`."""
  logger, said = logging.getLogger('urllib3.connectionpool'), _SayRetries(name)
  logger.addFilter(said)
  try:
    yield
  finally:
    logger.removeFilter(said)


def _paths_under(top: pathlib.Path) -> set[pathlib.Path]:
  return {top, *top.rglob('*')} if top.exists() else set()


def _remove_new(top: pathlib.Path, before: set[pathlib.Path], removable) -> None:
  """Removes what appeared under `top` since `before` and `removable` accepts, and the new folders it leaves
  empty (deepest first, so a folder's contents are seen before the folder)."""
  for path in sorted(_paths_under(top) - before, key=lambda p: len(p.parts), reverse=True):
    if removable(path):
      shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    elif path.is_dir() and not any(path.iterdir()):
      path.rmdir()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}.')
  print(f'{_NAME.value} is ready in {prepare(_NAME.value, _DATA_DIR.value)}')


if __name__ == '__main__':
  cli.run(main)
