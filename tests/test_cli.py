"""The command line: every command works, and bad input gets one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from justonce import App, JobState
from justonce.cli import cli

COMMANDS = [[], ["migrate"], ["worker"], ["enqueue"], ["status"], ["jobs"], ["jobs", "list"],
            ["jobs", "show"], ["jobs", "retry"], ["jobs", "cancel"], ["demo"], ["demo", "jobs"],
            ["batches"], ["batches", "list"], ["batches", "show"], ["batches", "seal"],
            ["batches", "prune"], ["partitions"], ["partitions", "list"], ["effects"],
            ["effects", "in-doubt"], ["effects", "resolve"], ["serve"], ["tokens"],
            ["tokens", "create"], ["tokens", "list"], ["tokens", "revoke"], ["lists"], ["lists", "list"],
            ["lists", "show"], ["lists", "create"], ["lists", "append"], ["lists", "seal"],
            ["lists", "drop"], ["lists", "run"], ["lists", "kick"], ["lists", "drain"], ["queues"],
            ["queues", "list"], ["queues", "pause"], ["queues", "resume"]]


def run(*args: str, ok: bool = True):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("cmd", COMMANDS, ids=[" ".join(c) or "justonce" for c in COMMANDS])
def test_every_command_has_help(cmd: list[str]) -> None:
    result = run(*cmd, "--help")
    assert "Usage:" in result.output
    if cmd and cmd not in (["jobs"], ["demo"], ["batches"], ["partitions"], ["effects"], ["tokens"],
                           ["lists"], ["queues"]):
        assert "--database-url" in result.output


def test_migrate_enqueue_status_and_jobs_commands(db_url: str) -> None:
    url = ["--database-url", db_url]
    assert "applied" in run("migrate", *url).output
    assert "up to date" in run("migrate", *url).output
    out = run("enqueue", "mail.send", "--args", '["a@example.com"]', "--kwargs", '{"n": 1}',
              "--queue", "mail", "--priority", "3", *url).output
    job_id = int(out.split()[1])
    dup = run("enqueue", "mail.send", "--key", "k1", *url).output
    dup2 = run("enqueue", "mail.send", "--key", "k1", *url).output
    assert "existing job" in dup2 and dup.split()[1] == dup2.split()[1]
    status = run("status", *url).output
    assert "mail" in status and "ready" in status
    listing = run("jobs", "list", "--state", "ready", *url).output
    assert "mail.send" in listing
    shown = run("jobs", "show", str(job_id), *url).output
    assert "a@example.com" in shown and "mail" in shown
    assert "cancelled" in run("jobs", "cancel", str(job_id), *url).output
    assert "ready" in run("jobs", "retry", str(job_id), *url).output
    app = App(db_url, strict=False)
    job = app.get_job(job_id)
    assert job.state is JobState.READY and job.kwargs == {"n": 1} and job.priority == 3
    app.close()


@pytest.mark.parametrize(("args", "needle"), [
    (["enqueue", "t", "--args", "{not json"], "not JSON"),
    (["enqueue", "t", "--args", "[" + "9" * 4400 + "]"], "4300 digits"),
    (["enqueue", "t", "--args", '{"a": 1}'], "JSON array"),
    (["enqueue", "t", "--kwargs", "[1]"], "JSON object"),
    (["enqueue", "t", "--queue", "bad queue"], "bad queue name"),
    (["enqueue", "t", "--delay", "-5"], "delay must be >= 0"),
    (["enqueue", "t", "--app", "no_such_module:app"], "cannot import"),
    (["enqueue", "t", "--app", "nocolon"], "package.module:app"),
    (["enqueue", "t", "--app", ".relative:app"], "package.module:app"),
    (["worker", "--app", "..up:app"], "package.module:app"),
    (["enqueue", "t\n", "--database-url", "sqlite:///:memory:"], "InvalidName"),
    (["enqueue", "t", "--queue", "mail\n", "--database-url", "sqlite:///:memory:"], "InvalidName"),
    (["enqueue", "t", "--app", "json:dumps"], "not a justonce.App"),
    (["jobs", "show", "999999"], "no job 999999"),
    (["jobs", "show", "0"], "0"),
    (["jobs", "show", "abc"], "abc"),
    (["jobs", "retry", "1"], "no job"),
    (["jobs", "list", "--state", "sleeping"], "sleeping"),
    (["worker", "--app", "json:dumps"], "not a justonce.App"),
    (["worker", "--app", "x:y", "--concurrency", "0"], "concurrency"),
    (["queues", "pause", "bad queue"], "bad queue name"),
    (["demo", "jobs", "--workers", "1", "--kill-one"], "--workers 2 or more"),
    (["jobs", "show", "1_5"], "not an id"), (["jobs", "cancel", " 01"], "not an id"),
    (["jobs", "retry", "+1"], "not an id"), (["batches", "show", "0x1"], "not an id"),
    (["queues", "resume", "mail\n"], "InvalidName"),
    (["queues", "pause", "mail", "--note", "n" * 4001], "note must be"),
    (["enqueue", "proc_app.record", "--app", "proc_app:app", "--args", "[1, 2]"],
     "InvalidArguments: arguments do not match proc_app.record"),
    (["enqueue", "proc_app.record", "--app", "proc_app:nope"], "proc_app has no 'nope' (its App: app)"),
    # int() and float() read these as numbers: a typo ran a job at priority 10.
    (["enqueue", "t", "--priority", "1_0"], "'1_0' is not an integer"),
    (["enqueue", "t", "--priority", " 7"], "' 7' is not an integer"),
    (["enqueue", "t", "--priority", "\u0663"], "is not an integer"),
    (["enqueue", "t", "--max-attempts", "\uff13"], "is not an integer"),
    (["enqueue", "t", "--delay", "1_0"], "'1_0' is not a finite number"),
    (["enqueue", "t", "--delay", " 1.5"], "' 1.5' is not a finite number"),
    (["enqueue", "t", "--timeout", "inf"], "'inf' is not a finite number"),
    (["enqueue", "t", "--timeout", "1e999"], "'1e999' is not a finite number"),
    (["jobs", "list", "--limit", "5_0"], "'5_0' is not an integer"),
    (["worker", "--app", "x:y", "--lease", "nan"], "'nan' is not a finite number"),
    (["worker", "--app", "x:y", "--concurrency", "\u0663"], "is not an integer"),
    (["lists", "create", "l", "--from", "-", "--ttr", "1_0"], "'1_0' is not a finite number"),
    (["serve", "--port", "80_80"], "'80_80' is not an integer"),
])
def test_bad_input_gets_one_line_and_a_non_zero_exit(db_url: str, args, needle) -> None:
    run("migrate", "--database-url", db_url)
    result = run(*args, "--database-url", db_url, ok=False)
    assert result.exit_code != 0
    assert needle in result.output
    assert "Traceback" not in result.output


def test_queues_pause_list_and_resume(db_url: str) -> None:
    run("migrate", "--database-url", db_url)
    app = App(db_url, strict=False)
    app.enqueue("t", queue="mail")
    out = run("queues", "pause", "mail", "--note", "smtp down", "--database-url", db_url).output
    assert "queue mail paused" in out
    again = run("queues", "pause", "mail", "--database-url", db_url).output
    assert "was paused already" in again and "nothing changed" in again
    [pause] = app.paused_queues()
    assert pause.note == "smtp down" and pause.actor is not None and pause.actor.startswith("cli ")
    assert app.backend.job_claim("mail", 5, "cli-test", 30) == []
    listed = run("queues", "list", "--database-url", db_url).output
    assert "paused" in listed and "smtp down" in listed
    assert "paused: mail" in run("status", "--database-url", db_url).output
    assert "queue mail resumed" in run("queues", "resume", "mail", "--database-url", db_url).output
    assert "was not paused" in run("queues", "resume", "mail", "--database-url", db_url).output
    assert app.paused_queues() == [] and len(app.backend.job_claim("mail", 5, "cli-test", 30)) == 1
    app.close()


@pytest.mark.parametrize("url", ["nonsense", "oracle://x/y", "mysql://x/y/z", "mysql://x/y?colour=blue",
                                 "sqlite:////no/such/dir/x.db", "postgresql://postgres@[::1:5432/x",
                                 "mysql://root@[zz]:3306/x", "sqlite:///x.db?busy_timeout=-5"])
def test_bad_database_url_is_one_line(url: str) -> None:
    result = run("status", "--database-url", url, ok=False)
    assert result.exit_code == 1
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ConfigurationError")


@pytest.mark.parametrize("scheme", ["postgresql://postgres", "mysql://root"])
def test_database_that_is_down_is_one_line_from_a_real_process(scheme: str) -> None:
    from pgcluster import free_port

    url = f"{scheme}@127.0.0.1:{free_port()}/test"
    proc = subprocess.run([sys.executable, "-m", "justonce", "status", "--database-url", url],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "DatabaseUnavailable" in proc.stderr and "Traceback" not in proc.stderr
    # One line: not also the connection pool's own warning for each try (two lines each).
    assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1, proc.stderr


def test_demo_jobs_runs_worker_processes_and_reports_no_duplicates(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "justonce", "demo", "jobs", "--jobs", "2000", "--workers", "2",
         "--database-url", f"sqlite:///{tmp_path / 'demo.db'}"],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing lost, nothing completed twice" in proc.stdout


def test_batches_commands_show_progress_seal_and_prune(db_url: str) -> None:
    url = ["--database-url", db_url]
    app = App(db_url)
    try:
        app.migrate()
        done = app.batches.open("all done")
        app.batches.ack(done.add(4).item_ids())
        app.batches.fail(done.add(1).item_ids(), "no stock")
        half = app.batches.open("half way")
        app.batches.ack(half.add(10).item_ids()[:5])
        listing = run("batches", "list", *url).output
        assert "half way" in listing and "all done" in listing and "━" in listing
        assert "no batches" in run("batches", "list", "--state", "completed", *url).output
        assert "sealed" in run("batches", "seal", str(half.id), *url).output
        assert "completed" in run("batches", "seal", str(done.id), *url).output
        shown = run("batches", "show", str(done.id), *url).output
        assert "failed items" in shown and "no stock" in shown and "completed" in shown
        out = run("batches", "prune", "--retention", "0", *url).output
        assert "removed 1 finished batches" in out
        assert [b.id for b in app.batches.list()] == [half.id]
    finally:
        app.close()


@pytest.mark.parametrize("args", [["batches", "show", "999"], ["batches", "seal", "999"],
                                  ["batches", "show", "0"], ["batches", "list", "--state", "x"],
                                  ["batches", "prune", "--retention", "-1"]])
def test_bad_batch_commands_fail_with_one_line(db_url: str, args: list[str]) -> None:
    App(db_url).migrate()
    result = run(*args, "--database-url", db_url, ok=False)
    assert result.exit_code != 0
    assert result.output.strip().splitlines()[-1].startswith("Error: "), result.output
    assert "Traceback" not in result.output


def test_partitions_list_shows_owners_tokens_and_expiries(db_url: str) -> None:
    url = ["--database-url", db_url]
    app = App(db_url)
    try:
        app.migrate()
        assert "no partition sets" in run("partitions", "list", *url).output
        app.partitions.try_acquire("mail", 3, owner="host-a:1", lease=60)
        app.partitions.try_acquire("mail", 3, owner="host-b:2", lease=60).release()
        out = run("partitions", "list", *url).output
        assert "host-a:1" in out and "held" in out and "free" in out and "mail" in out
        result = run("partitions", "list", "--set", "nope", *url, ok=False)
        assert result.exit_code != 0 and "PartitionSetNotFound" in result.output
    finally:
        app.close()


def test_effects_in_doubt_and_resolve(db_url: str) -> None:
    import time

    url = ["--database-url", db_url]
    app = App(db_url)
    try:
        app.migrate()
        assert "no effects in doubt" in run("effects", "in-doubt", *url).output
        app.effects.claim("push:9", 77, lease=0.05)
        time.sleep(0.1)
        listed = run("effects", "in-doubt", "--scope", "push:9", *url).output
        assert "push:9" in listed and "77" in listed and "there may be more" not in listed
        # A listing cut at its limit says so.
        app.effects.claim("push:9", 78, lease=0.05)
        time.sleep(0.1)
        cut = run("effects", "in-doubt", "--scope", "push:9", "--limit", "1", *url).output
        assert "the first 1 shown: there may be more" in cut, cut
        app.effects.resolve("push:9", 78, done=True)
        assert run("effects", "resolve", "push:9", "77", *url, ok=False).exit_code != 0
        # Both verdicts at once is a usage error in either order (the last once won
        # silently: "--done --redo" made an at-most-once entry claimable again).
        for both in (["--done", "--redo"], ["--redo", "--done"]):
            contradiction = run("effects", "resolve", "push:9", "77", *both, *url, ok=False)
            assert contradiction.exit_code == 2 and "contradict" in contradiction.output
            assert app.effects.get("push:9", 77).state == "in_doubt"
        for wait in ("0", "-1", "nan", "abc"):
            refused = run("effects", "resolve", "push:9", "77", "--done", "--lock-timeout", wait, *url,
                          ok=False)
            assert refused.exit_code in (1, 2) and "lock" in refused.output
            assert "Traceback" not in refused.output
        assert app.effects.get("push:9", 77).state == "in_doubt"
        assert "done" in run("effects", "resolve", "push:9", "77", "--done", "--lock-timeout", "2",
                             *url).output
        bad = run("effects", "resolve", "push:9", "77", "--redo", *url, ok=False)
        assert bad.exit_code != 0 and "InvalidTransition" in bad.output
        for k in (1, 2, 3):
            app.effects.claim("push:9", k, lease=0.05)
        time.sleep(0.1)
        many = run("effects", "resolve", "push:9", "1", "2", "3", "--redo", *url)
        assert "resolved 3 of 3" in many.output
        some = run("effects", "resolve", "push:9", "1", "77", "404", "--done", *url, ok=False)
        assert some.exit_code == 1 and "resolved 0 of 3" in some.output and "1, 404, 77" in some.output
    finally:
        app.close()


def test_tokens_create_refuses_a_bad_scope_or_name_with_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    bad_scope = run("tokens", "create", "--name", "x", "--scope", "root", "--database-url", url, ok=False)
    assert bad_scope.exit_code != 0 and "root" in bad_scope.output
    bad_name = run("tokens", "create", "--name", "", "--scope", "read", "--database-url", url, ok=False)
    assert bad_name.exit_code == 1 and "InvalidOption" in bad_name.output
    missing = run("tokens", "revoke", "42", "--database-url", url, ok=False)
    assert missing.exit_code == 1 and "TokenNotFound" in missing.output


@pytest.mark.parametrize("command", ["migrate", "status"])
@pytest.mark.parametrize("foreign", ["justonce_jobs", "justonce_migrations"])
def test_another_products_table_under_our_names_is_one_line_on_every_backend(
        db_url: str, foreign: str, command: str) -> None:
    """A database holding a table of something else under one of justonce's names: every
    command is a one-line SchemaError (on SQLite it was DatabaseUnavailable, or a traceback
    for a foreign justonce_migrations, as on MariaDB and for status on Postgres), and the
    table is left alone."""
    from justonce.demo import connect

    if db_url.startswith("postgresql"):
        import psycopg

        from justonce.backends.postgres.backend import parse_postgres_url

        conninfo, schema, _ = parse_postgres_url(db_url)
        with psycopg.connect(conninfo, autocommit=True) as pg:
            pg.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    conn = connect(db_url)
    try:
        conn.execute(f"CREATE TABLE {foreign} (x int)")
        conn.execute(f"INSERT INTO {foreign} VALUES (7)")
        result = run(command, "--database-url", db_url, ok=False)
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert result.exit_code == 1 and len(lines) == 1, result.output
        # (status before any migration says to migrate, which then names the table)
        assert lines[0].startswith("Error: SchemaError") and (
            "another" in lines[0] or "run `justonce migrate`" in lines[0]), lines
        assert [tuple(r) for r in conn.execute(f"SELECT x FROM {foreign}").fetchall()] == [(7,)]
    finally:
        conn.close()


@pytest.mark.parametrize("foreign", ["CREATE TABLE {s}.justonce_jobs (x int)",
                                     "CREATE TABLE {s}.justonce_migrations (x int)"])
def test_migrate_over_another_products_tables_is_one_line_on_postgres(foreign: str) -> None:
    """A schema holding tables of something else under justonce's names: a one-line
    SchemaError (it was psycopg's DuplicateTable traceback), and nothing of ours made."""
    import uuid

    import psycopg

    from conftest import _drop_schema, postgres_or_skip

    server = postgres_or_skip()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.split("?")[0], autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(foreign.format(s=schema))
    try:
        url = f"{server}{'&' if '?' in server else '?'}schema={schema}"
        result = run("migrate", "--database-url", url, ok=False)
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert result.exit_code == 1 and len(lines) == 1, result.output
        assert lines[0].startswith("Error: SchemaError") and "another schema" in lines[0]
        with psycopg.connect(server.split("?")[0]) as conn:
            tables = {r[0] for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,))}
        assert len(tables) == 1, tables  # the foreign table alone: the migration rolled back
    finally:
        _drop_schema(server, schema)


