"""Multi-host is the single-host path plus jax.distributed: two train.py processes with 4 CPU devices each
(gloo collectives) train exactly like one process with 8 devices, and only process 0 writes logs.

Token-budget batching: every host runs the same global pipeline and keeps its slice of each global batch,
so the global batches are the same for any host count (packed mode packs per host by design).
"""

import glob
import os
import socket
import subprocess

import numpy as np
import pytest

import helpers
from transformer_jax.core.workdir import Workdir
from transformer_jax.jobs import trainer
from transformer_jax.training import checkpoint

NUM_STEPS = 4
# One bucket (8 rows of 32 tokens): a single batch shape, so one compilation per run.
SETTINGS = {'pipeline__batching': 'token_budget', 'pipeline__bucket_boundaries': (32,), 'train__num_steps': NUM_STEPS,
            'train__checkpoint_every': 1000, 'train__keep_checkpoints': 1}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
  single = str(tmp_path / 'single')
  trainer.train_and_evaluate(helpers.tiny_config(**SETTINGS), single)
  expected = helpers.losses_by_step(single)
  assert sorted(expected) == list(range(1, NUM_STEPS + 1))

  workdir = str(tmp_path / 'multi')  # both processes share it, as hosts share a bucket
  port = _free_port()
  env = helpers.subprocess_env(device_count=4)
  processes = [
      subprocess.Popen(helpers.train_command(workdir, f'--coordinator_address=localhost:{port}', '--num_processes=2',
                                             f'--process_id={i}', **SETTINGS),
                       cwd=helpers.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outputs = []
  try:
    for process in processes:
      outputs.append(process.communicate(timeout=420)[0])
  finally:
    for process in processes:
      process.kill()
  for i, (process, output) in enumerate(zip(processes, outputs)):
    assert process.returncode == 0, f'process {i}:\n{output[-4000:]}'

  got = helpers.losses_by_step(workdir)
  assert sorted(got) == sorted(expected)
  np.testing.assert_allclose([got[s] for s in sorted(got)], [expected[s] for s in sorted(expected)], rtol=1e-5)
  # Only process 0 logs: one line per step in metrics.jsonl, one event file, no progress lines from process 1.
  assert [r['step'] for r in helpers.read_metrics(workdir)] == list(range(1, NUM_STEPS + 1))
  assert len(glob.glob(os.path.join(workdir, 'tensorboard', 'events.out.tfevents.*'))) == 1
  assert f'step {NUM_STEPS}/{NUM_STEPS}' in outputs[0]
  assert f'step 1/{NUM_STEPS}' not in outputs[1]
  # Each process saved its own input-iterator state with the shared checkpoint.
  data_dir = os.path.join(Workdir(workdir).checkpoints, str(NUM_STEPS), checkpoint.DATA)
  assert {'process_0-of-2.json', 'process_1-of-2.json'} <= set(os.listdir(data_dir))
