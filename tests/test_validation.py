"""Bad input on purpose: every public entry answers with a clear error and writes nothing."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta
from urllib.parse import quote

import pytest
from click.testing import CliRunner

from justonce import (
    MAX_PAYLOAD_BYTES,
    App,
    ConfigurationError,
    DatabaseUnavailable,
    Enqueue,
    InvalidArguments,
    InvalidName,
    InvalidOption,
    PayloadTooLarge,
    SchemaError,
    UnknownTask,
    ValidationError,
    validate,
)
from justonce.backends import redact_url
from justonce.cli import cli


@pytest.fixture
def vapp(app: App) -> App:
    @app.task(name="t")
    def t(*args, **kwargs) -> None:
        return None

    return app


def assert_nothing_written(app: App) -> None:
    assert app.queue_counts() == []


DEEP: list = []
for _ in range(63):
    DEEP = [DEEP]  # 64 levels; with the args list around it, 65

BAD_CALLS = [
    ("unknown task", dict(task="nope"), UnknownTask),
    ("task name with spaces", dict(task="no such task"), InvalidName),
    ("args not JSON", dict(args=[object()]), InvalidArguments),
    ("args with NaN", dict(args=[math.nan]), InvalidArguments),
    ("args with a set", dict(args=[{1, 2}]), InvalidArguments),
    ("args as a string", dict(args="abc"), InvalidArguments),
    ("args as a dict", dict(args={"a": 1}), InvalidArguments),
    ("kwargs not a dict", dict(kwargs=[1]), InvalidArguments),
    ("kwargs with int keys", dict(kwargs={1: 2}), InvalidArguments),
    ("NUL in args", dict(args=["a\x00b"]), InvalidArguments),
    ("NUL in kwargs", dict(kwargs={"k": "\x00"}), InvalidArguments),
    ("NUL in key", dict(key="a\x00"), InvalidName),
    ("lone surrogate in args", dict(args=["\ud800"]), InvalidArguments),
    ("run_at in year 9999", dict(run_at=datetime(9999, 1, 1).astimezone()), InvalidOption),
    ("oversize payload", dict(args=["x" * (MAX_PAYLOAD_BYTES + 1)]), PayloadTooLarge),
    ("empty queue", dict(queue=""), InvalidName),
    ("queue with spaces", dict(queue="my queue"), InvalidName),
    ("absurdly long queue", dict(queue="q" * 64), InvalidName),
    ("queue with SQL", dict(queue="x'; DROP TABLE justonce_jobs; --"), InvalidName),
    ("queue not a string", dict(queue=7), InvalidName),
    ("negative delay", dict(delay=-1), InvalidOption),
    ("negative timedelta", dict(delay=timedelta(seconds=-5)), InvalidOption),
    ("NaN delay", dict(delay=math.nan), InvalidOption),
    ("delay of a century", dict(delay=100 * 365 * 86400), InvalidOption),
    ("delay as text", dict(delay="5"), InvalidOption),
    ("delay and run_at", dict(delay=1, run_at=datetime.now().astimezone()), InvalidOption),
    ("naive run_at", dict(run_at=datetime.now()), InvalidOption),
    ("run_at not a datetime", dict(run_at="tomorrow"), InvalidOption),
    ("priority out of range", dict(priority=10**6), InvalidOption),
    ("priority as bool", dict(priority=True), InvalidOption),
    ("zero attempts", dict(max_attempts=0), InvalidOption),
    ("zero timeout", dict(timeout=0), InvalidOption),
    ("empty key", dict(key=""), InvalidName),
    ("huge key", dict(key="k" * 10_000), InvalidName),
    ("lone surrogate in key", dict(key="k\udfff"), InvalidName),
    ("run_at in year 1", dict(run_at=datetime(1, 1, 2).astimezone()), InvalidOption),
    ("args nested 65 deep", dict(args=[DEEP]), InvalidArguments),
    ("kwargs nested 65 deep", dict(kwargs={"k": DEEP}), InvalidArguments),
]


@pytest.mark.parametrize(("what", "call", "error"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_enqueue_gets_a_clear_error_and_writes_nothing(vapp: App, what, call, error) -> None:
    call = dict(call)
    task = call.pop("task", "t")
    with pytest.raises(error) as info:
        vapp.enqueue(task, **call)
    assert isinstance(info.value, ValidationError)
    assert str(info.value)  # a message a person can read
    assert_nothing_written(vapp)


def test_one_bad_job_in_a_bulk_enqueue_writes_none(vapp: App) -> None:
    reqs = [Enqueue("t", args=(i,)) for i in range(100)] + [Enqueue("t", args=(object(),))]
    with pytest.raises(InvalidArguments):
        vapp.enqueue_many(reqs)
    assert_nothing_written(vapp)


def test_an_unknown_option_to_a_bulk_enqueue_or_a_scan_is_refused_by_name(vapp: App) -> None:
    """enqueue_calls, a batch's enqueue_calls and partitions.scan pass their options to
    every job: a misspelt one is InvalidOption naming it (it once reached Enqueue as a
    TypeError), and nothing is written."""
    batch = vapp.batches.open("options")
    for call in (lambda: vapp.enqueue_calls("t", [[1]], prioirty=3),
                 lambda: batch.enqueue_calls("t", [[1]], colour="red"),
                 lambda: vapp.partitions.scan("t", column="id", n=2, args=[1])):
        with pytest.raises(InvalidOption, match="unknown option"):
            call()
    assert vapp.list_jobs() == [] and vapp.batches.get(batch.id).total == 0
    # In your transaction, a scan refused for an option leaves no batch behind either.
    opened = {b.id for b in vapp.batches.list()}
    with vapp.backend.transaction() as c, pytest.raises(InvalidOption, match="unknown option"):
        vapp.partitions.scan("t", column="id", n=2, prioirty=3, conn=c)
    assert {b.id for b in vapp.batches.list()} == opened


def test_arguments_nested_64_deep_are_accepted_and_brackets_in_text_do_not_count(vapp: App) -> None:
    job = vapp.enqueue("t", [DEEP[0]], kwargs={"k": "[" * 1000})
    assert vapp.get_job(job.id).args == [DEEP[0]]
    with pytest.raises(InvalidArguments):
        vapp.tasks["t"].enqueue_many([(1,), (DEEP,)])
    with pytest.raises(InvalidOption):  # a count past 64 bits is not a count
        vapp.apply_matching("cancel", vapp.job_filter(), expected=2**63)


def test_escaped_backslash_u0000_text_is_not_mistaken_for_nul(vapp: App) -> None:
    job = vapp.enqueue("t", ["a\\u0000b"])
    assert vapp.get_job(job.id).args == ["a\\u0000b"]


def test_payload_exactly_at_the_limit_is_accepted(vapp: App) -> None:
    # '["' + x*n + '"]' and '{}' add 6 bytes of JSON around the string.
    job = vapp.enqueue("t", ["x" * (MAX_PAYLOAD_BYTES - 6)])
    assert job.id > 0


def test_registering_a_task_twice_or_with_bad_options_fails(app: App) -> None:
    @app.task(name="dup")
    def one() -> None: ...

    with pytest.raises(InvalidOption):
        app.task(name="dup")(lambda: None)
    with pytest.raises(InvalidName):
        app.task(name="bad name")(lambda: None)
    with pytest.raises(InvalidName):
        app.task(name="ok", queue="")(lambda: None)
    with pytest.raises(InvalidOption):
        app.task(name="ok2", max_attempts=0)(lambda: None)
    with pytest.raises(InvalidOption):
        app.task(name="ok3", timeout=-1)(lambda: None)
    with pytest.raises(InvalidOption):
        app.task(name="ok4", backoff="fast")(lambda: None)  # type: ignore[arg-type]


def test_bad_job_ids_are_refused(vapp: App) -> None:
    for bad in (0, -1, "7", 1.5, None, True):
        with pytest.raises(InvalidOption):
            vapp.get_job(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("url", [
    "nonsense", "oracle://root@localhost/db", "sqlite://relative.db", "sqlite:///:memory:",
    "sqlite:///", "sqlite:////no/such/folder/jobs.db", "sqlite:///x.db?synchronous=SOMETIMES",
    "sqlite:///x.db?busy_timeout=soon", "sqlite:///x.db?colour=blue",
    "postgresql://localhost:notaport/db", "postgresql://", "postgresql://h/db?schema=Bad-Name",
    "mysql://", "mysql://h", "mysql://h/", "mysql://h/a/b", "mysql://h:notaport/db",
    "mysql://h/db?colour=blue", "mariadb://h/db?pool_size=many", "mysql://h/db?pool_size=0",
    "postgresql://postgres@[::1:5432/x", "mysql://root@[zz]:3306/x", "postgresql://h:99999/db",
    "sqlite:///x.db?busy_timeout=-5", "sqlite:///x.db?busy_timeout=nan",
    "sqlite:///x.db?busy_timeout=1e400", "sqlite:///x.db?busy_timeout=1_000",
    "sqlite:///x.db?busy_timeout=99999999999",
    "sqlite:///50%.db", "sqlite:///a%2Fb.db", "sqlite:///a%2fb.db", "sqlite:///a%00b.db", "sqlite:///a%4.db",
    "postgresql://h/db?pool_size=1_0", "postgresql://h/db?pool_size=%205", "mysql://h/db?pool_size=1_0",
    "mysql://h/db?pool_size=%D9%A3",
])
def test_malformed_database_urls_get_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        App(url).backend  # noqa: B018
    message = str(info.value).lower()
    assert any(word in message for word in ("url", "sqlite", "postgresql", "schema", "pool_size"))


SECRET_URLS = [
    "postgresq://u:SECRETPW@127.0.0.1/db",  # a scheme justonce does not know
    "postgresql//u:SECRETPW@127.0.0.1/db",  # no ://
    "postgresql:/u:SECRETPW@127.0.0.1/db",
    "postgresql://u:SECRETPW@:5432",  # no host, no database
    "postgresql://u:SECRETPW@127.0.0.1:notaport/db",
    "postgresql://u:SECRET/PW@127.0.0.1/db",  # an unescaped / in the password
    "postgresql://u:SECRETPW@127.0.0.1/db_%FF",  # an escape that is not UTF-8
    "postgresql://u:SECRETPW@127.0.0.1/db?schema=pg_x",
    "mysql://root:SECRETPW@127.0.0.1:3306/",  # no database
    "mysql://root:SECRETPW@127.0.0.1:3306/a/b",
    "mysql://root:SECRETPW@/db",  # no host
    "mysql://root:SECRETPW@127.0.0.1:3306/db?colour=blue",
    "mysql://root@127.0.0.1:3306/db?password=SECRETPW",  # libpq's option, not MySQL's
    "sqlite://SECRETPW/x.db",  # what stands for a host in a SQLite URL
    "sqlite://u:SECRETPW@/x.db",
    "sqlite:///x.db?password=SECRETPW",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_a_refused_database_url_is_shown_without_its_password(url: str) -> None:
    """Connection errors masked the password; the URL's own refusals (a scheme, a host or
    a database missing, an unknown option) showed it whole."""
    with pytest.raises(ConfigurationError) as info:
        App(url).backend  # noqa: B018
    assert "SECRET" not in str(info.value), info.value
    result = CliRunner().invoke(cli, ["status", "--database-url", url])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("Error: ConfigurationError") and "SECRET" not in lines[0], lines


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:pw@h:5432/db?schema=s", "postgresql://u:***@h:5432/db?schema=s"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    ("postgresql://u:p@w/x@h/db", "postgresql://u:***@h/db"),
    ("postgresql//u:pw@h/db", "postgresql//u:***@h/db"),
    ("mysql://u@h/db?Password=pw&ssl=1", "mysql://u@h/db?Password=***&ssl=1"),
    ("postgresql://h/db?sslpassword=pw", "postgresql://h/db?sslpassword=***"),
    ("sqlite://pw/x.db", "sqlite://***/x.db"),
    ("sqlite:///x.db", "sqlite:///x.db"),
    ("sqlite:////abs/x.db", "sqlite:////abs/x.db"),
    ("nonsense", "nonsense"),
])
def test_redact_url_masks_every_password_a_url_can_hold(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("url", [
    "postgresql://postgres@127.0.0.1:5432/db_%FF", "postgresql://postgres:pw%FF@127.0.0.1:5432/db",
    "postgresql://postgres@127.0.0.1:5432/db?application_name=%C3",
    "mysql://root:pw%FF@127.0.0.1:3306/db", "mysql://root@127.0.0.1:3306/db_%FF",
    "mysql://r%FF@127.0.0.1:3306/db", "sqlite:///db_%FF.db", "sqlite:///db_%C3.db?busy_timeout=1",
])
def test_an_escape_that_is_not_utf8_is_a_configuration_error(url: str) -> None:
    """psycopg decoded it as UTF-8 and raised UnicodeDecodeError (a traceback on the
    command line); PyMySQL got U+FFFD for it (another name, a password it could not send)."""
    with pytest.raises(ConfigurationError, match="not UTF-8"):
        App(url).backend  # noqa: B018
    result = CliRunner().invoke(cli, ["status", "--database-url", url])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and "not UTF-8" in lines[0], result.output
    assert "pw" not in lines[0]


def test_a_mysql_password_outside_latin1_is_sent_as_utf8() -> None:
    """PyMySQL encodes a str password as Latin-1: 'p€' raised UnicodeEncodeError, and
    'pé' was refused by a server that keeps it as set over a utf8mb4 connection."""
    import pymysql

    from conftest import mysql_database, mysql_or_skip
    from justonce.backends.mysql.backend import parse_mysql_url

    server = mysql_or_skip()
    admin, _ = parse_mysql_url(server)
    with mysql_database(server) as url, pymysql.connect(**admin, autocommit=True) as conn:
        database = url.split("?", 1)[0].rsplit("/", 1)[1]
        host = url.split("@", 1)[1].split("/", 1)[0]
        for password in ("pé", "p€ü"):
            with conn.cursor() as cur:
                cur.execute("DROP USER IF EXISTS 'justonce_pw'@'%'")
                cur.execute("CREATE USER 'justonce_pw'@'%%' IDENTIFIED BY %s", (password,))
                cur.execute(f"GRANT ALL ON `{database}`.* TO 'justonce_pw'@'%'")
            try:
                app = App(f"mysql://justonce_pw:{quote(password)}@{host}/{database}")
                app.migrate()
                assert app.backend.schema_version() == app.backend.schema_latest()
                app.close()
            finally:
                with conn.cursor() as cur:
                    cur.execute("DROP USER IF EXISTS 'justonce_pw'@'%'")


def test_a_postgres_schema_named_pg_something_is_refused_before_migrate(pg_server_url: str) -> None:
    """Postgres reserves the pg_ prefix: the name check let it through, and CREATE SCHEMA
    failed in the migration with psycopg's ReservedName (a traceback on the command line)."""
    url = f"{pg_server_url}{'&' if '?' in pg_server_url else '?'}schema=pg_justonce"
    with pytest.raises(ConfigurationError, match="reserves names that start with pg_"):
        App(url).migrate()
    result = CliRunner().invoke(cli, ["migrate", "--database-url", url])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("Error: ConfigurationError") and "pg_" in lines[0]


