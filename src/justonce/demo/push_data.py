"""The data of ``justonce demo push``: users with home coordinates and interests, a list
stored as criteria (turned into SQL), a Push with two variants, its A/B sample and the
"reached" snapshot that the rest phase subtracts (L minus R).

Users are made in bulk, streamed in chunks so that 10,000,000 of them never sit in memory:
``COPY`` on Postgres, one transaction of ``executemany`` on SQLite, multi-row ``INSERT``s
rendered here on MySQL (every value is a number or a generated ASCII address, so nothing
needs escaping).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sqlite3
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigurationError
from . import BouncedPostgres, dialect

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
TABLES = ("demo_push_reached", "demo_push_ab", "demo_pushes", "demo_lists", "demo_users")
CHUNK = 50_000


def criteria_sql(criteria: dict[str, Any], prefix: str = "") -> tuple[str, list[Any]]:
    """A WHERE clause (``?`` placeholders) and its parameters for a stored criteria tree:
    ``{"all": [...]}``, ``{"any": [...]}``, ``{"near": {lat, lon, km}}``, ``{"interest": name}``.
    ``prefix``: a table alias with its dot. Distances use an equirectangular projection
    (plain arithmetic, same on every backend), accurate to well under 1 % at these ranges."""
    (op, arg), = criteria.items()
    if op in ("all", "any"):
        parts = [criteria_sql(c, prefix) for c in arg]
        joiner = " AND " if op == "all" else " OR "
        return "(" + joiner.join(p for p, _ in parts) + ")", [x for _, ps in parts for x in ps]
    if op == "near":
        # Every number is a parameter, so a float: a decimal literal in the text (110.574)
        # is a DECIMAL to MariaDB, converted to a double again for every row it looks at
        # (~8 % of the server's time in a Push's slot scans).
        kx, ky = 111.320 * math.cos(math.radians(arg["lat"])), 110.574
        lat, lon = f"{prefix}lat", f"{prefix}lon"
        return (f"((({lon} - ?) * ?) * (({lon} - ?) * ?) + (({lat} - ?) * ?) * (({lat} - ?) * ?)"
                " <= ?)", [arg["lon"], kx, arg["lon"], kx, arg["lat"], ky, arg["lat"], ky,
                           float(arg["km"]) ** 2])
    if op == "interest":
        return f"({prefix}interests LIKE ?)", [f"%|{arg}|%"]
    raise ValueError(f"unknown list criterion {op!r}")


def sql(conn: Any, text: str) -> str:
    """``?`` placeholders in the connection's own style."""
    return text if isinstance(conn, sqlite3.Connection) else text.replace("?", "%s")


COLUMNS = {
    "demo_users": ["id", "email", "lat", "lon", "interests"],
    "demo_lists": ["id", "name", "criteria"],
    "demo_pushes": ["id", "name", "list_id", "variants", "winner"],
    "demo_push_ab": ["push_id", "user_id", "variant"],
    "demo_push_reached": ["push_id", "user_id"],
}
"""The demo's tables as create_schema makes them: any other table of these names is not
the demo's, and is never dropped."""

KINDS = {
    # pg_class.relkind
    "r": "table", "p": "partitioned table", "v": "view", "m": "materialized view",
    "f": "foreign table", "S": "sequence", "i": "index", "I": "partitioned index",
    "c": "composite type", "t": "TOAST table",
    # information_schema.TABLES.TABLE_TYPE (MariaDB)
    "BASE TABLE": "table", "VIEW": "view", "SEQUENCE": "sequence",
    "SYSTEM VERSIONED": "system-versioned table", "TEMPORARY": "temporary table",
}


def _kind(conn: Any, name: str) -> str | None:
    """What the database has under ``name`` where the demo would create its table (the
    schema of the connection's search path, the MySQL database, the SQLite file's main
    schema): "table" for a plain table, another word for anything else that holds the
    name (a view, a sequence, an index, a type), None for nothing. Read from the
    catalogue, not by trying a statement: ``DROP TABLE IF EXISTS`` on a view is an error
    on SQLite and Postgres, and a ``SELECT`` cannot tell a view from a table."""
    kind = dialect(conn)
    if kind == "sqlite":
        # (tables, views and indexes share one namespace there; triggers have their own)
        row = conn.execute("SELECT type FROM sqlite_master WHERE lower(name) = lower(?) "
                           "AND type IN ('table', 'view', 'index')", (name,)).fetchone()
    elif kind == "mysql":
        row = conn.execute("SELECT TABLE_TYPE FROM information_schema.TABLES "
                           "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s", (name,)).fetchone()
    else:
        # A relation of any kind, else a type (an enum, a domain): CREATE TABLE makes a
        # row type of the table's name, so a type of that name stops it too.
        row = conn.execute("SELECT COALESCE((SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)), "
                           "CASE WHEN to_regtype(%s) IS NOT NULL THEN 'type' END)", (name, name)).fetchone()
        row = row if row and row[0] is not None else None
    if row is None:
        return None
    return KINDS.get(str(row[0]), str(row[0]).lower())


