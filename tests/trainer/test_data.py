"""Training data helpers that need no model: shifting examples for next-token prediction."""

from __future__ import annotations

import pytest

from mint.errors import InvalidRequest
from mint.trainer.data import to_datum_arrays

pytestmark = pytest.mark.backend_free


def test_to_datum_arrays_shifts_for_next_token_prediction() -> None:
    model_input, targets, weights = to_datum_arrays([1, 2, 3, 4], [0.0, 0.0, 1.0, 1.0])
    assert (model_input, targets, weights) == ([1, 2, 3], [2, 3, 4], [0.0, 1.0, 1.0])
    with pytest.raises(InvalidRequest, match="same length"):
        to_datum_arrays([1, 2], [1.0])
    with pytest.raises(InvalidRequest, match="at least 2 tokens"):
        to_datum_arrays([1], [1.0])
