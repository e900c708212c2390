"""``justonce lists …``: load a list from a JSON-lines file, watch it, drain it with P
processes, kick its buried positions. Thin: parse, call ``app.lists``, print."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import IO, Any

import click
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.progress_bar import ProgressBar
from rich.table import Table

from .app import App
from .cli import Integer, Number, cli, database_option, load_app, show
from .cli_output import err, out, visible
from .errors import InvalidArguments, ListExists, ListNotFound, PayloadTooLarge
from .lists import LOAD_CHUNK, item_json
from .models import ListInfo

POLL = 0.5
"""Seconds between two looks at a running list's progress."""
FAILURE_EVERY = 5.0
"""Seconds between a ``lists run`` process's lines about failed attempts (the first at once)."""


@cli.group()
def lists() -> None:
    """Pre-loaded lists: load from a file, watch, run with P processes, kick."""


def _bar(info: ListInfo, width: int = 30) -> ProgressBar:
    p = info.progress
    done = p.done if p.total else (1 if info.state == "completed" else 0)
    return ProgressBar(total=max(p.total, 1), completed=done, width=width,
                       complete_style="red" if p.buried else "green", finished_style="green")


@lists.command("list")
@click.option("--limit", default=100, show_default=True, type=Integer(1, 10_000))
@database_option
def lists_list(limit: int, database_url: str | None) -> None:
    """Lists by name, with their progress."""
    rows = App(database_url).lists.list(limit)
    table = Table("name", "state", "task", "progress", "ready", "reserved", "done", "buried", "total")
    for i in rows:
        p = i.progress
        table.add_row(i.name, i.state, i.task or "", _bar(i, 20), *(f"{n:,}" for n in (
            p.ready, p.reserved, p.done, p.buried, p.total)))
    show(table, rows, limit, "no lists")


@lists.command("show")
@click.argument("name")
@click.option("--buried", "n_buried", default=20, show_default=True, type=Integer(0, 10_000),
              help="How many buried ranges to list.")
@database_option
def lists_show(name: str, n_buried: int, database_url: str | None) -> None:
    """One list: state, progress, settings and buried positions."""
    app = App(database_url)
    info = app.lists.get(name)
    table = Table(show_header=False, box=None)
    for key in ("id", "name", "state", "task", "ttr", "max_attempts", "on_complete", "batch_id",
                "created_at", "sealed_at", "finished_at"):
        value = getattr(info, key)
        table.add_row(key, "" if value is None else str(value))
    p = info.progress
    for key in ("total", "ready", "reserved", "done", "buried"):
        table.add_row(key, f"{getattr(p, key):,}")
    table.add_row("progress", _bar(info, 40))
    out.print(table)
    found = app.lists.buried(name, n_buried) if n_buried and p.buried else []
    if found:
        out.print(f"buried ({p.buried:,} positions)", style="bold")
        for b in found:
            spans = ", ".join(str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}" for lo, hi in b.ranges)
            reason = (b.reason or "").strip().splitlines()
            out.print(f"  {spans} (attempt {b.attempt}, {b.buried_at.isoformat(timespec='seconds')}): "
                      f"{reason[-1][:100] if reason else ''}", soft_wrap=True)


# -- loading ------------------------------------------------------------------------------
class BadLine(click.ClickException):
    """A line of the items file that is not a storable JSON item."""


def _size(f: IO[bytes]) -> int | None:
    """The file's size, for the bar; None for a pipe or stdin (the bar then only counts)."""
    try:
        st = os.fstat(f.fileno())
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


