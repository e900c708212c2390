"""The long run of mysql_bench.py (``--soak MINUTES``): does a deadlock or a lock wait ever
reach a justonce user on MySQL / MariaDB?

In a fresh database: ``--soak-workers`` (8) worker processes, each
``justonce.Worker(app, concurrency=1)`` with the defaults (so heartbeats, batched acks and
housekeeping of every worker run against each other), and one producer process that
enqueues for MINUTES without a pause beyond the ``--soak-rate`` cap: a single
``task.enqueue`` or, one call in three, ``task.enqueue_many`` of 2-200 jobs.

Every process counts what it showed its user: each record at WARNING or above on the
``justonce`` loggers, each exception escaping a thread or ``Worker.run()``, and (producer)
each exception an enqueue call raised; each is classed ``deadlock`` (MySQL 1213),
``lock_wait`` (1205) or ``other``. At the end, after the queue drains: every job whose
enqueue call returned ran exactly once; the jobs of a call that raised (their insert may or
may not have committed) ran at most once.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import tempfile
import time
from typing import Any

from mysql_common import (
    TASK_NAME,
    ErrorTrap,
    JustonceSystem,
    Workers,
    connect,
    count,
    fresh_database,
    log,
    merge_traps,
    wait_drained,
)


def producer_main(url: str, minutes: float, rate: float, seed: int, out_path: str, ready: Any,
                  go: Any) -> None:
    trap = ErrorTrap().install()
    import justonce

    rng = random.Random(seed)
    seq, err = 0, None
    uncertain: list[int] = []
    calls = {"enqueue": 0, "enqueue_many": 0}
    app = justonce.App(url)

    @app.task(name=TASK_NAME)
    def bench_noop(seq: int) -> None:  # pragma: no cover - runs in the workers
        pass

    try:
        ready.set()
        go.wait()
        t0 = time.monotonic()
        deadline = t0 + minutes * 60
        while (now := time.monotonic()) < deadline:
            ahead = seq - rate * (now - t0)
            if ahead > 0:
                time.sleep(min(ahead / rate, deadline - now))
                continue
            k = 1 if rng.random() < 2 / 3 else rng.randint(2, 200)
            try:
                if k == 1:
                    calls["enqueue"] += 1
                    bench_noop.enqueue(seq)
                else:
                    calls["enqueue_many"] += 1
                    bench_noop.enqueue_many([(s,) for s in range(seq, seq + k)])
            except Exception as e:  # noqa: BLE001 - what the user saw: counted, then go on
                trap.note("producer enqueue", e)
                uncertain.extend(range(seq, seq + k))
            seq += k
    except BaseException as e:
        err = f"{type(e).__name__}: {e}"
        trap.note("producer", e)
    finally:
        try:
            app.close()
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            trap.note("App.close", e)
        with open(out_path, "w") as f:
            json.dump({"next_seq": seq, "uncertain": uncertain, "calls": calls, "error": err,
                       "trap": trap.dump()}, f)


def soak(args: argparse.Namespace) -> dict[str, Any]:
    t_wall = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="jo-mysql-soak-")
    res: dict[str, Any] = {"system": "justonce_mysql", "workload": "soak", "minutes": args.soak,
                           "workers": args.soak_workers, "procs": args.soak_workers, "concurrency": 1,
                           "rate_cap": args.soak_rate}
    try:
        with fresh_database(args.url) as url:
            system = JustonceSystem(url)
            res["version"] = system.version()
            system.install()
            workers = Workers(system, args.soak_workers, tmp)
            ctx = mp.get_context("spawn")
            p_ready, p_out = ctx.Event(), os.path.join(tmp, "producer.json")
            producer = ctx.Process(target=producer_main, daemon=True,
                                   args=(url, args.soak, args.soak_rate, 1, p_out, p_ready, workers.go))
            try:
                producer.start()
                if not p_ready.wait(60):
                    raise RuntimeError("the producer did not start within 60 s")
                workers.start()  # its "go" starts the producer too
                t0 = time.time()
                max_pending = 0
                with connect(url) as mon:
                    while producer.is_alive():
                        producer.join(10)
                        pending = count(mon, system.pending_sql)
                        max_pending = max(max_pending, pending)
                        log(f"  {time.time() - t0:6.0f} s  pending {pending:,}  "
                            f"succeeded {count(mon, system.done_sql):,}  workers alive {workers.alive()}")
                    t_prod = time.time()
                    t_done = wait_drained(mon, system, workers, args.timeout, 0.2)
                    res["drain_s"] = None if t_done is None else round(t_done - t_prod, 1)
                    records, errors, traps, _ = workers.stop()
                    with mon.cursor() as cur:
                        cur.execute("SELECT state, count(*) FROM justonce_jobs GROUP BY state")
                        res["states"] = {str(s): int(c) for s, c in cur.fetchall()}
                    res["left_pending"] = count(mon, system.pending_sql)
            finally:
                workers.kill()
                if producer.is_alive():
                    producer.kill()
            with open(p_out) as f:
                prod = json.load(f)
            res.update(max_pending=max_pending, enqueued=prod["next_seq"], calls=prod["calls"])
            res.update(check(records, prod["next_seq"], set(prod["uncertain"])))
            res["processed_per_s"] = round(len(records) / max(1e-9, t_prod - t0), 1)
            worker_trap, producer_trap = merge_traps(traps), merge_traps([prod["trap"]])
            res["worker_seen"], res["producer_seen"] = worker_trap, producer_trap
            res["deadlocks_seen"] = worker_trap["counts"]["deadlock"] + producer_trap["counts"]["deadlock"]
            res["lock_waits_seen"] = worker_trap["counts"]["lock_wait"] + producer_trap["counts"]["lock_wait"]
            res["errors_seen"] = worker_trap["total"] + producer_trap["total"]
            if prod.get("error"):
                errors.append("producer: " + prod["error"])
            if errors:
                res["worker_errors"] = errors[:5]
            res["ok"] = (res["duplicates"] == 0 and res["missing"] == 0 and res["left_pending"] == 0
                         and res["deadlocks_seen"] == 0 and res["lock_waits_seen"] == 0 and not errors
                         and res["drain_s"] is not None)
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
        res["ok"] = False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["wall_s"] = round(time.perf_counter() - t_wall, 2)
    return res


def check(records: list[tuple[int, float]], n: int, uncertain: set[int]) -> dict[str, int]:
    """Jobs whose enqueue returned ran exactly once; those of a failed call at most once."""
    runs: dict[int, int] = {}
    for s, _ in records:
        runs[s] = runs.get(s, 0) + 1
    return {"executions": len(records),
            "duplicates": sum(c - 1 for c in runs.values()),
            "missing": sum(1 for s in range(n) if s not in uncertain and s not in runs),
            "uncertain": len(uncertain),
            "uncertain_ran": sum(1 for s in uncertain if s in runs),
            "unknown_seq": sum(1 for s in runs if not 0 <= s < n)}


def soak_report(r: dict[str, Any]) -> str:
    if r.get("error"):
        return f"soak FAILED: {r['error']}"
    w, p = r["worker_seen"], r["producer_seen"]
    lines = [
        f"soak {r['minutes']:g} min, {r['workers']} workers x 1, producer capped at {r['rate_cap']:g} jobs/s: "
        f"{'OK' if r['ok'] else 'NOT OK'}",
        f"- enqueued {r['enqueued']:,} jobs in {r['calls']['enqueue']:,} enqueue + "
        f"{r['calls']['enqueue_many']:,} enqueue_many calls; {r['executions']:,} executions "
        f"({r['processed_per_s']:,.0f}/s); max pending {r['max_pending']:,}; drained {r['drain_s']} s "
        "after the producer stopped",
        f"- duplicates {r['duplicates']}, missing {r['missing']}, left pending {r['left_pending']}, "
        f"failed-call jobs {r['uncertain']} (ran {r['uncertain_ran']}); states {r['states']}",
        f"- seen by users: deadlocks (1213) {r['deadlocks_seen']}, lock waits (1205) {r['lock_waits_seen']}, "
        f"all warnings/errors {r['errors_seen']} (workers {w['counts']}, producer {p['counts']})",
    ]
    sources: dict[str, int] = {}
    for seen in (w, p):
        for source, c in seen["by_source"].items():
            sources[source] = sources.get(source, 0) + c
    for source, c in sorted(sources.items()):
        lines.append(f"  - {source}: {c}")
    for s in (w["samples"] + p["samples"])[:4]:
        lines.append("  sample: " + s.replace("\n", "\n    ")[:2000])
    if r.get("worker_errors"):
        lines.append(f"- worker errors: {r['worker_errors']}")
    return "\n".join(lines)
