"""The main job, end to end: ``justonce demo push`` with real worker processes, a real SMTP
server and a worker killed with kill -9 in the middle of its chunks, on every backend. The
demo's own report must show no duplicate (counted by the SMTP server, per recipient), the
users never reached exactly the entries in doubt that were never sent, and ``--redo``
reaching each of them once."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import LONG
from fleet import process_state

pytestmark = pytest.mark.slow


def report_value(output: str, label: str) -> str:
    m = re.search(re.escape(label) + r"\s*│\s*([^│]+?)\s*│", output)
    assert m, f"no {label!r} in the report:\n{output}"
    return m.group(1)


def number(output: str, label: str) -> int:
    return int(report_value(output, label).replace(",", ""))


def demo_push(db_url: str, tmp_path: Path, *args: str,
              timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="140")
    env.pop("JUSTONCE_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "justonce", "demo", "push", "--database-url", db_url, *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def ab_split(output: str) -> tuple[int, int]:
    a, b = report_value(output, "A/B phase: variant A / variant B (by the ledger)").split("/")
    return int(a.replace(",", "")), int(b.replace(",", ""))


def phases_sum(output: str) -> int:
    """The report's rows that say how each email marked sent came to be, added up: A/B,
    rest, and in doubt resolved done by the server's log."""
    a, b = ab_split(output)
    return a + b + number(output, "rest phase: winner A sent (by the ledger)") + number(
        output, "in doubt, resolved done by the SMTP server's log")


def killed_push(db_url: str, tmp_path: Path, *args: str) -> str:
    """Run a Push with ``--kill-one``: its output, once it exited 0, killed a worker and
    sent no user two emails (by the SMTP server's count)."""
    result = demo_push(db_url, tmp_path, *args, "--kill-one")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "killed worker pid" in out, out
    assert number(out, "users who received two emails of this Push") == 0
    return out


def test_a_worker_killed_mid_chunk_leaves_exactly_its_unsent_users_and_redo_reaches_them_once(
        db_url: str, tmp_path: Path) -> None:
    # (60,000 users: a list of ~5,600, well over the A/B phase's 2,000; 200,000 in the long form)
    out = killed_push(db_url, tmp_path, "--users", "200000" if LONG else "60000", "--workers", "4",
                      "--senders", "4", "--redo")
    assert re.search(r"4 slot\s+jobs\s+per\s+phase", out)
    listed = number(out, "users in the list (L)")
    in_doubt = number(out, "in doubt after the run (a worker died between sends and done marks)")
    delivered = number(out, "  of them delivered, by the SMTP server's log (resolved done)")
    never_sent = number(out, "  of them never sent")
    # Killed inside its chunks: its senders' claimed, unmarked users are in doubt, and the
    # ones the server never got are exactly the users the run never reached.
    assert in_doubt > 0 and in_doubt == delivered + never_sent, out
    assert number(out, "users the server had no message for after the run") == never_sent, out
    assert number(out, "sent again with --redo (the never sent)") == never_sent, out
    # After the redo every user of the list has exactly one email, by the server and the ledger.
    assert number(out, "users of the list never reached") == 0
    assert number(out, "messages the SMTP server received") == listed
    assert number(out, "emails marked sent in the effect ledger") == listed
    assert phases_sum(out) == listed, out
    assert "every user of the list got exactly one email" in out
    # The kill line counts after the kill: what the server had then, what the ledger had.
    m = re.search(r"killed worker pid \d+ with SIGKILL: ([\d,]+) emails received by the\s+server,\s+"
                  r"([\d,]+)\s+marked\s+sent", out)
    assert m, out
    assert 0 < int(m.group(2).replace(",", "")) <= int(m.group(1).replace(",", "")) <= listed
    # The rest phase started while the A/B phase was still sending (the seed's race).
    started = re.search(r"rest phase started with ([\d,]+) of 2,000 A/B emails sent: ([\d,]+) users of the "
                        r"list\s+not reached yet, ([\d,]+) of them still waiting", out)
    assert started, out
    # One moment's numbers: R as the rest phase read it.
    sent_ab, rest, waiting = (int(g.replace(",", "")) for g in started.groups())
    assert rest == listed - sent_ab and waiting == 2000 - sent_ab, started.group(0)
    assert "the sending time includes the waits for the killed worker's leases" in out
    assert number(out, "mail server ceiling (16 plain senders)") > 0


