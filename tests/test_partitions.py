"""Partitions, against every backend: hashing in Python and SQL, leases, fencing, standby
takeover, partitioned claims, bad input. Real processes are in test_partition_processes.py."""

from __future__ import annotations

import logging
import random
import re
import string
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import proc_app
from conftest import LONG
from justonce import (
    App,
    ConfigurationError,
    Enqueue,
    InvalidName,
    InvalidOption,
    JobState,
    LeaseLost,
    NoFreeSlot,
    PartitionConflict,
    PartitionSetNotFound,
)
from justonce.models import SlotFence
from justonce.partitions import (
    partition_hash,
    partition_of,
    register_sqlite_functions,
    slot_expression,
    slot_predicate,
)

# -- hashing -----------------------------------------------------------------------------------


def test_partition_of_follows_the_documented_rule() -> None:
    assert [partition_of(k, 4) for k in (0, 1, 5, 8, -1, -7)] == [0, 1, 1, 0, 3, 1]
    assert partition_of("ada", 7) == zlib.crc32(b"ada") % 7
    assert partition_of("é", 5) == zlib.crc32("é".encode()) % 5
    assert partition_of(b"\x00\xff", 9) == zlib.crc32(b"\x00\xff") % 9
    assert partition_of(2**63 - 1, 10) == (2**63 - 1) % 10
    assert all(partition_of(k, 1) == 0 for k in (3, "x", b"y"))


@pytest.mark.parametrize("bad", [
    lambda: partition_of(1, 0), lambda: partition_of(1, -2), lambda: partition_of(1, 2.0),
    lambda: partition_of(1, True), lambda: partition_of(True, 2), lambda: partition_of(1.5, 2),
    lambda: partition_of(None, 2), lambda: partition_of(2**63, 2), lambda: partition_of("\ud800", 2),
    lambda: partition_of(1, 5000), lambda: slot_predicate("id", 4, 4), lambda: slot_predicate("id", 4, -1),
    lambda: slot_predicate("id; DROP TABLE x", 4, 1), lambda: slot_predicate("id", 4, 1, key_type="uuid"),
    lambda: slot_predicate("id", 4, 1, dialect="oracle"),
])
def test_bad_hashing_input_is_refused(bad: Any) -> None:
    with pytest.raises((InvalidOption, InvalidName)):
        bad()


HALF, WORDS = (500_000, 200_000) if LONG else (50_000, 20_000)


