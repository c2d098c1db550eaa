"""A stage name built at request time that is invalid never raises into serving code.

The decorator, applied when the code is defined, is still strict.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

import inferwatch
from inferwatch import _core
from inferwatch.wire import EV_DROPS
from tests.sdk.conftest import Receiver, buffered


def _user_stage(user_id: int) -> str:
    return f"user {user_id}"  # a space: not a valid stage name


def test_an_invalid_name_in_a_with_block_runs_the_block_and_counts_one_bad_name_drop(sdk: Receiver) -> None:
    ran = []
    with inferwatch.request(), inferwatch.stage(_user_stage(42)):
        ran.append(True)
    assert ran == [True]
    (req,) = buffered()
    assert req[-1] == [], "the bad stage is not timed"
    assert inferwatch.stats()["drops"] == {"bad_name": 1}
    assert inferwatch.flush()
    drops = [r for r in sdk.records() if r[0] == EV_DROPS]
    assert drops[-1][1] == {"bad_name": 1}


def test_an_invalid_name_in_an_async_with_block_does_not_raise(sdk: Receiver) -> None:
    async def handler() -> str:
        async with inferwatch.stage(""):
            return "done"

    assert asyncio.run(handler()) == "done"
    assert inferwatch.stats()["drops"] == {"bad_name": 1}


def test_a_non_string_name_in_a_with_block_does_not_raise(sdk: Receiver) -> None:
    with inferwatch.stage(None):  # type: ignore[arg-type]
        pass
    assert inferwatch.stats()["drops"] == {"bad_name": 1}


def test_an_exception_in_a_block_with_an_invalid_name_still_propagates(sdk: Receiver) -> None:
    with pytest.raises(KeyError), inferwatch.stage("bad name"):
        raise KeyError("x")
    assert inferwatch.stats()["drops"] == {"bad_name": 1}


def test_invalid_names_are_warned_about_at_most_once_per_interval(
    sdk: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="inferwatch"):
        for i in range(5):
            with inferwatch.stage(_user_stage(i)):
                pass
    warned = [r for r in caplog.records if "not timed" in r.getMessage()]
    assert len(warned) == 1 and "invalid stage name 'user 0'" in warned[0].getMessage()
    assert inferwatch.stats()["drops"] == {"bad_name": 5}


def test_an_invalid_name_before_configure_does_nothing() -> None:
    with inferwatch.stage("bad name"):
        pass
    assert inferwatch.stats() == {}


@pytest.mark.parametrize("bad", ["bad name", "", "1x"])
def test_the_decorator_with_an_invalid_name_still_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid stage name"):
        @inferwatch.stage(bad)
        def f() -> None: ...


def test_the_decorator_with_a_non_string_name_still_raises_type_error() -> None:
    with pytest.raises(TypeError, match="stage name must be a str"):
        inferwatch.stage(b"x")(lambda: None)  # type: ignore[arg-type]


def test_a_valid_name_stays_on_the_plain_stage_class(sdk: Receiver) -> None:
    """The invalid case is a subclass, so a valid stage's enter and exit run no extra check."""
    s = inferwatch.stage("valid_name")
    assert type(s) is _core.stage
    with s:
        pass
    assert inferwatch.stats()["drops"] == {}
