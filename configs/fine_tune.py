"""Fine-tunes a converted MarianMT checkpoint (`python -m transformer_jax.convert --from_hf=DIR --workdir=RUN`):

python train.py --config=configs/fine_tune.py:RUN --workdir=RUN [--config.data.source=files ...]

The `model` and `tokenizer` sections are the checkpoint's (RUN/config.json); everything else is configs/default.py's
(the built-in corpus, its pipeline, schedule and evaluation), overridable as usual. Training starts from the
imported params at step 0.
"""

from configs import default
from transformer_jax.core.workdir import Workdir


def get_config(workdir=None):
  if not workdir:
    raise ValueError('configs/fine_tune.py takes the converted workdir: --config=configs/fine_tune.py:RUN.')
  config = default.get_config()
  saved = Workdir(workdir).load_config()
  # The training length filter (model.max_len, also pipeline.max_length) stays default.py's: it is not a weight.
  config.model.update({key: value for key, value in saved.model.items() if key != 'max_len'})
  config.tokenizer.update(saved.tokenizer)
  config.train.fine_tune_workdir = workdir  # train.py refuses another --workdir, which would start from scratch
  return config
