"""The ``justonce`` command line: thin — parse, call the App, print."""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import UTC
from typing import Any

import click
from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table

from . import logs, validate
from .app import App
from .cli_output import out, print_lines, visible
from .errors import ConfigurationError, InvalidOption, JustonceError
from .models import BatchInfo, Job
from .types import BatchState, JobState
from .validate import plain_int, shown, text_float, text_int


class Group(click.Group):
    """Turns every JustonceError into a one-line message and exit status 1. A message
    quotes what it refused (a queue name, a key, an option's value): its control
    characters are shown escaped, as everything the CLI prints is (see cli_output)."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            raise _escaped(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JustonceError as exc:
            raise _escaped(click.ClickException(f"{type(exc).__name__}: {exc}")) from None
        except click.ClickException as exc:
            raise _escaped(exc) from None


def _escaped(exc: click.ClickException) -> click.ClickException:
    """``exc``, or when its message has a control character, the same error with it
    escaped (click prints a message raw to a terminal). Newlines stay: a usage error's
    message may be the help text."""
    message = exc.format_message()
    shown_message = "\n".join(visible(line) for line in message.split("\n"))
    if shown_message == message:
        return exc
    if isinstance(exc, click.UsageError):
        return click.UsageError(shown_message, exc.ctx)
    return click.ClickException(shown_message)  # (exit status 1, as every other ClickException)


class PlainId(click.ParamType):
    """A job's, batch's or token's id as ids are written: ASCII digits, no sign, no
    leading zero, no underscore or space (click's IntRange reads "1_5" as 15 and " 014"
    as 14: a malformed id must not name another job)."""

    name = "id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        n = plain_int(str(value) if isinstance(value, int) and not isinstance(value, bool) else value)
        if n is None:
            self.fail(f"{shown(value)} is not an id (a positive integer in plain digits, below 2**63)",
                      param, ctx)
        return n


ID = PlainId()


class Integer(click.IntRange):
    """click's IntRange (bounds and help as click shows them) over integers written as
    integers are: ASCII digits with an optional sign (validate.text_int). click reads
    a value with int(), which takes "1_0" for 10, " 7 " for 7 and "\u0663" for 3: a typo in
    ``--priority 1_0`` ran the job at priority 10."""

    def __init__(self, min: int | None = None, max: int | None = None) -> None:  # noqa: A002 - click's names
        super().__init__(min, max)
        if min is None and max is None:
            self.name = "integer"  # (the help's metavar: INTEGER, as click.INT's)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            number = text_int(value)
            if number is None:
                self.fail(f"{shown(value)} is not an integer (ASCII digits, optionally signed)",
                          param, ctx)
            value = number
        return super().convert(value, param, ctx)

    def _describe_range(self) -> str:
        # (Without bounds, click's help would read "[x<=None]".)
        return "" if self.min is None and self.max is None else super()._describe_range()


class Number(click.FloatRange):
    """click's FloatRange over finite numbers written as decimals are (validate.text_float):
    click reads a value with float(), which takes "1_0", " 1.5 ", "nan" and "inf" (a
    ``--delay nan`` or ``--lease inf`` means nothing the options could do)."""

    def __init__(self, min: float | None = None, max: float | None = None) -> None:  # noqa: A002 - click's names
        super().__init__(min, max)
        if min is None and max is None:
            self.name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            number = text_float(value)
            if number is None:
                self.fail(f"{shown(value)} is not a finite number (ASCII digits with an optional "
                          "sign, point and exponent)", param, ctx)
            value = number
        return super().convert(value, param, ctx)

    def _describe_range(self) -> str:
        return "" if self.min is None and self.max is None else super()._describe_range()


def host_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A --host option's value, checked when the command line is read (see
    :func:`justonce.validate.host`), before the command starts anything."""
    try:
        return validate.host(value, "the host")
    except InvalidOption as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def database_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--database-url", envvar="JUSTONCE_DATABASE_URL", default=None, metavar="URL",
        help="sqlite:///path.db (default sqlite:///justonce.db), postgresql://… or mysql://… "
        "[env JUSTONCE_DATABASE_URL]",
    )(fn)


