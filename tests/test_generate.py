"""sampling.generate checks its prompt as forward() checks idx: integer ids in [0, vocab_size), a
(batch, time) array. It cast float ids to int64 (truncating 2.7 to 2) and raised IndexError
on a 1-D prompt."""
import numpy as np
import pytest

from nanospa import GPT
from nanospa.sampling import generate

from conftest import tiny_config


@pytest.mark.parametrize("prompt, words", [
    (np.array([[1.0, 2.7]]), "token ids must be integers, got dtype float64"),
    (np.array([1, 2]), r"expected a \(batch, time\) array .* \(add a batch axis: idx\[None\]\)"),
    (np.array([[1, 13]]), r"token ids must lie in \[0, vocab_size=13\), got 1..13"),
    (np.array([[-1, 2]]), r"token ids must lie in .* \(nanospa has no padding id"),
    (np.zeros((1, 0), dtype=np.int64), r"expected a \(batch, time\) array of token ids with both sizes at least 1"),
])
def test_generate_checks_ids_as_forward_does(prompt, words):
    model = GPT(tiny_config())
    with pytest.raises(ValueError, match="^generate: idx: " + words):
        generate(model, prompt, 2)
    with pytest.raises(ValueError, match="^idx: " + words):
        model(prompt)
    assert generate(model, np.array([[1, 2]], dtype=np.int32), 2).shape == (1, 4)   # any integer dtype