@pytest.fixture
def smtp_sink() -> Iterator[str]:
    """Postfix's ``smtp-sink`` on a free port of 127.0.0.1: a fast external server, which
    takes each message and keeps nothing (skipped where it is not installed)."""
    from justonce.demo.mail import free_port

    exe = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
    if not os.path.exists(exe):
        pytest.skip("no smtp-sink (apt-get install postfix)")
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([exe, *(["-u", "nobody"] if os.geteuid() == 0 else []), address, "1024"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        host, port = address.rsplit(":", 1)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "smtp-sink did not start"
                time.sleep(0.1)
        yield address
    finally:
        proc.terminate()
        proc.wait(10)


def test_kill_one_into_a_fast_external_server_kills_a_worker_inside_a_chunk_every_time(
        db_url: str, tmp_path: Path, smtp_sink: str) -> None:
    """``--kill-one --smtp`` into smtp-sink, three times in a row (once in CI's short form):
    each run kills one worker with live claims of the Push (its entries left in doubt),
    and no user is marked sent twice. Against a server this fast the Push once ended
    before the kill landed (the workers were looked at one at a time, the others sending
    on meanwhile): nothing killed, and nothing said of it but a "no" in the table."""
    for run in range(3 if LONG else 1):
        result = demo_push(db_url, tmp_path, "--users", "60000", "--smtp", smtp_sink, "--kill-one")
        out = result.stdout + result.stderr
        assert result.returncode == 0, out
        assert "killed worker pid" in out and "no worker was killed" not in out, (run, out)
        assert report_value(out, "worker killed with SIGKILL").startswith("yes (pid "), out
        # Killed inside its chunk: its claimed, unmarked users are in doubt, never reached.
        never = number(out, "users of the list never reached")
        assert never > 0 and number(out, "  of them in doubt") == never, out


def test_kill_one_on_a_push_too_small_to_catch_a_worker_in_a_chunk_says_so_plainly(
        tmp_path: Path, smtp_sink: str) -> None:
    """A list of ~90 into smtp-sink: the A/B phase sends it in a few chunks of 25, each a
    few milliseconds long, and the Push may end before a look finds a worker inside one.
    Either a worker was killed, and the report says which, or the demo says in words that
    none was, and the table does not claim one."""
    result = demo_push(f"sqlite:///{tmp_path / 'small.db'}", tmp_path, "--users", "1000", "--smtp", smtp_sink,
                       "--kill-one", timeout=180)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    killed = report_value(out, "worker killed with SIGKILL")
    if "killed worker pid" in out:
        assert killed.startswith("yes (pid ") and "no worker was killed" not in out, out
    else:
        said = r"--kill-one: no worker was killed: (the Push ended before 40%|at each of \d+ look)"
        assert re.search(said, out), out
        assert killed == "no: the Push ended first", out


def test_the_per_user_jobs_push_with_a_killed_worker_sends_no_user_two_emails(
        db_url: str, tmp_path: Path) -> None:
    if not LONG and not db_url.startswith("sqlite"):
        pytest.skip("the per-user path (kept to compare) runs on every backend with JUSTONCE_LONG_TESTS=1")
    out = killed_push(db_url, tmp_path, "--users", "25000", "--workers", "4", "--per-user-jobs")
    assert re.search(r"one\s+job\s+per\s+user", out)
    ledger = number(out, "emails marked sent in the effect ledger")
    smtp = number(out, "messages the SMTP server received")
    listed = number(out, "users in the list (L)")
    never = number(out, "users of the list never reached")
    in_doubt = number(out, "  of them in doubt")
    # Without --redo the in-doubt entries the server's log has are resolved done; the others
    # stay in doubt, and they are exactly the users never reached.
    assert ledger == smtp and 0 < ledger <= listed
    assert never == in_doubt == number(out, "  of them never sent")
    assert phases_sum(out) == ledger, out
    a, b = ab_split(out)
    assert a <= 1000 and b <= 1000


@pytest.mark.parametrize("args, message", [
    (["--smtp", "nowhere"], "HOST:PORT"),
    (["--smtp", "127.0.0.1:0"], "HOST:PORT"),
    (["--smtp", "127.0.0.1:2525", "--redo"], "--redo needs the demo's own SMTP server"),
    (["--smtp", "127.0.0.1:1"], "cannot connect to 127.0.0.1:1"),  # (nothing listens there)
    (["--smtp", "::1:25"], "HOST:PORT"),  # (an IPv6 host goes in brackets)
    (["--smtp", "[]:25"], "HOST:PORT"),
    (["--smtp", "[localhost]:25"], "HOST:PORT"),
    (["--smtp", "[::1]:1"], "cannot connect to [::1]:1"),  # (parsed: nothing listens there)
    # A label Python's idna codec cannot encode (empty, or over 63): was its UnicodeError.
    (["--smtp", "mail..example.com:25"], "'mail..example.com' is not a host name"),
    (["--smtp", "x" * 64 + ".example:25"], "is not a host name"),
    (["--senders", "0"], "--senders"),
    (["--workers", "65"], "--workers"),
    (["--users", "999"], "--users"),
    (["--users", "10000001"], "--users"),
])
def test_demo_push_refuses_bad_options_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "justonce", "demo", "push", *args],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "justonce.db").exists()