@pytest.mark.parametrize("host", ["a..b", ".a", "mail..example.com", "x" * 64 + ".com", "", "a\x00b", 5])
def test_a_host_python_cannot_encode_is_invalid_option(host: object) -> None:
    """The idna codec raised UnicodeError for an empty label or one over 63 characters,
    from deep in the socket functions."""
    with pytest.raises(InvalidOption, match="host"):
        validate.host(host, "the host")


def test_hosts_that_encode_are_taken() -> None:
    for host in ("127.0.0.1", "::1", "localhost", "example.com.", "bücher.example", "0.0.0.0"):
        assert validate.host(host, "the host") == host


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
def test_a_database_that_is_down_is_reported_quickly(scheme: str) -> None:
    pytest.importorskip("psycopg" if scheme == "postgresql" else "pymysql")
    from pgcluster import free_port

    user = "postgres" if scheme == "postgresql" else "root"
    app = App(f"{scheme}://{user}@127.0.0.1:{free_port()}/test", strict=False)
    t0 = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match="(?i)refused"):
        app.enqueue("anything", [])
    assert time.monotonic() - t0 < 15
    app.close()


def test_a_postgres_server_that_refuses_says_why_at_once_in_one_line(pg_server_url: str) -> None:
    """No such database, a libpq option it cannot take, a malformed password: one error
    naming the reason, the password masked (the pool used to retry for connect_timeout,
    print each failure as a warning, and end with "cannot connect ... within 5s" alone). A
    refusal that may pass (nothing listening yet, the server starting) is still waited
    for, and its reason added (test_a_database_that_is_down_is_reported_quickly)."""
    import subprocess
    import sys

    base = pg_server_url.split("?")[0].rsplit("/", 1)[0]
    host = base.rsplit("@", 1)[-1]
    for url, reason in ((f"{base}/no_such_db_here", 'database "no_such_db_here" does not exist'),
                        (f"{base}/test?sslmode=bogus", "invalid sslmode value"),
                        (f"postgresql://postgres:top%zzsecret@{host}/test", "invalid percent-encoded token")):
        out = subprocess.run([sys.executable, "-m", "justonce", "status", "--database-url", url],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, out
        lines = (out.stdout + out.stderr).strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: DatabaseUnavailable"), lines
        assert reason in lines[0] and "zzsecret" not in lines[0], lines  # (the password masked)


def test_postgres_without_migration_says_run_migrate(pg_server_url: str) -> None:
    import uuid

    from conftest import _drop_schema

    schema = f"t_{uuid.uuid4().hex[:10]}"
    app = App(f"{pg_server_url}?schema={schema}", strict=False)
    with pytest.raises(SchemaError, match="justonce migrate"):
        app.enqueue("x", [])
    app.close()
    _drop_schema(pg_server_url, schema)


def test_mysql_without_migration_says_run_migrate() -> None:
    from conftest import mysql_database, mysql_or_skip

    with mysql_database(mysql_or_skip()) as url:
        app = App(url, strict=False)
        with pytest.raises(SchemaError, match="justonce migrate"):
            app.enqueue("x", [])
        app.close()


def test_embedded_sqlite_migrates_itself_on_first_use(tmp_path) -> None:
    app = App(f"sqlite:///{tmp_path / 'fresh.db'}", strict=False)
    job = app.enqueue("x", [1])
    assert app.get_job(job.id).args == [1]
    assert app.migrate() == []  # already there
    app.close()


@pytest.mark.parametrize(("calls", "error"), [
    ([(1,), (object(),)], InvalidArguments),
    ([(1,), ("a\x00",)], InvalidArguments),
    ([(1,), {1: "int key"}], InvalidArguments),
    ([(1,), "not a call"], InvalidArguments),
    ([(1,), ("x" * (MAX_PAYLOAD_BYTES + 1),)], PayloadTooLarge),
], ids=["not JSON", "NUL", "int kwargs key", "string call", "oversize"])
def test_bad_call_in_a_task_bulk_enqueue_writes_nothing(vapp: App, calls, error) -> None:
    with pytest.raises(error):
        vapp.tasks["t"].enqueue_many(calls)
    assert_nothing_written(vapp)


def test_bulk_enqueue_of_many_jobs_each_under_the_limit_is_accepted(vapp: App) -> None:
    # Together far over the per-job limit, each one under it.
    ids = vapp.tasks["t"].enqueue_many([("x" * 100_000,)] * 5)
    assert len(ids) == 5


def test_look_ups_and_waits_refuse_bad_values(vapp: App) -> None:
    with pytest.raises(InvalidOption):
        vapp.list_jobs(state="sleeping")
    with pytest.raises(InvalidOption):
        vapp.get_job(2**70)
    job = vapp.enqueue("t")
    for bad in ({"poll": -1}, {"timeout": None}, {"timeout": "soon"}):
        with pytest.raises(InvalidOption):
            vapp.wait(job.id, **bad)


def test_transactional_enqueue_refuses_something_that_is_not_a_connection(vapp: App) -> None:
    with pytest.raises(InvalidOption, match="conn must be"):
        vapp.enqueue("t", conn=object())
    with pytest.raises(InvalidOption, match="conn must be"):
        vapp.tasks["t"].app.enqueue_calls("t", [(1,)], conn="dsn")
    assert_nothing_written(vapp)


def test_a_time_option_past_a_floats_range_or_a_broken_timezone_is_invalid_option(vapp: App) -> None:
    """delay=10**400 raised OverflowError from the check itself; a run_at whose tzinfo
    raises, or gives an offset of a day or more, raised its own error."""
    import datetime as dt

    class TooFar(dt.tzinfo):
        def utcoffset(self, d: dt.datetime | None) -> dt.timedelta:
            return dt.timedelta(hours=25)

    class Broken(dt.tzinfo):
        def utcoffset(self, d: dt.datetime | None) -> dt.timedelta:
            raise RuntimeError("no offset today")

    for call in (lambda: vapp.enqueue("t", delay=10**400), lambda: vapp.enqueue("t", delay=-(10**400)),
                 lambda: vapp.enqueue("t", timeout=10**400),
                 lambda: vapp.enqueue("t", run_at=dt.datetime(2030, 1, 1, tzinfo=TooFar())),
                 lambda: vapp.enqueue("t", run_at=dt.datetime(2030, 1, 1, tzinfo=Broken()))):
        with pytest.raises(InvalidOption):
            call()
    assert_nothing_written(vapp)


def test_a_name_with_a_trailing_newline_is_refused_everywhere(vapp: App) -> None:
    """Names are matched to their end: a pattern ending in $ also matched before a final
    newline, so "mail\\n" passed as a queue (and reached the dashboard and /metrics)."""
    for call in (lambda: vapp.enqueue("t", queue="mail\n"),
                 lambda: vapp.enqueue("t\n"),
                 lambda: vapp.partitions.try_acquire("set\n", 2),
                 lambda: vapp.lists.create("list\n", items=[1]),
                 lambda: vapp.tokens.create("name\n", "read")):
        with pytest.raises((InvalidName, InvalidOption)):
            call()
    assert_nothing_written(vapp)


def test_plain_int_reads_only_numbers_as_they_are_written() -> None:
    """Ids and counts from URLs, forms and the command line: int() would read each of the
    refused ones as a number (and name another job)."""
    from justonce.validate import plain_int

    assert [plain_int(t) for t in ("1", "15", str(2**63 - 1))] == [1, 15, 2**63 - 1]
    assert plain_int("0", zero=True) == 0 and plain_int("0") is None
    for text in ("015", "+15", "-1", " 15", "15 ", "1_5", "\u0661\u0665", "1.0", "0x1", "", str(2**63),
                 "9" * 30, "15\n", None, 15, b"15"):
        assert plain_int(text) is None and plain_int(text, zero=True) is None, repr(text)


def test_enum_and_other_subclass_values_go_by_their_value_on_every_backend(vapp: App) -> None:
    """An int-valued Enum (``class P(int, Enum)``) passed validation as an int; PyMySQL then
    wrote it with str(), 'P.HIGH' (MySQL refused it with an error of the driver's, not
    justonce's), and a key took 'P.HIGH' on every backend. A str Enum named a queue or a
    scope by its name on MySQL, by its value elsewhere. A float whose __float__ says nan
    passed the delay check (then the driver refused it). Each goes by its value now."""
    import enum

    class P(int, enum.Enum):
        HIGH = -10
        THREE = 3

    class Q(str, enum.Enum):  # noqa: UP042 - the old idiom, whose str() is its name
        MAIL = "mail"

    class Sneaky(float):
        def __float__(self) -> float:
            return math.nan

    job = vapp.enqueue("t", priority=P.HIGH, max_attempts=P.THREE, key=P.HIGH, queue=Q.MAIL,
                       partition_key=P.THREE)
    stored = vapp.get_job(job.id)
    assert (stored.priority, stored.max_attempts, stored.key, stored.queue) == (-10, 3, "-10", "mail")
    assert type(job.priority) is int and job.key == "-10"
    assert vapp.enqueue("t", key=-10).duplicate  # (the same key)
    assert [c.queue for c in vapp.queue_counts()] == ["mail"]
    assert vapp.effects.run(Q.MAIL, P.HIGH, lambda idem: idem).result == "mail:-10"
    assert [e.key for e in vapp.effects.list("mail")] == ["-10"]
    batch = vapp.batches.open()
    group = batch.add(P.THREE)
    assert group.count == 3 and group.item_id(P.THREE - 1).endswith(":2")
    assert vapp.partitions.try_acquire("s", P.THREE).slot in (0, 1, 2)
    assert vapp.partitions.predicate("id", P.THREE, P.THREE - 1).endswith("= 2")
    info = vapp.lists.create("enum-list", items=[1], max_attempts=P.THREE)
    assert info.name == "enum-list"
    later = vapp.enqueue("t", delay=Sneaky(5.0))
    assert vapp.get_job(later.id).state == "scheduled"
    for bad in (lambda: vapp.enqueue("t", delay=Sneaky(math.nan)),):
        with pytest.raises(InvalidOption):
            bad()


def test_text_int_and_text_float_read_only_numbers_as_they_are_written() -> None:
    """Numbers of the command line and of URL options: int() and float() would read each
    refused one as a number ("1_0" as 10, "\u0663" as 3, "nan" and "inf" as floats)."""
    from justonce.validate import text_float, text_int

    assert [text_int(t) for t in ("0", "7", "-3", "+3", "007", str(2**70))] == [0, 7, -3, 3, 7, 2**70]
    for text in ("1_0", " 7", "7 ", "7\n", "\u0663", "\uff17", "1.0", "0x1", "", "+", "-", "1e3",
                 "9" * 5000, None, 7, b"7"):
        assert text_int(text) is None, repr(text)
    assert [text_float(t) for t in ("1", "-0.5", "+.5", "1.", "1e3", "2.5E-1")] == [
        1.0, -0.5, 0.5, 1.0, 1e3, 0.25]
    for text in ("nan", "NaN", "inf", "-inf", "infinity", "1e999", "-1e999", "1_0", " 1.5", "1.5 ",
                 "\u0661.\u0665", ".", "e3", "1e", "0x1p3", "", None, 1.5):
        assert text_float(text) is None, repr(text)


@pytest.mark.parametrize("flag", [1, 0, "yes", "no", None, [True]])
def test_a_flag_of_a_public_constructor_or_call_is_true_or_false(app: App, flag: object) -> None:
    """App(strict=1) and Worker(listen="no") were read by their truth value ("no" is
    truthy): a flag is True or False, as effects.resolve's done and force already were."""
    from justonce import Worker

    with pytest.raises(InvalidOption, match="strict must be True or False"):
        App(app.database_url, strict=flag)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="listen must be True or False"):
        Worker(app, listen=flag)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="housekeeping must be True or False"):
        Worker(app, housekeeping=flag)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="seal must be True or False"):
        app.lists.create("flagged", seal=flag)  # type: ignore[arg-type]
    assert app.lists.list() == []
    assert App(app.database_url, strict=False).strict is False
    assert Worker(app, listen=False, housekeeping=False).maintenance is None


