"""A batch's feature rows as a matrix: the compiled loop and numpy read every row to the same float64 matrix."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch_sidecar.stats import rows
from inferwatch_sidecar.stats.rows import float_rows


def test_the_compiled_loop_was_built_in_ci() -> None:
    if os.environ.get("CI") == "true":
        assert rows.COMPILED, "inferwatch_sidecar.stats._rows was not built: pip install -e . needs a C compiler"
    elif not rows.COMPILED:
        pytest.skip("built without a C compiler")


def _numpy(rs: list[Any], width: int) -> np.ndarray:
    return np.array(rs, dtype=np.float64).reshape(len(rs), width)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 12).flatmap(lambda w: st.tuples(st.just(w), st.lists(
    st.tuples(*[st.floats(allow_nan=True, allow_infinity=True)] * w), max_size=30))))
def test_tuples_of_floats_read_to_numpys_matrix(case: tuple[int, list[tuple[float, ...]]]) -> None:
    width, rs = case
    got = float_rows(rs, width)
    assert got.shape == (len(rs), width) and got.dtype == np.float64
    np.testing.assert_array_equal(got, _numpy(rs, width))  # NaN in the same places counts as equal


@pytest.mark.parametrize("rs", [
    [(1.0, 2.0), [3.0, 4.0]],          # a list row: numpy reads the batch
    [(1.0, 2), (3.0, 4.0)],            # an int value
    [(1.0, True), (3.0, 4.0)],         # a bool is a number to numpy
    [(1.0, None), (3.0, 4.0)],         # None is NaN to numpy, as before the compiled loop
    ((1.0, 2.0), (3.0, 4.0)),          # a tuple of rows, not a list
])
def test_other_rows_are_read_by_numpy_to_the_same_matrix(rs: Any) -> None:
    np.testing.assert_array_equal(float_rows(list(rs) if isinstance(rs, list) else rs, 2), _numpy(list(rs), 2))


@pytest.mark.parametrize("rs,err", [([(1.0, 2.0), (3.0,)], ValueError), ([(1.0, "x")], ValueError),
                                    ([(1.0, object())], TypeError)])
def test_rows_that_are_no_matrix_raise_as_numpy_does(rs: list[Any], err: type[Exception]) -> None:
    with pytest.raises(err):
        float_rows(rs, 2)


def test_the_compiled_loop_refuses_a_wrong_buffer_with_a_clear_error() -> None:
    if not rows.COMPILED:
        pytest.skip("built without a C compiler")
    from inferwatch_sidecar.stats._rows import stack_floats  # type: ignore[import-not-found,unused-ignore]

    with pytest.raises(ValueError, match="len\\(rows\\) \\* width"):
        stack_floats([(1.0, 2.0)], 2, np.empty((1, 3)))
    with pytest.raises(TypeError):
        stack_floats([(1.0, 2.0)], 2, b"\x00" * 16)  # read-only
    assert stack_floats([], 0, np.empty((0, 0))) is True
    out = np.empty((1, 2))
    assert stack_floats([(1.0, math.inf)], 2, out) is True and out[0, 1] == math.inf