def test_a_push_to_a_server_on_ipv6_loopback(tmp_path: Path) -> None:
    """``--smtp [::1]:PORT``: the ceiling's senders and the Push's reach a server on IPv6,
    each user of the list once (counted by that server)."""
    from aiosmtpd.controller import Controller

    from justonce.demo.mail import Recorder

    recorder = Recorder()
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    controller = Controller(recorder, hostname="::1", port=port)
    controller.start()
    try:
        result = demo_push(f"sqlite:///{tmp_path / 'v6.db'}", tmp_path, "--users", "2000", "--workers", "2",
                           "--senders", "2", "--smtp", f"[::1]:{port}", timeout=180)
    finally:
        controller.stop()
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert re.search(r"is no bigger than the\s+A/B phase's\s+2,000", out), out
    listed = number(out, "users in the list (L)")
    per_user = {rcpt: n for push, rcpts in recorder.per_recipient.items() if push != "ceiling"
                for rcpt, n in rcpts.items()}
    assert listed > 0 and len(per_user) == listed and set(per_user.values()) == {1}, out
    assert sum(recorder.per_recipient.get("ceiling", {}).values()) > 0  # (the ceiling reached it too)


def test_tables_of_something_else_under_the_demos_names_are_never_dropped(db_url: str, tmp_path: Path) -> None:
    """The set-up remakes the demo's own tables; a table of one of their names with other
    columns belongs to something else: one line, non-zero exit, the table as it was."""
    from justonce import App
    from justonce.demo import connect, dialect

    App(db_url).migrate()
    conn = connect(db_url)
    conn.execute("CREATE TABLE demo_pushes (invoice varchar(20))")
    conn.execute("INSERT INTO demo_pushes VALUES ('important')")
    if dialect(conn) == "sqlite":
        conn.commit()
    result = demo_push(db_url, tmp_path, "--users", "1000", timeout=120)
    lines = [ln for ln in result.stderr.splitlines() + result.stdout.splitlines() if ln.strip()]
    assert result.returncode == 1, lines
    assert "demo_pushes" in result.stderr and "not the demo's" in result.stderr, lines
    assert "Traceback" not in result.stderr
    assert [tuple(r) for r in conn.execute("SELECT invoice FROM demo_pushes").fetchall()] == [("important",)]
    conn.close()


