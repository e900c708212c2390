#!/usr/bin/env python3
"""Ratios of justonce to its peers from run.py JSON lines (``--json-out`` files).

    python bench/pg_ratios.py bench/results/full_n100000.jsonl [more.jsonl ...] [--label-prefix full-]

Medians over all lines of each (system, workload); "raw" enqueue and W2 figures pool
raw_sql_b1 and raw_sql_b100 (their producer and idle-wake paths are the same code).
Prints the medians and the ratios the performance targets are stated in, with a verdict.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

TARGETS = [
    # (label, metric, workload, peer systems, target ratio, higher_is_better)
    ("processing vs raw_sql_b100", "process_per_s", "W1_throughput", ["raw_sql_b100"], 0.5, True),
    ("processing vs pgqueuer", "process_per_s", "W1_throughput", ["pgqueuer"], 3.0, True),
    ("processing vs procrastinate", "process_per_s", "W1_throughput", ["procrastinate"], None, True),
    ("bulk enqueue vs raw", "enqueue_bulk_per_s", "W1_throughput", ["raw_sql_b1", "raw_sql_b100"], 0.5, True),
    ("one-by-one enqueue vs raw", "enqueue_per_s", "W1_throughput", ["raw_sql_b1", "raw_sql_b100"], 0.8, True),
    ("W2 p99 vs raw (lower is better)", "p99_ms", "W2_latency", ["raw_sql_b1", "raw_sql_b100"], 2.0, False),
    ("W2 p50 vs raw (lower is better)", "p50_ms", "W2_latency", ["raw_sql_b1", "raw_sql_b100"], None, False),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--label-prefix", default="", help="only lines whose label starts with this")
    ap.add_argument("--system", default="justonce")
    args = ap.parse_args()

    vals: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    bad: list[str] = []
    for path in args.files:
        with open(path) as f:
            lines = f.readlines()
        for line in lines:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if not str(r.get("label", "")).startswith(args.label_prefix):
                continue
            if r.get("error") or r.get("timed_out"):
                bad.append(f"{r['system']} {r['workload']} [{r.get('label')}]: error/timeout, excluded")
                continue
            if r.get("duplicates") or r.get("missing") or r.get("left_pending"):
                bad.append(f"{r['system']} {r['workload']} [{r.get('label')}]: "
                           f"duplicates={r.get('duplicates')} missing={r.get('missing')} "
                           f"left_pending={r.get('left_pending')} "
                           f"process_per_s={r.get('process_per_s')} (included)")
            for m in ("enqueue_per_s", "enqueue_bulk_per_s", "process_per_s", "p50_ms", "p99_ms"):
                if r.get(m) is not None:
                    vals[(r["system"], r["workload"], m)].append(r[m])

    def med(systems: list[str], wl: str, m: str) -> tuple[float | None, int]:
        v = [x for s in systems for x in vals.get((s, wl, m), [])]
        return (statistics.median(v) if v else None), len(v)

    print("| comparison | justonce (median) | peer (median) | ratio | target | met? |")
    print("|---|---:|---:|---:|---:|---|")
    for label, m, wl, peers, target, higher in TARGETS:
        a, na = med([args.system], wl, m)
        b, nb = med(peers, wl, m)
        if a is None or b is None:
            continue
        r = a / b
        if target is None:
            verdict, tgt = "(info)", "-"
        else:
            ok = r >= target if higher else r <= target
            verdict, tgt = ("yes" if ok else "**no**"), (f"≥ {target:g}" if higher else f"≤ {target:g}")
        nd = 2 if m.endswith("_ms") else 0
        print(f"| {label} | {a:,.{nd}f} (n={na}) | {b:,.{nd}f} (n={nb}) | {r:.2f} | {tgt} | {verdict} |")
    if bad:
        print("\nexactly-once check failed or run incomplete:")
        for b in bad:
            print(f"- {b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
