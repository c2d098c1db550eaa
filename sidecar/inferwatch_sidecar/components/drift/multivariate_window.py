"""The streaming joint-drift detector of one model version: its records' reconstruction errors in a window.

A :class:`JointWindow` turns each batch of records (of one feature schema)
into their reconstruction errors under the profile's joint model
(:mod:`.multivariate`) and keeps them, binned on the model's held-out error
bins, in a :class:`~inferwatch_sidecar.components.drift.window.ColumnWindow`
ring that rotates with the model version's other windows. Its size depends on
the model (at most 64 x 64 numbers) and the error bins, never on the traffic.

It meets the detector contract (:mod:`inferwatch_sidecar.components.detector`);
its state carries the model, so a warm-up reference's model survives a restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from inferwatch_sidecar.components.drift import engine, multivariate
from inferwatch_sidecar.components.drift.multivariate import JointModel
from inferwatch_sidecar.components.drift.window import ColumnWindow
from inferwatch_sidecar.stats.columns import NumericColumn

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; annotations only


class JointWindow:
    """Reconstruction errors of a model version's records, in a ring of sub-windows (see the module docstring).

    Args:
        model: the profile's joint model.
        subwindows: sub-windows in the ring.
    """

    __slots__ = ("_model", "_window")

    RESULTS = ("summary",)

    def __init__(self, model: JointModel, subwindows: int) -> None:
        self._model = model
        self._window = ColumnWindow(model.errors, subwindows)

    def update(self, num_names: Sequence[str], nums: np.ndarray | None, cat_names: Sequence[str],
               cats: Sequence[Sequence[Any]]) -> None:
        """Add records of one schema: their numbers (rows x ``num_names``) and categorical value tuples."""
        rows = len(cats) if nums is None else int(nums.shape[0])
        mat = nums if nums is not None else np.zeros((rows, 0))
        self._window.update(self._model.errors_of_records(num_names, mat, cat_names, cats))

    def rotate(self) -> None:
        """Start the next sub-window, forgetting the oldest one."""
        self._window.rotate()

    @property
    def summary(self) -> engine.Summary:
        """The window's errors on the model's error bins (a fresh copy)."""
        return self._window.summary

    @property
    def model(self) -> JointModel:
        return self._model

    @property
    def window(self) -> ColumnWindow:
        """The ring of error counts (read it, do not feed it)."""
        return self._window

    @property
    def nbytes(self) -> int:
        return self._window.nbytes + self._model.nbytes

    def score(self, settings: engine.Settings, errors: NumericColumn | None = None,
              current: engine.Summary | None = None) -> multivariate.JointResult:
        """The raw joint test of the window against the held-out errors (or ``errors``, on ``current``)."""
        return multivariate.score(self._model, errors if errors is not None else self._model.errors,
                                  current if current is not None else self.summary, settings)

    def to_state(self) -> dict[str, Any]:
        """Plain-JSON state, the model included; ``from_state`` rebuilds the window."""
        return {"model": self._model.to_json(), "window": self._window.to_state()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Self:
        """Rebuild a joint window from ``to_state()``.

        Raises:
            ValueError: the model or the window state is malformed (``ProfileError`` for the model).
        """
        raw = state.get("model")
        names = [e.get("name") for e in raw.get("inputs", [])] if isinstance(raw, dict) else []
        model = multivariate.from_json(raw, [n for n in names if isinstance(n, str)])
        win = ColumnWindow.from_state(state.get("window") or {})
        if win.ref.to_json() != model.errors.to_json():
            raise ValueError("the joint window's error bins are not its model's")
        out = cls(model, win.subwindows)
        out._window = win
        return out


__all__ = ["JointWindow"]
