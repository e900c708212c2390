"""``justonce demo push``: the story of the first seed, run for real.

A Push ("Kitty lovers") goes to a list (everyone within 50 km of Sydney who is a kitty
lover; the list's criteria are stored serialised and turned into SQL). An A/B phase sends
each of two variants to 1,000 random users of the list; then the "rest" phase sends the
winner to the list minus those already reached (L minus R) — started while the A/B phase is
still sending, so R is incomplete and the rest phase enqueues users the A/B phase is about
to reach: the race that sent duplicates in the seed. Real worker processes send the emails
through a real SMTP server, with jobs partitioned by ``MOD(user_id, N)`` and each send guarded
by the effect ledger. The report counts what the SMTP server received: no user may have two
emails of the Push (the demo exits non-zero if one does).
"""

from __future__ import annotations

import json
import math
import os
import random
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from email.parser import BytesHeaderParser
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..tasks import Enqueue
from . import connect, dialect, stop_workers
from .push_app import SMTP_ENV, app, send_push_email

CITIES = [("Sydney", -33.8688, 151.2093, 0.40), ("Melbourne", -37.8136, 144.9631, 0.25),
          ("Brisbane", -27.4698, 153.0251, 0.15), ("Perth", -31.9505, 115.8605, 0.10),
          ("Adelaide", -34.9285, 138.6007, 0.10)]
INTERESTS = ["kitty lover", "dog person", "surfer", "gardener", "gamer", "runner"]
LIST_CRITERIA = {"all": [
    {"near": {"place": "Sydney", "lat": -33.8688, "lon": 151.2093, "km": 50}},
    {"interest": "kitty lover"},
]}
VARIANTS = {
    "A": {"subject": "Your cat will love this", "body": "Kitty lovers: 20% off scratching posts."},
    "B": {"subject": "Purr-fect deals inside", "body": "Treat your cat: new toys this week."},
}
AB_SIZE = 1000


# -- the list: criteria stored as JSON, turned into SQL --------------------------------------


def criteria_sql(criteria: dict[str, Any]) -> tuple[str, list[Any]]:
    """A WHERE clause (``?`` placeholders) and its parameters for a stored criteria tree:
    ``{"all": [...]}``, ``{"any": [...]}``, ``{"near": {lat, lon, km}}``, ``{"interest": name}``.
    Distances use an equirectangular projection (plain arithmetic, same on every backend),
    accurate to well under 1 % at these ranges."""
    (op, arg), = criteria.items()
    if op in ("all", "any"):
        parts = [criteria_sql(c) for c in arg]
        joiner = " AND " if op == "all" else " OR "
        return "(" + joiner.join(p for p, _ in parts) + ")", [x for _, ps in parts for x in ps]
    if op == "near":
        kx = 111.320 * math.cos(math.radians(arg["lat"]))
        return ("(((lon - ?) * ?) * ((lon - ?) * ?) + ((lat - ?) * 110.574) * ((lat - ?) * 110.574) <= ?)",
                [arg["lon"], kx, arg["lon"], kx, arg["lat"], arg["lat"], float(arg["km"]) ** 2])
    if op == "interest":
        return "(interests LIKE ?)", [f"%|{arg}|%"]
    raise ValueError(f"unknown list criterion {op!r}")


def _sql(conn: Any, text: str) -> str:
    return text if isinstance(conn, sqlite3.Connection) else text.replace("?", "%s")


# -- the demo schema and its users ------------------------------------------------------------