def test_a_sqlite_path_is_percent_decoded_as_every_other_url_part(tmp_path) -> None:
    """sqlite:///a%20b.db opened a file literally named "a%20b.db", where postgresql://…/a%20b
    names the database "a b". The path is decoded as UTF-8; a '?' starts the options
    (an escaped one, %3F, is part of the name), so options still apply."""
    from urllib.parse import quote

    folder = tmp_path / "dossier été"
    folder.mkdir()
    name = "mes tâches ?#%.db"
    url = f"sqlite:///{quote(str(folder / name))}?busy_timeout=1234"
    assert "%20" in url and "%3F" in url and "%25" in url
    app = App(url, strict=False)
    job = app.enqueue("t", [1])
    assert app.backend.sqlite.busy_timeout == 1.234  # type: ignore[attr-defined]
    app.close()
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".db") == [name]
    # The same file through its plain path, and a URL that writes it escaped otherwise.
    same = App(f"sqlite:///{folder / 'mes%20t%C3%A2ches %3F#%25.db'}", strict=False)
    assert same.get_job(job.id).args == [1]
    same.close()
    assert not any("%" in p.name and p.name != name for p in folder.iterdir())


def test_a_short_postgres_password_leaves_the_servers_words_as_they_are(pg_server_url: str) -> None:
    """Every occurrence of the password in libpq's message was replaced: with the password
    5432 the message read "port *** failed", with the password "port" "*** 5432 failed"."""
    base = pg_server_url.split("?")[0].rsplit("/", 1)[0]
    host = base.rsplit("@", 1)[-1]
    port = host.rsplit(":", 1)[-1] if ":" in host else "5432"
    for url, words in ((f"postgresql://no_such_role_here:{port}@{host}/test", f"port {port} failed"),
                       (f"postgresql://postgres:port@{host}/no_such_db_here", f"port {port} failed"),
                       (f"postgresql://postgres:does@{host}/no_such_db_here", '"no_such_db_here" does not')):
        with pytest.raises(DatabaseUnavailable) as info:
            App(url).backend.schema_version()
        assert words in str(info.value) and "***" in str(info.value).split(": ", 1)[0], info.value
        assert str(info.value).count("***") == 1, info.value  # (the banner's URL only)


