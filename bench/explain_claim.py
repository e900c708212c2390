#!/usr/bin/env python3
"""EXPLAIN (ANALYZE, BUFFERS) of justonce's hot statements on a full, un-analyzed queue.

1. drops and recreates a scratch database (``--db``, default ``justonce_explain``; nothing
   else is touched), runs ``App.migrate()``;
2. inserts ``-n`` (100,000) ready jobs in ONE ``App.enqueue_many`` call (one burst, as a
   producer filling a queue would; autovacuum has not analyzed the table yet — the script
   prints ``reltuples`` / ``last_autoanalyze`` to show it);
3. explains, each inside a transaction that is rolled back:
   - ``job_claim`` (the block from backends/postgres/queries.sql, limit 100) as a custom
     plan (literal parameters, what the first executions of a connection get) and as the
     generic plan of a prepared statement (``plan_cache_mode = force_generic_plan``, what a
     long-running worker's prepared statement may switch to after 5 executions);
   - ``job_complete_many`` for the 100 jobs just claimed (the acker's statement);
4. runs ``ANALYZE justonce_jobs`` and repeats 3.

Usage: DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python bench/explain_claim.py
"""
from __future__ import annotations

import argparse
import os
import re
import time
import urllib.parse

import psycopg

import justonce
from justonce.backends.postgres.backend import Q

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PARAMS = {"queue": "default", "limit": 100, "owner": "explain:1", "lease": 15.0}


def with_db(url: str, db: str) -> str:
    p = urllib.parse.urlparse(url)
    return urllib.parse.urlunparse(p._replace(path="/" + db))


def to_positional(sql: str, names: list[str]) -> str:
    """%(name)s -> $n (for PREPARE)."""
    return re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", sql)


def show(title: str, rows) -> None:
    print(f"\n### {title}\n")
    print("```")
    for (line,) in rows:
        print(line)
    print("```")


def explain_round(conn: psycopg.Connection, label: str) -> None:
    st = conn.execute(
        "SELECT c.reltuples::bigint, c.relpages, s.last_analyze, s.last_autoanalyze, s.n_live_tup "
        "FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.relname = 'justonce_jobs'"
    ).fetchone()
    print(f"\n## {label}\n\npg_class.reltuples={st[0]} relpages={st[1]} last_analyze={st[2]} "
          f"last_autoanalyze={st[3]} n_live_tup={st[4]}")
    exp = "EXPLAIN (ANALYZE, BUFFERS, VERBOSE OFF) "
    # custom plan: parameters bound client-side, the planner sees the values
    with conn.transaction(force_rollback=True):
        cur = psycopg.ClientCursor(conn)
        cur.execute(exp + Q["job_claim"], PARAMS)
        show(f"{label}: job_claim, custom plan (limit 100)", cur.fetchall())
    # generic plan of the prepared statement
    names = ["queue", "limit", "owner", "lease"]
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE jo_claim AS " + to_positional(Q["job_claim"], names))
        cur = psycopg.ClientCursor(conn)
        cur.execute(exp + "EXECUTE jo_claim (%s, %s, %s, %s)", [PARAMS[n] for n in names])
        show(f"{label}: job_claim, generic plan (PREPARE, force_generic_plan)", cur.fetchall())
    conn.execute("DEALLOCATE ALL")
    # the acker's statement, for 100 freshly claimed jobs
    with conn.transaction(force_rollback=True):
        rows = conn.execute(Q["job_claim"], PARAMS).fetchall()
        ids, tokens = [r[0] for r in rows], [r[8] for r in rows]
        cur = psycopg.ClientCursor(conn)
        cur.execute(exp + Q["job_complete_many"], {
            "ids": ids, "tokens": tokens, "results": [None] * len(ids), "notes": [None] * len(ids)})
        show(f"{label}: job_complete_many (100 ids), custom plan", cur.fetchall())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("DATABASE_URL", DEFAULT_URL), help="admin URL")
    ap.add_argument("--db", default="justonce_explain", help="scratch database, DROPPED and recreated")
    ap.add_argument("-n", type=int, default=100_000)
    args = ap.parse_args()

    with psycopg.connect(args.dsn, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{args.db}"')
        ver = c.execute("SHOW server_version").fetchone()[0]
    url = with_db(args.dsn, args.db)
    app = justonce.App(url)
    app.migrate()

    @app.task(name="bench_noop")
    def bench_noop(seq: int) -> None:
        pass

    t = time.perf_counter()
    bench_noop.enqueue_many([(s,) for s in range(args.n)])
    print(f"# justonce {justonce.__version__}, PostgreSQL {ver}: {args.n} ready jobs inserted with one "
          f"enqueue_many call in {time.perf_counter() - t:.2f} s")
    app.close()
    with psycopg.connect(url, autocommit=True) as conn:
        explain_round(conn, "before ANALYZE (fresh table, no statistics)")
        conn.execute("ANALYZE justonce_jobs")
        explain_round(conn, "after ANALYZE justonce_jobs")
    with psycopg.connect(args.dsn, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