def test_a_view_under_any_of_the_demos_table_names_stops_it_with_one_line_and_is_kept(
        db_url: str, tmp_path: Path) -> None:
    """A view named like one of the demo's tables, with exactly the columns of the demo's
    table (so that a look at its columns alone takes it for the demo's): the set-up stops
    before it drops anything, saying what it found and what to do, and the view is still
    there. (``DROP TABLE IF EXISTS`` on a view was a traceback on SQLite and Postgres.)
    Each table name in turn, through ``create_schema``; once through the CLI."""
    from justonce import App
    from justonce.demo import connect
    from justonce.demo.push_data import COLUMNS, TABLES, create_schema
    from justonce.errors import ConfigurationError

    App(db_url).migrate()
    conn = connect(db_url)
    try:
        for table in TABLES:
            conn.execute(f"CREATE VIEW {table} AS SELECT " + ", ".join(f"1 AS {c}" for c in COLUMNS[table]))
            with pytest.raises(ConfigurationError, match=f"has a view named {table}: the demo never drops "
                                                         "what it did not make; drop or rename it yourself"):
                create_schema(conn)
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 1
            if table != "demo_users":
                conn.execute(f"DROP VIEW {table}")
        result = demo_push(db_url, tmp_path, "--users", "1000", timeout=120)
        assert result.returncode == 1, result
        assert "Traceback" not in result.stderr, result.stderr
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "a view named demo_users" in lines[0] and "--database-url" in lines[0], lines
        assert conn.execute("SELECT count(*) FROM demo_users").fetchone()[0] == 1
    finally:
        conn.close()


def test_what_else_may_hold_a_demo_table_name_stops_it_and_is_kept(db_url: str) -> None:
    """The names a table cannot take when something else holds them: a sequence (Postgres,
    MariaDB), a type (Postgres), an index (SQLite). One line each, nothing dropped."""
    from justonce import App
    from justonce.demo import connect, dialect
    from justonce.demo.push_data import create_schema
    from justonce.errors import ConfigurationError

    App(db_url).migrate()  # (on Postgres, its scratch schema)
    conn = connect(db_url)
    try:
        kind = dialect(conn)
        makes = {"postgres": [("sequence", "CREATE SEQUENCE demo_lists", "SELECT nextval('demo_lists')"),
                              ("type", "CREATE TYPE demo_lists AS ENUM ('a')", "SELECT 'a'::demo_lists")],
                 "mysql": [("sequence", "CREATE SEQUENCE demo_lists", "SELECT NEXTVAL(demo_lists)")],
                 "sqlite": [("index", "CREATE TABLE mine (x text); CREATE INDEX demo_lists ON mine (x)",
                             "SELECT name FROM sqlite_master WHERE name = 'demo_lists'")]}[kind]
        for what, make, still in makes:
            for statement in make.split("; "):
                conn.execute(statement)
            with pytest.raises(ConfigurationError, match=f"has an? {what} named demo_lists: "):
                create_schema(conn)
            assert conn.execute(still).fetchone() is not None
            conn.execute(f"DROP {what.upper()} demo_lists")
        create_schema(conn)  # (nothing in the way now)
    finally:
        conn.close()