def load_app(path: str | None, database_url: str | None, strict: bool = True) -> App:
    """``pkg.module:app`` → the App object, pointed at ``database_url`` when given."""
    if not path:
        return App(database_url, strict=strict)
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr or module_name.startswith("."):
        # (A relative module, ".tasks", has no package to be relative to here.)
        raise ConfigurationError(f"--app {shown(path)} must look like package.module:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {shown(module_name)} for --app: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the module's own code failed: one line, not its traceback
        raise ConfigurationError(f"importing {shown(module_name)} for --app raised "
                                 f"{type(exc).__name__}: {exc}") from None
    if not hasattr(module, attr):
        apps = sorted(k for k, v in vars(module).items() if isinstance(v, App))
        raise ConfigurationError(f"--app {shown(path)}: {module_name} has no {attr!r}"
                                 + (f" (its App: {', '.join(apps)})" if apps else ""))
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise ConfigurationError(f"{shown(path)} is not a justonce.App (got {type(app).__name__})")
    if database_url:
        app.use_database(database_url)
    return app


def parse_json(value: str | None, what: str, kind: type) -> Any:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError as exc:  # not JSON; or an integer past Python's 4,300 digits
        raise click.BadParameter(f"not JSON: {exc}", param_hint=what) from None
    except RecursionError:
        raise click.BadParameter("nested too deep", param_hint=what) from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"must be a JSON {'array' if kind is list else 'object'}",
                                 param_hint=what)
    return parsed


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="justonce")
def cli() -> None:
    """justonce: a job queue in your SQL database that does nothing twice and loses nothing."""


@cli.command()
@database_option
def migrate(database_url: str | None) -> None:
    """Create or upgrade justonce's tables."""
    app = App(database_url)
    applied = app.migrate()
    out.print(f"applied {len(applied)} migration(s): {', '.join(applied)}" if applied
              else "schema is up to date")


@cli.command()
@click.option("--app", "app_path", required=True, metavar="MODULE:APP",
              help="The App that registers your tasks, e.g. myproject.tasks:app")
@database_option
@click.option("--queues", default=None, help="Comma-separated queues (default: the app's).")
@click.option("--concurrency", "-c", default=4, show_default=True, type=Integer(1, 1000))
@click.option("--lease", default=15.0, show_default=True, type=Number(min=0.1),
              help="Seconds a claim lives without renewal.")
@click.option("--heartbeat", default=None, type=Number(min=0.01),
              help="Seconds between lease renewals [default: lease/3].")
@click.option("--grace", default=30.0, show_default=True, type=Number(min=0),
              help="Seconds in-flight jobs get to finish on SIGTERM.")
@click.option("--poll", default=1.0, show_default=True, type=Number(min=0.01),
              help="Seconds between polls when idle (wake-ups usually come sooner).")
@click.option("--prefetch", default=250, show_default=True, type=Integer(1, 10000),
              help="Most jobs leased at once. The worker leases about 50 ms of work at a "
              "time, so only jobs shorter than 0.2 ms reach the default.")
@click.option("--no-listen", is_flag=True, help="Never LISTEN (PgBouncer transaction mode).")
@click.option("--housekeeping-interval", default=1.0, show_default=True,
              type=Number(min=0.05))
@click.option("--partitions", "partitions", default=None, metavar="SET:N",
              help="Run only jobs with a partition_key, of the slots of SET this worker "
              "holds (N slots; SET alone takes N from $JUSTONCE_PARTITIONS).")
@click.option("--partition-slots", default=1, show_default=True, type=Integer(1, 4096),
              help="Slots of the set this worker holds at most.")
@click.option("--batch-retention", default=7 * 86400.0, show_default=True,
              type=Number(0, 10 * 365 * 86400),
              help="Seconds completed and expired batches are kept.")
@click.option("--metrics-port", default=None, type=Integer(1, 65535), metavar="PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (off by default).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, callback=host_option,
              help="Address the metrics server binds to.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", default="json", show_default=True, type=click.Choice(["json", "text"]))