@pytest.mark.slow
def test_every_key_lands_in_one_slot_and_python_and_sql_agree(db_url: str) -> None:
    """1,000,000 integer ids (negative ones too) and 200,000 random strings (fixed seed;
    200,000 and 40,000 in the short form),
    for n = 2..64: the SQL slot of every key is partition_of's, the per-slot counts and sums
    agree, integer slots differ by at most one key and string slots stay within 6 % of the
    mean. For n = 2, 7 and 64 the SQL slot of every key is compared with partition_of, and
    for n = 7 every slot's predicate is run: the slots cover every key exactly once."""
    dialect = db_url.split(":", 1)[0].replace("postgresql", "postgres")
    App(db_url).migrate()  # the Postgres CRC-32 function
    conn = proc_app.ledger_connect(db_url)
    if dialect == "sqlite":
        register_sqlite_functions(conn)
    rng = random.Random(20261122)
    words = ["".join(rng.choices(string.ascii_letters + string.digits + "éß✓", k=rng.randint(8, 32)))
             for _ in range(WORDS)]
    try:
        conn.execute("CREATE TABLE ints (id bigint PRIMARY KEY)")
        conn.execute("CREATE TABLE words (i integer PRIMARY KEY, w text NOT NULL, crc bigint)")
        if dialect == "sqlite":
            conn.execute("BEGIN")
            conn.execute(f"WITH RECURSIVE s(x) AS (SELECT {-HALF} UNION ALL SELECT x + 1 FROM s "
                         f"WHERE x < {HALF - 1}) INSERT INTO ints SELECT x FROM s")
            conn.executemany("INSERT INTO words (i, w) VALUES (?, ?)", list(enumerate(words)))
            conn.execute("UPDATE words SET crc = justonce_crc32(w)")
            conn.execute("COMMIT")
        elif dialect == "mysql":  # the database is utf8mb4: CRC32() hashes the UTF-8 bytes
            conn.execute(f"INSERT INTO ints {proc_app.integers_sql(-HALF, HALF - 1)}")
            conn.executemany("INSERT INTO words (i, w) VALUES (%s, %s)", list(enumerate(words)))
            conn.execute("UPDATE words SET crc = CRC32(w)")
        else:
            conn.execute(f"INSERT INTO ints SELECT generate_series({-HALF}, {HALF - 1})")
            with conn.cursor().copy("COPY words (i, w) FROM STDIN") as copy:
                for row in enumerate(words):
                    copy.write_row(row)
            conn.execute("UPDATE words SET crc = justonce_crc32(convert_to(w, 'UTF8'))")
        ints = range(-HALF, HALF)
        # Every string's CRC-32 computed in SQL is Python's.
        sql_crc = column(conn, dialect, "crc", "words", order="i")
        assert sql_crc == [zlib.crc32(w.encode()) for w in words]
        for n in range(2, 65):
            expr = slot_expression("id", n, dialect=dialect)
            got = {r[0]: (r[1], r[2]) for r in conn.execute(
                f"SELECT {expr}, count(*), sum(id) FROM ints GROUP BY 1").fetchall()}
            assert got == residue_counts_and_sums(ints, n), n
            counts = [c for c, _ in got.values()]
            assert max(counts) - min(counts) <= 1
            per_word = Counter(c % n for c in sql_crc)
            got_words = dict(conn.execute(f"SELECT crc % {n}, count(*) FROM words GROUP BY 1").fetchall())
            assert got_words == dict(per_word), n
            mean = len(words) / n
            # Within 6 % of the mean (long form), or 5 standard deviations of a fair split
            # (short form: fewer words per slot)
            tolerance = 0.06 * mean if LONG else 5 * mean ** 0.5
            assert all(abs(c - mean) <= tolerance for c in per_word.values()), (n, per_word)
        assert all(partition_of(k, 64) == k % 64 for k in ints)
        for n in (2, 7, 64):  # the SQL slot of every key, against partition_of
            slots = column(conn, dialect, slot_expression("id", n, dialect=dialect), "ints", order="id")
            assert_same(slots, [partition_of(k, n) for k in ints], list(ints), n)
            text = slot_expression("w", n, key_type="text", dialect=dialect)
            assert_same(column(conn, dialect, text, "words", order="i"),
                        [partition_of(w, n) for w in words], words, n)
        n = 7  # and the generated predicates themselves, slot by slot: each key in one slot
        seen_ints: Counter[int] = Counter()
        seen_words: Counter[int] = Counter()
        for slot in range(n):
            pred = slot_predicate("id", n, slot, dialect=dialect)
            seen_ints.update(column(conn, dialect, "id", "ints", pred))
            pred = slot_predicate("w", n, slot, key_type="text", dialect=dialect)
            seen_words.update(column(conn, dialect, "i", "words", pred))
        assert len(seen_ints) == len(ints) and set(seen_ints.values()) == {1}
        assert len(seen_words) == len(words) and set(seen_words.values()) == {1}
    finally:
        for table in ("ints", "words"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.close()


def column(conn: Any, dialect: str, expr: str, table: str, where: str = "1 = 1",
           order: str | None = None) -> list[int]:
    """The integer values of ``expr`` over the rows of ``table`` that match ``where``. On
    MySQL as one GROUP_CONCAT text: PyMySQL parses each row in Python, about 10 s for a
    million rows, while one text of a million numbers comes in a blink."""
    if dialect == "mysql":
        conn.execute("SET SESSION group_concat_max_len = 67108864")
        ordered = f" ORDER BY {order}" if order else ""
        [(text,)] = conn.execute(
            f"SELECT GROUP_CONCAT({expr}{ordered}) FROM {table} WHERE {where}").fetchall()
        return [int(x) for x in text.split(",")] if text else []
    ordered = f" ORDER BY {order}" if order else ""
    return [r[0] for r in conn.execute(f"SELECT {expr} FROM {table} WHERE {where}{ordered}")]


def assert_same(got: list[int], want: list[int], keys: list[Any], n: int) -> None:
    """``got == want`` position by position, naming the first key where they differ."""
    assert len(got) == len(want), (len(got), len(want), n)
    bad = next((i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w), None)
    assert bad is None, f"key {keys[bad]!r}, n={n}: SQL slot {got[bad]}, partition_of {want[bad]}"


def residue_counts_and_sums(keys: range, n: int) -> dict[int, tuple[int, int]]:
    """For each slot r of n: how many keys of the contiguous range have key mod n = r, and
    their sum (closed form: the keys of one slot are an arithmetic progression). The
    generated predicates are checked against partition_of key by key below."""
    out = {}
    for r in range(n):
        first = keys.start + (r - keys.start) % n
        count = max(0, (keys.stop - 1 - first) // n + 1)
        out[r] = (count, count * first + n * count * (count - 1) // 2)
    return out


AWKWARD_TEXT = [
    "", " ", "  ", "\t", "0", "a", "a ", "a  ", " a", "A", "ß", "SS", "ss", "ﬀ",
    "é", "e\u0301", "E\u0301", "Å", "A\u030a", "\u212b",            # precomposed, combining, Kelvin-like
    "🦀", "👩\u200d👩\u200d👧", "😀 ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\U0010ffff",        # 4-byte UTF-8
    "中文", "עברית", "ﻻ", "\u00a0", "\u3000", "x\u200b", "nul\x00in", "\x7f", "line\nbreak",
    "x" * 512, "é" * 300,
]
AWKWARD_INTS = [0, 1, -1, 2, -2, 63, -64, 4095, -4096, 2**31 - 1, -2**31, 2**32, -2**32 - 1,
                2**53 + 1, -2**53 - 1, 2**62, 2**63 - 1, -2**63 + 1, -2**63]


def test_sql_slots_of_awkward_keys_are_partition_of(app: App, db_url: str) -> None:
    """Empty and blank strings, trailing spaces, case variants, combining marks beside their
    precomposed forms, 4-byte characters (emoji, astral letters), NUL, and integers up to
    the ends of 64 bits: the database's slot expression of each, read from a table column,
    is partition_of's for every n tried. On MySQL the text column is utf8mb4 (the README's
    requirement), once binary and once case-insensitive with PAD SPACE: the collation does
    not matter, CRC32() hashes the stored bytes."""
    dialect = db_url.split(":", 1)[0].replace("postgresql", "postgres")
    columns = ["w", "v"] if dialect == "mysql" else ["w"]
    conn = proc_app.ledger_connect(db_url)
    if dialect == "sqlite":
        register_sqlite_functions(conn)
    try:
        if dialect == "mysql":
            conn.execute("CREATE TABLE awkward (i INT PRIMARY KEY,"
                         " w TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,"
                         " v VARCHAR(600) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci)")
            conn.execute("CREATE TABLE awkward_ints (i INT PRIMARY KEY, k BIGINT NOT NULL)")
        else:
            conn.execute("CREATE TABLE awkward (i integer PRIMARY KEY, w text, v text)")
            conn.execute("CREATE TABLE awkward_ints (i integer PRIMARY KEY, k bigint NOT NULL)")
        # Postgres text cannot hold NUL
        texts = [t for t in AWKWARD_TEXT if dialect != "postgres" or "\x00" not in t]
        for i, t in enumerate(texts):
            conn.execute(proc_app._sql(conn, "INSERT INTO awkward (i, w, v) VALUES (?, ?, ?)"), (i, t, t))
        for i, k in enumerate(AWKWARD_INTS):
            conn.execute(proc_app._sql(conn, "INSERT INTO awkward_ints (i, k) VALUES (?, ?)"), (i, k))
        stored = dict(conn.execute("SELECT i, w FROM awkward").fetchall())
        assert [stored[i] for i in range(len(texts))] == texts  # nothing trimmed or folded
        for n in (1, 2, 3, 7, 10, 64, 1000, 4096):
            for col in columns:
                expr = slot_expression(col, n, key_type="text", dialect=dialect)
                got = dict(conn.execute(f"SELECT i, {expr} FROM awkward").fetchall())
                assert {i: int(s) for i, s in got.items()} == {
                    i: partition_of(t, n) for i, t in enumerate(texts)}, (col, n)
            expr = slot_expression("k", n, dialect=dialect)
            got = dict(conn.execute(f"SELECT i, {expr} FROM awkward_ints").fetchall())
            assert {i: int(s) for i, s in got.items()} == {
                i: partition_of(k, n) for i, k in enumerate(AWKWARD_INTS)}, n
        if dialect == "mysql":
            # The limit the README names: a column in another character set hashes other bytes.
            conn.execute("CREATE TABLE latin (w VARCHAR(10) CHARACTER SET latin1)")
            conn.execute("INSERT INTO latin VALUES (%s)", ("é",))
            [(crc,)] = conn.execute("SELECT CRC32(w) FROM latin").fetchall()
            assert crc == zlib.crc32("é".encode("latin-1")) != zlib.crc32("é".encode())
    finally:
        for table in ("awkward", "awkward_ints", "latin"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.close()


# -- leases ------------------------------------------------------------------------------------


def test_slots_go_to_the_first_free_one_and_tokens_grow_with_each_holder(app: App) -> None:
    a = app.partitions.try_acquire("mail", 2, lease=0.3, owner="a")
    b = app.partitions.try_acquire("mail", 2, lease=30, owner="b")
    assert (a.slot, a.token, b.slot, b.token) == (0, 1, 1, 1)
    assert app.partitions.try_acquire("mail", 2, owner="c") is None
    time.sleep(0.4)  # a stops renewing: its lease expires
    c = app.partitions.try_acquire("mail", 2, lease=30, owner="c")
    assert (c.slot, c.token) == (0, 2)
    with pytest.raises(LeaseLost):
        a.renew()
    assert a.lost
    b.renew()
    b.release()
    d = app.partitions.try_acquire("mail", 2, owner="d")
    assert (d.slot, d.token) == (1, 2)
    listed = app.partitions.list("mail")
    assert [(s.slot, s.owner, s.token, s.held) for s in listed] == [(0, "c", 2, True), (1, "d", 2, True)]


def test_a_standby_waits_and_takes_the_slot_when_it_is_released(app: App) -> None:
    holder = app.partitions.acquire("s", 1, lease=30)
    with pytest.raises(NoFreeSlot):
        app.partitions.acquire("s", 1, timeout=0.2, poll=0.05)
    import threading

    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(app.partitions.acquire("s", 1, poll=0.02, timeout=10)))
    t.start()
    time.sleep(0.2)
    assert not got
    holder.release()
    t.join(10)
    assert got and got[0].slot == 0 and got[0].token == 2


def test_a_standby_waits_out_a_database_that_is_away(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """acquire() waits for a free slot for ever (timeout=None), but raised at the first
    DatabaseUnavailable (a restart, a failover): a standby process had to start over. It
    waits a database out as it waits out a held slot, and raises its error only when its
    own timeout passes meanwhile. (try_acquire, one round trip, fails as the database
    does: here two such failures stand for the database being away.)"""
    from justonce import DatabaseUnavailable

    real = app.partitions.try_acquire
    away = [2]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if away[0]:
            away[0] -= 1
            raise DatabaseUnavailable("cannot connect: the server is restarting")
        return real(*args, **kwargs)

    monkeypatch.setattr(app.partitions, "try_acquire", flaky)
    lease = app.partitions.acquire("away", 1, poll=0.02)
    assert away == [0] and lease.slot == 0
    lease.release()
    away[0] = 10**6
    with pytest.raises(DatabaseUnavailable, match="restarting"):
        app.partitions.acquire("away", 1, poll=0.02, timeout=0.2)


def test_a_lease_used_as_context_manager_renews_itself_and_releases_on_exit(app: App) -> None:
    with app.partitions.acquire("ctx", 1, lease=0.3) as lease:
        time.sleep(0.8)  # past the lease: the background renewal kept it
        lease.renew()
        assert not lease.lost
        assert app.partitions.try_acquire("ctx", 1) is None
    assert app.partitions.try_acquire("ctx", 1) is not None


def test_n_comes_from_the_environment(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUSTONCE_PARTITIONS", "3")
    assert app.partitions.try_acquire("env").n == 3
    # Plain digits only: int() read "4_0" as 40 and "٤" as 4.
    for bad in ("three", "4_0", "+4", " 4", "\u0664", "9" * 5000, "", "4.0"):
        monkeypatch.setenv("JUSTONCE_PARTITIONS", bad)
        with pytest.raises(ConfigurationError, match="JUSTONCE_PARTITIONS"):
            app.partitions.try_acquire("env")


def test_a_worker_partitions_spec_says_what_is_wrong_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--partitions SET:N``: each mistake named (all were "expected SET:N with N an
    integer", 0 and a bad set name included); a set name may hold ':' itself."""
    from justonce.partitions import parse_set_spec

    monkeypatch.delenv("JUSTONCE_PARTITIONS", raising=False)
    assert parse_set_spec("tenant:eu:8") == ("tenant:eu", 8)
    assert parse_set_spec("accounts:4") == ("accounts", 4)
    for spec, says in [("accounts:0", "an integer in [1, 4096], not 0"),
                       ("accounts:5000", "not 5000"),
                       ("bad set:4", "bad partition set name 'bad set'"),
                       ("accounts", "JUSTONCE_PARTITIONS"),
                       ("accounts:x", "JUSTONCE_PARTITIONS")]:
        with pytest.raises(InvalidOption, match=re.escape(says)):
            parse_set_spec(spec)
    monkeypatch.setenv("JUSTONCE_PARTITIONS", "6")
    assert parse_set_spec("accounts") == ("accounts", 6)
    # An N meant, mistyped, is not taken for part of the name (with N from the environment).
    for spec in ("orders:8x", "orders:-3", "orders:", "orders:+4"):
        with pytest.raises(InvalidOption, match="N must be a whole number"):
            parse_set_spec(spec)


def test_n_cannot_change_while_a_slot_is_held(app: App) -> None:
    held = app.partitions.try_acquire("resize", 4, lease=0.3)
    with pytest.raises(PartitionConflict, match="n can become 8"):
        app.partitions.try_acquire("resize", 8)
    time.sleep(0.4)  # the holder is gone: now n may change, and tokens keep growing
    bigger = app.partitions.try_acquire("resize", 8)
    assert (bigger.n, bigger.slot) == (8, 0) and bigger.token > held.token
    assert len(app.partitions.list("resize")) == 8


def test_the_fence_admits_the_holder_and_refuses_a_zombie(app: App, db_url: str) -> None:
    proc_app.create_partition_tables(db_url)
    zombie = app.partitions.try_acquire("f", 1, lease=0.2)
    conn = proc_app.ledger_connect(db_url)
    try:
        with pytest.raises(InvalidOption, match="transaction"):
            zombie.fence(conn)  # outside a transaction it would hold nothing
        with proc_app._Tx(conn) as c:
            zombie.fence(c)
            c.execute(proc_app._sql(c, "INSERT INTO fenced_writes (slot, token, pid, at) VALUES (?, ?, 1, 0)"),
                      (zombie.slot, zombie.token))
        time.sleep(0.3)
        successor = app.partitions.try_acquire("f", 1, lease=30)
        with pytest.raises(LeaseLost), proc_app._Tx(conn) as c:
            zombie.fence(c)
            c.execute(proc_app._sql(c, "INSERT INTO fenced_writes (slot, token, pid, at) VALUES (?, ?, 2, 0)"),
                      (zombie.slot, zombie.token))
        with proc_app._Tx(conn) as c:
            successor.fence(c)
        rows = conn.execute("SELECT pid FROM fenced_writes").fetchall()
        assert [r[0] for r in rows] == [1]
    finally:
        conn.close()


def test_bad_lease_input_gets_clear_errors(app: App) -> None:
    for call in (lambda: app.partitions.try_acquire("s", 0), lambda: app.partitions.try_acquire("s", -1),
                 lambda: app.partitions.try_acquire("s", "4"), lambda: app.partitions.try_acquire("", 2),
                 lambda: app.partitions.try_acquire("bad name", 2),
                 lambda: app.partitions.try_acquire("s", 2, lease=0),
                 lambda: app.partitions.acquire("s", 2, timeout=-1),
                 lambda: app.partitions.acquire("s", 2, poll=0)):
        with pytest.raises((InvalidOption, InvalidName)):
            call()
    with pytest.raises(PartitionSetNotFound):
        app.partitions.list("never-used")
    assert app.partitions.list() == []


# -- partitioned claims ------------------------------------------------------------------------


def hold(app: App, n: int, wanted: list[int], set_name: str = "jobs") -> SlotFence:
    """Take every slot of a set of ``n``; the fence of the ``wanted`` ones."""
    leases = [app.partitions.try_acquire(set_name, n, lease=60) for _ in range(n)]
    return SlotFence(set_name, n, tuple((le.slot, le.token) for le in leases
                                        if le is not None and le.slot in wanted))


def test_partitioned_jobs_are_claimed_one_per_key_in_enqueue_order_by_their_slots_holder(app: App) -> None:
    @app.task
    def step(key: Any, i: int) -> None: ...

    ids = {}
    for i in range(3):
        for key in ("a", "b", 7):
            ids[(key, i)] = app.enqueue(step, [key, i], partition_key=key).id
    plain = app.enqueue(step, ["plain", 0]).id
    n = 2
    slot_of = {k: partition_of(k, n) for k in ("a", "b", 7)}
    # An ordinary claim leaves partitioned jobs alone.
    assert [j.id for j in app.backend.job_claim("default", 10, "w", 30)] == [plain]
    both = hold(app, n, [0, 1])
    first = app.backend.job_claim("default", 10, "w", 30, both)
    assert sorted(j.id for j in first) == sorted(ids[(k, 0)] for k in ("a", "b", 7))
    assert app.backend.job_claim("default", 10, "w", 30, both) == []  # each key is busy
    done_a = next(j for j in first if j.args[0] == "a")
    from justonce.models import Completion

    accepted, nxt = app.backend.job_complete_and_claim(
        [Completion(done_a.id, done_a.lease_token, None)], "default", 10, "w", 30,
        SlotFence("jobs", n, tuple(p for p in both.slots if p[0] == slot_of["a"])))
    assert accepted == {done_a.id} and [j.id for j in nxt] == [ids[("a", 1)]]
    assert app.backend.job_claim("default", 10, "w", 30, SlotFence("jobs", n, ())) == []
    assert app.get_job(ids[("a", 2)]).state is JobState.READY


def test_a_slot_holder_gets_only_the_keys_of_its_slots(app: App) -> None:
    @app.task
    def step(key: int) -> None: ...

    for key in range(40):
        app.enqueue(step, [key], partition_key=key)
    every = hold(app, 4, [0, 1, 2, 3])
    got = app.backend.job_claim("default", 100, "w", 30,
                                SlotFence("jobs", 4, tuple(p for p in every.slots if p[0] in (1, 3))))
    assert sorted(j.args[0] for j in got) == [k for k in range(40) if k % 4 in (1, 3)]
    rest = app.backend.job_claim("default", 100, "w", 30,
                                 SlotFence("jobs", 4, tuple(p for p in every.slots if p[0] in (0, 2))))
    assert sorted(j.args[0] for j in rest) == [k for k in range(40) if k % 4 in (0, 2)]


def test_a_running_job_blocks_its_key_whatever_its_id(app: App, db_url: str) -> None:
    """A job of a key waits while any job of the key runs, not only an earlier one: a dead
    job retried by hand (a lower id) waits for the later job running now; and on Postgres,
    where ids are drawn at insert but jobs become visible at commit, an earlier id that
    commits later waits too."""
    from justonce.models import Completion, Failure

    @app.task
    def step(i: int) -> None: ...

    part = hold(app, 1, [0])
    first = app.enqueue(step, [1], partition_key="k")
    second = app.enqueue(step, [2], partition_key="k")
    [c1] = app.backend.job_claim("default", 10, "w", 30, part)
    assert c1.id == first.id and app.backend.job_claim("default", 10, "w", 30, part) == []
    assert app.backend.job_fail(Failure(c1.id, c1.lease_token, "boom", None)) is JobState.DEAD
    [c2] = app.backend.job_claim("default", 10, "w", 30, part)
    assert c2.id == second.id
    app.retry(first.id)  # the lower id is ready again, while the key's later job runs
    assert app.backend.job_claim("default", 10, "w", 30, part) == []
    app.backend.job_complete_many([Completion(c2.id, c2.lease_token, None)])
    assert [j.id for j in app.backend.job_claim("default", 10, "w", 30, part)] == [first.id]
    if db_url.startswith("sqlite"):
        return  # one writer at a time: SQLite commits in id order
    conn = proc_app.ledger_connect(db_url)
    try:
        with proc_app._Tx(conn) as c:
            slow = app.enqueue(step, [3], partition_key="m", conn=c)  # the lower id, uncommitted
            fast = app.enqueue(step, [4], partition_key="m")           # commits first
            [running] = [j for j in app.backend.job_claim("default", 10, "w", 30, part)
                         if j.args == [4]]
            assert running.id == fast.id > slow.id
        assert app.backend.job_claim("default", 10, "w", 30, part) == []  # m is busy
    finally:
        conn.close()


def test_a_claim_takes_nothing_for_a_slot_that_changed_hands(app: App) -> None:
    """The fence is in the claim statement: a claimer whose slot was taken over (its
    token is old) gets no job of it, whatever it believes; the new holder gets them all."""
    @app.task
    def step(key: int) -> None: ...

    for key in range(8):
        app.enqueue(step, [key], partition_key=key)
    zombie = app.partitions.try_acquire("jobs", 1, lease=0.2)
    assert zombie is not None
    old = SlotFence("jobs", 1, ((zombie.slot, zombie.token),))
    time.sleep(0.3)
    standby = app.partitions.try_acquire("jobs", 1, lease=30)
    assert standby is not None and standby.token == zombie.token + 1
    assert app.backend.job_claim("default", 10, "zombie", 30, old) == []
    assert app.backend.job_complete_and_claim([], "default", 10, "zombie", 30, old) == (set(), [])
    new = SlotFence("jobs", 1, ((standby.slot, standby.token),))
    assert sorted(j.args[0] for j in app.backend.job_claim("default", 10, "standby", 30, new)) == list(range(8))


def test_a_claim_takes_nothing_for_an_expired_slot_even_before_anyone_takes_it(app: App) -> None:
    """Expiry is checked by the database's clock in the claim itself; the expired token is
    spent: it cannot be renewed, and only a new acquire (a new token) claims again."""
    @app.task
    def step(key: int) -> None: ...

    job = app.enqueue(step, [1], partition_key=1)
    lease = app.partitions.try_acquire("jobs", 1, lease=0.2)
    assert lease is not None
    fence = SlotFence("jobs", 1, ((lease.slot, lease.token),))
    time.sleep(0.3)
    assert app.backend.job_claim("default", 10, "w", 30, fence) == []
    with pytest.raises(LeaseLost):
        lease.renew()
    again = app.partitions.try_acquire("jobs", 1, lease=30)
    assert again is not None and again.token == lease.token + 1
    [claimed] = app.backend.job_claim("default", 10, "w", 30,
                                      SlotFence("jobs", 1, ((again.slot, again.token),)))
    assert claimed.id == job.id and claimed.partition_hash == 1


def test_a_renewal_that_waited_past_the_expiry_for_the_slots_row_is_refused(
        app: App, db_url: str) -> None:
    """The renewal waits for the slot's row while the holder's own fenced transaction holds
    it; the lease expires meanwhile. The expiry used to be tested by the clock of before
    the wait (MySQL's statement start; Postgres does not re-check a row that was only
    locked), and the spent token was renewed."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite: a renewal waits for the file before its statements run")
    import threading

    sleep = "SELECT pg_sleep(%s)" if db_url.startswith("postgres") else "SELECT SLEEP(%s)"
    lease = app.partitions.try_acquire("waited", 1, lease=1.0)
    assert lease is not None
    outcome: list[Any] = []

    def renew() -> None:
        try:
            outcome.append(lease.renew())
        except LeaseLost as exc:
            outcome.append(exc)

    conn = proc_app.ledger_connect(db_url)
    try:
        with proc_app._Tx(conn) as c:
            lease.fence(c)
            c.execute(sleep % 0.6)  # busy, not idle: the fence's idle guard stays out of it
            waiting = threading.Thread(target=renew)
            waiting.start()
            c.execute(sleep % 0.8)  # the lease expires while the renewal waits
        waiting.join()
    finally:
        conn.close()
    assert len(outcome) == 1 and isinstance(outcome[0], LeaseLost), outcome
    assert lease.lost
    again = app.partitions.try_acquire("waited", 1, lease=30)
    assert again is not None and again.token == lease.token + 1


def test_a_fence_on_an_expired_lease_is_refused(app: App, db_url: str) -> None:
    lease = app.partitions.try_acquire("fenced", 1, lease=0.2)
    assert lease is not None
    time.sleep(0.3)
    conn = proc_app.ledger_connect(db_url)
    try:
        with pytest.raises(LeaseLost), proc_app._Tx(conn) as c:
            lease.fence(c)
    finally:
        conn.close()
    assert lease.lost


@contextmanager
def claim_left_open(app: App, db_url: str, name: str, params: dict[str, Any],
                    idle_limit: float | None = None) -> Iterator[list[Any]]:
    """Run a claim statement in a transaction of its own and yield its rows with the
    transaction still open (committed when the block ends). ``idle_limit``: the server's
    limit on the session idling inside it, as a partitioned claim of a worker sets it."""
    if db_url.startswith("mysql"):
        d = app.backend.mysql
        with d._connection() as c:
            c.begin()
            if idle_limit is not None:
                d.guard_idle(c, idle_limit)
            yield d.rows(c, name, params)
            c.commit()
        return
    from justonce.backends.postgres.backend import Q

    with app.backend.pg._connection() as conn, conn.transaction():
        if idle_limit is not None:
            conn.execute(Q["idle_timeout_local"], {"ms": f"{round(idle_limit * 1000)}ms"})
        yield conn.execute(Q[name], params).fetchall()


def test_an_uncommitted_partitioned_claim_keeps_a_standby_off_its_slot(app: App, db_url: str) -> None:
    """The claim holds its slots' rows (Postgres: FOR SHARE; MySQL: LOCK IN SHARE MODE)
    until it commits, so a claimer paused between its claim statement and its commit cannot
    have a standby take the slot meanwhile (on SQLite the claim holds the one write lock,
    which does the same)."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite serialises every write: nothing to race")

    @app.task
    def step(key: int) -> None: ...

    job = app.enqueue(step, [3], partition_key=3)
    lease = app.partitions.try_acquire("jobs", 1, lease=0.3)
    assert lease is not None
    name, params = app.backend.claim_params(
        "default", 10, "paused", 30, SlotFence("jobs", 1, ((lease.slot, lease.token),)))
    with claim_left_open(app, db_url, name, params) as rows:
        assert [r[0] for r in rows] == [job.id]
        time.sleep(0.5)  # the slot's lease runs out while the claim is not committed
        assert app.partitions.try_acquire("jobs", 1, lease=30) is None
    standby = app.partitions.try_acquire("jobs", 1, lease=30)
    assert standby is not None and standby.token == lease.token + 1


def test_a_claim_left_uncommitted_by_a_frozen_worker_frees_its_slot_after_a_lease(
    app: App, db_url: str
) -> None:
    """A claim that shares its transaction with completions sets the session's
    idle-in-transaction timeout to the lease (Postgres: idle_in_transaction_session_timeout;
    MariaDB: idle_transaction_timeout, in whole seconds), so a worker frozen between its
    claim and its COMMIT holds its slots' rows for one lease at most: then the server ends
    the session, the claim rolls back, and a standby takes the slot."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite: a process frozen inside a write transaction stalls the file (README)")
    from justonce.errors import DatabaseUnavailable

    if db_url.startswith("mysql"):
        import pymysql

        if not app.backend.mysql.mariadb:
            pytest.skip("MySQL 8 has no idle-in-transaction timeout (README: A frozen claimer)")
        errors: tuple[type[BaseException], ...] = (pymysql.err.MySQLError, DatabaseUnavailable)
        frozen = 1.6  # MariaDB's timeout is whole seconds: the 0.3 s lease becomes 1 s
    else:
        import psycopg

        errors, frozen = (psycopg.Error, DatabaseUnavailable), 1.0

    @app.task
    def step(key: int) -> None: ...

    job = app.enqueue(step, [3], partition_key=3)
    lease = app.partitions.try_acquire("jobs", 1, lease=0.3)
    assert lease is not None
    name, params = app.backend.claim_params(
        "default", 10, "frozen", 0.3, SlotFence("jobs", 1, ((lease.slot, lease.token),)))
    took = None
    with pytest.raises(errors), claim_left_open(app, db_url, name, params, idle_limit=0.3) as rows:
        assert [r[0] for r in rows] == [job.id]
        time.sleep(frozen)  # frozen before COMMIT, past the lease and the idle timeout
        took = app.partitions.try_acquire("jobs", 1, lease=30)
    assert took is not None and took.token == lease.token + 1
    assert app.get_job(job.id).state is JobState.READY  # the claim rolled back


def test_a_holder_frozen_inside_its_fenced_transaction_keeps_the_slot_one_lease_at_most(
    app: App, db_url: str
) -> None:
    """fence() holds the slot's row until the caller's transaction ends, so a holder frozen
    inside that transaction would keep standbys out for as long as it is frozen. On
    Postgres the fence sets the idle-in-transaction timeout for that transaction alone (to
    the lease): the server ends the session, its uncommitted writes roll back, and a standby
    takes the slot. On MariaDB the caller sets idle_transaction_timeout on its own
    connection (the README says so): justonce does not change a caller's session."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite: a process frozen inside a write transaction stalls the file (README)")
    if db_url.startswith("mysql") and not app.backend.mysql.mariadb:
        pytest.skip("MySQL 8 has no idle-in-transaction timeout (README: A frozen claimer)")
    proc_app.create_partition_tables(db_url)
    conn = proc_app.ledger_connect(db_url)  # (before the short lease starts)
    if db_url.startswith("mysql"):
        conn.execute("SET SESSION idle_transaction_timeout = 1")
    lease = app.partitions.try_acquire("frozen-fence", 1, lease=0.3)
    assert lease is not None
    frozen = 1.6 if db_url.startswith("mysql") else 1.0  # MariaDB: whole seconds
    took = None
    with pytest.raises(Exception) as failed, proc_app._Tx(conn) as c:
        lease.fence(c)
        c.execute(proc_app._sql(c, "INSERT INTO fenced_writes (slot, token, pid, at) "
                                   "VALUES (?, ?, ?, 0)"), (lease.slot, lease.token, -1))
        time.sleep(frozen)  # idle inside the fenced transaction, past the lease
        deadline = time.monotonic() + 10  # the server ends the session about now
        while took is None and time.monotonic() < deadline:
            took = app.partitions.try_acquire("frozen-fence", 1, lease=30)
            time.sleep(0 if took else 0.1)
    assert not isinstance(failed.value, LeaseLost), failed.value  # its COMMIT failed
    assert took is not None and took.token == lease.token + 1
    check = proc_app.ledger_connect(db_url)
    try:
        assert check.execute("SELECT COUNT(*) FROM fenced_writes WHERE pid = -1").fetchone()[0] == 0
    finally:
        check.close()
        conn.close()


def test_changing_n_fences_the_holders_of_the_old_n(app: App, db_url: str) -> None:
    zombie = app.partitions.try_acquire("grow", 4, lease=0.2)
    for _ in range(3):
        app.partitions.try_acquire("grow", 4, lease=0.2)
    time.sleep(0.3)  # every lease of n=4 expired: n may change
    app.partitions.try_acquire("grow", 2, lease=30)
    with pytest.raises(LeaseLost):
        zombie.renew()
    proc_app.create_partition_tables(db_url)
    conn = proc_app.ledger_connect(db_url)
    try:
        with pytest.raises(LeaseLost), proc_app._Tx(conn) as c:
            zombie.fence(c)
    finally:
        conn.close()


def test_a_failed_job_holds_back_the_rest_of_its_key_until_it_is_retried(
    app: App, worker_factory: Any
) -> None:
    runs: list[int] = []

    @app.task(max_attempts=3, backoff=lambda attempt: 0.2)
    def flaky(i: int) -> None:
        runs.append(i)
        if i == 0 and runs.count(0) == 1:
            raise RuntimeError("first try fails")

    for i in range(4):
        app.enqueue(flaky, [i], partition_key="k")
    worker_factory(partitions="p:1", concurrency=4)
    deadline = time.monotonic() + 20
    while len(runs) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runs == [0, 0, 1, 2, 3]


def test_worker_partition_options_are_checked(app: App) -> None:
    from justonce import Worker

    for bad in ({"partitions": "p"}, {"partitions": "p:0"}, {"partitions": "p:x"},
                {"partitions": "bad name:2"}, {"partitions": "p:2", "partition_slots": 3},
                {"partitions": "p:2", "partition_slots": 0}):
        with pytest.raises(Exception) as info:
            Worker(app, **bad)
        assert "JUSTONCE_PARTITIONS" in str(info.value) or isinstance(info.value, (InvalidOption, InvalidName))


def test_a_scan_passes_its_kwargs_to_every_slot_job_beside_the_predicate(app: App) -> None:
    @app.task(name="scan_with_kwargs")
    def scan_slot(predicate: str, slot: int, n: int, push_id: int, phase: str) -> None: ...

    batch = app.partitions.scan(scan_slot, column="u.id", n=3, queue="scans",
                                kwargs={"push_id": 7, "phase": "rest"})
    jobs = sorted(app.list_jobs(queue="scans"), key=lambda j: j.kwargs["slot"])
    assert [j.kwargs["slot"] for j in jobs] == [0, 1, 2] and batch.info().total == 3
    for job in jobs:
        assert job.kwargs["push_id"] == 7 and job.kwargs["phase"] == "rest" and job.kwargs["n"] == 3
        assert job.kwargs["predicate"] == app.partitions.predicate("u.id", 3, job.kwargs["slot"])


@pytest.mark.parametrize("kwargs", [{"slot": 1}, {"predicate": "1=1"}, {"n": 2}, [("a", 1)], {1: "x"}, "k=v"])
def test_a_scan_refuses_kwargs_that_are_no_mapping_of_names_or_clash_with_its_own(
        app: App, kwargs: Any) -> None:
    before = app.list_jobs(limit=10000)
    with pytest.raises(InvalidOption):
        app.partitions.scan("anything", column="id", n=2, kwargs=kwargs)
    assert app.list_jobs(limit=10000) == before


def test_a_batch_or_list_callback_with_a_partition_key_is_claimed_by_its_slot(app: App) -> None:
    """A callback given a partition key runs where the key's other jobs run: on the worker
    holding its slot, never on a plain worker (its partition hash is kept with the stored
    callback; once it was not, and such a callback waited for ever on partitioned workers)."""
    @app.task
    def done(**kwargs: Any) -> None: ...

    keys: dict[str, str | int] = {"cb-batch": "acct-7", "cb-list": 12345}
    batch = app.batches.open("p", on_complete=Enqueue(done, partition_key=keys["cb-batch"], queue="cb-batch"))
    batch.seal()
    app.lists.create("cb-list", items=["only"],
                     on_complete=Enqueue(done, partition_key=keys["cb-list"], queue="cb-list"))
    reservation = app.lists.reserve("cb-list", 1)
    assert reservation is not None
    app.lists.complete(reservation)
    n = 4
    for queue, key in keys.items():
        assert [j.task for j in app.list_jobs(queue=queue)] == [done.name]
        assert app.backend.job_claim(queue, 10, "plain", 30) == []  # not a plain worker's
        leases = [app.partitions.try_acquire(queue, n, lease=30) for _ in range(n)]
        fence = {lease.slot: SlotFence(queue, n, ((lease.slot, lease.token),)) for lease in leases if lease}
        for other in sorted(set(fence) - {partition_of(key, n)}):
            assert app.backend.job_claim(queue, 10, "w", 30, fence[other]) == []
        [claimed] = app.backend.job_claim(queue, 10, "w", 30, fence[partition_of(key, n)])
        assert claimed.partition_hash == partition_hash(key)
        assert app.get_job(claimed.id).partition_key == str(key)


def test_a_callback_stored_before_its_partition_hash_was_kept_gets_the_keys_hash() -> None:
    """Callbacks stored by an older version have the key's text alone: an integer key's
    digits give the integer's hash, any other text the text's (partition_hash's rule)."""
    from justonce.backends.batchstore import callback_job

    spec = {"task": "t", "queue": "q", "args": [], "kwargs": {}, "priority": 0, "max_attempts": 3,
            "timeout": 60.0}
    for key, stored in [(12345, "12345"), (-7, "-7"), ("acct-7", "acct-7"), ("007", "007"), ("+7", "+7"),
                        (2**63 - 1, str(2**63 - 1)), (str(2**63), str(2**63)), (str(10**20), str(10**20))]:
        job = callback_job({**spec, "partition_key": stored}, {})
        assert job.partition_key == stored and job.partition_hash == partition_hash(key)
    assert callback_job(spec, {}).partition_hash is None
    assert callback_job({**spec, "partition_key": "k", "partition_hash": 99}, {}).partition_hash == 99


def test_a_partitioned_worker_says_in_one_line_that_its_database_is_away(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A standby partitioned worker tries to take a slot every heartbeat. Its database
    goes away (Postgres, MariaDB: the worker reaches them through a TCP forwarder, which
    is shut, so connections break and new ones are refused; SQLite: another connection
    holds the file's write lock past the worker's busy timeout). Each failed round is a
    one-line partition.error with the reason (DatabaseUnavailable), never a
    supervisor.error with a traceback: a traceback is for a bug."""
    import sqlite3
    from urllib.parse import urlsplit, urlunsplit

    from fleet import events, named, wait_for
    from justonce import Worker
    from test_network_loss import Forwarder

    caplog.set_level(logging.WARNING, logger="justonce")
    holder_app = App(db_url)
    holder_app.migrate()
    held = holder_app.partitions.try_acquire("away", 1, lease=120.0)  # the worker stands by
    assert held is not None
    forwarder = lock = None
    if db_url.startswith("sqlite"):
        url = db_url + "?busy_timeout=300"
    else:
        parts = urlsplit(db_url)
        forwarder = Forwarder("127.0.0.1", parts.port or 0)
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        url = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{forwarder.port}"))
    app = App(url)
    worker = Worker(app, queues=["default"], partitions="away:1", lease=3.0, heartbeat=0.3,
                    concurrency=1, poll=0.2, housekeeping=False)
    try:
        with events() as got:
            worker.start()
            wait_for(lambda: named(got, "worker.started"), 30, "the worker to start")
            time.sleep(1.0)  # a few rounds as a standby, with the database there
            assert named(got, "partition.error") == []
            if forwarder is not None:
                forwarder.close()
            else:
                lock = sqlite3.connect(db_url[len("sqlite:///"):], isolation_level=None)
                lock.execute("BEGIN IMMEDIATE")
            wait_for(lambda: len(named(got, "partition.error")) >= 2, 60,
                     "the worker's partition rounds to fail twice")
        errors = named(got, "partition.error")
        assert all(e["error"] for e in errors), errors
        assert named(got, "supervisor.error") == []
        tracebacks = [(r.name, r.getMessage()) for r in caplog.records
                      if r.name.startswith("justonce") and r.exc_info]
        assert tracebacks == []
    finally:
        if lock is not None:
            lock.execute("ROLLBACK")
            lock.close()
        worker.stop(grace=0)
        assert worker.join(30)
        app.close()
        held.release()
        holder_app.close()
