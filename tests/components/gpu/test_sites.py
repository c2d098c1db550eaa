"""The torch probe's allocation sites in the sidecar: bounded per process and device, shown in ``/v1/status``
beside the process, its allocator entry, its leak and the episode they were captured in."""

from __future__ import annotations

import random
from typing import Any

import pytest

from inferwatch.wire import EV_ALLOC_SITE
from inferwatch_sidecar.components.gpu import sites as sm
from inferwatch_sidecar.components.gpu.sites import SiteCaptures, in_episode, site_of
from tests.components.gpu.test_component import scenario
from tests.components.gpu.test_sampler_faults import values

LEAK = ("/srv/app/cache.py", 42, "remember")


def site(t: float, file: str, line: int, nbytes: int, count: int = 1, device: int = 0,
         function: str | None = "f") -> tuple[Any, ...]:
    return (EV_ALLOC_SITE, int(t * 1e9), device, file, line, function, nbytes, count)


def test_site_events_are_validated_by_reason() -> None:
    assert site_of(site(5.0, "a.py", 3, 10, 2)) == (5 * 10**9, 0, {"file": "a.py", "line": 3, "function": "f",
                                                                   "bytes": 10, "count": 2})
    assert site_of(site(5.0, None, 0, 0, function=None))[2]["file"] == "?"
    for bad, reason in [((EV_ALLOC_SITE, 1), "bad_layout"), ((9, 1, 0, "a", 1, "f", 1, 1), "bad_layout"),
                        (site(1.0, "a", -1, 5), "bad_value"), (site(1.0, 7, 1, 5), "bad_value"),  # type: ignore[arg-type]
                        (site(1.0, "a", 1, 5, function=b"f"), "bad_value"),  # type: ignore[arg-type]
                        ((EV_ALLOC_SITE, 1, 0, "a", True, "f", 1, 1), "bad_value")]:
        with pytest.raises(ValueError, match=reason):
            site_of(bad)


@pytest.mark.parametrize("seed", range(5))
def test_captures_stay_bounded_and_keep_the_newest(seed: int) -> None:
    rng = random.Random(seed)
    caps = SiteCaptures()
    sent: dict[tuple[int, int], dict[float, int]] = {}
    for _ in range(4000):
        pid, dev = rng.randrange(400), rng.randrange(2)
        at = float(rng.randrange(10))
        caps.add(pid, int(at * 1e9), dev, {"file": "x.py", "line": rng.randrange(100), "function": "f",
                                            "bytes": rng.randrange(1 << 30), "count": 1})
        sent.setdefault((pid, dev), {}).setdefault(at, 0)
        sent[(pid, dev)][at] += 1
    assert len(caps) == sm.MAX_KEYS
    for (pid, dev), by_at in sent.items():
        got = caps.of(pid, dev)
        if not got:
            continue
        # The newest captures of the key, oldest first, each holding at most MAX_SITES of what it was sent.
        assert [c.at for c in got] == sorted(got_at := [c.at for c in got]) and len(got_at) <= sm.MAX_CAPTURES_PER_KEY
        assert set(got_at) <= set(by_at)
        for c in got:
            assert len(c.sites) <= min(sm.MAX_SITES, by_at[c.at])
        d = caps.latest(pid, dev)
        assert d is not None and d["captured_at"] == got[-1].at
        assert [s["bytes"] for s in d["sites"]] == sorted((s["bytes"] for s in d["sites"]), reverse=True)
    caps.keep([])
    assert len(caps) == 0


def test_a_capture_belongs_to_the_episode_it_fell_in() -> None:
    caps = SiteCaptures()
    for at in (100.0, 2000.0, 5000.0):
        caps.add(7, int(at * 1e9), 0, {"file": f"{at}.py", "line": 1, "function": "f", "bytes": 1, "count": 1})
    got = caps.of(7)
    assert in_episode(got, 1500.0, 3000.0)["captured_at"] == 2000.0  # type: ignore[index]
    assert in_episode(got, 2500.0, None)["captured_at"] == 5000.0  # type: ignore[index]  # open: the newest
    assert in_episode(got, 100.0 + sm.BEFORE_ONSET_S + 1, 1900.0) is None
    assert in_episode(got, 4000.0 + sm.BEFORE_ONSET_S, 4500.0) is None


def test_status_shows_the_sites_by_process_leak_and_episode() -> None:
    def extra(i: int, t: float) -> list[tuple[Any, ...]]:
        if i == 450:  # the probe's recording ends while the leak runs
            return [site(t, LEAK[0], LEAK[1], 900 << 20, 30, function=LEAK[2]), site(t, "/srv/app/model.py", 17, 64 << 20, 2)]
        if i == 5:  # an earlier capture, long before the leak's onset
            return [site(t, "/srv/app/warm.py", 3, 1 << 20)]
        return []

    comp, _clock = scenario("tensor", extra)
    st = comp.status()
    want = [{"file": LEAK[0], "line": 42, "function": "remember", "bytes": 900 << 20, "count": 30},
            {"file": "/srv/app/model.py", "line": 17, "function": "f", "bytes": 64 << 20, "count": 2}]
    proc = st["devices"][0]["processes"][0]
    assert proc["verdict"] == "leak" and proc["cause"] == "tensor"
    assert proc["sites"]["sites"] == want
    assert st["allocator"][0]["sites"] == proc["sites"]
    (leak,) = [x for x in st["leaks"] if x["pid"] == 50]
    assert leak["sites"] == proc["sites"]
    eps = [e for e in st["episodes"] if e["pid"] == 50]
    assert eps and eps[-1]["sites"] == proc["sites"]
    assert eps[-1]["onset_estimate"] - sm.BEFORE_ONSET_S <= proc["sites"]["captured_at"]
    # Sites are status only: no metric carries a file name.
    assert not any("remember" in str(lab) or "cache.py" in str(lab) for (_n, lab) in values(comp))


def test_malformed_site_records_are_counted_and_dropped() -> None:
    comp, clock = scenario("native")
    comp.handle(50, 1, [(EV_ALLOC_SITE, 1), site(clock.t, "a.py", -3, 5), site(clock.t, "a.py", 3, 5)])
    v = values(comp)
    assert v[("inferwatch_gpu_allocator_records_dropped_total", (("reason", "bad_layout"),))] == 1
    assert v[("inferwatch_gpu_allocator_records_dropped_total", (("reason", "bad_value"),))] == 1
    assert comp.status()["allocator"][0]["sites"]["sites"][0]["file"] == "a.py"


def test_a_flood_of_site_records_is_bounded_and_counted_until_the_sampler_folds_it() -> None:
    comp, clock = scenario("native")
    n = sm.MAX_KEYS * sm.MAX_SITES
    comp.handle(50, 1, [site(clock.t, "a.py", i, 5) for i in range(n + 7)])
    assert len(comp._site_inbox) == n
    v = values(comp)
    assert v[("inferwatch_gpu_allocator_records_dropped_total", (("reason", "sites_full"),))] == 7
    comp.status()  # folds the queue under the lock: the capture holds at most MAX_SITES of them
    assert len(comp._site_inbox) == 0
    assert len(comp.status()["allocator"][0]["sites"]["sites"]) == sm.MAX_SITES
