"""The Push at scale: ``justonce demo push`` on each database, against Postfix's
``smtp-sink`` and against the demo's own SMTP server, with the emails/s set beside the
mail server's ceiling measured at the start of the same run (the same number of plain
smtplib senders, same server, no database).

    PYTHONPATH=src .venv/bin/python bench/push_bench.py --users 2000000
    PYTHONPATH=src .venv/bin/python bench/push_bench.py --users 200000 --per-user-jobs \\
        --backends sqlite --servers own

``smtp-sink`` comes with Debian's ``postfix`` package (``apt-get install postfix``); it is
started on a free loopback port for the run (as ``nobody`` when run as root) and stopped
after. Databases: a temporary SQLite file (synchronous FULL, the default), a fresh Postgres
schema (``DATABASE_URL``, default postgresql://postgres@127.0.0.1:5432/test), a fresh
MariaDB/MySQL database (``MYSQL_URL``, default mysql://root@127.0.0.1:3306/test). Each row
ends with the 1-minute load average at its end: another load on the machine lowers both
the Push and the ceiling, not always equally.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from justonce.testing.databases import fresh_database

ROOT = Path(__file__).resolve().parent.parent
PG_SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
MY_SERVER = os.environ.get("MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
NAMES = {"sqlite": "SQLite FULL", "postgres": "PostgreSQL", "mysql": "MariaDB/MySQL"}


@contextlib.contextmanager
def database(backend: str) -> Iterator[str]:
    """A fresh, empty database of ``backend``: its justonce URL, dropped afterwards."""
    with tempfile.TemporaryDirectory() as d, fresh_database(
            backend, Path(d), postgres=PG_SERVER, mysql=MY_SERVER, prefix="push") as url:
        yield url


@contextlib.contextmanager
def smtp_sink() -> Iterator[str]:
    exe = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
    if not os.path.exists(exe):
        sys.exit("no smtp-sink: apt-get install postfix (or --servers own)")
    from justonce.demo.mail import free_port

    address = f"127.0.0.1:{free_port()}"
    cmd = [exe, *(["-u", "nobody"] if os.geteuid() == 0 else []), address, "1024"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        yield address
    finally:
        proc.terminate()
        proc.wait(10)


def value(output: str, label: str) -> str:
    m = re.search(re.escape(label) + r"\s*│\s*([^│]+?)\s*│", output)
    if not m:
        raise SystemExit(f"no {label!r} in the demo's report:\n{output[-3000:]}")
    return m.group(1).replace(",", "")


def run_push(url: str, users: int, workers: int, senders: int, smtp: str | None,
             per_user: bool) -> dict[str, object]:
    cmd = [sys.executable, "-m", "justonce", "demo", "push", "--database-url", url, "--users", str(users),
           "--workers", str(workers), "--senders", str(senders)]
    cmd += ["--smtp", smtp] if smtp else []
    cmd += ["--per-user-jobs"] if per_user else []
    env = dict(os.environ, COLUMNS="160", PYTHONPATH=str(ROOT / "src"))
    env.pop("JUSTONCE_DATABASE_URL", None)
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=4 * 3600)
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"the demo failed:\n{out[-3000:]}")
    return {
        "list": int(value(out, "users in the list (L)")),
        "setup_s": float(value(out, "set-up time (users, list, Push)").rstrip("s")),
        "sending_s": float(value(out, "sending time").rstrip("s")),
        "emails_s": float(value(out, "emails per second")),
        "ceiling": float(value(out, f"mail server ceiling ({workers * senders} plain senders)")),
        "ratio": float(value(out, "emails per second ÷ ceiling")),
        "dupes": int(value(out, "users who received two emails of this Push")) if not smtp else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=2_000_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--backends", default="sqlite,postgres,mysql")
    ap.add_argument("--servers", default="smtp-sink,own", help="smtp-sink, own, or both")
    ap.add_argument("--per-user-jobs", action="store_true", help="one job per user instead of slot scans")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json-out", default=None, help="also append one JSON line per row here")
    args = ap.parse_args()
    servers = ["smtp-sink", "own"] if args.servers == "both" else args.servers.split(",")
    unknown = sorted(set(servers) - {"smtp-sink", "own"})
    if unknown:
        ap.error(f"--servers: unknown {unknown} (smtp-sink, own, or both)")
    print(f"{'database':15} {'server':10} {'users':>10} {'list':>8} {'set-up':>7} {'sending':>8} "
          f"{'emails/s':>9} {'ceiling':>8} {'ratio':>6} {'load':>5}")
    for _ in range(args.repeat):
        for backend in args.backends.split(","):
            for server in servers:
                with database(backend) as url, (smtp_sink() if server == "smtp-sink"
                                                else contextlib.nullcontext(None)) as smtp:
                    row = run_push(url, args.users, args.workers, args.senders, smtp, args.per_user_jobs)
                load = os.getloadavg()[0]
                print(f"{NAMES[backend]:15} {server:10} {args.users:>10,} {row['list']:>8,} "
                      f"{row['setup_s']:>6.1f}s {row['sending_s']:>7.1f}s {row['emails_s']:>9,.0f} "
                      f"{row['ceiling']:>8,.0f} {row['ratio']:>6.2f} {load:>5.2f}", flush=True)
                if args.json_out:
                    with open(args.json_out, "a") as f:
                        f.write(json.dumps({"backend": backend, "server": server, "users": args.users,
                                            "per_user_jobs": args.per_user_jobs, "load": load, **row}) + "\n")


if __name__ == "__main__":
    main()