def test_a_users_view_or_table_over_the_demos_table_is_never_dropped_with_it(db_url: str) -> None:
    """A view of the user's that reads the demo's table: the next set-up never drops it.
    Postgres refuses the table's drop (it has a dependent) and the demo says so in one line;
    SQLite and MariaDB drop the table under the view, which reads the remade one."""
    from justonce import App
    from justonce.demo import connect, dialect
    from justonce.demo.push_data import create_schema
    from justonce.errors import ConfigurationError

    App(db_url).migrate()  # (on Postgres, its scratch schema)
    conn = connect(db_url)
    try:
        create_schema(conn)
        conn.execute("CREATE VIEW my_demo_users AS SELECT id FROM demo_users")
        if dialect(conn) == "postgres":
            with pytest.raises(ConfigurationError, match="cannot drop the demo's table demo_users to remake "
                                                         "it: cannot drop table demo_users because other "
                                                         "objects depend on it"):
                create_schema(conn)
        else:
            create_schema(conn)
        assert conn.execute("SELECT count(*) FROM my_demo_users").fetchone()[0] == 0
        conn.execute("DROP VIEW my_demo_users")
        # A table of the user's with a foreign key to it: Postgres and MariaDB refuse the
        # drop (SQLite, its foreign keys off by default, drops it under the table).
        conn.execute("CREATE TABLE my_orders (id integer PRIMARY KEY, "
                     "user_id integer REFERENCES demo_users (id))")
        if dialect(conn) == "sqlite":
            create_schema(conn)
        else:
            with pytest.raises(ConfigurationError, match=r"cannot drop the demo's table demo_users to remake "
                                                         r"it: [^(]*(depend|foreign key)"):
                create_schema(conn)
        assert conn.execute("SELECT count(*) FROM my_orders").fetchone()[0] == 0
    finally:
        conn.close()