def test_numbers_written_as_numbers_are_taken(db_url: str) -> None:
    """The strict reading refuses only what is not written as a number: signs, leading
    zeros, points and exponents are numbers."""
    run("migrate", "--database-url", db_url)
    app = App(db_url, strict=False)
    for priority, delay in (("-3", "1e3"), ("+3", ".5"), ("007", "2.")):
        out = run("enqueue", "t", "--priority", priority, "--delay", delay, "--max-attempts", "+2",
                  "--timeout", "1.5e1", "--database-url", db_url).output
        job = app.get_job(int(out.split()[1]))
        assert (job.priority, job.max_attempts, job.timeout) == (int(priority), 2, 15.0)
    app.close()


def test_a_sqlite_path_with_spaces_and_accents_is_percent_decoded(tmp_path: Path) -> None:
    """``sqlite:///…/a%20b.db`` opened a file literally named ``a%20b.db``: the command line
    and the API open the same real file, named as the URL's path decodes."""
    from urllib.parse import quote

    path = tmp_path / "tâches à faire.db"
    url = "sqlite:///" + quote(str(path))
    out = run("enqueue", "t", "--args", "[1]", "--database-url", url).output
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".db"] == [path.name]
    app = App(url, strict=False)
    assert app.get_job(int(out.split()[1])).args == [1]
    app.close()
    bad = run("status", "--database-url", f"sqlite:///{tmp_path}/50%.db", ok=False)
    assert bad.exit_code == 1 and "write %25 for a '%'" in bad.output