class _Loader:
    """Appends parsed items in transactions of LOAD_CHUNK, remembering each item's line.
    The library checks every item of a chunk before its transaction; only when it refuses
    one are the items checked here one by one, to append those before the bad one and name
    its line (checking each item twice would cost a third of a load's time)."""

    def __init__(self, app: App, name: str, label: str,
                 create: Callable[[list[Any]], Any] | None = None, list_id: int | None = None) -> None:
        self.app, self.name, self.label = app, name, label
        self.list_id = list_id
        """The list this load fills (its first chunk's): a list dropped and made again under
        the name meanwhile is another, and refuses the rest."""
        self.create = create
        """Creates the list with its first items (one transaction), until it has."""
        self.created = create is not None
        self.items: list[Any] = []
        self.lines: list[int] = []
        self.appended = 0

    def _store(self, items: list[Any]) -> int:
        if self.create is None:
            return self.app.lists.append(self.name, items, list_id=self.list_id)
        self.list_id = self.create(items).id
        self.create = None
        return len(items)

    def finish(self) -> None:
        """An empty source still creates its list."""
        self.flush()
        if self.create is not None:
            self._store([])

    def add(self, item: Any, line: int) -> None:
        self.items.append(item)
        self.lines.append(line)
        if len(self.items) >= LOAD_CHUNK:
            self.flush()

    def flush(self) -> None:
        items, lines = self.items, self.lines
        self.items, self.lines = [], []
        if not items:
            return
        try:
            self.appended += self._store(items)
        except (InvalidArguments, PayloadTooLarge):
            for i, item in enumerate(items):
                try:
                    item_json(item)
                except (InvalidArguments, PayloadTooLarge) as exc:
                    if i:
                        self.appended += self._store(items[:i])
                    raise self.bad(lines[i], f"{type(exc).__name__}: {exc}") from None
            raise

    def bad(self, line: int, what: str) -> BadLine:
        name = self.name
        if self.created and not self.appended:
            return BadLine(f"line {line} of {self.label}: {what}. As nothing was appended, list "
                           f"{name!r} was not created.")
        return BadLine(
            f"line {line} of {self.label}: {what}. The {self.appended:,} items before it were "
            f"appended and stay; list {name!r} is NOT sealed (still loading): append the rest "
            f"with `justonce lists append {name} --from FILE`, or drop it with "
            f"`justonce lists drop {name}`.")


def _load(app: App, name: str, source: IO[bytes],
          create: Callable[[list[Any]], ListInfo] | None = None,
          list_id: int | None = None) -> tuple[int, int | None]:
    """Append the JSON lines of ``source`` to list ``name`` in transactions of LOAD_CHUNK,
    with a progress bar of the bytes read. A bad line appends the items before it, then
    stops with its number (the list stays unsealed). ``create``: the list is made for this
    load, in the transaction of its first chunk (so a load that stops before it leaves no
    list, and nobody sees the list empty). ``list_id``: the list to append to (each chunk
    goes to it or to nothing). Returns how many, and the list's id."""
    label = getattr(source, "name", "-")
    loader = _Loader(app, name, "stdin" if label in ("-", "<stdin>") else str(label), create, list_id)
    return _read(loader, source), loader.list_id