def _columns(conn: Any, table: str) -> list[str]:
    """The columns of ``table`` (one that exists), in order."""
    cur = conn.execute(f"SELECT * FROM {table} WHERE 1 = 0")
    return [str(d[0]).lower() for d in cur.description or ()]


def _not_ours(conn: Any, table: str) -> str | None:
    """Why the object the database has under ``table`` is not the demo's table (one
    phrase), or None when it is the demo's or there is none."""
    kind = _kind(conn, table)
    if kind is None:
        return None
    if kind != "table":
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} named {table}"
    found = _columns(conn, table)
    if found != COLUMNS[table]:
        return f"a table {table} that is not the demo's (columns {', '.join(found) or 'none'})"
    return None


def create_schema(conn: Any) -> None:
    """Remake the demo's tables (dropped first: each run starts afresh). Anything else
    under one of their names (a view, a table of other columns, a sequence) stops the demo
    with one line instead, before anything is dropped: it belongs to something else, and
    is left as it is. A drop the database refuses (a view of the user's over the demo's
    table, on Postgres) stops it with the database's own reason."""
    kind = dialect(conn)
    real, js = {"postgres": ("float8", "jsonb"), "mysql": ("DOUBLE", "JSON")}.get(kind, ("REAL", "TEXT"))
    for table in TABLES:
        found = _not_ours(conn, table)
        if found is not None:
            raise ConfigurationError(
                f"this database has {found}: the demo never drops what it did not make; "
                "drop or rename it yourself, or run the demo on another database (--database-url)")
    for table in TABLES:
        try:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        except Exception as exc:  # noqa: BLE001 - each driver's own error class
            if not _database_error(exc):
                raise
            # (PyMySQL's error is the tuple (code, message): the message says it)
            text = str(exc.args[1]) if len(exc.args) == 2 and isinstance(exc.args[0], int) else str(exc)
            reason = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            raise ConfigurationError(
                f"cannot drop the demo's table {table} to remake it: {reason} (drop what depends "
                "on it yourself, or run the demo on another database with --database-url)") from None
    conn.execute(f"CREATE TABLE demo_users (id integer PRIMARY KEY, email varchar(100) NOT NULL, "
                 f"lat {real} NOT NULL, lon {real} NOT NULL, interests varchar(200) NOT NULL)")
    conn.execute(f"CREATE TABLE demo_lists (id integer PRIMARY KEY, name text NOT NULL, "
                 f"criteria {js} NOT NULL)")
    conn.execute(f"CREATE TABLE demo_pushes (id integer PRIMARY KEY, name text NOT NULL, "
                 f"list_id integer NOT NULL, variants {js} NOT NULL, winner text)")
    conn.execute("CREATE TABLE demo_push_ab (push_id integer NOT NULL, user_id integer NOT NULL, "
                 "variant varchar(10) NOT NULL, PRIMARY KEY (push_id, user_id))")
    conn.execute("CREATE TABLE demo_push_reached (push_id integer NOT NULL, user_id integer NOT NULL, "
                 "PRIMARY KEY (push_id, user_id))")


def _database_error(exc: Exception) -> bool:
    """Whether ``exc`` is the database's refusal (sqlite3's, psycopg's or PyMySQL's
    DB-API ``Error``), not a bug of the demo's."""
    return any(c.__name__ == "Error" and c.__module__.split(".")[0] in ("sqlite3", "psycopg", "pymysql")
               for c in type(exc).__mro__)


def load_users(conn: Any, n: int, seed: int) -> None:
    """``n`` users, ids ``1..n``, made from ``seed`` (the same users on every backend)."""
    kind = dialect(conn)
    if kind == "postgres":
        with _pg_cursor(conn) as cur, cur.copy("COPY demo_users (id, email, lat, lon, interests) "
                                                "FROM STDIN") as copy:
            for chunk in users(n, seed):
                for row in chunk:
                    copy.write_row(row)
    elif kind == "mysql":
        for chunk in users(n, seed):
            for at in range(0, len(chunk), 10_000):
                values = ",".join(f"({i},'{e}',{la!r},{lo!r},'{it}')"
                                  for i, e, la, lo, it in chunk[at:at + 10_000])
                conn.execute("INSERT INTO demo_users (id, email, lat, lon, interests) VALUES " + values)
    else:
        # A transaction per chunk, not one for the whole load: SQLite's write lock, held for
        # the load (8.7 s at 2,000,000 users, a minute at 10,000,000), kept the demo's own
        # lease renewals out until the lease ran out and another demo could take the file.
        for chunk in users(n, seed):
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO demo_users VALUES (?, ?, ?, ?, ?)", chunk)
            conn.execute("COMMIT")
    if kind == "mysql":
        conn.execute("ANALYZE TABLE demo_users")
    elif kind == "postgres":
        # VACUUM too: a table just filled by COPY is soon vacuumed by autovacuum (an insert
        # threshold), which would otherwise land in the middle of the ceiling or the Push.
        if isinstance(conn, BouncedPostgres):
            conn.maintain("VACUUM ANALYZE", "demo_users")
        else:
            conn.execute("VACUUM ANALYZE demo_users")


