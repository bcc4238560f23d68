"""Continues prompts with a trained language model:
python -m transformer_jax.generate --workdir=DIR --prompt="The dog" [--max_new_tokens=N --temperature=T --top_k=K
--top_p=P --seed=S --num_samples=M], or prompts on standard input, one per line.

Prints --num_samples texts per prompt, one per line, prompts in order: the prompt followed by what the model wrote,
up to --max_new_tokens tokens or the end of its document. An empty line is an empty prompt, which the model
continues from the start of a document (an unconditional sample), where translate gives an empty line back. Each prompt goes through the model's key/value cache at
once, then tokens are sampled from it (--temperature=0: greedy), batched and jitted once per shape. Unset flags
take the run's `decode.*` settings (an unset --max_new_tokens also stops at the model's max length).
"""

import sys

from absl import app
from absl import flags

from transformer_jax import cli
from transformer_jax import config as config_lib
from transformer_jax.config import decode as decode_section
from transformer_jax.config.model import ModelConfig
from transformer_jax.data import text_input
from transformer_jax.inference import generation
from transformer_jax.inference import restoring

_WORKDIR = flags.DEFINE_string('workdir', None, 'The training run\'s workdir.', required=True)
_PROMPT = flags.DEFINE_string('prompt', None, 'The text to continue (default: one prompt per line of standard input).')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the run\'s final model, the average of its last '
                             'eval.average_last periodic saves, as train.py\'s final evaluation).')
_AVERAGE_LAST = flags.DEFINE_integer('average_last', None, 'Average the last K checkpoints.')
_NUM_SAMPLES = flags.DEFINE_integer('num_samples', 1, 'Continuations per prompt.', lower_bound=1)
_SEED = flags.DEFINE_integer('seed', 0, 'Sampling seed.')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Rows (prompts × samples) generated at once.', lower_bound=1)
# The sampling settings: None takes the run's decode.<name>.
_SAMPLING = {
    'max_new_tokens': flags.DEFINE_integer('max_new_tokens', None, 'Most tokens generated after a prompt.'),
    'temperature': flags.DEFINE_float('temperature', None, 'Sampling temperature; 0 = greedy.'),
    'top_k': flags.DEFINE_integer('top_k', None, 'Sample from the k most likely tokens (0 = all).'),
    'top_p': flags.DEFINE_float('top_p', None, 'Sample from the smallest set of tokens with this probability.'),
}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; prompts come from --prompt or standard input.')
  prompts = [text_input.flag_text(_PROMPT.value, 'prompt')] if _PROMPT.value is not None else text_input.read_stdin()
  config = config_lib.of_run(_WORKDIR.value)
  model = ModelConfig.from_dict(config.model)
  if not model.decoder_only:
    raise ValueError(f"{_WORKDIR.value} holds a translation model (model.architecture='{model.architecture}'): "
                     'use python -m transformer_jax.translate.')
  for name, flag in _SAMPLING.items():
    if flag.value is not None:
      config.decode[name] = flag.value
  decode_section.validate(config.decode)
  restored = restoring.restore(config, _WORKDIR.value, step=_STEP.value, average_last=_AVERAGE_LAST.value)
  texts = generation.continue_prompts(restored, prompts, **{name: config.decode[name] for name in _SAMPLING},
                                     seed=_SEED.value, num_samples=_NUM_SAMPLES.value, batch_size=_BATCH.value,
                                     fit=_SAMPLING['max_new_tokens'].value is None)
  sys.stdout.write(''.join(text + '\n' for samples in texts for text in samples))


if __name__ == '__main__':
  cli.run(main)
