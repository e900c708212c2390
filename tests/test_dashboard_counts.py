"""The dashboard's counts: exact on a small table, bounded on a big one (never a full
count), and what a capped or estimated count looks like."""

from __future__ import annotations

import pytest

from justonce import App
from justonce.backends import dashstore
from justonce.backends.dashstore import Count
from justonce.errors import CountChanged, JustonceError
from justonce.web.dashboard import ERRORS, _error_code, fmt_count
from justonce.web.snapshot import Snapshots


def _jobs(app: App) -> None:
    @app.task(name="work")
    def work(i: int) -> None:
        pass

    app.enqueue_calls("work", [(i,) for i in range(40)], queue="big")
    small = app.enqueue_calls("work", [(i,) for i in range(3)], queue="small")
    app.cancel(small[0])


def test_a_small_table_is_counted_exactly(app: App) -> None:
    _jobs(app)
    counts = app.backend.dash_counts()
    assert counts == {("big", "ready"): Count(40), ("small", "ready"): Count(2),
                      ("small", "cancelled"): Count(1)}
    snap = Snapshots(app, interval=60).get()
    assert snap.kinds == {"exact"}  # no "≈ estimate" footnote when every count is exact


def test_a_big_table_is_counted_within_the_cap_and_small_queues_stay_exact(
        app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    _jobs(app)
    monkeypatch.setattr(dashstore, "EXACT_BELOW", 30)
    monkeypatch.setattr(dashstore, "COUNT_CAP", 10)
    counts = app.backend.dash_counts()
    big = counts[("big", "ready")]
    # At least the cap: "10+" or, where a sample says more, an estimate.
    assert big.kind in ("capped", "estimate") and big.n >= 10, big
    assert counts[("small", "ready")] == Count(2)
    assert "capped" in Snapshots(app).get().kinds or big.kind == "estimate"


def test_a_count_that_reaches_the_cap_reads_as_a_lower_bound() -> None:
    assert fmt_count(Count(10_000, "capped")) == "10,000+"
    assert fmt_count(Count(10_000)) == "10,000"
    assert fmt_count(Count(1_234_567, "estimate")) == "≈1.2M"


def test_error_redirects_carry_a_known_code_never_the_text() -> None:
    assert _error_code(CountChanged("<script>")) == "count_changed"
    assert _error_code(JustonceError("anything")) == "failed"
    assert set(ERRORS) >= {"count_changed", "failed"}
