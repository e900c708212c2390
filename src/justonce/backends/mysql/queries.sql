-- justonce: every SQL statement of the MySQL 8 / MariaDB 10.6+ dialect, one named block each.
-- Parameters use PyMySQL's %(name)s style and are always bound (a literal percent sign is
-- written twice). List parameters arrive as JSON text and are read with JSON_TABLE.
--
-- A block may hold several statements, each ending with a semicolon at the end of a line.
-- They run in order, in one READ COMMITTED transaction. After each SELECT the first column
-- of its rows is bound as %(picked)s (a literal list: `id IN %(picked)s` is a primary-key
-- look-up in every plan). A SELECT that finds no row, or a write that changes no row, ends
-- the block with no rows; otherwise the block returns the rows of its last SELECT. This is
-- how UPDATE ... RETURNING is written here: lock the rows, update them by key, read them.
--
-- Every write of a worker names (id, lease_token) and state = 'running' in its locking
-- SELECT: a worker whose lease was lost touches 0 rows, and that is how it learns it.
--
-- Locking reads and InnoDB. A locking read locks every row it reads, and a row a join
-- buffer or a sort has read stays locked until commit even if it is then thrown away. So:
--   * a locking read driven by a JSON list reads the list first and looks each row up by
--     key: `JSON_TABLE(...) d STRAIGHT_JOIN t FORCE INDEX (PRIMARY) ON t.id = d.id`. Rows
--     are locked in the list's order (an ORDER BY sorts after locking): callers pass lists
--     sorted by key, so that two transactions lock in one order and cannot deadlock;
--   * a locking read with ORDER BY ... LIMIT walks an index in that order (FORCE INDEX),
--     so it stops at the LIMIT instead of locking every candidate before a sort.
-- Aligned lists are joined on their ordinality. MariaDB joins two JSON_TABLEs by comparing
-- every row with every row (5 s for two lists of 10,000), so the second list is a derived
-- table that the LIMIT materialises and the optimizer indexes on ord (linear).
-- Subqueries of a locking read are plain reads (they lock nothing).
--
-- Times are DATETIME(6) in UTC (the session's time_zone is '+00:00'); durations arrive as
-- seconds and are added as whole microseconds. Epoch seconds are computed with
-- TIMESTAMPDIFF, which, unlike UNIX_TIMESTAMP on MariaDB, goes past 2038.
--
-- PostgreSQL's pg_notify columns are kept as NULL so that every block returns the same
-- columns as its PostgreSQL twin (this dialect has no notifications; workers poll).

-- name: job_insert
-- A held live key makes the insert change nothing (the unique index on live_key), which
-- ends the block with no row: the caller then looks the holder up (job_live_by_keys).
-- On a connection that counts rows found (CLIENT_FOUND_ROWS, SQLAlchemy's default) that
-- no-op counts 1 and the block goes on: LAST_INSERT_ID(0) then makes its SELECT find no
-- row (LAST_INSERT_ID() was the connection's previous insert: another job, returned as
-- this one).
INSERT INTO justonce_jobs (queue, task, args, kwargs, state, priority, run_at, max_attempts,
                           timeout, `key`, partition_key, batch_item, partition_hash)
VALUES (%(queue)s, %(task)s, %(args)s, %(kwargs)s,
        CASE WHEN COALESCE(CAST(%(run_at)s AS DATETIME(6)),
                           NOW(6) + INTERVAL ROUND(%(delay)s * 1000000) MICROSECOND) > NOW(6)
             THEN 'scheduled' ELSE 'ready' END,
        %(priority)s,
        COALESCE(CAST(%(run_at)s AS DATETIME(6)),
                 NOW(6) + INTERVAL ROUND(%(delay)s * 1000000) MICROSECOND),
        %(max_attempts)s, %(timeout)s, %(key)s, %(partition_key)s, %(batch_item)s,
        %(partition_hash)s)
ON DUPLICATE KEY UPDATE id = id + LAST_INSERT_ID(0);
SELECT id, state, run_at, created_at, NULL FROM justonce_jobs WHERE id = LAST_INSERT_ID();

-- name: job_take_key
-- dialect-only: MySQLDialect.insert_rows inserts a bulk insert's keyed jobs without their
-- key, in the order given, then sets the keys in key order: a key a live job holds fails
-- this with a duplicate key error (1062), which ends only this statement.
UPDATE justonce_jobs SET `key` = %(key)s WHERE id = %(id)s AND `key` IS NULL;

-- name: job_drop_unkeyed
-- dialect-only: the job whose key was refused (see job_take_key), never committed.
DELETE FROM justonce_jobs WHERE id = %(id)s AND `key` IS NULL;

-- name: job_insert_doc
-- dialect-only: MariaDB's bulk insert of calls (MySQLDialect.insert_calls)
-- One task, one set of options, no keys, and calls that differ in one of args or kwargs:
-- %(doc)s is that JSON list as justonce encoded it, one entry per job, and the other one
-- (%(args)s or %(kwargs)s) is the same for every job. Nothing is rendered per job: the
-- server splits the list (MariaDB's JSON_TABLE returns each entry's text as written;
-- MySQL 8's would be normalised: big integers, key order) and the options are parsed
-- once, not once per row. Server time per job here: 14 us, against 19 us for
-- job_insert_values' rows as they were (17 us with the state in a variable, as now). A
-- bulk enqueue of 1,000 jobs took 9.9 ms of client CPU with rendered rows, and takes
-- 1.7 ms, validation included. MariaDB refuses a list nested 32 deep or more (error 4040,
-- nothing written): the dialect then renders job_insert_values. ORDER BY ord: rows are
-- inserted, and so draw their consecutive ids (an INSERT … SELECT holds the table's
-- AUTO-INC lock to its end under innodb_autoinc_lock_mode 0 or 1), in the list's order.
-- Returns (first id, rows).
SET @justonce_due = COALESCE(CAST(%(run_at)s AS DATETIME(6)),
                             NOW(6) + INTERVAL ROUND(%(delay)s * 1000000) MICROSECOND),
    @justonce_state = IF(COALESCE(CAST(%(run_at)s AS DATETIME(6)),
                                  NOW(6) + INTERVAL ROUND(%(delay)s * 1000000) MICROSECOND)
                         > NOW(6), 'scheduled', 'ready');
INSERT INTO justonce_jobs (queue, task, args, kwargs, state, priority, run_at, max_attempts,
                           timeout, partition_key, batch_item, partition_hash)
SELECT %(queue)s, %(task)s, COALESCE(%(args)s, d.doc), COALESCE(%(kwargs)s, d.doc),
       @justonce_state, %(priority)s, @justonce_due, %(max_attempts)s, %(timeout)s,
       %(partition_key)s, CONCAT(%(item_prefix)s, d.ord - 1), %(partition_hash)s
  FROM JSON_TABLE(%(doc)s, '$[*]' COLUMNS (ord FOR ORDINALITY, doc JSON PATH '$')) AS d
 ORDER BY d.ord;
SELECT LAST_INSERT_ID(), ROW_COUNT();

-- name: job_insert_values
-- dialect-only: MySQL's bulk insert of calls (MySQLDialect.insert_calls)
-- One task, one set of options, no keys: one multi-row INSERT, whose /*rows*/ the dialect
-- replaces with one job_insert_row per job (rendered and escaped by the driver, as a plain
-- multi-row insert is). MySQL 8 and calls that mix positional and keyword arguments come
-- here (job_insert_doc is MariaDB's, for calls that differ in one of them). The state is
-- worked out once: per row it was one more expression for the server to parse and run
-- (2 us a row). Returns (first id, rows): a multi-row insert draws consecutive ids, in row
-- order, under innodb_autoinc_lock_mode 0 or 1.
SET @justonce_due = COALESCE(CAST(%(run_at)s AS DATETIME(6)),
                             NOW(6) + INTERVAL ROUND(%(delay)s * 1000000) MICROSECOND),
    @justonce_state = IF(COALESCE(CAST(%(run_at)s AS DATETIME(6)),
                                  NOW(6) + INTERVAL ROUND(%(delay)s * 1000000) MICROSECOND)
                         > NOW(6), 'scheduled', 'ready');
INSERT INTO justonce_jobs (queue, task, args, kwargs, state, priority, run_at, max_attempts,
                           timeout, partition_key, batch_item, partition_hash)
VALUES /*rows*/;
SELECT LAST_INSERT_ID(), ROW_COUNT();

-- name: job_insert_row
-- dialect-only: one row of job_insert_values
(%(queue)s, %(task)s, %(args)s, %(kwargs)s, @justonce_state, %(priority)s, @justonce_due,
 %(max_attempts)s, %(timeout)s, %(partition_key)s, %(batch_item)s, %(partition_hash)s)

-- name: job_live_by_keys
-- %(keys)s: a JSON list. The list's column compares with the binary collation of live_key.
SELECT j.*
  FROM JSON_TABLE(%(keys)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$')) AS d
  STRAIGHT_JOIN justonce_jobs j FORCE INDEX (justonce_jobs_live_key) ON j.live_key = d.k;

-- name: job_live_by_keys_locked
-- dialect-only: MySQLDialect.live_key_holders, for keys a caller's snapshot did not show
-- A locking read reads the latest committed rows, whatever the transaction's snapshot:
-- under REPEATABLE READ a key's holder committed after the caller's snapshot began fails
-- the insert (the unique check sees it) but is not in a plain read.
SELECT j.*
  FROM JSON_TABLE(%(keys)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$')) AS d
  STRAIGHT_JOIN justonce_jobs j FORCE INDEX (justonce_jobs_live_key) ON j.live_key = d.k
  LOCK IN SHARE MODE;

-- name: job_get
SELECT * FROM justonce_jobs WHERE id = %(id)s;

-- name: claim_lease
-- (A fragment of the claims below: lease the picked jobs.)
UPDATE justonce_jobs
   SET state = 'running',
       attempts = attempts + 1,
       lease_token = lease_token + 1,
       lease_owner = %(owner)s,
       lease_expires_at = NOW(6) + INTERVAL ROUND(%(lease)s * 1000000) MICROSECOND,
       started_at = NOW(6)

-- name: claim_returning
-- (A fragment: the claimed jobs as the claims return them.) queue_wait: seconds since the
-- job became due (run_at), by the database's clock.
SELECT id, queue, task, args, kwargs, attempts, max_attempts, timeout, lease_token, priority,
       batch_item, partition_hash,
       GREATEST(0e0, TIMESTAMPDIFF(MICROSECOND, run_at, NOW(6)) / 1e6) AS queue_wait
  FROM justonce_jobs

-- name: job_claim
-- Lock up to %(limit)s ready jobs of ONE queue in (priority, id) order, skipping rows
-- another worker is claiming right now, and lease them. The claim index gives that order
-- (partition_hash IS NULL is an equality in it), so the scan stops at the LIMIT.
SELECT id FROM justonce_jobs FORCE INDEX (justonce_jobs_claim)
 WHERE state = 'ready' AND queue = %(queue)s AND partition_hash IS NULL
   AND NOT EXISTS (SELECT 1 FROM justonce_queue_pauses p WHERE p.queue = %(queue)s)
 ORDER BY priority, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;
{{claim_lease}}
 WHERE id IN %(picked)s;
{{claim_returning}}
 WHERE id IN %(picked)s;

-- name: job_claim_partitioned
-- The claim of a worker that holds slots %(slots)s of set %(set)s (n = %(n)s) with tokens
-- %(tokens)s (two aligned JSON lists). First the fence: the slots whose token is still the
-- caller's and whose lease has not expired by the database's clock, their rows held in
-- share mode until commit, so that a standby's takeover (lease_take skips locked rows)
-- cannot commit before this claim does. No live slot: no claim.
-- Then ready jobs of those slots, oldest first, and only the first live job of each key:
-- a job waits while any job of its key runs (whatever its id: ids are drawn at insert,
-- jobs become visible at commit) or an earlier one is scheduled or ready. The slot list is
-- a literal here, so the slot test runs on the index entry before a row is read or locked.
-- partition_state is a partitioned job's state (NULL for other jobs: migration 0008), and
-- both indexes read here start with it.
SELECT l.slot
  FROM JSON_TABLE(%(slots)s, '$[*]' COLUMNS (ord FOR ORDINALITY, slot INT PATH '$')) AS s
  JOIN JSON_TABLE(%(tokens)s, '$[*]' COLUMNS (ord FOR ORDINALITY, token BIGINT PATH '$')) AS t
    ON t.ord = s.ord
  STRAIGHT_JOIN justonce_partition_leases l FORCE INDEX (PRIMARY)
    ON l.set_name = %(set)s AND l.slot = s.slot
 WHERE l.token = t.token AND l.owner IS NOT NULL AND l.expires_at > NOW(6)
  LOCK IN SHARE MODE;
SELECT c.id FROM justonce_jobs c FORCE INDEX (justonce_jobs_claim_partitioned)
 WHERE c.partition_state = 'ready' AND c.queue = %(queue)s
   AND NOT EXISTS (SELECT 1 FROM justonce_queue_pauses p WHERE p.queue = %(queue)s)
   AND MOD(MOD(c.partition_hash, %(n)s) + %(n)s, %(n)s) IN %(picked)s
   AND NOT EXISTS (SELECT 1 FROM justonce_jobs e
                    WHERE e.partition_key = c.partition_key
                      AND e.partition_state IN ('scheduled','ready','running')
                      AND (e.partition_state = 'running' OR e.id < c.id))
 ORDER BY c.id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;
{{claim_lease}}
 WHERE id IN %(picked)s;
{{claim_returning}}
 WHERE id IN %(picked)s;

-- name: job_any_ready
SELECT 1 FROM justonce_jobs
 WHERE state = 'ready' AND queue = %(queue)s AND partition_hash IS NULL
   AND NOT EXISTS (SELECT 1 FROM justonce_queue_pauses p WHERE p.queue = %(queue)s)
 LIMIT 1;

-- name: fenced_running
-- dialect-only: a fragment of job_complete_many, job_heartbeat and job_release
-- The running jobs of the aligned lists %(ids)s and %(tokens)s whose token is still the
-- caller's, locked in list order (sorted by id) and looked up by key.
  FROM JSON_TABLE(%(ids)s, '$[*]' COLUMNS (ord FOR ORDINALITY, id BIGINT PATH '$')) AS d
  JOIN (SELECT ord, token
          FROM JSON_TABLE(%(tokens)s, '$[*]' COLUMNS (ord FOR ORDINALITY, token BIGINT PATH '$')) AS x
         LIMIT 18446744073709551615) AS t ON t.ord = d.ord
  STRAIGHT_JOIN justonce_jobs j FORCE INDEX (PRIMARY) ON j.id = d.id
 WHERE j.lease_token = t.token AND j.state = 'running'
   FOR UPDATE

-- name: job_complete_many
-- %(ids)s, %(tokens)s, %(results)s (JSON text or null), %(notes)s (text or null): four
-- aligned JSON lists (sorted by id: rows are locked in list order). The rows are locked,
-- then updated from the same lists; the accepted ids come back.
SELECT j.id, NULL
{{fenced_running}};
UPDATE JSON_TABLE(%(ids)s, '$[*]' COLUMNS (ord FOR ORDINALITY, id BIGINT PATH '$')) AS d
  JOIN (SELECT ord, result
          FROM JSON_TABLE(%(results)s, '$[*]' COLUMNS (ord FOR ORDINALITY, result LONGTEXT PATH '$')) AS x
         LIMIT 18446744073709551615) AS r ON r.ord = d.ord
  JOIN (SELECT ord, note
          FROM JSON_TABLE(%(notes)s, '$[*]' COLUMNS (ord FOR ORDINALITY, note LONGTEXT PATH '$')) AS x
         LIMIT 18446744073709551615) AS n ON n.ord = d.ord
  STRAIGHT_JOIN justonce_jobs j FORCE INDEX (PRIMARY) ON j.id = d.id
   SET j.state = 'succeeded', j.result = r.result, j.last_error = COALESCE(n.note, j.last_error),
       j.finished_at = NOW(6), j.lease_owner = NULL, j.lease_expires_at = NULL
 WHERE j.id IN %(picked)s;

-- name: job_fail
-- MySQL assigns left to right, each assignment seeing the ones before it: lease_owner is
-- read (errors) before it is cleared.
SELECT id FROM justonce_jobs
 WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
   FOR UPDATE;
UPDATE justonce_jobs
   SET state = CASE WHEN %(retry_in)s IS NULL OR attempts >= max_attempts THEN 'dead'
                    WHEN %(retry_in)s > 0 THEN 'scheduled'
                    ELSE 'ready' END,
       run_at = CASE WHEN %(retry_in)s IS NULL OR attempts >= max_attempts THEN run_at
                     ELSE NOW(6) + INTERVAL ROUND(%(retry_in)s * 1000000) MICROSECOND END,
       finished_at = CASE WHEN %(retry_in)s IS NULL OR attempts >= max_attempts THEN NOW(6) END,
       last_error = %(error)s,
       errors = JSON_ARRAY_APPEND(errors, '$', JSON_OBJECT(
                    'attempt', attempts,
                    'at', DATE_FORMAT(NOW(6), '%%Y-%%m-%%dT%%H:%%i:%%s.%%fZ'),
                    'kind', %(kind)s, 'error', %(error)s, 'owner', lease_owner,
                    'retry_in', CASE WHEN attempts < max_attempts THEN %(retry_in)s END)),
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id IN %(picked)s;
SELECT state, NULL FROM justonce_jobs WHERE id IN %(picked)s;

-- name: job_settled
-- %(ids)s, %(tokens)s: aligned JSON lists.
-- A worker whose write raised (its connection broke, perhaps after the COMMIT, before the
-- reply) and whose retry was refused asks which of its (id, token) pairs an earlier try did
-- settle: lease_token is the job's own count of claims, so a row that still carries the
-- token and is no longer running was last leased by that claim. A plain read: such a row
-- changes only by a later claim (a new token), an operator, or its pruning.
SELECT j.id, j.state, j.attempts, j.last_error
  FROM JSON_TABLE(%(ids)s, '$[*]' COLUMNS (ord FOR ORDINALITY, id BIGINT PATH '$')) AS d
  JOIN (SELECT ord, token
          FROM JSON_TABLE(%(tokens)s, '$[*]' COLUMNS (ord FOR ORDINALITY, token BIGINT PATH '$')) AS x
         LIMIT 18446744073709551615) AS t ON t.ord = d.ord
  STRAIGHT_JOIN justonce_jobs j FORCE INDEX (PRIMARY) ON j.id = d.id
 WHERE j.lease_token = t.token AND j.state <> 'running';

-- name: job_heartbeat
-- %(ids)s, %(tokens)s: aligned JSON lists. Returns the ids whose lease was renewed.
SELECT j.id
{{fenced_running}};
UPDATE justonce_jobs
   SET lease_expires_at = NOW(6) + INTERVAL ROUND(%(lease)s * 1000000) MICROSECOND
 WHERE id IN %(picked)s;

-- name: job_release
-- Give leased jobs back untouched (graceful shutdown). %(refund)s: the job never started,
-- so its attempt does not count.
SELECT j.id, NULL
{{fenced_running}};
UPDATE justonce_jobs
   SET state = 'ready',
       attempts = CASE WHEN %(refund)s THEN GREATEST(attempts - 1, 0) ELSE attempts END,
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id IN %(picked)s;

-- name: job_cancel
SELECT id FROM justonce_jobs
 WHERE id = %(id)s AND state IN ('scheduled','ready','running')
   FOR UPDATE;
UPDATE justonce_jobs
   SET state = 'cancelled', finished_at = NOW(6), lease_owner = NULL, lease_expires_at = NULL
 WHERE id IN %(picked)s;
SELECT * FROM justonce_jobs WHERE id IN %(picked)s;

-- name: job_retry
-- A live job holding the key makes the UPDATE fail with a duplicate key error (1062).
SELECT id FROM justonce_jobs
 WHERE id = %(id)s AND state IN ('dead','cancelled')
   FOR UPDATE;
UPDATE justonce_jobs
   SET state = 'ready', attempts = 0, run_at = NOW(6), finished_at = NULL,
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id IN %(picked)s;
SELECT *, NULL AS pg_notify FROM justonce_jobs WHERE id IN %(picked)s;

-- name: jobs_promote
-- Nothing due: no row (the count is 0). A scheduled job's due_at is its run_at (migration
-- 0008: one index serves promotion, rescue and pruning, in due order).
SELECT id FROM justonce_jobs FORCE INDEX (justonce_jobs_due)
 WHERE state = 'scheduled' AND due_at <= NOW(6)
 ORDER BY due_at
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;
UPDATE justonce_jobs SET state = 'ready' WHERE id IN %(picked)s;
SELECT COUNT(*), NULL FROM justonce_jobs WHERE id IN %(picked)s;

-- name: jobs_any_expired
-- Housekeeping's first look: almost always nothing expired, and then a read is all it costs.
-- A running job's due_at is its lease's expiry.
SELECT 1 FROM justonce_jobs FORCE INDEX (justonce_jobs_due)
 WHERE state = 'running' AND due_at < NOW(6)
 LIMIT 1;

-- name: jobs_rescue
-- Leases that ran out: the worker died or froze. The attempt it made still counts, so a
-- job that kills its worker every time ends dead after max_attempts. One row per rescued
-- job: (its new state, its batch item). lease_owner is cleared last (see job_fail).
SELECT id FROM justonce_jobs FORCE INDEX (justonce_jobs_due)
 WHERE state = 'running' AND due_at < NOW(6)
 ORDER BY due_at
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;
UPDATE justonce_jobs
   SET state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'ready' END,
       finished_at = CASE WHEN attempts >= max_attempts THEN NOW(6) END,
       last_error = CONCAT('lease expired: worker ', COALESCE(lease_owner, '?'),
                           ' stopped renewing it during attempt ', attempts),
       errors = JSON_ARRAY_APPEND(errors, '$', JSON_OBJECT(
                    'attempt', attempts,
                    'at', DATE_FORMAT(NOW(6), '%%Y-%%m-%%dT%%H:%%i:%%s.%%fZ'),
                    'kind', 'lease_expired', 'error', 'lease expired', 'owner', lease_owner)),
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id IN %(picked)s;
SELECT state, batch_item FROM justonce_jobs WHERE id IN %(picked)s;

-- name: jobs_prune
-- Returns one row per job deleted (PostgreSQL's block returns none: its caller reads the
-- row count). A finished job that someone holds locked (a retry) is skipped. A finished
-- job's due_at is its finished_at.
SELECT id FROM justonce_jobs FORCE INDEX (justonce_jobs_due)
 WHERE (state IN ('succeeded','cancelled')
        AND due_at < NOW(6) - INTERVAL ROUND(%(keep_succeeded)s * 1000000) MICROSECOND)
    OR (state = 'dead'
        AND due_at < NOW(6) - INTERVAL ROUND(%(keep_dead)s * 1000000) MICROSECOND)
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;
DELETE FROM justonce_jobs WHERE id IN %(picked)s;

-- name: queue_counts
SELECT queue, state, COUNT(*) FROM justonce_jobs GROUP BY queue, state ORDER BY queue, state;

-- name: queue_pause
-- Pause %(queue)s: a no-op when it is paused already (the first pause's time, actor and
-- note stay). queue_pause_get then reads the pause in force, in the same transaction.
-- Whether this call made it is told by LAST_INSERT_ID (1 before, 0 after a no-op), not by
-- the count alone: a connection that counts rows found (CLIENT_FOUND_ROWS) counts the no-op.
DO LAST_INSERT_ID(1);
INSERT INTO justonce_queue_pauses (queue, actor, note) VALUES (%(queue)s, %(actor)s, %(note)s)
    ON DUPLICATE KEY UPDATE queue = IF(LAST_INSERT_ID(0), queue, queue);
SELECT %(queue)s AS queue FROM DUAL WHERE LAST_INSERT_ID() = 1;

-- name: queue_pause_get
SELECT queue, paused_at, actor, note FROM justonce_queue_pauses WHERE queue = %(queue)s;

-- name: queue_resume
-- Resume %(queue)s (no row: it was not paused). Idle workers see it at their next poll.
SELECT queue FROM justonce_queue_pauses WHERE queue = %(queue)s FOR UPDATE;
DELETE FROM justonce_queue_pauses WHERE queue IN %(picked)s;

-- name: database_mark
-- dialect-only: each dialect reads its own mark (Dialect.database_mark)
-- Which database a connection reaches (Dialect.same_database): when its first migration
-- ran, to the microsecond, as a number (DATETIME has no time zone; a number reads the
-- same whatever the connection's converters). The same on a replica. And how far the
-- session's NOW() is from UTC: every time justonce keeps is UTC and read with NOW(6), so a
-- caller's connection in another time zone would move every lease, fence, delay and
-- expiry it touches by that much (refused unless 0). And the session's sql_mode and
-- character sets, read in the same round trip: a mode that changes how justonce's
-- statements parse or what they mean (NO_BACKSLASH_ESCAPES, ORACLE, ...), or a character
-- set other than utf8mb4 between client and server, would corrupt what is written.
SELECT TIMESTAMPDIFF(MICROSECOND, '2000-01-01', applied_at),
       TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), NOW(6)),
       @@SESSION.sql_mode, @@SESSION.character_set_client,
       @@SESSION.character_set_connection, @@SESSION.character_set_results
  FROM justonce_migrations WHERE version = 1;

-- name: queue_pauses
SELECT queue, paused_at, actor, note FROM justonce_queue_pauses ORDER BY queue;

-- name: maintenance_try
-- The upsert takes the duty's row lock, so callers take turns. next_run_at holds when the
-- last round began (see the PostgreSQL file): it moves only when this caller's interval
-- has passed since (last_owner first: each assignment sees the ones before it); a call
-- that is not due changes nothing, which ends the block with no row. The SELECT confirms
-- that the row holds what this caller wrote.
SET @justonce_due = NOW(6);
INSERT INTO justonce_maintenance (name, next_run_at, last_owner)
VALUES (%(name)s, @justonce_due, %(owner)s)
ON DUPLICATE KEY UPDATE
   last_owner = IF(next_run_at <= NOW(6) - INTERVAL ROUND(%(interval)s * 1000000) MICROSECOND,
                   %(owner)s, last_owner),
   next_run_at = IF(next_run_at <= NOW(6) - INTERVAL ROUND(%(interval)s * 1000000) MICROSECOND,
                    @justonce_due, next_run_at);
SELECT name FROM justonce_maintenance
 WHERE name = %(name)s AND last_owner = %(owner)s AND next_run_at = @justonce_due;

-- Dashboard (backends/dashstore.py, web/snapshot.py). Each statement stays bounded on a
-- big jobs table: it reads the table statistics, walks an index that starts with the
-- state, or stops after %(cap)s rows.

-- InnoDB's row estimate (sampled; MySQL 8 caches it for information_schema_stats_expiry,
-- a day by default). A stale small figure only costs one capped exact count, which then
-- finds the table bigger.
-- name: dash_jobs_estimate
SELECT TABLE_ROWS FROM information_schema.TABLES
 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'justonce_jobs';

-- name: dash_counts_exact
SELECT queue, state, COUNT(*) FROM (SELECT queue, state FROM justonce_jobs LIMIT %(cap)s) j
 GROUP BY queue, state;

-- MySQL and MariaDB keep no statistics per (queue, state) pair: no rows, so the caller
-- always uses the sample below.
-- name: dash_counts_estimated
SELECT NULL, NULL, 0 FROM DUAL WHERE FALSE;

-- name: dash_counts_sample
SELECT queue, state, COUNT(*)
  FROM (SELECT queue, state FROM justonce_jobs ORDER BY id DESC LIMIT %(cap)s) j
 GROUP BY queue, state;

-- As many running jobs as workers run them: exact, on the claim index (in queue order: no
-- temporary table; the due index, which the optimizer would pick, needs one).
-- name: dash_counts_running
SELECT queue, 'running', COUNT(*) FROM justonce_jobs FORCE INDEX (justonce_jobs_claim)
 WHERE state = 'running' GROUP BY queue;

-- Scheduled and dead jobs per queue, at most %(cap)s of each state, in index order, from
-- the due index alone (it holds queue).
-- name: dash_counts_capped
SELECT queue, state, COUNT(*) FROM (
    (SELECT queue, state FROM justonce_jobs FORCE INDEX (justonce_jobs_due)
      WHERE state = 'scheduled' ORDER BY due_at LIMIT %(cap)s)
    UNION ALL
    (SELECT queue, 'dead' FROM justonce_jobs FORCE INDEX (justonce_jobs_due)
      WHERE state = 'dead' ORDER BY due_at LIMIT %(cap)s)
) j GROUP BY queue, state;

-- The queues that have ready jobs, at most %(limit)s: one pass over the ready entries of
-- the claim index, from the index alone (60 ms for 100,000 ready jobs on MariaDB 10.11).
-- Written as a recursive loose scan (queue > the previous one) it was slower: MariaDB
-- plans the correlated `queue >` as a scan from the first ready entry, not a seek.
-- name: dash_ready_queues
SELECT DISTINCT queue FROM justonce_jobs FORCE INDEX (justonce_jobs_claim)
 WHERE state = 'ready'
 ORDER BY queue
 LIMIT %(limit)s;

-- Ready jobs of each queue in %(queues)s (a JSON list), at most %(cap)s per queue. MariaDB
-- has no LATERAL: a probe for a row past the cap (LIMIT cap, 1 on the claim index) decides
-- between the cap and an exact count, which then reads fewer than cap index entries.
-- name: dash_count_ready
SELECT q.queue,
       CASE WHEN (SELECT 1 FROM justonce_jobs j
                   WHERE j.state = 'ready' AND j.queue = q.queue
                   LIMIT %(cap)s, 1) IS NOT NULL
            THEN %(cap)s
            ELSE (SELECT COUNT(*) FROM justonce_jobs j WHERE j.state = 'ready' AND j.queue = q.queue)
       END
  FROM JSON_TABLE(%(queues)s, '$[*]' COLUMNS (queue VARCHAR(63) PATH '$')) AS q;

-- The due index from %(since)s (epoch seconds) on (a finished job's due_at is its
-- finished_at): as many index entries as jobs finished since.
-- name: dash_finished_since
SELECT TIMESTAMPDIFF(SECOND, '1970-01-01', due_at), state, COUNT(*)
  FROM justonce_jobs FORCE INDEX (justonce_jobs_due)
 WHERE state IN ('succeeded','dead')
   AND due_at >= TIMESTAMP '1970-01-01 00:00:00'
                      + INTERVAL ROUND(%(since)s * 1000000) MICROSECOND
 GROUP BY 1, 2;

-- name: dash_clock
SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', NOW(6)) / 1e6;

-- name: dash_running
SELECT id, queue, task, state, attempts, max_attempts, lease_owner, lease_expires_at,
       started_at, finished_at, last_error
  FROM justonce_jobs FORCE INDEX (justonce_jobs_due) WHERE state = 'running'
 ORDER BY due_at
 LIMIT %(limit)s;

-- name: dash_dead
SELECT id, queue, task, state, attempts, max_attempts, lease_owner, lease_expires_at,
       started_at, finished_at, last_error
  FROM justonce_jobs FORCE INDEX (justonce_jobs_due) WHERE state = 'dead'
 ORDER BY due_at DESC
 LIMIT %(limit)s;

-- name: db_now
SELECT NOW(6);

-- Batches. The algorithm is shared by every backend (backends/batchstore.py); these
-- statements are its MySQL dialect. List parameters are JSON documents. Bits are set in
-- Python under the chunks' row locks (batch_chunks_lock, then batch_chunk_update), as on
-- SQLite: MySQL has no bit operations on binary strings longer than 8 bytes in MariaDB.

-- name: batch_open
INSERT INTO justonce_batches (state, description, callbacks, expire_after)
VALUES ('open', %(description)s, %(callbacks)s, %(expire_after)s);
SELECT LAST_INSERT_ID();

-- name: batch_state
SELECT state FROM justonce_batches WHERE id = %(id)s;

-- name: batch_add
SELECT id FROM justonce_batches WHERE id = %(id)s AND state = 'open' FOR UPDATE;
UPDATE justonce_batches
   SET total = total + %(count)s, `groups` = `groups` + 1, updated_at = NOW(6)
 WHERE id IN %(picked)s;

-- name: batch_chunks_insert
-- %(sizes)s: a JSON list, chunk i has sizes[i] items; bits start as zero bytes.
INSERT INTO justonce_batch_chunks (batch_id, group_id, chunk, size, pending, bits)
SELECT %(id)s, %(group_id)s, s.ord - 1, s.size, s.size, UNHEX(REPEAT('00', (s.size + 7) DIV 8))
  FROM JSON_TABLE(%(sizes)s, '$[*]' COLUMNS (ord FOR ORDINALITY, size INT PATH '$')) AS s;

-- name: batch_seal
SELECT id FROM justonce_batches WHERE id = %(id)s AND state = 'open' FOR UPDATE;
UPDATE justonce_batches SET state = 'sealed', sealed_at = NOW(6), updated_at = NOW(6)
 WHERE id IN %(picked)s;

-- name: batch_chunks_lock
-- dialect-only: bits set in Python (Dialect.flip's default)
-- %(keys)s: a JSON list of [batch id, group id, chunk], sorted. The chunks are looked up
-- one by one through the primary key and locked in that order (two bulk acks cannot
-- deadlock); the ORDER BY only orders the answer. The
-- batch's state is read by a subquery, which locks nothing: the batch row is locked only
-- by batch_lock, after the chunks (the lock order of batchstore.py).
SELECT c.batch_id, c.group_id, c.chunk, c.size, c.pending, c.bits,
       (SELECT b.state FROM justonce_batches b WHERE b.id = c.batch_id) AS state
  FROM JSON_TABLE(%(keys)s, '$[*]' COLUMNS (batch_id BIGINT PATH '$[0]',
                                            group_id VARCHAR(32) PATH '$[1]',
                                            chunk INT PATH '$[2]')) AS k
  STRAIGHT_JOIN justonce_batch_chunks c FORCE INDEX (PRIMARY)
    ON c.batch_id = k.batch_id AND c.group_id = k.group_id AND c.chunk = k.chunk
 ORDER BY c.batch_id, c.group_id, c.chunk
   FOR UPDATE;

-- name: batch_chunk_update
-- dialect-only: bits set in Python (Dialect.flip's default)
-- Run once per changed chunk, under the lock batch_chunks_lock took.
UPDATE justonce_batch_chunks
   SET bits = %(bits)s, pending = %(pending)s, updated_at = NOW(6)
 WHERE batch_id = %(batch_id)s AND group_id = %(group_id)s AND chunk = %(chunk)s;

-- name: batch_failure_insert
INSERT INTO justonce_batch_failures (batch_id, item, reason)
VALUES (%(batch_id)s, %(item)s, %(reason)s)
ON DUPLICATE KEY UPDATE batch_id = batch_id;

-- name: batch_group_size
SELECT SUM(size) FROM justonce_batch_chunks WHERE batch_id = %(id)s AND group_id = %(group_id)s;

-- name: batch_lock
SELECT b.id, b.state, b.description, b.callbacks, b.total
  FROM JSON_TABLE(%(ids)s, '$[*]' COLUMNS (id BIGINT PATH '$')) AS i
  STRAIGHT_JOIN justonce_batches b FORCE INDEX (PRIMARY) ON b.id = i.id
 ORDER BY b.id
   FOR UPDATE;

-- name: batch_pending
-- Runs under the batch lock: one early-exit probe per batch.
SELECT i.id FROM JSON_TABLE(%(ids)s, '$[*]' COLUMNS (id BIGINT PATH '$')) AS i
 WHERE EXISTS (SELECT 1 FROM justonce_batch_chunks c WHERE c.batch_id = i.id AND c.pending > 0);

-- name: batch_failure_counts
SELECT f.batch_id, COUNT(*)
  FROM JSON_TABLE(%(ids)s, '$[*]' COLUMNS (id BIGINT PATH '$')) AS i
  STRAIGHT_JOIN justonce_batch_failures f ON f.batch_id = i.id
 GROUP BY f.batch_id;

-- name: batch_complete
UPDATE justonce_batches
   SET state = 'completed', finished_at = NOW(6), updated_at = NOW(6),
       acked = %(acked)s, failed = %(failed)s
 WHERE id = %(id)s AND state = 'sealed';

-- name: batch_get
SELECT b.id, b.state, b.description, b.callbacks, b.total, b.`groups`, b.expire_after,
       b.created_at, b.updated_at, b.sealed_at, b.finished_at,
       COALESCE((SELECT SUM(pending) FROM justonce_batch_chunks c WHERE c.batch_id = b.id), 0),
       (SELECT COUNT(*) FROM justonce_batch_failures f WHERE f.batch_id = b.id)
  FROM justonce_batches b
 WHERE b.id = %(id)s;

-- name: batch_list
SELECT b.id, b.state, b.description, b.callbacks, b.total, b.`groups`, b.expire_after,
       b.created_at, b.updated_at, b.sealed_at, b.finished_at,
       COALESCE((SELECT SUM(pending) FROM justonce_batch_chunks c WHERE c.batch_id = b.id), 0),
       (SELECT COUNT(*) FROM justonce_batch_failures f WHERE f.batch_id = b.id)
  FROM justonce_batches b
 WHERE %(state)s IS NULL OR b.state = %(state)s
 ORDER BY b.id DESC
 LIMIT %(limit)s;

-- name: batch_failures
SELECT item, reason, failed_at FROM justonce_batch_failures
 WHERE batch_id = %(id)s
 ORDER BY failed_at, item
 LIMIT %(limit)s;

-- name: batches_expire
-- Orphans: open batches with no add or ack for their expire_after. (A sealed batch waits
-- for its items, however long their jobs are delayed or backed off.) Returns their ids.
SELECT x.id FROM justonce_batches x FORCE INDEX (justonce_batches_idle)
 WHERE x.state = 'open'
   AND x.updated_at < NOW(6) - INTERVAL ROUND(x.expire_after * 1000000) MICROSECOND
   AND NOT EXISTS (SELECT 1 FROM justonce_batch_chunks c
                    WHERE c.batch_id = x.id
                      AND c.updated_at >= NOW(6) - INTERVAL ROUND(x.expire_after * 1000000) MICROSECOND)
 ORDER BY x.updated_at
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;
UPDATE justonce_batches SET state = 'expired', finished_at = NOW(6) WHERE id IN %(picked)s;

-- name: batches_old
SELECT id FROM justonce_batches
 WHERE state IN ('completed','expired')
   AND finished_at <= NOW(6) - INTERVAL ROUND(%(retention)s * 1000000) MICROSECOND
 ORDER BY finished_at
 LIMIT %(limit)s;

-- name: batch_delete_chunks
DELETE FROM justonce_batch_chunks WHERE batch_id = %(id)s;

-- name: batch_delete_failures
DELETE FROM justonce_batch_failures WHERE batch_id = %(id)s;

-- name: batch_delete
DELETE FROM justonce_batches WHERE id = %(id)s;

-- Partition leases. Acquiring holds the set's row for the whole transaction, so acquires
-- of one set take turns (they are rare) and a change of n is checked and made atomically.

-- name: lease_set_lock
-- The update always changes the row (an upsert that changes nothing would end the block):
-- updated_at moves forward by at least a microsecond.
INSERT INTO justonce_partition_sets (set_name, n) VALUES (%(set)s, %(n)s)
ON DUPLICATE KEY UPDATE updated_at = GREATEST(NOW(6), updated_at + INTERVAL 1 MICROSECOND);
SELECT n FROM justonce_partition_sets WHERE set_name = %(set)s;

-- name: lease_set_fence_all
-- A new n: every slot's token moves on, so a holder of the old n (its lease expired, it is
-- paused) can neither renew nor pass a fence, whichever slot it had.
UPDATE justonce_partition_leases SET owner = NULL, expires_at = NULL, token = token + 1
 WHERE set_name = %(set)s;
SELECT slot FROM justonce_partition_leases WHERE set_name = %(set)s;

-- name: lease_set_held
SELECT COUNT(*) FROM justonce_partition_leases
 WHERE set_name = %(set)s AND owner IS NOT NULL AND expires_at > NOW(6);

-- name: lease_set_resize
UPDATE justonce_partition_sets SET n = %(n)s, updated_at = NOW(6) WHERE set_name = %(set)s;
SELECT n FROM justonce_partition_sets WHERE set_name = %(set)s;

-- name: lease_slots_ensure
-- Slots 0 .. n-1 (a JSON array of n zeros numbers them: no recursion depth limit). Slots
-- that exist already change nothing; the new ones come back.
INSERT INTO justonce_partition_leases (set_name, slot)
SELECT %(set)s, s.ord - 1
  FROM JSON_TABLE(CONCAT('[', REPEAT('0,', %(n)s - 1), '0]'),
                  '$[*]' COLUMNS (ord FOR ORDINALITY)) AS s
 -- Only slots that do not exist yet: the upsert below would take an exclusive lock on an
 -- existing slot row, and wait for a claim that holds it in share mode (a plain read under
 -- READ COMMITTED locks nothing).
 WHERE NOT EXISTS (SELECT 1 FROM justonce_partition_leases e
                    WHERE e.set_name = %(set)s AND e.slot = s.ord - 1)
ON DUPLICATE KEY UPDATE slot = justonce_partition_leases.slot;
-- (the set's slots, after the insert: PostgreSQL's twin returns the new ones)
SELECT slot FROM justonce_partition_leases WHERE set_name = %(set)s AND slot < %(n)s;

-- name: lease_take
-- The first free or expired slot; the token grows with every new holder.
SELECT slot FROM justonce_partition_leases
 WHERE set_name = %(set)s AND slot < %(n)s AND (owner IS NULL OR expires_at <= NOW(6))
 ORDER BY slot
 LIMIT 1
   FOR UPDATE SKIP LOCKED;
UPDATE justonce_partition_leases
   SET owner = %(owner)s, token = token + 1,
       expires_at = NOW(6) + INTERVAL ROUND(%(lease)s * 1000000) MICROSECOND,
       acquired_at = NOW(6), renewed_at = NOW(6)
 WHERE set_name = %(set)s AND slot IN %(picked)s;
SELECT slot, token, expires_at FROM justonce_partition_leases
 WHERE set_name = %(set)s AND slot IN %(picked)s;

-- name: lease_hold
-- The slot's row locked for a renewal (LeaseStore.lease_renew), if the lease looked live
-- when the statement began (NOW() is the statement's start, not the end of a lock wait);
-- lease_renew then tests the expiry again, after any wait here.
SELECT slot FROM justonce_partition_leases
 WHERE set_name = %(set)s AND slot = %(slot)s AND token = %(token)s AND owner IS NOT NULL
   AND expires_at > NOW(6)
   FOR UPDATE;

-- name: lease_renew
-- Only a live lease is renewed: once it has expired by the database's clock its token is
-- spent (a standby may be taking the slot right now), and the holder must acquire anew.
SELECT slot FROM justonce_partition_leases
 WHERE set_name = %(set)s AND slot = %(slot)s AND token = %(token)s AND owner IS NOT NULL
   AND expires_at > NOW(6)
   FOR UPDATE;
UPDATE justonce_partition_leases
   SET expires_at = NOW(6) + INTERVAL ROUND(%(lease)s * 1000000) MICROSECOND,
       renewed_at = NOW(6)
 WHERE set_name = %(set)s AND slot IN %(picked)s;
SELECT expires_at FROM justonce_partition_leases WHERE set_name = %(set)s AND slot IN %(picked)s;

-- name: lease_release
SELECT slot FROM justonce_partition_leases
 WHERE set_name = %(set)s AND slot = %(slot)s AND token = %(token)s AND owner IS NOT NULL
   FOR UPDATE;
UPDATE justonce_partition_leases SET owner = NULL, expires_at = NULL
 WHERE set_name = %(set)s AND slot IN %(picked)s;

-- name: lease_fence
-- In share mode: a takeover (an UPDATE of this row) waits until the caller's transaction
-- ends. An expired lease fails the fence even before anyone took the slot over.
SELECT 1 FROM justonce_partition_leases
 WHERE set_name = %(set)s AND slot = %(slot)s AND token = %(token)s AND owner IS NOT NULL
   AND expires_at > NOW(6)
  LOCK IN SHARE MODE;

-- name: lease_list
SELECT l.set_name, s.n, l.slot, l.owner, l.token, l.expires_at,
       (l.owner IS NOT NULL AND l.expires_at > NOW(6))
  FROM justonce_partition_leases l
  JOIN justonce_partition_sets s ON s.set_name = l.set_name
 WHERE (%(set)s IS NULL OR l.set_name = %(set)s) AND l.slot < s.n
 ORDER BY l.set_name, l.slot;

-- Effects ("just once"). Claims run in a transaction with a lock wait timeout.

-- name: effect_ensure
INSERT INTO justonce_effects (scope, `key`, state, policy)
VALUES (%(scope)s, %(key)s, 'pending', %(policy)s)
ON DUPLICATE KEY UPDATE scope = scope;

-- name: effect_lock
-- "Check state": the entry's row lock, held until the claim's transaction ends, and the
-- chunk of run_many that holds it, if one does, whose state effect_chunks_read reads next
-- (see the PostgreSQL file).
SELECT state, policy, token, (lease_expires_at <= NOW(6)) AS expired, chunk_id
  FROM justonce_effects WHERE scope = %(scope)s AND `key` = %(key)s
   FOR UPDATE;

-- name: effect_take
-- "Change state": this caller's claim, with a new token (the entry leaves any chunk).
UPDATE justonce_effects
   SET state = 'running', token = token + 1, owner = %(owner)s, attempts = attempts + 1,
       lease_expires_at = NOW(6) + INTERVAL ROUND(%(lease)s * 1000000) MICROSECOND,
       updated_at = NOW(6), chunk_id = NULL
 WHERE scope = %(scope)s AND `key` = %(key)s;
SELECT token FROM justonce_effects WHERE scope = %(scope)s AND `key` = %(key)s;

-- name: effect_done
UPDATE justonce_effects
   SET state = 'done', done_at = NOW(6), updated_at = NOW(6), lease_expires_at = NULL,
       result = %(result)s
 WHERE scope = %(scope)s AND `key` = %(key)s AND token = %(token)s AND state = 'running'
   AND chunk_id IS NULL;
SELECT 1;

-- name: effect_release
UPDATE justonce_effects
   SET state = 'pending', updated_at = NOW(6), lease_expires_at = NULL, last_error = %(error)s
 WHERE scope = %(scope)s AND `key` = %(key)s AND token = %(token)s AND state = 'running'
   AND chunk_id IS NULL;
SELECT 1;

-- name: effect_resolve_lock
-- An operator's verdict, first step: the running entries among %(keys)s (sorted), locked
-- in list order: (key, lease expired, the chunk that holds it). The caller share-locks
-- those chunks, then picks the entries in doubt.
SELECT e.`key`, (e.lease_expires_at <= NOW(6)), e.chunk_id
  FROM JSON_TABLE(%(keys)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$')) AS d
  STRAIGHT_JOIN justonce_effects e FORCE INDEX (PRIMARY) ON e.scope = %(scope)s AND e.`key` = d.k
 WHERE e.state = 'running'
   FOR UPDATE;

-- name: effect_resolve_set
-- The verdict on the entries picked (locked by this transaction): done, or pending (to be
-- redone), on each entry itself.
UPDATE justonce_effects FORCE INDEX (PRIMARY)
   SET state = %(state)s, updated_at = NOW(6), lease_expires_at = NULL, chunk_id = NULL,
       done_at = CASE WHEN %(state)s = 'done' THEN NOW(6) END,
       last_error = COALESCE(%(note)s, last_error)
 WHERE scope = %(scope)s AND `key` IN (SELECT k FROM JSON_TABLE(%(keys)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$')) AS d)
   AND state = 'running';
SELECT e.`key`
  FROM JSON_TABLE(%(keys)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$')) AS d
  STRAIGHT_JOIN justonce_effects e FORCE INDEX (PRIMARY) ON e.scope = %(scope)s AND e.`key` = d.k;

-- name: effect_columns
-- (A fragment of effect_get and effects_list: an entry as its chunk makes it, e the entry,
-- c its chunk or NULLs.)
e.scope, e.`key`, IF(c.state = 'done', 'done', e.state), e.policy, e.token, e.owner,
       e.attempts, IF(c.state = 'done', NULL, COALESCE(e.lease_expires_at, c.lease_expires_at)),
       e.last_error, COALESCE(e.result, c.result), e.created_at, COALESCE(c.done_at, e.updated_at),
       COALESCE(e.done_at, c.done_at),
       (e.state = 'running' AND NOT (c.state <=> 'done')
        AND COALESCE(e.lease_expires_at, c.lease_expires_at) <= NOW(6))

-- name: effect_get
SELECT {{effect_columns}}
  FROM justonce_effects e LEFT JOIN justonce_effect_chunks c ON c.id = e.chunk_id
 WHERE e.scope = %(scope)s AND e.`key` = %(key)s;

-- name: effects_in_doubt
-- Entries in doubt: those whose own lease ran out while running, and those held by a
-- chunk whose lease ran out before it was done (the chunk's lease is theirs).
SELECT * FROM (
    SELECT scope, `key`, state, policy, token, owner, attempts, lease_expires_at, last_error,
           result, created_at, updated_at, done_at, TRUE AS in_doubt
      FROM justonce_effects
     WHERE state = 'running' AND lease_expires_at <= NOW(6)
       AND (%(scope)s IS NULL OR scope = %(scope)s)
    UNION ALL
    SELECT e.scope, e.`key`, e.state, e.policy, e.token, e.owner, e.attempts, c.lease_expires_at,
           e.last_error, e.result, e.created_at, e.updated_at, e.done_at, TRUE
      FROM justonce_effect_chunks c JOIN justonce_effects e ON e.chunk_id = c.id
     WHERE c.state = 'running' AND c.lease_expires_at <= NOW(6)
       AND (%(scope)s IS NULL OR c.scope = %(scope)s)
) AS d
 ORDER BY 8
 LIMIT %(limit)s;

-- name: effects_list
-- A page of a scope by key: the keys after %(after)s ('' when it is NULL: every key is
-- non-empty), a range of the primary key, so a page deep in a big scope costs what the
-- first one does (an `IS NULL OR key >` form left SQLite filtering the whole scope).
SELECT {{effect_columns}}
  FROM justonce_effects e LEFT JOIN justonce_effect_chunks c ON c.id = e.chunk_id
 WHERE e.scope = %(scope)s
   AND (%(state)s IS NULL OR IF(c.state = 'done', 'done', e.state) = %(state)s)
   AND e.`key` > COALESCE(%(after)s, '')
 ORDER BY e.`key`
 LIMIT %(limit)s;

-- name: effects_count
-- Counted per (state, chunk) first: a chunk's entries take their state from one look-up.
SELECT IF(c.state = 'done', 'done', g.state),
       (g.state = 'running' AND NOT (c.state <=> 'done')
        AND COALESCE(g.lease_expires_at, c.lease_expires_at) <= NOW(6)),
       SUM(g.n)
  FROM (SELECT state, chunk_id, lease_expires_at, COUNT(*) AS n
          FROM justonce_effects WHERE scope = %(scope)s
         GROUP BY state, chunk_id, lease_expires_at) AS g
  LEFT JOIN justonce_effect_chunks c ON c.id = g.chunk_id
 GROUP BY 1, 2;

-- Effects in bulk (Effects.run_many): per chunk of keys, one claim transaction (the chunk's
-- row; ensure, lock, take) and one finishing transaction. %(keys)s is a JSON list sorted
-- by key (the binary collation's order): every locking statement below reads the list
-- first and looks each entry up by key, so rows are locked in that order and overlapping
-- chunks cannot deadlock; entries are locked before chunks, by every caller. The list's
-- column compares with the binary collation of `key` (as in job_live_by_keys).
--
-- The entries a chunk claims point at its row (chunk_id) and have no lease of their own:
-- the chunk's lease is theirs, and so is its done mark: marking a chunk of 500 done is one
-- row update instead of 500 look-ups and updates (~20-30 us of the server's time a key on
-- MariaDB 10.11, most of a Push's ledger cost there).

-- name: effect_chunk_open
INSERT INTO justonce_effect_chunks (scope, state, lease_expires_at)
VALUES (%(scope)s, 'running', NOW(6) + INTERVAL ROUND(%(lease)s * 1000000) MICROSECOND);
SELECT LAST_INSERT_ID();

-- name: effect_chunk_drop
-- A chunk that claimed nothing.
DELETE FROM justonce_effect_chunks WHERE id = %(chunk)s;
SELECT 1;

-- name: effect_chunks_read
-- Chunks by id, read after the entries they hold are locked: (id, state, lease expired).
SELECT c.id, c.state, (c.lease_expires_at <= NOW(6))
  FROM JSON_TABLE(%(ids)s, '$[*]' COLUMNS (i BIGINT PATH '$')) AS d
  STRAIGHT_JOIN justonce_effect_chunks c FORCE INDEX (PRIMARY) ON c.id = d.i;

-- name: effect_chunks_share
-- Chunks by id, share-locked in id order (after the entries they hold): an at-least-once
-- claim of an entry in doubt, or an operator's verdict, keeps the chunk's finisher from
-- marking it done meanwhile. (id, state, lease expired).
SELECT c.id, c.state, (c.lease_expires_at <= NOW(6))
  FROM JSON_TABLE(%(ids)s, '$[*]' COLUMNS (i BIGINT PATH '$')) AS d
  STRAIGHT_JOIN justonce_effect_chunks c FORCE INDEX (PRIMARY) ON c.id = d.i
 ORDER BY c.id
  LOCK IN SHARE MODE;

-- name: effect_chunk_done
-- The chunk's done mark, with the result its entries share.
UPDATE justonce_effect_chunks SET state = 'done', done_at = NOW(6), result = %(result)s
 WHERE id = %(chunk)s AND scope = %(scope)s AND state = 'running';
SELECT 1;

-- name: effect_chunk_keys
-- The entries a chunk still holds (none taken over by another claim or an operator), with
-- their tokens.
SELECT `key`, token FROM justonce_effects FORCE INDEX (justonce_effects_chunk)
 WHERE chunk_id = %(chunk)s AND scope = %(scope)s;

-- name: effect_chunk_held
-- How many entries a chunk still holds (the chunk's index alone: it holds the primary key).
SELECT COUNT(*) FROM justonce_effects FORCE INDEX (justonce_effects_chunk)
 WHERE chunk_id = %(chunk)s AND scope = %(scope)s;

-- name: effect_claim_new_many
-- The missing entries of the chunk, inserted already claimed (running, token 1) by it.
-- Existing ones are filtered out by a plain read (READ COMMITTED: INSERT ... SELECT reads
-- its source without locks), so a re-run over a finished scope locks nothing here; ON
-- DUPLICATE KEY covers a key inserted meanwhile (left as it is). With no RETURNING, the
-- rows inserted are read back by their chunk (locked by the insert itself); but
-- claim_new_effects runs the insert alone where it can trust its count (all new: nothing
-- to read; some: effect_claim_new_others).
INSERT INTO justonce_effects (scope, `key`, state, policy, token, owner, attempts, chunk_id)
SELECT %(scope)s, d.k, 'running', %(policy)s, 1, %(owner)s, 1, %(chunk)s
  FROM JSON_TABLE(%(keys)s, '$[*]' COLUMNS (ord FOR ORDINALITY, k VARCHAR(512) PATH '$')) AS d
 WHERE NOT EXISTS (SELECT 1 FROM justonce_effects x
                    WHERE x.scope = %(scope)s AND x.`key` = d.k)
 ORDER BY d.ord
ON DUPLICATE KEY UPDATE scope = justonce_effects.scope;
SELECT `key`, token FROM justonce_effects FORCE INDEX (justonce_effects_chunk)
 WHERE chunk_id = %(chunk)s;

-- name: effect_claim_new_others
-- dialect-only: claim_new_effects, after effect_claim_new_many's insert made some keys of
-- %(keys)s but not all: the keys that the chunk, new in this transaction, does not hold
-- (the ones that existed). Usually a few, where reading back the rows inserted meant
-- parsing up to the whole chunk in the worker (a Push's rest phase meets a few entries of
-- its racing A/B phase in half its chunks).
SELECT d.k FROM JSON_TABLE(%(keys)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$')) AS d
 WHERE NOT EXISTS (SELECT 1 FROM justonce_effects x
                    WHERE x.scope = %(scope)s AND x.`key` = d.k AND x.chunk_id = %(chunk)s);

-- name: effect_lock_many
-- "Check state": the chunk's entries locked in list order (READ COMMITTED releases the
-- lock of a row the WHERE then rejects), with the chunk that holds each (whose state
-- effect_chunks_read reads next, in a statement of its own). Done entries are left out,
-- and so are those of chunks that are done (read by a subquery: InnoDB does not lock what
-- the subqueries of a locking read read, where a join would lock the chunk's row); a key
-- missing from the answer is done. Those of another policy come back anyway, so that the
-- caller refuses.
SELECT e.`key`, e.state, e.policy, e.token, (e.lease_expires_at <= NOW(6)) AS expired, e.chunk_id
  FROM JSON_TABLE(%(keys)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$')) AS d
  STRAIGHT_JOIN justonce_effects e FORCE INDEX (PRIMARY) ON e.scope = %(scope)s AND e.`key` = d.k
 WHERE (e.state <> 'done' AND NOT EXISTS (SELECT 1 FROM justonce_effect_chunks x
                                          WHERE x.id = e.chunk_id AND x.state = 'done'))
    OR e.policy <> %(policy)s
   FOR UPDATE;

-- name: effect_take_many
-- "Change state": the claimable keys of the chunk (all locked by this transaction already),
-- each with a new token, held by the chunk.
UPDATE JSON_TABLE(%(keys)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$')) AS d
  STRAIGHT_JOIN justonce_effects e FORCE INDEX (PRIMARY) ON e.scope = %(scope)s AND e.`key` = d.k
   SET e.state = 'running', e.token = e.token + 1, e.owner = %(owner)s,
       e.attempts = e.attempts + 1, e.lease_expires_at = NULL, e.chunk_id = %(chunk)s,
       e.updated_at = NOW(6);
SELECT e.`key`, e.token
  FROM JSON_TABLE(%(keys)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$')) AS d
  STRAIGHT_JOIN justonce_effects e FORCE INDEX (PRIMARY) ON e.scope = %(scope)s AND e.`key` = d.k;

-- name: effect_finish_many
-- Entries of a chunk marked one by one (results that differ, or failures released):
-- %(rows)s is one JSON list of [key, token, result, error] in key order (result: JSON text
-- or null; error: null when fn returned, so done; text when fn raised, so pending again).
-- The entries still held by their token and the chunk are locked in list order and
-- answered with the state they are given, then updated (each leaves the chunk); a key
-- whose claim was taken over is not in the answer. One JSON_TABLE reads all four columns:
-- four parallel lists aligned by joins on their ordinals (a derived table each) and a
-- read-back of the states cost MariaDB ~75 us a key (now ~35).
SELECT e.`key`, IF(d.error IS NULL, 'done', 'pending')
  FROM JSON_TABLE(%(rows)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$[0]', token BIGINT PATH '$[1]',
                                             error LONGTEXT PATH '$[3]')) AS d
  STRAIGHT_JOIN justonce_effects e FORCE INDEX (PRIMARY) ON e.scope = %(scope)s AND e.`key` = d.k
 WHERE e.token = d.token AND e.state = 'running' AND e.chunk_id = %(chunk)s
   FOR UPDATE;
UPDATE JSON_TABLE(%(rows)s, '$[*]' COLUMNS (k VARCHAR(512) PATH '$[0]', token BIGINT PATH '$[1]',
                                             result LONGTEXT PATH '$[2]', error LONGTEXT PATH '$[3]')) AS d
  STRAIGHT_JOIN justonce_effects e FORCE INDEX (PRIMARY) ON e.scope = %(scope)s AND e.`key` = d.k
   SET e.state = IF(d.error IS NULL, 'done', 'pending'),
       e.done_at = IF(d.error IS NULL, NOW(6), NULL),
       e.result = IF(d.error IS NULL, d.result, e.result),
       e.last_error = COALESCE(d.error, e.last_error),
       e.updated_at = NOW(6), e.lease_expires_at = NULL, e.chunk_id = NULL
 WHERE e.`key` IN %(picked)s;

-- Metrics

-- name: metrics_snapshot
-- What /metrics shows beside queue_counts: per queue, the age of the longest-waiting job
-- at the head of each priority (and of the partitioned jobs), then (NULL, batches not
-- finished). The heads are the smallest id per group of the claim indexes, read from the
-- indexes alone (one pass over the ready entries: 90 ms for 100,000 ready jobs; PostgreSQL
-- skips from head to head); only the heads' rows are read for run_at.
SELECT j.queue, MAX(GREATEST(0e0, TIMESTAMPDIFF(MICROSECOND, j.run_at, NOW(6)) / 1e6))
  FROM (SELECT MIN(id) AS id FROM justonce_jobs FORCE INDEX (justonce_jobs_claim)
         WHERE state = 'ready' AND partition_hash IS NULL GROUP BY queue, priority
        UNION ALL
        SELECT MIN(id) FROM justonce_jobs FORCE INDEX (justonce_jobs_claim_partitioned)
         WHERE partition_state = 'ready' GROUP BY queue) AS h
  STRAIGHT_JOIN justonce_jobs j FORCE INDEX (PRIMARY) ON j.id = h.id
 WHERE j.state = 'ready'
 GROUP BY j.queue
UNION ALL
SELECT NULL, COUNT(*) FROM justonce_batches WHERE state IN ('open', 'sealed');

-- Service: tokens and audit --------------------------------------------------------------

-- name: token_create
INSERT INTO justonce_api_tokens (name, scope, secret_hash, prefix)
VALUES (%(name)s, %(scope)s, %(secret_hash)s, %(prefix)s);
SELECT id, name, scope, prefix, created_at, last_used_at, revoked_at
  FROM justonce_api_tokens WHERE id = LAST_INSERT_ID();

-- name: token_find_by_hash
-- The UNIQUE index on secret_hash finds the row; tokens.py compares the hash again in
-- constant time.
SELECT id, name, scope, prefix, created_at, last_used_at, revoked_at, secret_hash
  FROM justonce_api_tokens WHERE secret_hash = %(secret_hash)s;

-- name: token_get
SELECT id, name, scope, prefix, created_at, last_used_at, revoked_at
  FROM justonce_api_tokens WHERE id = %(id)s;

-- name: token_list
SELECT id, name, scope, prefix, created_at, last_used_at, revoked_at
  FROM justonce_api_tokens ORDER BY id;

-- name: token_revoke
SELECT id FROM justonce_api_tokens WHERE id = %(id)s AND revoked_at IS NULL FOR UPDATE;
UPDATE justonce_api_tokens SET revoked_at = NOW(6) WHERE id IN %(picked)s;

-- name: token_touch
-- At most one write a minute per token: the condition makes the other calls no-ops.
UPDATE justonce_api_tokens SET last_used_at = NOW(6)
 WHERE id = %(id)s AND (last_used_at IS NULL OR last_used_at < NOW(6) - INTERVAL 60 SECOND);
SELECT %(id)s;

-- name: audit_record
INSERT INTO justonce_audit (token_id, actor, action, target, count, detail)
VALUES (%(token_id)s, %(actor)s, %(action)s, %(target)s, %(count)s, %(detail)s);
SELECT LAST_INSERT_ID();

-- name: audit_list
SELECT id, at, token_id, actor, action, target, count, detail
  FROM justonce_audit
 WHERE (%(cursor)s IS NULL OR id < %(cursor)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- Service: job listings with filters, and actions on all matching jobs --------------------

-- name: job_filter
-- (A fragment: the filters of a listing, over the alias j.)
(%(state)s IS NULL OR j.state = %(state)s)
   AND (%(queue)s IS NULL OR j.queue = %(queue)s)
   AND (%(task)s IS NULL OR j.task = %(task)s)
   AND (%(created_after)s IS NULL OR j.created_at >= %(created_after)s)
   AND (%(created_before)s IS NULL OR j.created_at < %(created_before)s)
   AND (%(max_id)s IS NULL OR j.id <= %(max_id)s)

-- name: match_cancel
-- (A fragment: the jobs "cancel all matching" acts on: live ones.)
j.state IN ('scheduled','ready','running') AND {{job_filter}}

-- name: match_retry
-- (A fragment: the jobs "retry all matching" acts on: dead or cancelled ones. A keyed job
-- is left out when a live job holds its key, and only the newest finished job of a key is
-- taken, so one chunk never makes two live jobs of one key.)
j.state IN ('dead','cancelled') AND {{job_filter}}
   AND (j.`key` IS NULL OR (
        NOT EXISTS (SELECT 1 FROM justonce_jobs l WHERE l.live_key = j.`key`)
        AND j.id = (SELECT MAX(k.id) FROM justonce_jobs k
                     WHERE k.`key` = j.`key` AND k.state IN ('dead','cancelled'))))

-- name: job_page
-- Newest first, keyset paging by id: the primary key walks backwards from the cursor.
SELECT * FROM justonce_jobs j
 WHERE {{job_filter}} AND (%(cursor)s IS NULL OR j.id < %(cursor)s)
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: jobs_count_cancel
SELECT COUNT(*), MAX(j.id) FROM justonce_jobs j WHERE {{match_cancel}};

-- name: jobs_count_retry
SELECT COUNT(*), MAX(j.id) FROM justonce_jobs j WHERE {{match_retry}};

-- name: jobs_cancel_matching
-- One chunk, in id order. FOR UPDATE (not SKIP LOCKED): a job a worker is claiming right
-- now is waited for, not skipped, and its state is read again once the lock is ours.
SELECT j.id, j.batch_item FROM justonce_jobs j FORCE INDEX (PRIMARY)
 WHERE {{match_cancel}} AND j.id > %(after)s
 ORDER BY j.id
 LIMIT %(limit)s
   FOR UPDATE;
UPDATE justonce_jobs
   SET state = 'cancelled', finished_at = NOW(6), lease_owner = NULL, lease_expires_at = NULL
 WHERE id IN %(picked)s;

-- name: jobs_retry_matching
SELECT j.id, NULL FROM justonce_jobs j FORCE INDEX (PRIMARY)
 WHERE {{match_retry}} AND j.id > %(after)s
 ORDER BY j.id
 LIMIT %(limit)s
   FOR UPDATE;
UPDATE justonce_jobs
   SET state = 'ready', attempts = 0, run_at = NOW(6), finished_at = NULL,
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id IN %(picked)s;

-- name: queue_heads
-- The ready job each queue hands out next: the head of the claim index (lowest priority,
-- then id) and the oldest partitioned ready job, whichever waited longer (two index
-- descents per queue).
SELECT h.q, TIMESTAMPDIFF(MICROSECOND, LEAST(COALESCE(h.a, h.b), COALESCE(h.b, h.a)), NOW(6)) / 1e6
  FROM (SELECT q.q,
               (SELECT j.run_at FROM justonce_jobs j FORCE INDEX (justonce_jobs_claim)
                 WHERE j.state = 'ready' AND j.partition_hash IS NULL AND j.queue = q.q
                 ORDER BY j.priority, j.id LIMIT 1) AS a,
               (SELECT j.run_at FROM justonce_jobs j FORCE INDEX (justonce_jobs_claim_partitioned)
                 WHERE j.partition_state = 'ready' AND j.queue = q.q
                 ORDER BY j.id LIMIT 1) AS b
          FROM JSON_TABLE(%(queues)s, '$[*]' COLUMNS (q VARCHAR(63) PATH '$')) AS q) AS h;

-- name: jobs_ready_in
-- dialect-only: MySQLWaiter's poll (no LISTEN/NOTIFY): is a job of %(queues)s ready? One
-- probe of the claim index per queue; a paused queue's ready jobs do not count (its
-- workers would otherwise claim in vain at every poll).
SELECT 1 FROM JSON_TABLE(%(queues)s, '$[*]' COLUMNS (q VARCHAR(63) PATH '$')) AS w
 WHERE EXISTS (SELECT 1 FROM justonce_jobs j WHERE j.state = 'ready' AND j.queue = w.q)
   AND NOT EXISTS (SELECT 1 FROM justonce_queue_pauses p WHERE p.queue = w.q)
 LIMIT 1;

-- Lists (backends/liststore.py; see the PostgreSQL queries). A reservation row's columns:
-- id, list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr,
-- error, created_at, and whether its time has come by the database's clock (expired).

-- name: list_create
INSERT INTO justonce_lists (name, task, state, ttr, max_attempts, callbacks)
VALUES (%(name)s, %(task)s, 'loading', %(ttr)s, %(max_attempts)s, %(callbacks)s);
SELECT LAST_INSERT_ID();

-- name: list_lock
SELECT id, state, total, next_position, ttr, max_attempts, batch_id, group_id
  FROM justonce_lists WHERE name = %(name)s
   FOR UPDATE;

-- name: list_task
-- What run_next needs of a list, read without the progress sums of list_get.
SELECT task, max_attempts FROM justonce_lists WHERE name = %(name)s;

-- name: list_callbacks
SELECT callbacks FROM justonce_lists WHERE id = %(id)s;

-- name: list_item_insert
INSERT INTO justonce_list_items (list_id, position, item) VALUES (%(list_id)s, %(position)s, %(item)s);

-- name: list_grow
UPDATE justonce_lists SET total = %(total)s WHERE id = %(id)s;

-- name: list_seal
UPDATE justonce_lists
   SET state = 'sealed', sealed_at = NOW(6), batch_id = %(batch_id)s, group_id = %(group_id)s
 WHERE id = %(id)s;

-- name: list_finish
UPDATE justonce_lists SET state = 'completed', finished_at = NOW(6)
 WHERE batch_id = %(batch_id)s AND state = 'sealed';

-- name: list_advance
UPDATE justonce_lists SET next_position = %(next_position)s WHERE id = %(id)s;

-- name: list_drop_items
DELETE FROM justonce_list_items WHERE list_id = %(id)s;

-- name: list_drop_reservations
DELETE FROM justonce_list_reservations WHERE list_id = %(id)s;

-- name: list_drop
DELETE FROM justonce_lists WHERE id = %(id)s;

-- name: list_due
-- The walk of the due index stops at the first row it can lock (NULL due_at, buried and
-- done rows, sort before the range and are never read).
SELECT id FROM justonce_list_reservations FORCE INDEX (justonce_list_reservations_due)
 WHERE list_id = %(list_id)s AND due_at <= NOW(6)
 ORDER BY due_at
 LIMIT 1
   FOR UPDATE SKIP LOCKED;
SELECT id, list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr,
       error, created_at, 1 AS expired
  FROM justonce_list_reservations WHERE id IN %(picked)s;

-- name: list_reservation_insert
INSERT INTO justonce_list_reservations
       (list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr, error)
VALUES (%(list_id)s, %(secret)s, %(request_id)s, %(state)s,
        NOW(6) + INTERVAL ROUND(%(due_in)s * 1000000) MICROSECOND, %(ranges)s, %(held)s,
        %(pending)s, %(attempt)s, %(ttr)s, %(error)s);
SELECT id, due_at FROM justonce_list_reservations WHERE id = LAST_INSERT_ID();

-- name: list_reservation_by_request
SELECT r.id, r.list_id, r.secret, r.request_id, r.state, r.due_at, r.ranges, r.held, r.pending,
       r.attempt, r.ttr, r.error, r.created_at, COALESCE(r.due_at <= NOW(6), 0) AS expired
  FROM justonce_lists l
  JOIN justonce_list_reservations r ON r.list_id = l.id AND r.request_id = %(request_id)s
 WHERE l.name = %(name)s;

-- name: list_reservation_lock
-- The holder's row is locked alone (a locking read locks every row it reads: the list's
-- row, which reserves take, is read by the second, plain SELECT).
SELECT id FROM justonce_list_reservations WHERE id = %(id)s FOR UPDATE;
SELECT r.id, r.list_id, r.secret, r.request_id, r.state, r.due_at, r.ranges, r.held, r.pending,
       r.attempt, r.ttr, r.error, r.created_at, COALESCE(r.due_at <= NOW(6), 0) AS expired,
       l.id, l.state, l.total, l.next_position, l.ttr, l.max_attempts, l.batch_id, l.group_id
  FROM justonce_list_reservations r
  JOIN justonce_lists l ON l.id = r.list_id
 WHERE r.id IN %(picked)s AND l.name = %(name)s;

-- name: list_reservation_pending
UPDATE justonce_list_reservations SET pending = %(pending)s, updated_at = NOW(6) WHERE id = %(id)s;

-- name: list_reservation_touch
UPDATE justonce_list_reservations
   SET due_at = NOW(6) + INTERVAL ROUND(%(due_in)s * 1000000) MICROSECOND, updated_at = NOW(6)
 WHERE id = %(id)s;

-- name: list_reservation_due
SELECT due_at FROM justonce_list_reservations WHERE id = %(id)s;

-- name: list_reservation_hold
UPDATE justonce_list_reservations SET held = %(held)s, pending = %(pending)s, updated_at = NOW(6)
 WHERE id = %(id)s;

-- name: list_reservation_set
UPDATE justonce_list_reservations
   SET state = %(state)s, due_at = NOW(6) + INTERVAL ROUND(%(due_in)s * 1000000) MICROSECOND,
       held = %(held)s, pending = %(pending)s, attempt = %(attempt)s, error = %(error)s,
       updated_at = NOW(6)
 WHERE id = %(id)s;

-- name: list_reservation_delete
DELETE FROM justonce_list_reservations WHERE id = %(id)s;

-- name: list_buried_lock
SELECT id FROM justonce_list_reservations FORCE INDEX (justonce_list_reservations_state)
 WHERE list_id = %(list_id)s AND state = 'buried'
 ORDER BY id
 LIMIT %(limit)s
   FOR UPDATE;
SELECT id, list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr,
       error, created_at, 0 AS expired
  FROM justonce_list_reservations WHERE id IN %(picked)s ORDER BY id;

-- name: list_buried
SELECT r.held, r.attempt, r.error, r.updated_at
  FROM justonce_lists l
  JOIN justonce_list_reservations r ON r.list_id = l.id AND r.state = 'buried'
 WHERE l.name = %(name)s
 ORDER BY r.id
 LIMIT %(limit)s;

-- name: list_items
-- The items at the ranges (JSON [[lo, hi], ...]: half-open, sorted) in position order, as
-- many as fit, from the first, in the budget's bytes of item text. The running sum is over
-- the items' lengths alone (the derived table's rows carry no item text; LENGTH counts
-- bytes), and only the items within the budget are joined in and sent: an answer's memory
-- is bounded by the budget whatever the mix of sizes, and positions between the ranges are
-- not read at all. Here the positions come one by one (JSON, as many as the ranges hold, at
-- most 10,000): MariaDB read a range join `position >= r.lo AND position < r.hi` as a look-up
-- by list_id alone, every item of the list once per range; and without STRAIGHT_JOIN it
-- scanned every list's items and looked each up in the derived table.
-- unused: ranges
SELECT i.position, i.item
  FROM (SELECT s.list_id, s.position,
               SUM(s.n) OVER (ORDER BY s.position ROWS UNBOUNDED PRECEDING) AS upto
          FROM (SELECT i.list_id, i.position, LENGTH(i.item) AS n
                  FROM justonce_lists l
                  JOIN JSON_TABLE(%(positions)s, '$[*]' COLUMNS (p BIGINT PATH '$')) AS r
                  STRAIGHT_JOIN justonce_list_items i FORCE INDEX (PRIMARY)
                    ON i.list_id = l.id AND i.position = r.p
                 WHERE l.name = %(name)s) s) w
  STRAIGHT_JOIN justonce_list_items i FORCE INDEX (PRIMARY)
    ON i.list_id = w.list_id AND i.position = w.position
 WHERE w.upto <= %(budget)s
 ORDER BY w.position;

-- name: list_get
SELECT l.id, l.name, l.task, l.state, l.total, l.next_position, l.ttr, l.max_attempts,
       l.batch_id, l.callbacks, l.created_at, l.sealed_at, l.finished_at,
       (SELECT SUM(c.pending) FROM justonce_batch_chunks c WHERE c.batch_id = l.batch_id) AS undone
  FROM justonce_lists l
 WHERE l.name = %(name)s;

-- name: list_all
SELECT l.id, l.name, l.task, l.state, l.total, l.next_position, l.ttr, l.max_attempts,
       l.batch_id, l.callbacks, l.created_at, l.sealed_at, l.finished_at,
       (SELECT SUM(c.pending) FROM justonce_batch_chunks c WHERE c.batch_id = l.batch_id) AS undone
  FROM justonce_lists l
 ORDER BY l.name
 LIMIT %(limit)s;

-- name: list_reservation_counts
SELECT state, COALESCE(state = 'active' AND due_at <= NOW(6), 0) AS expired, SUM(pending)
  FROM justonce_list_reservations
 WHERE list_id = %(id)s AND state IN ('active', 'free', 'buried')
 GROUP BY 1, 2;

-- name: list_bits
SELECT chunk, bits FROM justonce_batch_chunks
 WHERE batch_id = %(batch_id)s AND group_id = %(group_id)s AND chunk BETWEEN %(lo)s AND %(hi)s;

-- name: lists_prune_done
DELETE FROM justonce_list_reservations
 WHERE state = 'done' AND updated_at <= NOW(6) - INTERVAL ROUND(%(retention)s * 1000000) MICROSECOND
 LIMIT %(limit)s;