def worker(app_path: str, database_url: str | None, queues: str | None, concurrency: int,
           lease: float, heartbeat: float | None, grace: float, poll: float, prefetch: int,
           no_listen: bool, housekeeping_interval: float, partitions: str | None,
           partition_slots: int, batch_retention: float, metrics_port: int | None,
           metrics_host: str, log_level: str, log_format: str) -> None:
    """Run jobs until SIGTERM / SIGINT / SIGHUP (a second signal stops at once)."""
    from .worker import Worker

    logs.setup(log_level, json_lines=log_format == "json")
    app = load_app(app_path, database_url)
    queue_list = [q.strip() for q in queues.split(",")] if queues else None
    w = Worker(app, queues=queue_list, concurrency=concurrency, lease=lease,
               heartbeat=heartbeat, grace=grace, poll=poll, prefetch=prefetch,
               listen=not no_listen, housekeeping_interval=housekeeping_interval,
               batch_retention=batch_retention, partitions=partitions,
               partition_slots=partition_slots)
    server = None
    try:
        if metrics_port is not None:
            from .metrics import serve_worker_metrics

            try:
                server, _ = serve_worker_metrics(w, metrics_port, metrics_host)
            except InvalidOption as exc:
                raise click.BadParameter(str(exc), param_hint="--metrics-port") from exc
        w.run()
    finally:
        if server is not None:
            server.shutdown()
        app.close()


@cli.command()
@click.argument("task")
@click.option("--args", "args_json", default=None, metavar="JSON", help="Positional arguments, a JSON array.")
@click.option("--kwargs", "kwargs_json", default=None, metavar="JSON", help="Keyword arguments, a JSON object.")
@click.option("--queue", default=None)
@click.option("--delay", default=None, type=Number(), help="Seconds from now.")
@click.option("--priority", default=None, type=Integer(), help="Lower runs first.")
@click.option("--key", default=None, help="Uniqueness key among live jobs.")
@click.option("--max-attempts", default=None, type=Integer())
@click.option("--timeout", default=None, type=Number())
@click.option("--app", "app_path", default=None, metavar="MODULE:APP",
              help="Check TASK against this app's tasks and use its defaults.")
@database_option
def enqueue(task: str, args_json: str | None, kwargs_json: str | None, queue: str | None,
            delay: float | None, priority: int | None, key: str | None,
            max_attempts: int | None, timeout: float | None, app_path: str | None,
            database_url: str | None) -> None:
    """Queue one run of TASK and print its id."""
    args = parse_json(args_json, "--args", list) or []
    kwargs = parse_json(kwargs_json, "--kwargs", dict)
    app = load_app(app_path, database_url, strict=app_path is not None)
    job = app.enqueue(task, args, kwargs, queue=queue, delay=delay, priority=priority, key=key,
                      max_attempts=max_attempts, timeout=timeout)
    note = " (existing job holding that key)" if job.duplicate else ""
    out.print(f"job {job.id} {job.state}{note}")


@cli.command()
@database_option
def status(database_url: str | None) -> None:
    """Jobs per queue and state."""
    app = App(database_url)
    counts = app.queue_counts()
    states = [s.value for s in JobState]
    table = Table("queue", *states, title="justonce jobs")
    by_queue: dict[str, dict[str, int]] = {}
    for c in counts:
        by_queue.setdefault(c.queue, {})[c.state.value] = c.count
    for queue, row in sorted(by_queue.items()):
        table.add_row(queue, *(str(row.get(s, 0)) for s in states))
    paused = app.paused_queues()
    if not by_queue:
        out.print("no jobs")
    else:
        out.print(table)
    if paused:
        out.print("paused: " + ", ".join(p.queue for p in paused) + " (justonce queues resume NAME)")


@cli.group()
def jobs() -> None:
    """List, inspect, retry and cancel jobs."""


