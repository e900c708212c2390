"""Check a run's history against justonce's promises:
``python -m justonce.testing.check HISTORY...`` (last line ``violations: N``; exit 0 when
N is 0, 1 when not, 2 when the input is not a history).

Events (every line also has ``ev``, ``t`` and ``pid``; see :mod:`.history`):

- ``enqueue`` job, key (partition key or null), max_attempts, seq (optional: order among
  the key's jobs; else enqueue time) · ``claim`` job, token, attempt · ``start`` job, token
  (the job's code began) · ``end`` job, token (its code returned) · ``complete`` job, token,
  accepted · ``fail`` job, token, accepted, final · ``final`` job, state, attempts,
  max_attempts (the database's last word, read at the end)
- ``effect`` scope, key (the side effect itself happened) · ``effect_start`` scope, key,
  token, mode · ``effect_done`` scope, key, token, accepted · ``effect_resolved`` scope, key,
  redo
- ``slot_acquire`` set, slot, token, until, lease (optional) · ``slot_renew`` set, slot,
  token, until · ``slot_lose`` / ``slot_release`` set, slot, token · ``slot_act`` set,
  slot, token
- ``batch_items`` batch, n · ``batch_ack`` batch, item, accepted · ``batch_complete`` batch
- ``list_add`` list, item · ``list_reserve`` list, item, token · ``list_complete`` list,
  item, token, accepted · ``list_final`` list, item, state

Unknown events are counted and ignored.

What the times prove. A line is written after what it records: a claim's after its commit,
a ``start`` after the code began, an ``end`` after the code returned and before its outcome
is sent, a write's after its commit. So "A's line is earlier than B's line" does not
prove A happened before B; a rule flags only orderings that hold whatever the logging
delays: e.g. a claim line earlier than an ``end`` line proves the claim committed before the
write that follows that ``end`` was sent. Times from the database (a slot's ``until``) are
compared only with each other. The checker prefers missing a violation to inventing one.

The rules (each violation is printed with its smallest witness, the lines that prove it):

- ``no loss``: every enqueued job has a ``final`` in a terminal state (succeeded, dead,
  cancelled); every ``list_add`` item a terminal ``list_final`` (done, buried); every batch
  with ``batch_items`` and a ``batch_complete`` had all its items acked.
- ``one accepted completion per job``: at most one accepted ``complete`` per job, and none
  for a job whose final state is not succeeded; a job that succeeded has no accepted final
  ``fail``.
- ``at most one effect per key``: ``effect`` lines per (scope, key) at most 1 + the redo
  resolutions of the key (unless its ``effect_start`` says mode at_least_once).
- ``no accepted write with an old token``: at most one accepted write per (job, token), and
  per (effect key, token); at most one accepted completion per list item, whatever its
  token (an item is newly done once; a repeat is reported as already done), and per batch
  item (an item is acked once: a second accepted ack is a write that should have been
  refused); an accepted complete or fail of token k is a violation when a claim of the
  same job with a greater token was logged before the ``end`` of token k (that claim
  committed before the write was sent).
- ``one live holder per slot and epoch``: per (set, slot) a token is held by one process;
  an acquisition of a greater token by another process at a database time (``until`` less
  the lease) before the known ``until`` of the previous token, which was not released, is a
  violation; so is a ``slot_act`` of a token past both its own ``until`` and a greater
  token's acquisition.
- ``one batch completion``: at most one ``batch_complete`` per batch, and none for a batch
  whose items were not all acked.
- ``bounded attempts``: distinct tokens among a job's ``start`` lines, and its final
  attempts, are at most its max_attempts.
- ``per-key order``: jobs of one key, in seq (or enqueue) order: job i+1 has no ``start``
  logged before the ``end`` of job i's last accepted attempt (i+1 began before i's outcome
  could be written). An attempt frozen mid-run whose late write was refused is not i's
  last (the documented frozen-worker overlap is not an order violation).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .history import Line, MalformedHistory, read_all

RULES = (
    "no loss", "one accepted completion per job", "at most one effect per key",
    "no accepted write with an old token", "one live holder per slot and epoch",
    "one batch completion", "bounded attempts", "per-key order",
)
TERMINAL = {"succeeded", "dead", "cancelled"}
LIST_TERMINAL = {"done", "buried"}
REQUIRED: dict[str, tuple[str, ...]] = {
    "enqueue": ("job",), "claim": ("job", "token"), "start": ("job",), "end": ("job",),
    "complete": ("job", "token", "accepted"), "fail": ("job", "token", "accepted"),
    "final": ("job", "state"), "effect": ("scope", "key"),
    "effect_start": ("scope", "key", "token"),
    "effect_done": ("scope", "key", "token", "accepted"),
    "effect_resolved": ("scope", "key", "redo"),
    "slot_acquire": ("set", "slot", "token", "until"), "slot_renew": ("set", "slot", "token", "until"),
    "slot_lose": ("set", "slot", "token"), "slot_release": ("set", "slot", "token"),
    "slot_act": ("set", "slot", "token"), "batch_items": ("batch", "n"),
    "batch_ack": ("batch", "item", "accepted"), "batch_complete": ("batch",),
    "list_add": ("list", "item"), "list_reserve": ("list", "item", "token"),
    "list_complete": ("list", "item", "token", "accepted"), "list_final": ("list", "item", "state"),
}


@dataclass
class Violation:
    rule: str
    message: str
    witness: list[Line]

    def text(self) -> str:
        return "\n".join([f"  {self.message}", *(f"    {w}" for w in self.witness)])


@dataclass
class Report:
    counts: dict[str, int] = field(default_factory=dict)
    found: dict[str, list[Violation]] = field(default_factory=lambda: defaultdict(list))
    unknown: int = 0
    cut: int = 0

    @property
    def violations(self) -> int:
        return sum(len(v) for v in self.found.values())

    def add(self, rule: str, message: str, *witness: Line) -> None:
        self.found[rule].append(Violation(rule, message, list(witness)))

    def text(self, shown: int = 5) -> str:
        c = self.counts
        out = [f"checked: {c.get('jobs', 0)} jobs, {c.get('starts', 0)} starts, "
               f"{c.get('effects', 0)} effect keys, {c.get('acks', 0)} batch acks, "
               f"{c.get('batches', 0)} batches, {c.get('slots', 0)} slot tenures, "
               f"{c.get('list_items', 0)} list items ({c.get('lines', 0)} lines"
               + (f", {self.unknown} of unknown events" if self.unknown else "")
               + (f", {self.cut} cut-off last lines skipped" if self.cut else "") + ")"]
        for rule in RULES:
            found = self.found.get(rule, [])
            if not found:
                out.append(f"{rule}: ok")
                continue
            out.append(f"{rule}: {len(found)} VIOLATION{'S' if len(found) > 1 else ''}")
            for v in found[:shown]:
                out.append(v.text())
            if len(found) > shown:
                out.append(f"  ... and {len(found) - shown} more")
        return "\n".join(out)


def _key(line: Line, *names: str) -> tuple[Any, ...]:
    return tuple(line[n] for n in names)


def check(lines: Sequence[Line], cut: int = 0) -> Report:
    """The verdict on a history (lines in any order: they are sorted by time here)."""
    lines = sorted(lines, key=lambda x: x.t)
    r = Report(cut=cut)
    by: dict[str, list[Line]] = defaultdict(list)
    for line in lines:
        need = REQUIRED.get(line.ev)
        if need is None:
            r.unknown += 1
            continue
        missing = [n for n in need if n not in line.data]
        if missing:
            raise MalformedHistory(f"{line.where()}: a {line.ev!r} line without "
                                   f"{', '.join(missing)}")
        by[line.ev].append(line)
    _jobs(r, by)
    _effects(r, by)
    _slots(r, by)
    _batches(r, by)
    _lists(r, by)
    r.counts["lines"] = len(lines)
    return r


def _per_job(by: dict[str, list[Line]], ev: str) -> dict[Any, list[Line]]:
    out: dict[Any, list[Line]] = defaultdict(list)
    for line in by.get(ev, []):
        out[line["job"]].append(line)
    return out


def _no_loss(r: Report, added: dict[Any, Line], finals: dict[Any, Line], terminal: Any,
             name: Callable[[Any], str]) -> None:
    """Everything added reached a final state, and a terminal one."""
    for k, a in added.items():
        f = finals.get(k)
        if f is None:
            r.add("no loss", f"{name(k)} has no final state", a)
        elif f["state"] not in terminal:
            r.add("no loss", f"{name(k)} ended {f['state']!r}, not finished", a, f)


def _jobs(r: Report, by: dict[str, list[Line]]) -> None:
    enq = {line["job"]: line for line in by.get("enqueue", [])}
    final = {line["job"]: line for line in by.get("final", [])}
    claims, starts, ends = _per_job(by, "claim"), _per_job(by, "start"), _per_job(by, "end")
    completes, fails = _per_job(by, "complete"), _per_job(by, "fail")
    r.counts["jobs"] = len(enq)
    r.counts["starts"] = len(by.get("start", []))

    _no_loss(r, enq, final, TERMINAL, lambda job: f"job {job}")

    for job in set(completes) | set(fails):
        ok = [c for c in completes.get(job, []) if c["accepted"]]
        if len(ok) > 1:
            r.add("one accepted completion per job",
                  f"job {job} has {len(ok)} accepted completions", *ok[:2])
        f = final.get(job)
        if ok and f is not None and f["state"] != "succeeded":
            r.add("one accepted completion per job",
                  f"job {job} had an accepted completion but ended {f['state']!r}", ok[0], f)
        dead = [x for x in fails.get(job, []) if x["accepted"] and x.get("final")]
        if dead and f is not None and f["state"] == "succeeded":
            r.add("one accepted completion per job",
                  f"job {job} succeeded after an accepted final failure", dead[0], f)
        # One accepted write per (job, token); none with a token older than a claim that
        # provably committed before the write was sent.
        seen: dict[Any, Line] = {}
        for w in sorted(ok + [x for x in fails.get(job, []) if x["accepted"]], key=lambda x: x.t):
            if w["token"] in seen:
                r.add("no accepted write with an old token",
                      f"job {job}: two accepted writes with token {w['token']}", seen[w["token"]], w)
            seen[w["token"]] = w
            code_ends = [x for x in ends.get(job, []) if x.get("token") == w["token"]]
            if not code_ends:
                continue
            last_end = max(code_ends, key=lambda x: x.t)
            newer = [c for c in claims.get(job, []) if c["token"] > w["token"] and c.t < last_end.t]
            if newer:
                r.add("no accepted write with an old token",
                      f"job {job}: a write with token {w['token']} was accepted after a claim "
                      f"with token {newer[0]['token']} had committed", newer[0], last_end, w)

    for job, ss in starts.items():
        e_line, f_line = enq.get(job), final.get(job)
        limit = (f_line.get("max_attempts") if f_line is not None else None) or \
            (e_line.get("max_attempts") if e_line is not None else None)
        if limit is None:
            continue
        tokens: dict[Any, Line] = {}
        for s in ss:
            tokens.setdefault(s.get("token") if s.get("token") is not None else id(s), s)
        if len(tokens) > limit:
            r.add("bounded attempts", f"job {job} started {len(tokens)} times, max_attempts "
                  f"{limit}", *list(tokens.values())[: limit + 1])
    for job, f in final.items():
        if f.get("max_attempts") is not None and f.get("attempts") is not None \
                and f["attempts"] > f["max_attempts"]:
            r.add("bounded attempts", f"job {job} ended with {f['attempts']} attempts, max "
                  f"{f['max_attempts']}", f)

    keyed: dict[Any, list[Line]] = defaultdict(list)
    for e in enq.values():
        if e.get("key") is not None:
            keyed[e["key"]].append(e)
    for key, jobs in keyed.items():
        jobs.sort(key=lambda x: (x.get("seq") if x.get("seq") is not None else float("-inf"), x.t))
        for a, b in zip(jobs, jobs[1:], strict=False):
            # The end of the attempt whose outcome was accepted as the last: a frozen
            # attempt's late end (its write refused) says nothing about the key's order.
            done = [w["token"] for w in completes.get(a["job"], []) + fails.get(a["job"], [])
                    if w["accepted"] and (w.ev == "complete" or w.get("final"))]
            a_ends = [x for x in ends.get(a["job"], []) if x.get("token") in done]
            b_starts = starts.get(b["job"], [])
            if not a_ends or not b_starts:
                continue
            last_end = max(a_ends, key=lambda x: x.t)
            first = min(b_starts, key=lambda x: x.t)
            if first.t < last_end.t:
                r.add("per-key order", f"key {key!r}: job {b['job']} started before job "
                      f"{a['job']} (enqueued before it) had finished", first, last_end)


def _effects(r: Report, by: dict[str, list[Line]]) -> None:
    effects: dict[tuple[Any, ...], list[Line]] = defaultdict(list)
    for line in by.get("effect", []):
        effects[_key(line, "scope", "key")].append(line)
    redo: dict[tuple[Any, ...], int] = defaultdict(int)
    for line in by.get("effect_resolved", []):
        if line["redo"]:
            redo[_key(line, "scope", "key")] += 1
    least = {_key(x, "scope", "key") for x in by.get("effect_start", [])
             if x.get("mode") == "at_least_once"}
    keys = set(effects) | {_key(x, "scope", "key") for x in by.get("effect_start", [])}
    r.counts["effects"] = len(keys)
    for k, lines in effects.items():
        if k in least:
            continue
        if len(lines) > 1 + redo[k]:
            r.add("at most one effect per key", f"effect {k[0]}:{k[1]} happened {len(lines)} "
                  f"times ({redo[k]} redo resolutions)", *lines[: 2 + redo[k]])
    seen: dict[tuple[Any, ...], Line] = {}
    for line in by.get("effect_done", []):
        if not line["accepted"]:
            continue
        k = _key(line, "scope", "key", "token")
        if k in seen:
            r.add("no accepted write with an old token",
                  f"effect {k[0]}:{k[1]}: two accepted done marks with token {k[2]}", seen[k], line)
        seen[k] = line


def _slots(r: Report, by: dict[str, list[Line]]) -> None:
    tenures: dict[tuple[Any, ...], list[Line]] = defaultdict(list)  # (set, slot) -> acquires
    holder: dict[tuple[Any, ...], Line] = {}
    until: dict[tuple[Any, ...], float] = {}
    released: set[tuple[Any, ...]] = set()
    for line in by.get("slot_acquire", []):
        k = _key(line, "set", "slot", "token")
        first = holder.get(k)
        if first is not None and first.pid != line.pid:
            r.add("one live holder per slot and epoch", f"slot {k[1]} of {k[0]!r}: token "
                  f"{k[2]} acquired by two processes", first, line)
            continue
        if first is None:
            holder[k] = line
            tenures[k[:2]].append(line)
        until[k] = max(until.get(k, float("-inf")), float(line["until"]))
    for line in by.get("slot_renew", []):
        k = _key(line, "set", "slot", "token")
        until[k] = max(until.get(k, float("-inf")), float(line["until"]))
    for line in by.get("slot_release", []):
        released.add(_key(line, "set", "slot", "token"))
    r.counts["slots"] = len(holder)
    for (set_name, slot), acquires in tenures.items():
        acquires.sort(key=lambda x: x["token"])
        for a, b in zip(acquires, acquires[1:], strict=False):
            ka = (set_name, slot, a["token"])
            if a.pid == b.pid or ka in released or b.get("lease") is None:
                continue
            b_at = _acquired_at(b)
            if b_at < until[ka] - 1e-3:
                r.add("one live holder per slot and epoch",
                      f"slot {slot} of {set_name!r}: token {b['token']} acquired at "
                      f"{b_at:.3f} while token {a['token']} was held until {until[ka]:.3f}",
                      a, b)
    for act in by.get("slot_act", []):
        k = _key(act, "set", "slot", "token")
        later = [x for x in tenures.get(k[:2], []) if x["token"] > k[2] and x.pid != act.pid
                 and _acquired_at(x) < act.t]
        if later and k in until and act.t > until[k]:
            r.add("one live holder per slot and epoch", f"slot {k[1]} of {k[0]!r}: token "
                  f"{k[2]} acted after its lease ran out and token {later[0]['token']} was "
                  f"acquired", holder.get(k, act), later[0], act)


def _acquired_at(line: Line) -> float:
    """When a slot was acquired, by the database's clock where the line says (``until``
    less the lease), else when it was logged."""
    if line.get("lease") is None:
        return float(line.t)
    return float(line["until"]) - float(line["lease"])


def _batches(r: Report, by: dict[str, list[Line]]) -> None:
    items = {line["batch"]: line for line in by.get("batch_items", [])}
    acked: dict[Any, set[Any]] = defaultdict(set)
    first: dict[tuple[Any, Any], Line] = {}
    for line in by.get("batch_ack", []):
        if line["accepted"]:
            acked[line["batch"]].add(line["item"])
            k = (line["batch"], line["item"])
            if k in first:
                r.add("no accepted write with an old token", f"batch {k[0]} item {k[1]} "
                      "acked twice", first[k], line)
            first.setdefault(k, line)
    r.counts["acks"] = sum(len(v) for v in acked.values())
    completes: dict[Any, list[Line]] = defaultdict(list)
    for line in by.get("batch_complete", []):
        completes[line["batch"]].append(line)
    r.counts["batches"] = len(set(items) | set(completes))
    for batch, cs in completes.items():
        if len(cs) > 1:
            r.add("one batch completion", f"batch {batch} completed {len(cs)} times", *cs[:2])
        n = items.get(batch)
        if n is not None and len(acked[batch]) < int(n["n"]):
            r.add("one batch completion", f"batch {batch} completed with "
                  f"{len(acked[batch])} of its {n['n']} items acked", n, cs[0])
            r.add("no loss", f"batch {batch}: {int(n['n']) - len(acked[batch])} items never "
                  "acked", n)


def _lists(r: Report, by: dict[str, list[Line]]) -> None:
    adds = {_key(x, "list", "item"): x for x in by.get("list_add", [])}
    finals = {_key(x, "list", "item"): x for x in by.get("list_final", [])}
    r.counts["list_items"] = len(adds)
    _no_loss(r, adds, finals, LIST_TERMINAL, lambda k: f"list {k[0]!r} item {k[1]}")
    seen: dict[tuple[Any, ...], Line] = {}
    for line in by.get("list_complete", []):
        if not line["accepted"]:
            continue
        k = _key(line, "list", "item")
        first = seen.get(k)
        if first is not None:
            # An item is newly done once: a second accepted completion, with its own token
            # or another reservation's, is a write that should have been refused.
            same = first["token"] == line["token"]
            r.add("no accepted write with an old token", f"list {k[0]!r} item {k[1]}: two "
                  "accepted completions, " + (f"both with token {line['token']}" if same else
                                              f"with tokens {first['token']} and {line['token']}"),
                  first, line)
        else:
            seen[k] = line


def main(argv: Iterable[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or any(a in ("-h", "--help") for a in args):
        print("usage: python -m justonce.testing.check HISTORY.jsonl...\n\n" + (__doc__ or ""))
        return 0 if args else 2
    try:
        got = read_all(args)
        report = check(got.lines, got.cut)
    except (OSError, MalformedHistory) as exc:
        print(f"check: {exc}", file=sys.stderr)
        return 2
    print(report.text())
    print(f"violations: {report.violations}")
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