def test_a_second_demo_push_on_a_database_where_one_runs_refuses_and_changes_nothing(tmp_path: Path) -> None:
    """A demo's set-up remakes the demo's tables: a second demo on the same database would
    wipe out the Push the first is sending (its whole list then never reached). While one
    runs (it holds the demo's partition lease), another refuses with one line."""
    from justonce import App
    from justonce.demo.push import DEMO_LEASE

    url = f"sqlite:///{tmp_path / 'demo.db'}"
    app = App(url)
    app.migrate()
    running = app.partitions.try_acquire(DEMO_LEASE, 1, lease=60)
    assert running is not None
    try:
        result = subprocess.run([sys.executable, "-m", "justonce", "demo", "push", "--users", "1000",
                                 "--database-url", url], capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and "another `justonce demo push` is running" in result.stdout, result
        import sqlite3

        with sqlite3.connect(tmp_path / "demo.db") as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "demo_users" not in tables  # (its set-up never ran)
    finally:
        running.release()
        app.close()


def test_the_ceiling_counts_only_what_every_sender_sent_inside_one_common_window() -> None:
    """The plain senders start together (each process connects and says so before the
    clock starts) and count only the messages that ended inside the window: the server
    got exactly one more per sender thread (its message that ended after the window)."""
    from justonce.demo.mail import measure_ceiling, start_smtp

    controller, recorder, address = start_smtp()
    try:
        ceiling = measure_ceiling(address, 2, 3, seconds=1.0)
        assert ceiling.senders == 6 and ceiling.seconds == 1.0
        assert ceiling.messages > 0
        assert recorder.received("ceiling") == ceiling.messages + 6
        assert ceiling.per_second == ceiling.messages / 1.0
    finally:
        controller.stop()


def test_a_ceiling_whose_senders_cannot_connect_fails_clearly() -> None:
    from justonce.demo.mail import free_port, measure_ceiling

    with pytest.raises(RuntimeError, match="did not start"):
        measure_ceiling(f"127.0.0.1:{free_port()}", 2, 2, seconds=0.5)


def test_a_ceiling_process_that_reads_its_start_time_late_fails_the_try() -> None:
    """A start time already past when it is read (here: given in the past) would leave that
    process a short window and the ceiling low: the try fails as late, and
    ``measure_ceiling`` tries again with a longer lead."""
    from justonce.demo.mail import _Late, _measure, start_smtp

    controller, recorder, address = start_smtp()
    try:
        with pytest.raises(_Late, match="late"):
            _measure(address, 2, 2, 0.5, lead=-1.0)
    finally:
        controller.stop()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")
def test_the_wait_for_started_workers_ends_when_they_fall_quiet_and_not_while_one_spins() -> None:
    """The Push's clock starts once its workers have fallen quiet: real processes, one idle
    and two spinning a core each. Beside the spinners the wait gives up at its limit (False);
    with the idle one alone it ends after two quiet half seconds (True); a process that
    has ended is not counted."""
    from justonce.demo.push import _await_started

    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        gone.wait(10)
        started = time.monotonic()
        assert _await_started([idle, *spin], limit=2.0) is False
        assert time.monotonic() - started >= 2.0  # (it waited its limit)
        assert _await_started([idle, gone], limit=10.0) is True
    finally:
        for p in (idle, *spin):
            p.kill()
            p.wait(10)


HOLDER = """
import sys, time
from justonce import App
app = App(sys.argv[1])
def fn(key):
    if sys.argv[3] == "hold":
        print("ready", flush=True)
        time.sleep(120)  # (mid-chunk: its keys claimed, none marked done)
print(app.effects.run_many(sys.argv[2], sys.argv[4:], fn, lease=60), file=sys.stderr)
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")
def test_kill_one_kills_a_worker_in_the_middle_of_its_chunk_and_lets_the_others_go_on(
        db_url: str, tmp_path: Path) -> None:
    """``--kill-one``'s choice, with real processes: of two, the one that holds live claims
    of the Push's scope (its chunk half done) is frozen, checked and killed; the one whose
    entries are all marked done is let go on, not left stopped. A process that is not the
    run's own is never signalled, whatever it holds; with no holder among the run's own
    nobody is killed (the demo looks again later)."""
    from justonce.demo.push import _kill_a_sender
    from justonce.demo.push_app import app
    from justonce.owner import owner_pid

    def state(p: subprocess.Popen[str]) -> str:
        return process_state(p.pid)

    scope, was = "push:kill-one", app.database_url
    app.use_database(db_url)
    app.migrate()
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    procs = [subprocess.Popen([sys.executable, str(script), db_url, scope, how, *keys], text=True,
                              stdout=subprocess.PIPE)
             for how, keys in (("hold", ["1", "2", "3"]), ("finish", ["4", "5"]))]
    holder, other = procs
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        # The holder is not among the run's processes here, and the other holds nothing.
        assert _kill_a_sender(scope, [other]) is None
        assert state(other) != "T" and holder.poll() is None and state(holder) != "T"
        assert _kill_a_sender(scope, procs) == holder.pid
        assert holder.wait(10) == -9
        assert other.poll() is None and state(other) != "T"
        assert {e.key for e in app.effects.list(scope, "running")} == {"1", "2", "3"}
        assert {owner_pid(e.owner) for e in app.effects.list(scope, "running")} == {holder.pid}
        assert _kill_a_sender(scope, [other]) is None and state(other) != "T"
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        app.use_database(was)
    assert owner_pid("host:42:abc123") == 42
    assert owner_pid("a:b:42:abc123") == 42  # (a host name with colons)
    assert owner_pid(None) is None and owner_pid("nobody") is None


def test_the_rest_phase_scan_finds_r_analyzed_and_plans_each_window_for_its_own_values(db_url: str) -> None:
    """At 10,000,000 users the rest phase's slot scans cost Postgres up to ~7x what they should:
    psycopg prepares the window query after five runs, the server then kept a generic plan
    that expects one user per window, and (R never analyzed, so taken for a few rows) it
    read all of R for every user a window found, in a parallel worker started per window.
    Now R (and the A/B sample) are analyzed once filled, and the scan's own connection
    plans each window for its values, with no parallel workers."""
    import threading

    from justonce import App
    from justonce.demo import connect, dialect, push_app, push_data

    setup = App(db_url)
    setup.migrate()  # (the demo's set-up does it first: it makes the schema)
    setup.close()
    conn = connect(db_url)
    kind = dialect(conn)
    try:
        push_data.create_schema(conn)
        push_data.load_users(conn, 20_000, 7)
        push_data.create_push(conn)
        members = push_data.list_members(conn)
        push_data.save_ab(conn, 1, {"A": members[:100], "B": members[100:200]})
        push_data.save_reached(conn, 1, members[:150])
        if kind == "postgres":
            stats = dict(conn.execute("SELECT relname, reltuples FROM pg_class WHERE relname IN "
                                      "('demo_push_reached', 'demo_push_ab') "
                                      "AND relnamespace = current_schema()::regnamespace").fetchall())
            assert stats == {"demo_push_reached": 150, "demo_push_ab": 200}
        elif kind == "sqlite":
            analyzed = {r[0] for r in conn.execute("SELECT tbl FROM sqlite_stat1")}
            assert {"demo_push_reached", "demo_push_ab"} <= analyzed
        # (MariaDB: InnoDB counts a table's rows as they come, with or without ANALYZE
        # TABLE, which save_* run all the same: nothing to tell apart here.)
    finally:
        conn.close()

    seen: dict[str, object] = {}
    was = push_app.app.database_url

    def scan() -> None:
        try:
            push_app.app.use_database(db_url)
            db = push_app._db()
            push = push_app._push(1)
            predicate = "mod(u.id, 2) = 0" if kind != "sqlite" else "u.id % 2 = 0"
            seen["users"] = sum(len(page) for page in push_app._pages(push, 1, "rest", predicate))
            if kind == "postgres":
                seen["settings"] = [db.execute(f"SHOW {s}").fetchone()[0]
                                    for s in ("plan_cache_mode", "max_parallel_workers_per_gather")]
                where, params = push_data.criteria_sql(push["criteria"], "u.")
                for n in range(1, len(params) + 1):
                    where = where.replace("?", f"${n}", 1)
                db.execute(f"PREPARE w AS SELECT u.id FROM demo_users u WHERE {where} AND NOT EXISTS "
                           "(SELECT 1 FROM demo_push_reached r WHERE r.push_id = 1 AND r.user_id = u.id) "
                           f"AND u.id > ${len(params) + 1} AND u.id <= ${len(params) + 2} ORDER BY u.id")
                args = ", ".join(repr(p) for p in [*params, 0, 20_000])
                for _ in range(7):  # past the point where a server settles on a generic plan
                    db.execute(f"EXECUTE w({args})").fetchall()
                seen["plan"] = "\n".join(r[0] for r in db.execute(f"EXPLAIN EXECUTE w({args})"))
        except BaseException as exc:  # (reported by the test's thread)
            seen["error"] = exc
        finally:
            db_conn = getattr(push_app._local, "db", None)
            if db_conn is not None:
                db_conn.close()

    t = threading.Thread(target=scan)
    t.start()
    t.join(60)
    push_app.app.use_database(was)
    push_app._pushes.pop(1, None)
    assert not t.is_alive(), "the scan did not end in 60 s"
    if "error" in seen:
        raise seen["error"]  # type: ignore[misc]
    assert seen["users"] == sum(1 for m in members[150:] if m % 2 == 0)
    if kind == "postgres":
        assert seen["settings"] == ["force_custom_plan", "0"]
        plan = str(seen["plan"])
        # A plan for these values (no $n left in it), without a parallel worker, that
        # looks R up by key for each user or reads it once (a hash or merge anti join):
        # never one that reads R for each user and filters it ("Join Filter").
        assert "$" not in plan and "Gather" not in plan, plan
        assert "Anti Join" in plan and "Join Filter" not in plan, plan


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(entry))
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().split("\0")
    except OSError:
        return []


@pytest.mark.parametrize("demo", ["push", "jobs"])
def test_a_demo_killed_with_sigkill_leaves_no_worker_running(tmp_path: Path, demo: str) -> None:
    """The workers a demo starts stop on their own once the demo is gone (they watch for
    their parent): a demo killed with SIGKILL left them polling its database for ever."""
    env = dict(os.environ, COLUMNS="140")
    env.pop("JUSTONCE_DATABASE_URL", None)
    args = (["push", "--users", "300000", "--workers", "2", "--senders", "2"] if demo == "push"
            else ["jobs", "--jobs", "200000", "--workers", "3"])
    proc = subprocess.Popen([sys.executable, "-m", "justonce", "demo", *args,
                             "--database-url", f"sqlite:///{tmp_path / 'demo.db'}"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    want = 3  # workers (the Push: two slots and a standby)
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while len(workers) < want:
            assert proc.poll() is None, "the demo ended before its workers were all up"
            assert time.monotonic() < deadline, "the demo did not start its workers"
            workers = [p for p in _children(proc.pid) if "worker" in _cmdline(p)]
            time.sleep(0.2)
        time.sleep(1.0)  # (their app modules imported: the watch is on)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 45  # their grace is 10 s
    while time.monotonic() < deadline:
        if all(process_state(p) in ("gone", "Z") for p in workers):
            break
        time.sleep(0.2)
    left = [p for p in workers if process_state(p) not in ("gone", "Z")]
    for p in left:
        os.kill(p, 9)
    assert not left, f"workers still running after the demo was killed: {left}"


def test_a_send_whose_reply_is_lost_after_data_is_in_doubt_and_an_idle_drop_is_resent_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A mail server that took a message and then lost the connection before its reply:
    the demo's sender sent it again on a fresh connection (every such user got two emails).
    Now that send raises EffectInDoubt (the ledger leaves the user in doubt); only a
    connection found closed before the message went out is replaced and the send made."""
    import threading
    from collections import Counter

    from aiosmtpd.controller import Controller

    from justonce import EffectInDoubt
    from justonce.demo.mail import SMTP_ENV, ThreadSMTP, free_port

    got: Counter[str] = Counter()
    lock = threading.Lock()

    class Handler:
        async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
            rcpts = envelope.rcpt_tos  # type: ignore[attr-defined]
            with lock:
                got.update(rcpts)
            if "drop@example.test" in rcpts:
                server.transport.abort()  # type: ignore[attr-defined]  # took it, then gone
            return "250 OK"

    port = free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        monkeypatch.setenv(SMTP_ENV, f"127.0.0.1:{port}")
        smtp = ThreadSMTP()
        smtp.send("a@example.test", b"Subject: a\r\n\r\na\r\n")
        with pytest.raises(EffectInDoubt, match="after DATA"):
            smtp.send("drop@example.test", b"Subject: b\r\n\r\nb\r\n")
        smtp.send("c@example.test", b"Subject: c\r\n\r\nc\r\n")  # (a fresh connection)
        # The server closes the idle connection: the next send goes out once, on a new one.
        smtp._local.smtp.sock.shutdown(socket.SHUT_RDWR)
        smtp.send("d@example.test", b"Subject: d\r\n\r\nd\r\n")
        time.sleep(0.2)
        assert dict(got) == {"a@example.test": 1, "drop@example.test": 1, "c@example.test": 1,
                             "d@example.test": 1}
    finally:
        controller.stop()


def test_a_demo_paused_past_its_lease_stops_instead_of_reading_tables_another_may_remake(
        tmp_path: Path) -> None:
    """A demo holds the database with a partition lease (10 s) while it runs; frozen past
    it (SIGSTOP, a paused VM), another demo could take the database and remake its tables,
    and the first, continued, went on reading them ("users never reached", the ledger and the
    server disagreeing). It stops with one line now, its workers with it."""
    import signal

    env = dict(os.environ, COLUMNS="140")
    env.pop("JUSTONCE_DATABASE_URL", None)
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    proc = subprocess.Popen([sys.executable, "-m", "justonce", "demo", "push", "--users", "20000",
                             "--database-url", url], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("SMTP:"):
                break
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(11)  # (past the demo's 10 s lease)
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=120)
        out = "".join(lines) + out
        assert proc.returncode == 1, out
        assert "stopped: this demo's lease on the database ran out" in out, out
        assert "Traceback" not in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
