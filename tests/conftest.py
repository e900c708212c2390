"""Fixtures shared by every suite: one behaviour suite runs against a temp SQLite file and
against the real PostgreSQL (a schema of its own per test)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fleet import Fleet, Procs, fleet_on  # noqa: E402
from justonce import App, Worker  # noqa: E402
from justonce.testing.databases import fresh_mysql  # noqa: E402
from pgcluster import DEFAULT_URL, Cluster, can_connect, pg_bin  # noqa: E402

LONG = os.environ.get("JUSTONCE_LONG_TESTS") == "1"
"""The long forms of the heaviest scenarios (more keys, jobs, freezes); CI runs the short
forms, which check the same properties on less data."""
REQUIRE_PG = os.environ.get("JUSTONCE_REQUIRE_POSTGRES") == "1"
REQUIRE_MYSQL = os.environ.get("JUSTONCE_REQUIRE_MYSQL") == "1"
MYSQL_URL = os.environ.get("JUSTONCE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
_pg: dict[str, object] = {}
_my: dict[str, object] = {}


def _postgres_url() -> str | None:
    """The server URL, starting a throwaway cluster if no server answers. None = skip."""
    if "url" in _pg:
        return _pg["url"]  # type: ignore[return-value]
    url = os.environ.get("JUSTONCE_TEST_POSTGRES_URL", DEFAULT_URL)
    reason = can_connect(url)
    if reason is not None and pg_bin() is not None:
        try:
            cluster = Cluster.create()
            _pg["cluster"] = cluster
            url, reason = cluster.url, None
        except Exception as exc:  # noqa: BLE001
            reason = f"{reason}; a throwaway cluster failed too: {exc}"
    _pg["url"] = None if reason else url
    _pg["reason"] = reason
    return _pg["url"]  # type: ignore[return-value]


def postgres_or_skip() -> str:
    url = _postgres_url()
    if url is None:
        msg = f"PostgreSQL not available: {_pg['reason']}"
        if REQUIRE_PG:
            pytest.fail(msg + " (JUSTONCE_REQUIRE_POSTGRES=1)", pytrace=False)
        pytest.skip(msg)
    return url


def _mysql_server() -> str | None:
    """The MySQL/MariaDB server URL, or None (with the reason kept) when none answers."""
    if "url" in _my:
        return _my["url"]  # type: ignore[return-value]
    try:
        import pymysql

        from justonce.backends.mysql.backend import parse_mysql_url

        kwargs, _ = parse_mysql_url(MYSQL_URL)
        pymysql.connect(**kwargs, connect_timeout=3).close()
        _my["url"], _my["reason"] = MYSQL_URL, None
    except Exception as exc:  # noqa: BLE001
        _my["url"], _my["reason"] = None, f"{MYSQL_URL}: {exc}"
    return _my["url"]  # type: ignore[return-value]


def mysql_or_skip() -> str:
    url = _mysql_server()
    if url is None:
        msg = f"MySQL/MariaDB not available: {_my['reason']}"
        if REQUIRE_MYSQL:
            pytest.fail(msg + " (JUSTONCE_REQUIRE_MYSQL=1)", pytrace=False)
        pytest.skip(msg)
    return url


def mysql_database(server: str) -> AbstractContextManager[str]:
    """A fresh database of its own on the server, dropped afterwards: its URL."""
    return fresh_mysql(server)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    cluster = _pg.get("cluster")
    if isinstance(cluster, Cluster):
        cluster.destroy()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its skip reasons go to the controller
        workeroutput["justonce_skips"] = {"pg": _pg.get("reason"), "my": _my.get("reason")}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """(xdist's controller) keep a worker's reasons for skipping a database, so that the
    summary below says it as loudly as a run without workers does."""
    skips = getattr(node, "workeroutput", {}).get("justonce_skips") or {}
    for kept, reason in ((_pg, skips.get("pg")), (_my, skips.get("my"))):
        if reason and not kept.get("reason"):
            kept["reason"] = reason


# -- running on several pytest-xdist workers (the README's test command) -----------------
#
# Tests marked ``slow`` start worker processes whose correctness hangs on leases, heartbeats,
# kill -9 and SIGSTOP timings measured in seconds: they all go to one xdist worker, one at a
# time, as they were written to run, while the other worker runs the in-process tests beside
# them (``--dist loadgroup``). A test marked ``alone`` changes something the whole server
# shares (a MySQL global): it takes an exclusive lock that every other test holds shared,
# so it runs with nothing else running.


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group("processes"))


@pytest.fixture(autouse=True)
def _alone_or_shared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[None]:
    if not hasattr(request.config, "workerinput"):  # one process runs every test
        yield
        return
    import fcntl

    mode = fcntl.LOCK_EX if request.node.get_closest_marker("alone") else fcntl.LOCK_SH
    # (the workers' temp folders share the run's own, which pytest cleans up)
    with open(tmp_path_factory.getbasetemp().parent / "alone.lock", "a") as lock:
        fcntl.flock(lock, mode)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if _pg.get("reason"):
        terminalreporter.write_sep(
            "!", f"POSTGRES TESTS SKIPPED: {_pg['reason']}", red=True, bold=True
        )
    if _my.get("reason"):
        terminalreporter.write_sep(
            "!", f"MYSQL TESTS SKIPPED: {_my['reason']}", red=True, bold=True
        )


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    return postgres_or_skip()


def _drop_schema(server: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database of each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    if request.param == "mysql":
        with mysql_database(mysql_or_skip()) as url:
            yield url
        return
    server = postgres_or_skip()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in server else "?"
    yield f"{server}{sep}schema={schema}"
    _drop_schema(server, schema)


@pytest.fixture
def app(db_url: str) -> Iterator[App]:
    a = App(db_url)
    a.migrate()
    yield a
    a.close()


@pytest.fixture
def worker_factory(app: App):
    """Start in-process workers (threads) with short leases; all are stopped at the end."""
    started: list[Worker] = []

    def start(**options) -> Worker:  # type: ignore[no-untyped-def]
        opts = {"concurrency": 2, "lease": 3.0, "heartbeat": 0.5, "poll": 0.2,
                "housekeeping_interval": 0.1, "grace": 5.0, **options}
        w = Worker(app, **opts).start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()
        assert w.join(15)


@pytest.fixture
def fleet(db_url: str, tmp_path: Path) -> Iterator[Fleet]:
    """Real ``justonce worker`` processes on the test's database, killed at the end."""
    with fleet_on(db_url, tmp_path) as f:
        yield f


@pytest.fixture
def procs() -> Iterator[Procs]:
    """Spawned helper processes, killed at the end whatever happens."""
    p = Procs()
    try:
        yield p
    finally:
        p.kill_all()


# The service's clients, for every module that defines a ``server`` fixture (webserver.py).
@pytest.fixture(scope="module")
def lib(server: Any) -> Iterator[App]:
    """The library on the server's database, to set up and inspect state directly."""
    a = App(server.db_url, strict=False)
    yield a
    a.close()


@pytest.fixture(scope="module")
def admin(server: Any) -> Iterator[Any]:
    with server.client(server.admin) as c:
        yield c


@pytest.fixture(scope="module")
def reader(server: Any) -> Iterator[Any]:
    with server.client(server.reader) as c:
        yield c
