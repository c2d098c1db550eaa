"""A version's window: class counts, the class cap and its overflow bucket, per sub-window."""

from __future__ import annotations

import random

import numpy as np

from inferwatch_sidecar.components.canary.window import OTHER_CLASS, VersionWindow


def _one_by_one(preds_by_slot: list[list[str]], subwindows: int, max_classes: int) -> dict[str, list[int]]:
    """The reference: each prediction counted alone, a class past the cap into OTHER_CLASS."""
    classes: dict[str, list[int]] = {}
    for slot, preds in enumerate(preds_by_slot):
        for p in preds:
            if p not in classes and len(classes) >= max_classes - 1:
                p = OTHER_CLASS
            classes.setdefault(p, [0] * subwindows)[slot] += 1
    return classes


def test_class_counts_and_the_cap_match_counting_one_record_at_a_time() -> None:
    rng = random.Random(7)
    for _ in range(200):
        subwindows, max_classes = rng.randint(1, 4), rng.randint(2, 8)
        names = [f"c{i}" for i in range(rng.randint(1, 12))]
        preds_by_slot = [[rng.choice(names) for _ in range(rng.randint(0, 40))] for _ in range(subwindows)]
        w = VersionWindow(("svc", "m", "v1"), subwindows, max_stages=4, max_classes=max_classes)
        for slot, preds in enumerate(preds_by_slot):
            w.add_records(slot, [0.5] * len(preds), preds)
        want = _one_by_one(preds_by_slot, subwindows, max_classes)
        assert {k: v.tolist() for k, v in w.classes.items()} == want
        assert list(w.classes) == list(want)  # classes are made in first-seen order
        assert len(w.classes) <= max_classes
        assert int(sum(v.sum() for v in w.classes.values())) == sum(map(len, preds_by_slot))
        assert np.array_equal(w.conf.sum(axis=1), [len(p) for p in preds_by_slot])
