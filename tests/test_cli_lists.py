"""``justonce lists …`` on real databases: a list loaded from a JSON-lines file (and from
stdin), a bad line that stops the load with its number and leaves the list unsealed, show
and list, kick, and ``lists run --parallelism 3`` as real processes whose task writes one
ledger row per item run: every item runs exactly once; SIGTERM and SIGINT stop every
process after its current item."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import proc_app
from fleet import proc_app_on, wait_for
from justonce import App
from justonce.cli import cli

HERE = Path(__file__).resolve().parent


def run(*args: str, ok: bool = True, stdin: bytes | None = None):  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def jsonl(path: Path, items: list[object], extra: bytes = b"") -> Path:
    path.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in items) + extra)
    return path


def lists_run(url: str, name: str, parallelism: int, *more: str) -> subprocess.Popen[str]:
    """``justonce lists run`` as a real process (it starts its own children)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    env.pop("JUSTONCE_DATABASE_URL", None)
    return subprocess.Popen([sys.executable, "-m", "justonce", "lists", "run", name, "--parallelism",
                             str(parallelism), "--app", "proc_app:app", "--database-url", url, *more],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.fixture
def app(db_url: str) -> Iterator[App]:
    with proc_app_on(db_url) as a:
        yield a


def test_create_from_a_file_and_from_stdin_then_show_and_list(app: App, db_url: str, tmp_path: Path) -> None:
    url = ["--database-url", db_url]
    items = [{"user": i, "name": f"user {i} \u00e9"} for i in range(25_000)]
    path = jsonl(tmp_path / "items.jsonl", items[:12_000], b"\n   \n")
    with path.open("ab") as f:  # blank lines are skipped, wherever they are
        f.write(b"".join(json.dumps(x).encode() + b"\n" for x in items[12_000:]))
    out = run("lists", "create", "users", "--from", str(path), "--ttr", "30", "--max-attempts", "3",
              *url).output
    assert "25,000 items appended, 25,000 in all, sealed" in out
    info = app.lists.get("users")
    assert (info.state, info.progress.total, info.ttr, info.max_attempts) == ("sealed", 25_000, 30.0, 3)
    res = app.lists.reserve("users", 10_000)
    assert res is not None
    assert app.lists.items(res) == [(i, items[i]) for i in range(10_000)]
    piped = run("lists", "create", "piped", "--from", "-", "--no-seal", *url,
                stdin=b'"a"\n["b"]\n{"c": 1}\n').output
    assert "3 items appended" in piped and "not sealed" in piped
    assert app.lists.get("piped").state == "loading"
    listing = run("lists", "list", *url).output
    assert "users" in listing and "piped" in listing and "25,000" in listing and "loading" in listing
    shown = run("lists", "show", "users", *url).output
    assert "sealed" in shown and "25,000" in shown and "10,000" in shown  # total, reserved
    missing = run("lists", "show", "nobody", *url, ok=False)
    assert missing.exit_code == 1 and "ListNotFound" in missing.output
    again = run("lists", "create", "users", "--from", str(path), *url, ok=False)
    assert again.exit_code == 1 and "ListExists" in again.output
    assert app.lists.get("users").progress.total == 25_000


def test_a_bad_line_stops_with_its_number_and_the_list_stays_unsealed(app: App, db_url: str,
                                                                      tmp_path: Path) -> None:
    url = ["--database-url", db_url]
    good = list(range(12_345))
    path = jsonl(tmp_path / "broken.jsonl", good, b'{"oops": \n7\n')
    result = run("lists", "create", "broken", "--from", str(path), *url, ok=False)
    assert result.exit_code == 1
    message = result.output.strip().splitlines()[-1]
    assert message.startswith("Error: line 12346 of ") and "not JSON" in message
    assert "12,345 items before it were appended and stay" in message and "NOT sealed" in message
    info = app.lists.get("broken")
    assert (info.state, info.progress.total) == ("loading", 12_345)
    # The rest, fixed, is appended and the list sealed.
    rest = jsonl(tmp_path / "rest.jsonl", [12_345, 12_346])
    assert "2 items appended, 12,347 in all, sealed" in run("lists", "append", "broken", "--from", str(rest),
                                                            *url).output
    # An item the database cannot take (over 256 KiB) stops the load the same way.
    big = jsonl(tmp_path / "big.jsonl", ["ok", "x" * 300_000, "never"])
    result = run("lists", "create", "big", "--from", str(big), *url, ok=False)
    assert result.exit_code == 1 and "big.jsonl: PayloadTooLarge: " in result.output
    assert "at most 262144 bytes" in result.output and "1 items before it" in result.output
    assert app.lists.get("big").progress.total == 1 and app.lists.get("big").state == "loading"
    assert "Traceback" not in result.output


def test_a_bad_line_before_any_item_was_appended_leaves_no_list(app: App, db_url: str,
                                                                 tmp_path: Path) -> None:
    url = ["--database-url", db_url]
    for name, body in (("first", b'{"oops": \n1\n'), ("nul", b'"a\\u0000b"\n1\n'),
                       ("deep", b"[" * 10_000 + b"]" * 10_000 + b"\n"),
                       ("big", b'"' + b"x" * 300_000 + b'"\n')):
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(body)
        result = run("lists", "create", name, "--from", str(path), *url, ok=False)
        message = result.output.strip().splitlines()[-1]
        assert result.exit_code == 1 and message.startswith("Error: line "), result.output
        assert "nothing was appended" in message and "not created" in message, message
        assert name not in {i.name for i in app.lists.list()}


def test_create_makes_the_list_with_its_first_chunk_so_nobody_sees_it_empty(
        app: App, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lists create` made an empty, unsealed list, then appended: a seal in between (or a
    kill -9) left an empty list, completed at once by the seal. Now the first chunk is stored
    in the transaction that creates the list; a taken name is refused before the file is
    read; an empty file still makes its (empty) list."""
    from justonce import lists as lists_module

    url = ["--database-url", db_url]
    seen: list[int] = []
    create = lists_module.Lists.create

    def watching(self: lists_module.Lists, name: str, **kw: object) -> object:
        info = create(self, name, **kw)  # type: ignore[arg-type]
        seen.append(info.progress.total)
        return info

    monkeypatch.setattr(lists_module.Lists, "create", watching)
    monkeypatch.setattr("justonce.cli_lists.LOAD_CHUNK", 40)
    run("lists", "create", "whole", "--from", str(jsonl(tmp_path / "a.jsonl", list(range(100)))), *url)
    assert seen == [40] and app.lists.get("whole").progress.total == 100  # made with 40, then appended
    result = run("lists", "create", "whole", "--from", str(tmp_path / "a.jsonl"), *url, ok=False)
    assert result.exit_code == 1 and "ListExists" in result.output, result.output
    assert app.lists.get("whole").progress.total == 100
    (tmp_path / "empty.jsonl").write_bytes(b"\n")
    run("lists", "create", "nothing", "--from", str(tmp_path / "empty.jsonl"), *url)
    assert app.lists.get("nothing").state == "completed" and seen == [40, 0]


def test_kick_revives_buried_positions(app: App, db_url: str) -> None:
    url = ["--database-url", db_url]
    app.lists.create("kicks", items=range(6))
    res = app.lists.reserve("kicks", 6)
    assert res is not None
    app.lists.bury(res, positions=[0, 1], reason="poison")
    app.lists.bury(res, positions=[4], reason="again")
    shown = run("lists", "show", "kicks", *url).output
    assert "0-1 (attempt 1" in shown and "poison" in shown
    kicked = run("lists", "kick", "kicks", "--limit", "1", *url).output
    assert "kicked 2 buried positions of list kicks" in kicked  # a buried range goes back whole
    assert "kicked 1 buried" in run("lists", "kick", "kicks", *url).output
    assert app.lists.progress("kicks").buried == 0
    assert "kicked 0" in run("lists", "kick", "kicks", *url).output
    assert "ListNotFound" in run("lists", "kick", "nope", *url, ok=False).output


def test_run_needs_the_app_of_the_lists_task(app: App, db_url: str) -> None:
    url = ["--database-url", db_url]
    app.lists.create("tasked", task="proc_app.list_item", items=[1])
    app.lists.create("untasked", items=[1])
    app.lists.create("open", task="proc_app.list_item", seal=False)
    result = run("lists", "run", "tasked", "-p", "2", *url, ok=False)
    assert result.exit_code == 1 and "--app MODULE:APP" in result.output
    assert "has no task" in run("lists", "run", "untasked", "--app", "proc_app:app", *url, ok=False).output
    assert "still loading" in run("lists", "run", "open", "--app", "proc_app:app", *url, ok=False).output
    assert app.lists.progress("tasked").ready == 1


def test_run_with_three_processes_runs_every_item_exactly_once(app: App, db_url: str, tmp_path: Path) -> None:
    n = 900
    path = jsonl(tmp_path / "items.jsonl", list(range(n)))
    run("lists", "create", "work", "--from", str(path), "--task", "proc_app.list_item",
        "--on-complete", "proc_app.batch_done", "--app", "proc_app:app", "--database-url", db_url)
    proc = lists_run(db_url, "work", 3)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err
    assert f"{n:,} of {n:,} done, 0 buried" in out and f"{n:,} completed by 3 processes" in out
    rows = proc_app.ledger_rows(db_url, "list")
    assert Counter(r[0] for r in rows) == Counter(range(n)), "every item ran exactly once"
    assert len({r[1] for r in rows}) >= 2, "the items were shared among the processes"
    info = app.lists.get("work")
    assert info.state == "completed" and info.progress.done == n
    assert len(app.list_jobs(task="proc_app.batch_done", limit=10)) == 1  # on_complete, once


def test_run_says_when_the_task_fails(app: App, db_url: str) -> None:
    """A failing task's attempts are said on screen (the first at once, then a line each
    5 s per process): a list whose task always failed sat at 0 done through its backoffs
    with nothing said. Buried positions are named at the end."""
    app.lists.create("odd", task="proc_app.list_odd_fails", items=range(6))
    proc = lists_run(db_url, "odd", 1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert "list odd: 1 attempt(s) failed in process" in err, err
    assert "ValueError: odd item 1" in err and "retried after a backoff" in err, err
    assert "3 of 6 done, 3 buried" in out and "revive them with `justonce lists kick odd`" in out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_every_process_after_its_current_item(app: App, db_url: str,
                                                            sig: signal.Signals) -> None:
    app.lists.create("slow", task="proc_app.list_slow", items=range(60))
    proc = lists_run(db_url, "slow", 2)
    wait_for(lambda: len(proc_app.ledger_rows(db_url, "list")) >= 3, 60, "a few items done")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, out + err
    assert f"stopped by {sig.name}" in out and "Traceback" not in err
    started = Counter(r[0] for r in proc_app.ledger_rows(db_url, "list_start"))
    finished = Counter(r[0] for r in proc_app.ledger_rows(db_url, "list"))
    assert started == finished, "each process finished the item it had started"
    p = app.lists.progress("slow")
    assert (p.reserved, p.done, p.ready) == (0, sum(finished.values()), 60 - sum(finished.values()))
    assert p.done < 60
    time.sleep(0.5)
    assert len(proc_app.ledger_rows(db_url, "list_start")) == sum(started.values()), "no process ran on"
