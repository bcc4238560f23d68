"""bench.attention's inputs and timed function: `--dropout_rate` reaches the attention (the same bits in every
implementation), and a rate outside [0, 1) is one line."""

import numpy as np
import pytest

from bench import attention as attention_bench


def test_dropout_rate_reaches_every_implementation_with_the_same_bits():
  q, k, v, spec = attention_bench.make_inputs(24, 2, 2, 8, packed=2)
  loss = {(impl, rate): attention_bench.forward_backward(impl, spec, 8, rate)(q, k, v)[0]
          for impl in ('reference', 'chunked') for rate in (0.0, 0.3)}
  assert not np.isclose(loss['reference', 0.3], loss['reference', 0.0])
  np.testing.assert_allclose(loss['chunked', 0.3], loss['reference', 0.3], rtol=1e-5)


def test_a_rate_outside_the_unit_interval_is_one_line(capsys):
  with pytest.raises(SystemExit):
    attention_bench.main(['--lengths=16', '--implementations=reference', '--dropout_rate=1.0'])
  assert capsys.readouterr().err.splitlines()[-1].endswith('--dropout_rate=1.0: give a rate in [0, 1)')
