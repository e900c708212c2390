"""The history checker (python -m justonce.testing.check): a clean history passes, and each
rule catches a violation planted in it, with the lines that prove it as the witness."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from justonce.testing.check import RULES, check
from justonce.testing.history import Line, MalformedHistory, Recorder, read, read_all

P, Q, S = 100, 200, 300  # pids: two workers and a standby


def clean() -> list[dict[str, Any]]:
    """A run: job 1 plain, run once; job 2 killed mid-run, re-run under a new token, the
    late write of the first attempt refused; jobs 3 and 4 share a key and run in order;
    job 5 fails once and succeeds; effects once each; slot 0 taken over after its lease
    expired; a batch of two items; a list of two items."""
    h: list[dict[str, Any]] = []

    def at(t: float, ev: str, pid: int = P, **f: Any) -> None:
        h.append({"ev": ev, "t": t, "pid": pid, **f})

    for job, key in ((1, None), (2, None), (3, "a"), (4, "a"), (5, None)):
        at(1.0 + job / 100, "enqueue", 1, job=job, key=key, max_attempts=3)
    at(2.0, "claim", job=1, token=1, attempt=1)
    at(2.1, "start", job=1, token=1)
    at(2.2, "effect", scope="mail", key="u1")
    at(2.3, "end", job=1, token=1)
    at(2.4, "complete", job=1, token=1, accepted=True)
    at(2.0, "claim", Q, job=2, token=1, attempt=1)
    at(2.1, "start", Q, job=2, token=1)
    at(6.0, "claim", job=2, token=2, attempt=2)  # Q froze; its lease ran out
    at(6.1, "start", job=2, token=2)
    at(6.2, "end", job=2, token=2)
    at(6.3, "complete", job=2, token=2, accepted=True)
    at(9.0, "end", Q, job=2, token=1)  # Q wakes
    at(9.1, "complete", Q, job=2, token=1, accepted=False)
    at(3.0, "claim", job=3, token=1, attempt=1)
    at(3.1, "start", job=3, token=1)
    at(3.2, "end", job=3, token=1)
    at(3.3, "complete", job=3, token=1, accepted=True)
    at(3.5, "claim", job=4, token=1, attempt=1)
    at(3.6, "start", job=4, token=1)
    at(3.7, "end", job=4, token=1)
    at(3.8, "complete", job=4, token=1, accepted=True)
    at(4.0, "claim", job=5, token=1, attempt=1)
    at(4.1, "start", job=5, token=1)
    at(4.2, "fail", job=5, token=1, accepted=True, final=False)
    at(4.5, "claim", job=5, token=2, attempt=2)
    at(4.6, "start", job=5, token=2)
    at(4.7, "effect", scope="mail", key="u5")
    at(4.8, "end", job=5, token=2)
    at(4.9, "complete", job=5, token=2, accepted=True)
    at(1.5, "slot_acquire", Q, set="s", slot=0, token=1, until=3.5, lease=2.0)
    at(5.0, "slot_acquire", S, set="s", slot=0, token=2, until=7.0, lease=2.0)
    at(3.2, "slot_act", Q, set="s", slot=0, token=1)
    at(1.6, "slot_acquire", P, set="s", slot=1, token=1, until=3.6, lease=2.0)
    at(2.5, "slot_renew", P, set="s", slot=1, token=1, until=4.5)
    at(4.0, "slot_release", P, set="s", slot=1, token=1)
    at(4.1, "slot_acquire", S, set="s", slot=1, token=2, until=6.1, lease=2.0)
    at(5.0, "batch_ack", batch="b", item=0, accepted=True)
    at(5.1, "batch_ack", batch="b", item=1, accepted=True)
    at(5.2, "batch_ack", Q, batch="b", item=1, accepted=False)
    at(5.3, "batch_complete", batch="b")
    at(1.0, "list_add", 1, list="L", item=0)
    at(1.0, "list_add", 1, list="L", item=1)
    at(2.0, "list_reserve", list="L", item=0, token=7)
    at(2.5, "list_complete", list="L", item=0, token=7, accepted=True)
    at(2.0, "list_reserve", Q, list="L", item=1, token=8)
    at(2.6, "list_complete", Q, list="L", item=1, token=8, accepted=True)
    at(2.0, "effect_start", scope="mail", key="u1", token=1)
    at(2.25, "effect_done", scope="mail", key="u1", token=1, accepted=True)
    for job in (1, 2, 3, 4, 5):
        at(20.0, "final", 1, job=job, state="succeeded", attempts=2 if job in (2, 5) else 1,
           max_attempts=3)
    at(20.0, "batch_items", 1, batch="b", n=2)
    at(20.0, "list_final", 1, list="L", item=0, state="done")
    at(20.0, "list_final", 1, list="L", item=1, state="done")
    return h


def lines(h: list[dict[str, Any]]) -> list[Line]:
    return [Line(d, "history.jsonl", i) for i, d in enumerate(h, 1)]


def verdict(h: list[dict[str, Any]]) -> dict[str, list[str]]:
    r = check(lines(h))
    return {rule: [v.message for v in vs] for rule, vs in r.found.items() if vs}


def test_a_clean_history_has_no_violation() -> None:
    r = check(lines(clean()))
    assert r.violations == 0, r.text()
    assert r.counts["jobs"] == 5 and r.counts["effects"] == 2 and r.counts["acks"] == 2
    assert r.counts["slots"] == 4 and r.counts["list_items"] == 2
    assert all(f"{rule}: ok" in r.text() for rule in RULES)


def plant(h: list[dict[str, Any]], *, drop: Any = None, add: list[dict[str, Any]] = (),  # type: ignore[assignment]
          change: Any = None) -> list[dict[str, Any]]:
    out = [dict(d) for d in h if drop is None or not drop(d)]
    if change is not None:
        for d in out:
            change(d)
    return out + [dict(d, pid=d.get("pid", 999)) for d in add]


def setting(ev: str, match: dict[str, Any], **update: Any) -> Any:
    """A ``change`` for plant(): update the ``ev`` lines whose fields match."""
    def change(d: dict[str, Any]) -> None:
        if d["ev"] == ev and all(d.get(k) == v for k, v in match.items()):
            d.update(update)
    return change


CASES = {
    "no loss": [
        plant(clean(), drop=lambda d: d["ev"] == "final" and d["job"] == 3),
        plant(clean(), change=setting("final", {"job": 4}, state="ready")),
        plant(clean(), drop=lambda d: d["ev"] == "list_final" and d["item"] == 1),
    ],
    "one accepted completion per job": [
        plant(clean(), add=[{"ev": "complete", "t": 9.2, "job": 1, "token": 2, "accepted": True}]),
        plant(clean(), add=[{"ev": "fail", "t": 4.95, "job": 5, "token": 3, "accepted": True, "final": True}]),
    ],
    "at most one effect per key": [
        plant(clean(), add=[{"ev": "effect", "t": 7.0, "scope": "mail", "key": "u1"}]),
    ],
    "no accepted write with an old token": [
        # Q's late write of job 2 accepted although token 2's claim (6.0) came before
        # Q's end (9.0): the late write was sent after a newer claim committed.
        plant(clean(), change=setting("complete", {"job": 2, "token": 1}, accepted=True)),
        plant(clean(), add=[{"ev": "effect_done", "t": 2.3, "scope": "mail", "key": "u1", "token": 1,
                             "accepted": True}]),
        # list item 0 re-reserved by token 9 (its first reservation timed out) and newly
        # done again: one of the two completions should have been refused
        plant(clean(), add=[{"ev": "list_reserve", "t": 3.0, "pid": Q, "list": "L", "item": 0, "token": 9},
                            {"ev": "list_complete", "t": 3.2, "pid": Q, "list": "L", "item": 0, "token": 9,
                             "accepted": True}]),
        plant(clean(), add=[{"ev": "list_complete", "t": 2.7, "list": "L", "item": 0, "token": 7,
                             "accepted": True}]),
        plant(clean(), add=[{"ev": "batch_ack", "t": 5.15, "pid": P, "batch": "b", "item": 0,
                             "accepted": True}]),
    ],
    "one live holder per slot and epoch": [
        # slot 0's token 2 acquired (db time 3.0) while token 1 held it until 3.5
        plant(clean(), change=setting("slot_acquire", {"slot": 0, "token": 2}, until=5.0)),
        plant(clean(), add=[{"ev": "slot_acquire", "t": 1.7, "pid": P, "set": "s", "slot": 0, "token": 1,
                             "until": 3.7, "lease": 2.0}]),
        plant(clean(), add=[{"ev": "slot_act", "t": 5.5, "pid": Q, "set": "s", "slot": 0, "token": 1}]),
        # the same, with token 2's acquisition logged late (its database time is still 5.0)
        plant(clean(), change=setting("slot_acquire", {"slot": 0, "token": 2}, t=6.0),
              add=[{"ev": "slot_act", "t": 5.5, "pid": Q, "set": "s", "slot": 0, "token": 1}]),
    ],
    "one batch completion": [
        plant(clean(), add=[{"ev": "batch_complete", "t": 5.4, "batch": "b"}]),
        plant(clean(), drop=lambda d: d["ev"] == "batch_ack" and d["item"] == 1),
    ],
    "bounded attempts": [
        plant(clean(), add=[{"ev": "start", "t": 4.65, "job": 5, "token": t} for t in (3, 4)]),
        plant(clean(), change=setting("final", {"job": 1}, attempts=4)),
    ],
    "per-key order": [
        # job 4 (enqueued after job 3 with the same key) starts while job 3 still runs
        plant(clean(), change=setting("start", {"job": 4}, t=3.15)),
    ],
}


def test_every_rule_has_planted_cases() -> None:
    assert set(CASES) == set(RULES)


@pytest.mark.parametrize("rule, i", [(r, i) for r, cs in CASES.items() for i in range(len(cs))])
def test_a_planted_violation_is_caught_by_its_rule_with_a_witness(rule: str, i: int) -> None:
    r = check(lines(CASES[rule][i]))
    found = r.found.get(rule, [])
    assert found, f"{rule} missed case {i}:\n{r.text()}"
    assert all(v.witness for v in found)
    # Nothing else is accused, but for the rules a planted line also breaks on its own.
    others = {k for k, v in r.found.items() if v and k != rule}
    assert others <= {"no loss", "one accepted completion per job", "one batch completion"}, r.text()


def test_the_witness_is_the_lines_that_prove_it() -> None:
    r = check(lines(CASES["one accepted completion per job"][0]))
    (v,) = r.found["one accepted completion per job"]
    assert [w.data["token"] for w in v.witness] == [1, 2]
    assert all(w.where().startswith("history.jsonl:") for w in v.witness)


@settings(max_examples=30, deadline=None)
@given(st.randoms(use_true_random=False))
def test_the_verdict_does_not_depend_on_the_order_of_the_lines(rnd: Any) -> None:
    for h in (clean(), CASES["per-key order"][0], CASES["no loss"][0]):
        shuffled = list(h)
        rnd.shuffle(shuffled)
        assert verdict(shuffled) == verdict(h)


def write(path: Path, h: list[dict[str, Any]], tail: bytes = b"") -> None:
    path.write_bytes(b"".join(json.dumps(d).encode() + b"\n" for d in h) + tail)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "justonce.testing.check", *args],
                          capture_output=True, text=True, timeout=60)


def test_the_command_prints_the_verdict_and_ends_with_the_count(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write(good, clean())
    write(bad, CASES["at most one effect per key"][0])
    out = run_cli(str(good))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "violations: 0"
    out = run_cli(str(bad))
    assert out.returncode == 1
    assert out.stdout.strip().splitlines()[-1] == "violations: 1"
    assert "at most one effect per key: 1 VIOLATION" in out.stdout
    assert "bad.jsonl:" in out.stdout  # the witness says where


def test_a_line_cut_by_a_kill_is_skipped_and_garbage_is_refused(tmp_path: Path) -> None:
    cut = tmp_path / "cut.jsonl"
    write(cut, clean(), tail=b'{"ev":"complete","t":9.9,"pid":1,"jo')
    got = read_all([cut])
    assert got.cut == 1 and len(got.lines) == len(clean())
    out = run_cli(str(cut))
    assert out.returncode == 0 and "1 cut-off last lines skipped" in out.stdout
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b'{"ev":"enqueue","t":1,"job":1}\nnot json at all\n{"ev":"x","t":2}\n')
    out = run_cli(str(garbage))
    assert out.returncode == 2 and "garbage.jsonl:2" in out.stderr
    out = run_cli(str(tmp_path / "missing.jsonl"))
    assert out.returncode == 2
    missing_field = tmp_path / "field.jsonl"
    write(missing_field, [{"ev": "claim", "t": 1.0, "job": 1}])
    with pytest.raises(MalformedHistory, match="without token"):
        check(read([missing_field]))
    assert run_cli().returncode == 2


def test_many_processes_append_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    code = ("import sys\nfrom justonce.testing.history import Recorder\n"
            "r = Recorder(sys.argv[1])\n"
            "for i in range(2000): r.record('effect', scope='s', key=f'{sys.argv[2]}-{i}', pad='x' * 300)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(n)]) for n in range(6)]
    assert all(p.wait(60) == 0 for p in procs)
    got = read_all([path])
    assert got.cut == 0 and len(got.lines) == 12000
    assert check(got.lines).violations == 0
    Recorder(path).close()