@jobs.command("list")
@click.option("--state", type=click.Choice([s.value for s in JobState]), default=None)
@click.option("--queue", default=None)
@click.option("--task", default=None)
@click.option("--limit", default=50, show_default=True, type=Integer(1, 10000))
@database_option
def jobs_list(state: str | None, queue: str | None, task: str | None, limit: int,
              database_url: str | None) -> None:
    """The newest jobs first."""
    rows = App(database_url).list_jobs(state=state, queue=queue, task=task, limit=limit)
    table = Table("id", "queue", "task", "state", "attempts", "run_at", "last error")
    for j in rows:
        err = (j.last_error or "").strip().splitlines()
        table.add_row(str(j.id), j.queue, j.task, j.state.value, f"{j.attempts}/{j.max_attempts}",
                      j.run_at.isoformat(timespec="seconds"), err[-1][:60] if err else "")
    show(table, rows, limit, "no jobs")


def show(table: Table, rows: Sequence[object], limit: int, empty: str) -> None:
    """A listing's table, or ``empty``; when it filled ``limit``, a line saying that there
    may be more (a listing cut at its limit without a word reads as all there is)."""
    if not rows:
        out.print(empty)
        return
    out.print(table)
    if len(rows) >= limit:
        out.print(f"the first {limit:,} shown: there may be more (--limit raises it)", style="yellow")


def _print_job(job: Job) -> None:
    table = Table(show_header=False, box=None)
    for name in ("id", "queue", "task", "state", "priority", "attempts", "max_attempts",
                 "timeout", "key", "partition_key", "run_at", "created_at", "started_at",
                 "finished_at", "lease_owner", "lease_expires_at"):
        value = getattr(job, name)
        table.add_row(name, "" if value is None else str(value))
    table.add_row("args", json.dumps(job.args))
    table.add_row("kwargs", json.dumps(job.kwargs))
    table.add_row("result", json.dumps(job.result))
    if job.undecodable:
        table.add_row("undecodable", job.undecodable)
    out.print(table)
    if job.errors:
        out.print("history", style="bold")
        for e in job.errors:
            first = str(e.get("error", "")).strip().splitlines()
            out.print(f"  attempt {e.get('attempt')} {e.get('kind')} at {e.get('at')} "
                      f"({e.get('owner')}): {first[-1] if first else ''}")
    if job.last_error:
        out.print("last error", style="bold")
        print_lines(job.last_error)


@jobs.command("show")
@click.argument("job_id", type=ID)
@database_option
def jobs_show(job_id: int, database_url: str | None) -> None:
    """Everything about one job, with its history of failed attempts."""
    _print_job(App(database_url).get_job(job_id))


@jobs.command("retry")
@click.argument("job_id", type=ID)
@database_option
def jobs_retry(job_id: int, database_url: str | None) -> None:
    """Make a dead or cancelled job ready again."""
    job = App(database_url).retry(job_id)
    out.print(f"job {job.id} {job.state}")


@jobs.command("cancel")
@click.argument("job_id", type=ID)
@database_option
def jobs_cancel(job_id: int, database_url: str | None) -> None:
    """Cancel a scheduled, ready or running job."""
    job = App(database_url).cancel(job_id)
    out.print(f"job {job.id} {job.state}")


@cli.group()
def queues() -> None:
    """See queues; pause and resume them."""


def _cli_actor() -> str:
    try:
        user = os.getlogin()
    except OSError:
        user = os.environ.get("USER") or "?"
    return f"cli {user}@{socket.gethostname()}"[:200]


@queues.command("list")
@database_option
def queues_list(database_url: str | None) -> None:
    """Jobs per queue and state, the wait of each queue's next ready job, and which queues
    are paused."""
    stats = App(database_url).queue_stats()
    if not stats:
        out.print("no queues")
        return
    states = [s.value for s in JobState]
    table = Table("queue", "paused", *states, "waited", title="justonce queues",
                  caption="waited: how long the queue's next ready job has waited")
    for q in stats:
        wait = "" if q.oldest_ready_age is None else f"{q.oldest_ready_age:.1f}s"
        table.add_row(q.queue, "" if q.paused is None else "paused",
                      *(str(q.counts.get(s, 0)) for s in states), wait)
    out.print(table)
    for q in stats:
        if q.paused is not None:
            p = q.paused
            out.print(f"{p.queue}: paused since {p.paused_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
                      + (f" by {p.actor}" if p.actor else "") + (f": {p.note}" if p.note else ""))
    if any(q.estimated for q in stats):
        out.print("(counts estimated from a sample: the jobs table is large)")