def create_schema(conn: Any, n_users: int, seed: int) -> None:
    kind = dialect(conn)
    real, js = {"postgres": ("float8", "jsonb"), "mysql": ("DOUBLE", "JSON")}.get(kind, ("REAL", "TEXT"))
    for table in ("demo_users", "demo_lists", "demo_pushes"):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE demo_users (id integer PRIMARY KEY, email text NOT NULL, "
                 f"lat {real} NOT NULL, lon {real} NOT NULL, interests text NOT NULL)")
    conn.execute(f"CREATE TABLE demo_lists (id integer PRIMARY KEY, name text NOT NULL, "
                 f"criteria {js} NOT NULL)")
    conn.execute(f"CREATE TABLE demo_pushes (id integer PRIMARY KEY, name text NOT NULL, "
                 f"list_id integer NOT NULL, variants {js} NOT NULL, winner text)")
    rows = list(_users(n_users, seed))
    if kind == "mysql":
        for i in range(0, len(rows), 5000):
            conn.executemany("INSERT INTO demo_users VALUES (%s, %s, %s, %s, %s)", rows[i:i + 5000])
    elif kind == "postgres":
        with conn.cursor().copy("COPY demo_users (id, email, lat, lon, interests) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
    else:
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO demo_users VALUES (?, ?, ?, ?, ?)", rows)
        conn.execute("COMMIT")


def _users(n: int, seed: int) -> Any:
    rng = random.Random(seed)
    weights = [c[3] for c in CITIES]
    for uid in range(1, n + 1):
        _, lat0, lon0, _ = rng.choices(CITIES, weights)[0]
        dist, angle = abs(rng.gauss(0, 40)), rng.uniform(0, 2 * math.pi)
        lat = lat0 + dist * math.sin(angle) / 110.574
        lon = lon0 + dist * math.cos(angle) / (111.320 * math.cos(math.radians(lat0)))
        interests = [i for i in INTERESTS if rng.random() < 0.3]
        yield uid, f"user{uid}@example.test", round(lat, 6), round(lon, 6), "|" + "|".join(interests) + "|"


# -- the SMTP server ---------------------------------------------------------------------------


class Recorder:
    """An aiosmtpd handler that keeps a count of what it receives, per Push."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.per_recipient: dict[str, Counter[str]] = {}
        self.per_variant: dict[str, Counter[tuple[str, str]]] = {}

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        headers = BytesHeaderParser().parsebytes(envelope.content)
        push = headers.get("X-Justonce-Push", "?")
        with self.lock:
            rcpts = self.per_recipient.setdefault(push, Counter())
            for rcpt in envelope.rcpt_tos:
                rcpts[rcpt] += 1
            self.per_variant.setdefault(push, Counter())[
                (headers.get("X-Justonce-Variant", "?"), headers.get("X-Justonce-Phase", "?"))] += 1
        return "250 OK"


def start_smtp() -> tuple[Any, Recorder, str]:
    from aiosmtpd.controller import Controller

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recorder = Recorder()
    controller = Controller(recorder, hostname="127.0.0.1", port=port)
    controller.start()
    return controller, recorder, f"127.0.0.1:{port}"


# -- the run -----------------------------------------------------------------------------------


def run_push_demo(database_url: str | None, users: int, workers: int, kill_one: bool,
                  smtp: str | None, seed: int, out: Console) -> bool:
    if database_url:
        app.use_database(database_url)
    url = app.database_url
    app.migrate()
    run = secrets.token_hex(3)
    queue, pset = f"push-{run}", f"push-{run}"
    conn = connect(url)
    t0 = time.perf_counter()
    create_schema(conn, users, seed)
    where, params = criteria_sql(LIST_CRITERIA)
    conn.execute(_sql(conn, "INSERT INTO demo_lists VALUES (1, ?, ?)"),
                 ("Kitty lovers within 50 km of Sydney", json.dumps(LIST_CRITERIA)))
    conn.execute(_sql(conn, "INSERT INTO demo_pushes (id, name, list_id, variants) VALUES (1, ?, 1, ?)"),
                 ("Kitty lovers", json.dumps(VARIANTS)))
    members = [r[0] for r in conn.execute(_sql(conn, f"SELECT id FROM demo_users WHERE {where}"), params)]
    out.print(f"[bold]justonce demo push[/bold]: {users:,} users, list of {len(members):,} "
              f"(kitty lovers within 50 km of Sydney), {workers} worker processes, database {url}"
              f" ({time.perf_counter() - t0:.1f}s to set up)")
    controller, recorder, address = (None, None, smtp) if smtp else start_smtp()
    out.print(f"SMTP: {'your server at ' + smtp if smtp else 'a local server at ' + address}")
    scope = "push:1"
    env = dict(os.environ, **{SMTP_ENV: address})
    env.pop("JUSTONCE_DATABASE_URL", None)
    cmd = [sys.executable, "-m", "justonce", "worker", "--app", "justonce.demo.push_app:app",
           "--database-url", url, "--queues", queue, "--partitions", f"{pset}:{workers}",
           "--concurrency", "4", "--lease", "3", "--heartbeat", "0.5", "--grace", "10",
           "--log-level", "WARNING", "--housekeeping-interval", "0.5"]
    # One more process than slots: a standby, to take over the slot of a worker that dies.
    procs = [subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL) for _ in range(workers + 1)]
    rng = random.Random(seed)
    ab = rng.sample(members, min(2 * AB_SIZE, len(members)))
    phases = {"A": ab[:AB_SIZE], "B": ab[AB_SIZE:]}
    winner = "A"  # the simulated A/B result: A opened 23.1 %, B 19.4 %
    killed: int | None = None
    rest: list[int] = []
    rest_started = False
    t1 = time.perf_counter()
    try:
        for variant, ids in phases.items():
            app.enqueue_many(Enqueue(send_push_email, args=(1, uid, variant, "ab"),
                                     partition_key=uid, queue=queue) for uid in ids)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=out) as bar:
            task = bar.add_task("emails sent", total=len(members))
            while True:
                done = app.effects.counts(scope).get("done", 0)
                bar.update(task, completed=done)
                if not rest_started and done >= min(AB_SIZE // 2, len(ab) // 4):
                    rest_started = True
                    # The rest phase, while the A/B phase is still sending: L minus R.
                    reached = {int(e.key) for e in app.effects.list(scope, "done", limit=10_000_000)}
                    rest = [uid for uid in members if uid not in reached]
                    for i in range(0, len(rest), 5000):
                        app.enqueue_many(Enqueue(send_push_email, args=(1, uid, winner, "rest"),
                                                 partition_key=uid, queue=queue) for uid in rest[i:i + 5000])
                    bar.console.print(f"rest phase started with {done:,} of {len(ab):,} A/B emails sent: "
                                      f"{len(rest):,} users of the list not reached yet, "
                                      f"{len(set(rest) & set(ab)):,} of them still waiting for their A/B email")
                if kill_one and killed is None and rest_started and done >= len(members) * 0.4:
                    killed = _kill_a_holder(pset)
                    bar.console.print(f"killed worker pid {killed} with SIGKILL at {done:,} emails")
                if rest_started and _live_jobs(queue) == 0:
                    bar.update(task, completed=app.effects.counts(scope).get("done", 0))
                    break
                if all(p.poll() is not None for p in procs):
                    out.print("[red]all workers exited[/red]")
                    break
                time.sleep(0.2)
        elapsed = time.perf_counter() - t1
    finally:
        stop_workers(procs)
        if controller is not None:
            time.sleep(0.2)
            controller.stop()
    ok = _report(out, members, ab, rest, scope, recorder, killed, elapsed)
    conn.close()
    return ok


def _live_jobs(queue: str) -> int:
    return sum(c.count for c in app.queue_counts() if c.queue == queue and c.state.is_live)


def _kill_a_holder(pset: str) -> int | None:
    for slot in app.partitions.list(pset):
        if slot.held and slot.owner:
            pid = int(slot.owner.split(":")[1])
            os.kill(pid, signal.SIGKILL)
            return pid
    return None


def _report(out: Console, members: list[int], ab: list[int], rest: list[int], scope: str,
            recorder: Recorder | None, killed: int | None, elapsed: float) -> bool:
    done = app.effects.list(scope, "done", limit=10_000_000)
    by_phase = Counter((e.result or {}).get("phase", "?") + " " + (e.result or {}).get("variant", "?")
                       for e in done)
    reached = {int(e.key) for e in done}
    missed = [uid for uid in members if uid not in reached]
    doubt = {e.key: e for e in app.effects.in_doubt(scope, limit=100_000)}
    table = Table("", "count", title="report: Push 1, \"Kitty lovers\"")
    table.add_row("users in the list (L)", f"{len(members):,}")
    table.add_row("A/B phase: variant A / variant B (by the ledger)",
                  f"{by_phase['ab A']:,} / {by_phase['ab B']:,}")
    table.add_row("rest phase: users enqueued (L minus R when it started)", f"{len(rest):,}")
    table.add_row("rest phase: winner A sent (by the ledger)", f"{by_phase['rest A']:,}")
    table.add_row("emails marked sent in the effect ledger", f"{len(done):,}")
    dupes = 0
    if recorder is not None:
        received = recorder.per_recipient.get("1", Counter())
        dupes = sum(1 for c in received.values() if c > 1)
        variants = recorder.per_variant.get("1", Counter())
        table.add_row("messages the SMTP server received", f"{sum(received.values()):,}")
        table.add_row("  of them A/B phase A / B, rest phase A",
                      f"{variants[('A', 'ab')]:,} / {variants[('B', 'ab')]:,} / {variants[('A', 'rest')]:,}")
        table.add_row("users who received two emails of this Push", str(dupes))
    else:
        table.add_row("messages the SMTP server received", "(your server: see its own count)")
    table.add_row("users of the list never reached", str(len(missed)))
    table.add_row("  of them in doubt (a worker died mid-send)", str(sum(1 for u in missed if str(u) in doubt)))
    table.add_row("worker killed with SIGKILL", f"yes (pid {killed})" if killed else "no")
    table.add_row("sending time", f"{elapsed:.1f}s")
    table.add_row("emails per second", f"{len(done) / elapsed:,.0f}" if elapsed else "-")
    out.print(table)
    if doubt:
        out.print("[yellow]in doubt (at most once: not resent; check the SMTP log, then "
                  "`justonce effects resolve push:1 KEY --done|--redo`):[/yellow] "
                  + ", ".join(sorted(doubt)[:20]) + (" …" if len(doubt) > 20 else ""))
    # Checked user by user: every user marked sent got exactly one message, and every
    # message went to a user marked sent or in doubt (a worker killed after the server
    # accepted its message, before the ledger's done mark).
    server_ok = True
    if recorder is not None:
        email_of = {f"user{uid}@example.test": str(uid) for uid in members}
        received = recorder.per_recipient.get("1", Counter())
        server_ok = all(received.get(f"user{int(e.key)}@example.test", 0) == 1 for e in done) and all(
            email_of.get(rcpt) in doubt or int(email_of.get(rcpt, "0")) in reached for rcpt in received)
    unexplained = [u for u in missed if str(u) not in doubt]
    ok = dupes == 0 and server_ok and not unexplained
    if not ok:
        out.print("[red]FAILED: " + ("duplicates! " if dupes else "")
                  + ("" if server_ok else "the SMTP server's messages and the ledger disagree! ")
                  + (f"{len(unexplained)} users never reached! " if unexplained else "") + "[/red]")
    elif recorder is None:
        out.print("[green]OK by the ledger: no user marked sent twice[/green] (compare with your "
                  "SMTP server's own count)")
    else:
        out.print("[green]OK: every user of the list got exactly one email of the Push[/green]"
                  if not missed else "[green]OK: no user got two emails[/green]")
    return ok