def test_every_number_option_reads_numbers_as_they_are_written() -> None:
    """click's own number types read with int() and float() ("1_0" is 10, "nan" a float):
    every number a command takes goes through Integer, Number or the id type instead."""
    import click

    from justonce.cli import ID, Integer, Number

    def params(group: click.Group, path: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                yield from params(command, (*path, name))
            else:
                for p in command.params:
                    yield " ".join((*path, name)), p

    loose = [f"{where} {p.name}" for where, p in params(cli)
             if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))
             and not isinstance(p.type, (Integer, Number)) and p.type is not ID]
    assert not loose, f"number options read with int()/float(): {loose}"


def test_an_app_module_that_fails_on_import_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module of --app whose own code raises at import (not ImportError: a RuntimeError of
    its configuration, a SyntaxError) printed its whole traceback."""
    (tmp_path / "cfg_raises.py").write_text('raise RuntimeError("JOBS_CONFIG is not set")\n')
    (tmp_path / "cfg_syntax.py").write_text("def broken(:\n")
    monkeypatch.chdir(tmp_path)
    url = ["--database-url", f"sqlite:///{tmp_path / 'x.db'}"]
    for module, said in (("cfg_raises", "RuntimeError: JOBS_CONFIG is not set"),
                         ("cfg_syntax", "SyntaxError")):
        result = run("enqueue", "t", "--app", f"{module}:app", *url, ok=False)
        assert result.exit_code == 1 and said in result.output, result.output
        assert "Traceback" not in result.output