@queues.command("pause")
@click.argument("queue")
@click.option("--note", default=None, help="Why: kept with the pause and shown where it is listed.")
@database_option
def queues_pause(queue: str, note: str | None, database_url: str | None) -> None:
    """Stop every worker from claiming QUEUE's jobs until it is resumed. Jobs already
    running finish; enqueueing goes on (the jobs wait). Pausing a paused queue changes
    nothing."""
    pause = App(database_url).pause_queue(queue, note=note, actor=_cli_actor())
    since = f"{pause.paused_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    if pause.already:
        out.print(f"queue {pause.queue} was paused already (since {since}): nothing changed")
    else:
        out.print(f"queue {pause.queue} paused (since {since})")


@queues.command("resume")
@click.argument("queue")
@database_option
def queues_resume(queue: str, database_url: str | None) -> None:
    """Let workers claim QUEUE's jobs again."""
    if App(database_url).resume_queue(queue):
        out.print(f"queue {queue} resumed")
    else:
        out.print(f"queue {queue} was not paused")


@cli.group()
def batches() -> None:
    """Follow, seal and clean up batches."""


def _bar(b: BatchInfo, width: int = 30) -> ProgressBar:
    """Resolved items (acked + failed) out of the total; an empty sealed batch is full."""
    total = max(b.total, 1)
    done = b.acked + b.failed if b.total else (1 if b.state is BatchState.COMPLETED else 0)
    return ProgressBar(total=total, completed=done, width=width,
                       complete_style="red" if b.failed else "green", finished_style="green"
                       if not b.failed else "red")


@batches.command("list")
@click.option("--state", type=click.Choice([s.value for s in BatchState]), default=None)
@click.option("--limit", default=50, show_default=True, type=Integer(1, 10000))
@database_option
def batches_list(state: str | None, limit: int, database_url: str | None) -> None:
    """The newest batches first, with their progress."""
    rows = App(database_url).batches.list(state=state, limit=limit)
    table = Table("id", "state", "progress", "acked", "failed", "total", "description")
    for b in rows:
        table.add_row(str(b.id), b.state.value, _bar(b, 20), str(b.acked), str(b.failed),
                      str(b.total), (b.description or "")[:30])
    show(table, rows, limit, "no batches")


@batches.command("show")
@click.argument("batch_id", type=ID)
@click.option("--failures", "n_failures", default=20, show_default=True,
              type=Integer(0, 100_000), help="How many failed items to list.")
@database_option
def batches_show(batch_id: int, n_failures: int, database_url: str | None) -> None:
    """One batch: its state, progress, callbacks and failed items."""
    app = App(database_url)
    b = app.batches.get(batch_id)
    table = Table(show_header=False, box=None)
    for name in ("id", "state", "description", "total", "acked", "failed", "pending", "groups",
                 "on_complete", "on_success", "expire_after", "created_at", "updated_at",
                 "sealed_at", "finished_at"):
        value = getattr(b, name)
        table.add_row(name, "" if value is None else str(value))
    table.add_row("progress", _bar(b, 40))
    out.print(table)
    failures = app.batches.failures(batch_id, limit=n_failures) if n_failures and b.failed else []
    if failures:
        out.print(f"failed items ({b.failed})", style="bold")
        for f in failures:
            first = f.reason.strip().splitlines()
            out.print(f"  {f.item} at {f.failed_at.isoformat(timespec='seconds')}: "
                      f"{first[-1][:100] if first else ''}")


@batches.command("seal")
@click.argument("batch_id", type=ID)
@database_option
def batches_seal(batch_id: int, database_url: str | None) -> None:
    """Seal an open batch (no more items); completes it when nothing is pending."""
    r = App(database_url).batches.seal(batch_id)
    note = " (was sealed already)" if r.already_sealed else ""
    out.print(f"batch {r.batch_id} {r.state}{note}")