def _read(loader: _Loader, source: IO[bytes]) -> int:
    columns = [TextColumn("loading"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TextColumn("{task.fields[items]:,} items")]
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task("load", total=_size(source), items=0)
        read = 0
        try:
            for number, line in enumerate(source, 1):
                read += len(line)
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    loader.flush()  # the items before it (or an earlier bad one)
                    raise loader.bad(number, f"not JSON ({exc})") from None
                loader.add(item, number)
                if not loader.items:
                    bar.update(task, completed=read, items=loader.appended)
            loader.finish()
        finally:
            bar.update(task, completed=read, items=loader.appended)
    return loader.appended


def _loaded(app: App, name: str, loaded: tuple[int, int | None], seal: bool) -> None:
    n, list_id = loaded
    info = app.lists.seal(name, list_id=list_id) if seal else app.lists.get(name)
    how = "sealed" if seal else "not sealed: append more, then `justonce lists seal`"
    out.print(f"list {name}: {n:,} items appended, {info.progress.total:,} in all, {how}", soft_wrap=True)


FROM = click.option("--from", "source", required=True, type=click.File("rb", lazy=False),
                    help="JSON lines: one item per line (blank lines skipped); - reads stdin.")


@lists.command("create")
@click.argument("name")
@FROM
@click.option("--task", default=None, help="What `lists run` and POST /lists/NAME/next run on each item.")
@click.option("--ttr", default=60.0, show_default=True, type=Number(0.001, 7 * 86400),
              help="Seconds a reservation lives without a touch.")
@click.option("--max-attempts", default=None, type=Integer(1, 1000),
              help="Attempts per item before it is buried [default: the task's, else 5].")
@click.option("--on-complete", default=None, metavar="TASK", help="Task enqueued once when every item is done.")
@click.option("--no-seal", is_flag=True, help="Leave the list open for more appends.")
@click.option("--app", "app_path", default=None, metavar="MODULE:APP",
              help="Check --task against this app's tasks and use its defaults.")
@database_option
def lists_create(name: str, source: IO[bytes], task: str | None, ttr: float, max_attempts: int | None,
                 on_complete: str | None, no_seal: bool, app_path: str | None,
                 database_url: str | None) -> None:
    """Create list NAME from a JSON-lines file, with a progress bar, and seal it."""
    app = load_app(app_path, database_url, strict=app_path is not None)

    def create(items: list[Any]) -> ListInfo:
        return app.lists.create(name, task=task, items=items, seal=False, ttr=ttr,
                                max_attempts=max_attempts, on_complete=on_complete)

    # A taken name is refused before the file is read; the list itself is made with its
    # first chunk (see _load), which checks the name again.
    try:
        app.lists.get(name)
    except ListNotFound:
        pass
    else:
        raise ListExists(f"a list named {name!r} exists already")
    _loaded(app, name, _load(app, name, source, create), not no_seal)


@lists.command("append")
@click.argument("name")
@FROM
@click.option("--no-seal", is_flag=True, help="Leave the list open for more appends.")
@database_option
def lists_append(name: str, source: IO[bytes], no_seal: bool, database_url: str | None) -> None:
    """Append a JSON-lines file to a list that is still loading, then seal it."""
    app = App(database_url, strict=False)
    list_id = app.lists.get(name).id  # (an unknown name says so before the file is read)
    _loaded(app, name, _load(app, name, source, list_id=list_id), not no_seal)


@lists.command("seal")
@click.argument("name")
@database_option
def lists_seal(name: str, database_url: str | None) -> None:
    """Seal a list: its items become immutable and its positions can be handed out."""
    info = App(database_url).lists.seal(name)
    out.print(f"list {info.name} {info.state} ({info.progress.total:,} items)", soft_wrap=True)


@lists.command("drop")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask.")
@database_option
def lists_drop(name: str, yes: bool, database_url: str | None) -> None:
    """Delete a list, its items and its bookkeeping."""
    if not yes:
        click.confirm(f"Drop list {name!r} and all its items?", abort=True)
    gone = App(database_url).lists.drop(name)
    out.print(f"list {name} dropped" if gone else f"no list named {name!r}", soft_wrap=True)
    if not gone:
        sys.exit(1)


@lists.command("kick")
@click.argument("name")
@click.option("--limit", default=None, type=Integer(1, 10**9), help="Most positions to revive.")
@database_option
def lists_kick(name: str, limit: int | None, database_url: str | None) -> None:
    """Hand buried positions out again (oldest first), with their attempts counted afresh."""
    lists_api = App(database_url).lists
    n = lists_api.kick(name) if limit is None else lists_api.kick(name, limit)
    out.print(f"kicked {n:,} buried positions of list {name}", soft_wrap=True)


# -- running ------------------------------------------------------------------------------
class _Stop:
    """``drain``'s stop flag: a signal, or the parent ``lists run`` gone (this process
    would otherwise drain on alone, unseen)."""

    def __init__(self, parent: int | None) -> None:
        self.event = threading.Event()
        self.parent = parent

    def is_set(self) -> bool:
        return self.event.is_set() or (self.parent is not None and os.getppid() != self.parent)


@lists.command("drain", hidden=True)
@click.argument("name")
@click.option("--app", "app_path", required=True, metavar="MODULE:APP")
@database_option
@click.option("--parent", type=Integer(), default=None, help="Stop when this process is gone.")
@click.option("--report", type=click.Path(dir_okay=False), default=None,
              help="Write the counts of outcomes here as JSON at the end.")
def lists_drain(name: str, app_path: str, database_url: str | None, parent: int | None,
                report: str | None) -> None:
    """One process of `lists run`: run_next until the list has nothing ready or reserved.
    The first SIGINT/SIGTERM stops it after its current item, a second at once."""
    stop = _Stop(parent)

    def on_signal(signum: int, frame: Any) -> None:
        if stop.event.is_set():
            raise KeyboardInterrupt
        stop.event.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    app = load_app(app_path, database_url)
    counts: dict[str, int] = {}
    said, failures = -math.inf, 0
    try:
        for run in app.lists.drain(name, stop=stop):
            counts[run.outcome] = counts.get(run.outcome, 0) + 1
            if run.outcome in ("released", "buried"):
                # Failures go on screen (the first at once, then one line each 5 s per
                # process): a task that always fails would otherwise sit at 0 done
                # through its backoffs with nothing said.
                failures += 1
                if time.monotonic() - said >= FAILURE_EVERY:
                    said = time.monotonic()
                    last = (run.error or "").strip().splitlines()
                    what = "buried" if run.outcome == "buried" else "to be retried after a backoff"
                    err.print(f"list {name}: {failures:,} attempt(s) failed in process {os.getpid()}; "
                              f"last: position {run.position}, attempt {run.attempt}, {what}: "
                              f"{last[-1][:200] if last else '?'}", soft_wrap=True)
    finally:
        app.close()
    if report:
        with open(report, "w") as f:
            json.dump({"pid": os.getpid(), "stopped": stop.is_set(), **counts}, f)


@lists.command("run")
@click.argument("name")
@click.option("--parallelism", "-p", default=4, show_default=True, type=Integer(1, 256),
              help="Worker processes.")
@click.option("--app", "app_path", default=None, metavar="MODULE:APP",
              help="The App that registers the list's task (each process loads it).")
@database_option
def lists_run(name: str, parallelism: int, app_path: str | None, database_url: str | None) -> None:
    """Drain list NAME with P processes, each running the list's task on one item at a
    time. Exits 0 once nothing is ready or reserved, 1 if a process failed; SIGINT or
    SIGTERM stops every process after its current item."""
    app = load_app(app_path, database_url, strict=False)
    info = app.lists.get(name)
    if info.task is None:
        raise click.ClickException(f"list {name!r} has no task: its consumers reserve and complete it")
    if info.task not in app.tasks:
        raise click.ClickException(f"list {name!r} runs task {info.task!r}: give the App that "
                                   "registers it with --app MODULE:APP")
    if info.state == "loading":
        raise click.ClickException(f"list {name!r} is still loading: seal it first")
    cmd = [sys.executable, "-m", "justonce", "lists", "drain", name, "--app", str(app_path),
           "--parent", str(os.getpid())]
    env = {**os.environ, "JUSTONCE_DATABASE_URL": app.database_url}  # not in argv: ps shows it
    reports = tempfile.mkdtemp(prefix="justonce-run-")
    # Children get a session of their own: a terminal's Ctrl-C reaches only this process,
    # which passes on one SIGTERM (a second would make them drop their current item).
    # Their output is the terminal's (a task may print): the counts come back in files.
    procs = [subprocess.Popen([*cmd, "--report", os.path.join(reports, f"{i}.json")],
                              stdin=subprocess.DEVNULL, env=env, start_new_session=True)
             for i in range(parallelism)]
    stopped: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stopped.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        info = _watch(app, name, procs)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        app.close()
    failed = [(p.pid, p.returncode) for p in procs if p.returncode != 0]
    runs = sum(_completed(os.path.join(reports, f"{i}.json")) for i in range(parallelism))
    shutil.rmtree(reports, ignore_errors=True)
    p = info.progress
    out.print(f"list {name}: {p.done:,} of {p.total:,} done, {p.buried:,} buried, {p.ready:,} ready, "
              f"{p.reserved:,} reserved; {runs:,} completed by {parallelism} processes", soft_wrap=True)
    if stopped:
        out.print(f"stopped by {signal.Signals(stopped[0]).name}: each process finished its current "
                  "item; run again to go on", soft_wrap=True)
        sys.exit(128 + stopped[0])
    if failed:
        raise click.ClickException(f"{len(failed)} of {parallelism} processes failed: "
                                   + ", ".join(f"pid {pid} exit {rc}" for pid, rc in failed))
    if p.buried:
        out.print(f"{p.buried:,} positions are buried: see `justonce lists show {name}`, "
                  f"revive them with `justonce lists kick {name}`", soft_wrap=True)


def _completed(report: str) -> int:
    """Items a child completed, from its report (none if it died without one)."""
    try:
        with open(report) as f:
            return int(json.load(f).get("completed", 0))
    except (OSError, ValueError, AttributeError):
        return 0


def _watch(app: App, name: str, procs: list[subprocess.Popen[bytes]]) -> ListInfo:
    """Show the list's progress until every process has exited; the last look."""
    # (A column's text is a format string read as markup: the name goes in as the task's
    # description, shown plain.)
    columns = [TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
               MofNCompleteColumn(), TextColumn("{task.fields[detail]}"), TimeElapsedColumn()]
    with Progress(*columns, console=err) as bar:
        task = bar.add_task(visible(name), total=None, detail="")
        while True:
            running = sum(p.poll() is None for p in procs)
            info = app.lists.get(name)
            p = info.progress
            bar.update(task, total=p.total, completed=p.done, detail=(
                f"{p.reserved:,} reserved, {p.buried:,} buried, {running} processes"))
            if not running:
                return info
            time.sleep(POLL)