@pytest.mark.parametrize(("password", "masked"), [
    ("top%zzsecret", 'invalid percent-encoded token: "***"'),
    ("top%00secret", 'forbidden value %00 in percent-encoded value: "***"'),
    ("top secret", 'unexpected spaces found in "***"'),
    ('top"se%zzcret', 'invalid percent-encoded token: "***"'),
])
def test_a_password_libpq_quotes_is_masked_through_the_api_and_the_cli(
        pg_server_url: str, password: str, masked: str) -> None:
    """libpq quotes a token of the URL it cannot read: when that token is the password,
    the message shows "***" in its place, from the API and from a real process."""
    import subprocess
    import sys

    host = pg_server_url.split("?")[0].rsplit("/", 1)[0].rsplit("@", 1)[-1]
    url = f"postgresql://postgres:{password}@{host}/test"
    with pytest.raises(DatabaseUnavailable) as info:
        App(url).backend.schema_version()
    assert masked in str(info.value) and "secret" not in str(info.value), info.value
    out = subprocess.run([sys.executable, "-m", "justonce", "status", "--database-url", url],
                         capture_output=True, text=True, timeout=60)
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1 and masked in lines[0], lines
    assert "secret" not in lines[0]


def test_a_url_libpq_echoes_whole_is_shown_with_its_password_masked(pg_server_url: str) -> None:
    """libpq quotes the whole URL for some mistakes (a character after an IPv6 host's
    bracket): the password in it, as written or as an option, is masked there too."""
    for url in ("postgresql://postgres:pw5432@[::1]x/test",
                "postgresql://postgres@[::1]x/test?password=pw5432"):
        with pytest.raises((DatabaseUnavailable, ConfigurationError)) as info:
            App(url).backend.schema_version()
        assert "unexpected character" in str(info.value) and "pw5432" not in str(info.value), info.value


def test_a_postgres_url_option_reaches_libpq_as_written(pg_server_url: str) -> None:
    """Options were read with parse_qsl and written back with urlencode's '+' for a space:
    ``?application_name=a%20b`` reached libpq as "a+b" (a ``password=`` option with a space
    was another password), and a literal '+' became a space. libpq decodes %-escapes only."""
    base = pg_server_url.split("?")[0]
    for written, meant in (("a%20b", "a b"), ("a+b", "a+b"), ("a%2Bb%20c", "a+b c")):
        import psycopg

        app = App(f"{base}?application_name={written}")
        # (The connection string the App's pool connects with, on a connection of its own:
        # the scratch database has no justonce tables for the App to use.)
        with psycopg.connect(app.backend.pg.conninfo) as conn:  # type: ignore[attr-defined]
            assert conn.execute("SHOW application_name").fetchone()[0] == meant  # type: ignore[index]
        app.close()