@batches.command("prune")
@click.option("--retention", default=7 * 86400.0, show_default=True,
              type=Number(0, 10 * 365 * 86400),
              help="Remove completed and expired batches finished this many seconds ago.")
@database_option
def batches_prune(retention: float, database_url: str | None) -> None:
    """Expire idle open batches and remove old finished ones now (workers do it
    in their housekeeping too)."""
    report = App(database_url).batches.prune(retention)
    out.print(f"expired {report.expired} idle batches, removed {report.removed} finished batches")


@cli.group()
def partitions() -> None:
    """Partition sets: who holds which slot."""


@partitions.command("list")
@click.option("--set", "set_name", default=None, help="Only this set.")
@database_option
def partitions_list(set_name: str | None, database_url: str | None) -> None:
    """Every slot of every set: owner, expiry and fencing token."""
    rows = App(database_url).partitions.list(set_name)
    table = Table("set", "slot", "n", "state", "owner", "token", "expires")
    for r in rows:
        state = "held" if r.held else ("expired" if r.owner else "free")
        table.add_row(r.set_name, str(r.slot), str(r.n), state, r.owner or "", str(r.token),
                      r.expires_at.isoformat(timespec="seconds") if r.expires_at else "")
    out.print(table if rows else "no partition sets")


@cli.group()
def effects() -> None:
    """The effect ledger: entries in doubt, and an operator's verdict on them."""


@effects.command("in-doubt")
@click.option("--scope", default=None, help="Only this scope (e.g. push:7).")
@click.option("--limit", default=100, show_default=True, type=Integer(1, 100_000))
@database_option
def effects_in_doubt(scope: str | None, limit: int, database_url: str | None) -> None:
    """Effects whose holder died (or stalled) mid-effect: at most once, nobody redoes
    them; check the provider, then resolve each with `justonce effects resolve`."""
    rows = App(database_url).effects.in_doubt(scope, limit)
    table = Table("scope", "key", "policy", "owner", "attempts", "lease expired", "last error")
    for e in rows:
        table.add_row(e.scope, e.key, e.policy, e.owner or "", str(e.attempts),
                      e.lease_expires_at.isoformat(timespec="seconds") if e.lease_expires_at else "",
                      (e.last_error or "")[:40])
    show(table, rows, limit, "no effects in doubt")


@effects.command("resolve")
@click.argument("scope")
@click.argument("keys", metavar="KEY...", nargs=-1, required=True)
@click.option("--done", "done", is_flag=True, help="It happened: never redo it.")
@click.option("--redo", "redo", is_flag=True, help="It did not happen: claimable again.")
@click.option("--note", default=None, help="Why (kept as the entry's last error).")
@click.option("--force", is_flag=True, help="Also resolve an entry whose lease is still live.")
@click.option("--lock-timeout", default=5.0, show_default=True, type=Number(0.001, 3600),
              help="Seconds to wait for an entry locked by another process (then fail, "
                   "nothing written).")
@database_option
def effects_resolve(scope: str, keys: tuple[str, ...], done: bool, redo: bool, note: str | None, force: bool,
                    lock_timeout: float, database_url: str | None) -> None:
    """Resolve effects in doubt: --done or --redo. With several keys, those not in doubt
    are named and left as they are (exit status 1)."""
    # Two flags, not one option with two values: given both, the last used to win
    # silently, and "--done --redo" made an at-most-once entry claimable again.
    if done == redo:
        raise click.UsageError("say --done or --redo" if not done else "--done and --redo contradict "
                               "each other: say one of them")
    verdict = "done" if done else "redo"
    effects = App(database_url).effects
    if len(keys) == 1:
        e = effects.resolve(scope, keys[0], done=verdict == "done", note=note, force=force,
                            lock_timeout=lock_timeout)
        out.print(f"effect {e.scope}:{e.key} {e.state}")
        return
    resolved = effects.resolve_many(scope, keys, done=verdict == "done", note=note, force=force,
                                    lock_timeout=lock_timeout)
    left = sorted(set(keys) - set(resolved))
    out.print(f"resolved {len(resolved)} of {len(set(keys))} effects of {scope} "
              f"({'done' if verdict == 'done' else 'claimable again'})")
    if left:
        out.print(f"not in doubt, left as they are: {', '.join(left[:20])}" + (" …" if len(left) > 20 else ""))
        sys.exit(1)


