"""bench.attention's inputs and timed function: the attention dropout rate reaches the attention (the same bits in
every implementation); its settings are the model's keys (`--config.model.KEY=VALUE`), checked as a model's."""

import numpy as np
import pytest

from bench import attention as attention_bench


def test_dropout_rate_reaches_every_implementation_with_the_same_bits():
  q, k, v, spec = attention_bench.make_inputs(24, 2, 2, 8, packed=2)
  loss = {(impl, rate): attention_bench.forward_backward(impl, spec, 8, rate)(q, k, v)[0]
          for impl in ('reference', 'chunked') for rate in (0.0, 0.3)}
  assert not np.isclose(loss['reference', 0.3], loss['reference', 0.0])
  np.testing.assert_allclose(loss['chunked', 0.3], loss['reference', 0.3], rtol=1e-5)


def test_the_attentions_settings_are_the_models_keys_checked_as_a_models():
  """--config.model.KEY=VALUE: the bench's defaults with the given keys; a value a model refuses is refused here."""
  model = attention_bench.settings({'num_heads': 2, 'attention_dropout': 0.1})
  assert (model.num_heads, model.head_dim_k, model.head_dim_v, model.dtype, model.attention_chunk_size,
          model.attention_dropout) == (2, 64, 64, 'float32', 512, 0.1)
  with pytest.raises(ValueError, match=r'model.attention_dropout must be in \[0, 1\), got 1.0'):
    attention_bench.settings({'attention_dropout': 1.0})
  with pytest.raises(ValueError, match='model.d_k must be positive, got 0'):
    attention_bench.settings({'d_k': 0})
  with pytest.raises(ValueError, match="model.dtype='float8' is not one of"):
    attention_bench.settings({'dtype': 'float8'})
