"""The one contract every detector meets: the GPU leak detector and the per-column drift windows.

After river's ``base/drift_detector.py``: a detector is fed with ``update(...)``
and read through read-only result properties, named in ``RESULTS``. Its whole
state round-trips through plain JSON: ``type(d).from_state(d.to_state())`` is a
detector that gives the same results as ``d`` on every further update. That is
what a checkpoint stores, so a checkpoint never reaches into a detector's
internals, and what ``tests/components/test_detector_contract.py`` checks for
every implementation, along with bounded memory on a long stream and identical
results on identical seeded streams.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; annotations only


@runtime_checkable
class Detector(Protocol):
    """What a detector offers (see the module docstring)."""

    #: Names of the read-only result properties.
    RESULTS: ClassVar[tuple[str, ...]]

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Feed observations; what they are depends on the detector."""
        ...

    def to_state(self) -> dict[str, Any]:
        """The whole state as JSON-able data (dicts, lists, strings, numbers, None)."""
        ...

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Self:
        """Rebuild a detector from ``to_state()``. Raises ``ValueError`` on a state it cannot use."""
        ...