@cli.group()
def demo() -> None:
    """Runnable demonstrations on real worker processes."""


@demo.command("jobs")
@click.option("--jobs", "n_jobs", default=20000, show_default=True, type=Integer(1, 10_000_000))
@click.option("--workers", default=4, show_default=True, type=Integer(1, 64))
@click.option("--kill-one", is_flag=True, help="kill -9 one worker midway.")
@database_option
def demo_jobs(n_jobs: int, workers: int, kill_one: bool, database_url: str | None) -> None:
    """Queue N jobs, run them on W worker processes, and prove none ran twice or got lost."""
    if kill_one and workers < 2:
        # (with its only worker killed, the jobs it leaves are nobody's to run)
        raise click.UsageError("--kill-one needs --workers 2 or more: a worker must be left "
                               "to take over the killed one's jobs")
    from .demo.jobs import run_demo

    # (The demos style their own lines with markup, and print no stored text.)
    ok = run_demo(database_url, n_jobs, workers, kill_one, Console())
    sys.exit(0 if ok else 1)


@demo.command("push")
@click.option("--users", default=200_000, show_default=True, type=Integer(1000, 10_000_000))
@click.option("--workers", default=4, show_default=True, type=Integer(1, 64),
              help="Worker processes; each phase is one job per slot of MOD(user_id, N), N = workers.")
@click.option("--senders", default=4, show_default=True, type=Integer(1, 64),
              help="Sender threads per worker, one SMTP connection each.")
@click.option("--per-user-jobs", is_flag=True,
              help="One job per user (a claim, a done mark and a look-up per email), to compare.")
@click.option("--kill-one", is_flag=True, help="kill -9 a worker midway, in the middle of its chunks.")
@click.option("--redo", is_flag=True,
              help="After the run, send once again the entries in doubt that the demo server's log "
                   "lacks (those it has are resolved done after every run on the demo's own server).")
@click.option("--smtp", default=None, metavar="HOST:PORT",
              help="Send to your SMTP server (a mail catcher, smtp-sink) instead of the demo's own.")
@click.option("--seed", default=7, show_default=True, type=Integer(), help="Seed of the users and samples.")
@database_option
def demo_push(users: int, workers: int, senders: int, per_user_jobs: bool, kill_one: bool, redo: bool,
              smtp: str | None, seed: int, database_url: str | None) -> None:
    """Send a Push to a list with A/B and "rest" phases racing: at most one email per user."""
    from .demo.push import Options, run_push_demo

    if smtp is not None:
        from .demo.mail import split_address

        try:
            host, port = split_address(smtp)
        except ValueError as exc:
            raise click.BadParameter(f"{exc} (HOST:PORT, [::1]:PORT for an IPv6 host)",
                                     param_hint="--smtp") from None
        if redo:
            raise click.UsageError("--redo needs the demo's own SMTP server: its log tells which emails in "
                                   "doubt were delivered (with your server, check its log and use "
                                   "`justonce effects resolve`)")
        try:  # (before anything is set up: a Push to a server that is not there sends nothing)
            socket.create_connection((host, port), timeout=5).close()
        except OSError as exc:
            raise click.BadParameter(f"cannot connect to {smtp}: {exc}", param_hint="--smtp") from None
    opts = Options(users=users, workers=workers, senders=senders, kill_one=kill_one, smtp=smtp, seed=seed,
                   per_user_jobs=per_user_jobs, redo=redo)
    ok = run_push_demo(database_url, opts, Console())
    sys.exit(0 if ok else 1)


from . import cli_lists, cli_service  # noqa: E402,F401  (register lists, serve and tokens)


def main() -> None:
    cli(prog_name="justonce")