def users(n: int, seed: int) -> Iterator[list[tuple[int, str, float, float, str]]]:
    """The users, in chunks of ``CHUNK`` rows: a home near one of five cities (a normal
    spread of 40 km) and each interest with a chance of 30 %."""
    rng = random.Random(seed)
    rand, gauss, uniform, choices = rng.random, rng.gauss, rng.uniform, rng.choices
    sin, cos, two_pi = math.sin, math.cos, 2 * math.pi
    weights = [c[3] for c in CITIES]
    homes = [(lat0, 110.574, 111.320 * cos(math.radians(lat0)), lon0) for _, lat0, lon0, _ in CITIES]
    for start in range(1, n + 1, CHUNK):
        ids = range(start, min(n, start + CHUNK - 1) + 1)
        picks = choices(homes, weights, k=len(ids))
        chunk = []
        for uid, (lat0, ky, kx, lon0) in zip(ids, picks, strict=True):
            dist, angle = abs(gauss(0, 40)), uniform(0, two_pi)
            interests = "|".join(i for i in INTERESTS if rand() < 0.3)
            chunk.append((uid, f"user{uid}@example.test", round(lat0 + dist * sin(angle) / ky, 6),
                          round(lon0 + dist * cos(angle) / kx, 6), f"|{interests}|" if interests else "||"))
        yield chunk


def create_push(conn: Any, push_id: int = 1) -> tuple[str, list[Any]]:
    """The list row, the Push row; returns the list's WHERE clause and parameters."""
    conn.execute(sql(conn, "INSERT INTO demo_lists VALUES (1, ?, ?)"),
                 ("Kitty lovers within 50 km of Sydney", json.dumps(LIST_CRITERIA)))
    conn.execute(sql(conn, "INSERT INTO demo_pushes (id, name, list_id, variants) VALUES (?, ?, 1, ?)"),
                 (push_id, "Kitty lovers", json.dumps(VARIANTS)))
    return criteria_sql(LIST_CRITERIA)


def list_members(conn: Any) -> list[int]:
    where, params = criteria_sql(LIST_CRITERIA)
    return [r[0] for r in conn.execute(sql(conn, f"SELECT id FROM demo_users WHERE {where} ORDER BY id"),
                                       params)]


def save_ab(conn: Any, push_id: int, phases: dict[str, list[int]]) -> None:
    rows = [(push_id, uid, variant) for variant, ids in phases.items() for uid in ids]
    _insert_many(conn, "INSERT INTO demo_push_ab (push_id, user_id, variant) VALUES (?, ?, ?)", rows)
    analyze(conn, "demo_push_ab")


def save_reached(conn: Any, push_id: int, reached: list[int]) -> None:
    """R, as the rest phase sees it when it starts: the users marked sent by then."""
    _insert_many(conn, "INSERT INTO demo_push_reached (push_id, user_id) VALUES (?, ?)",
                 [(push_id, uid) for uid in reached])
    analyze(conn, "demo_push_reached")


def analyze(conn: Any, table: str) -> None:
    """Statistics for a table just filled, before the slot scans query it: autovacuum's
    ANALYZE comes later, if at all. Without them Postgres takes the rest phase's R for a
    handful of rows and may answer its ``NOT EXISTS`` by reading all of R for every user
    a window looks at (measured at 10,000,000 users, with the plan the scans settled on: 24-85
    ms of the server's CPU a window of 50,000 ids, against 11-13 with R analyzed and each
    window planned for its values)."""
    conn.execute(f"ANALYZE TABLE {table}" if dialect(conn) == "mysql" else f"ANALYZE {table}")


@contextlib.contextmanager
def _pg_cursor(conn: Any) -> Iterator[Any]:
    """A psycopg cursor for a statement of several steps (COPY): through PgBouncer, in a
    transaction that sets the schema first."""
    if isinstance(conn, BouncedPostgres):
        with conn.transaction() as cur:
            yield cur
    else:
        yield conn.cursor()


def _insert_many(conn: Any, statement: str, rows: list[tuple[Any, ...]]) -> None:
    if isinstance(conn, sqlite3.Connection):
        conn.execute("BEGIN")
        conn.executemany(statement, rows)
        conn.execute("COMMIT")
        return
    target = conn if hasattr(conn, "executemany") else conn.cursor()  # psycopg: a cursor's
    for at in range(0, len(rows), 5000):
        target.executemany(sql(conn, statement), rows[at:at + 5000])


def load_push(conn: Any, push_id: int) -> dict[str, Any]:
    """What a sender needs of a Push: its name, variants and its list's criteria."""
    row = conn.execute(sql(conn, "SELECT p.name, p.variants, l.criteria FROM demo_pushes p "
                                 "JOIN demo_lists l ON l.id = p.list_id WHERE p.id = ?"),
                       (push_id,)).fetchone()
    if row is None:
        raise LookupError(f"no Push {push_id} in the demo's tables")

    def doc(v: Any) -> Any:
        return v if isinstance(v, dict) else json.loads(v)

    return {"name": row[0], "variants": doc(row[1]), "criteria": doc(row[2])}
