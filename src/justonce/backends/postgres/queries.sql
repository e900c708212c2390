-- justonce: every SQL statement of the PostgreSQL backend, one named block each.
-- Parameters use psycopg's %(name)s style and are always bound, never formatted in.
-- Every write of a worker names (id, lease_token) and state = 'running' in its WHERE
-- clause: a worker whose lease was lost touches 0 rows, and that is how it learns it.
--
-- Batched writes join an id list with `j.state = (SELECT 'running'::text)`, not with the
-- literal: statistics taken while every job was ready say no row is running, and with the
-- literal the planner walks the partial index justonce_jobs_leases (WHERE state='running')
-- and rescans the id list for every row, which under load took seconds per ack. Hidden in
-- an InitPlan, the state cannot match that index, and every plan looks ids up by primary key.

-- name: job_insert
-- One statement: insert (or find the live job holding the key: DO NOTHING returns no
-- row) and wake listening workers when the job is ready now.
WITH v AS (
    SELECT COALESCE(%(run_at)s::timestamptz, now() + %(delay)s::float8 * interval '1 second') AS due
), ins AS (
    INSERT INTO justonce_jobs (queue, task, args, kwargs, state, priority, run_at,
                               max_attempts, timeout, key, partition_key, batch_item,
                               partition_hash)
    SELECT %(queue)s, %(task)s, %(args)s::jsonb, %(kwargs)s::jsonb,
           CASE WHEN v.due > now() THEN 'scheduled' ELSE 'ready' END,
           %(priority)s, v.due, %(max_attempts)s, %(timeout)s, %(key)s, %(partition_key)s,
           %(batch_item)s, %(partition_hash)s
      FROM v
    ON CONFLICT (key) WHERE key IS NOT NULL AND state IN ('scheduled','ready','running')
    DO NOTHING
    RETURNING id, state, run_at, created_at, queue
)
SELECT id, state, run_at, created_at,
       CASE WHEN ins.state = 'ready' THEN pg_notify(%(channel)s, ins.queue) END
  FROM ins

-- name: job_insert_many
-- dialect-only: PostgreSQL's one-statement bulk insert (Dialect.insert_rows)
-- The rows arrive as ONE JSON array of arrays (built by the backend from validated values;
-- args and kwargs are embedded as JSON): Postgres parses it in C, which is several times
-- cheaper than sending eleven typed arrays. Ids are drawn in the order the rows are given
-- (the CTE, volatile, is scanned once in ordinality order) and the rows inserted in key
-- order: jobs run in the order given, and concurrent bulk inserts cannot deadlock. (An
-- explicit nextval needs USAGE on the sequence, which the identity default does not.)
WITH seq AS (
    SELECT pg_get_serial_sequence('justonce_jobs', 'id')::regclass AS name
), d AS (
    SELECT e.ord, nextval((SELECT name FROM seq)) AS id, e.r->>0 AS queue, e.r->>1 AS task, e.r->2 AS args, e.r->3 AS kwargs,
           (e.r->>4)::int AS priority,
           COALESCE((e.r->>6)::timestamptz,
                    now() + (e.r->>5)::float8 * interval '1 second') AS due,
           (e.r->>7)::int AS max_attempts, (e.r->>8)::float8 AS timeout,
           e.r->>9 AS key, e.r->>10 AS partition_key, e.r->>11 AS batch_item,
           (e.r->>12)::bigint AS partition_hash
      FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS e(r, ord)
), ins AS (
    INSERT INTO justonce_jobs (id, queue, task, args, kwargs, state, priority, run_at,
                               max_attempts, timeout, key, partition_key, batch_item,
                               partition_hash)
    SELECT id, queue, task, args, kwargs,
           CASE WHEN due > now() THEN 'scheduled' ELSE 'ready' END,
           priority, due, max_attempts, timeout, key, partition_key, batch_item, partition_hash
      FROM d ORDER BY key, ord  -- keys in one order: concurrent bulk inserts cannot deadlock
    ON CONFLICT (key) WHERE key IS NOT NULL AND state IN ('scheduled','ready','running')
    DO NOTHING
    RETURNING id, key, state, queue
), woke AS (
    SELECT count(pg_notify(%(channel)s, q)) AS n
      FROM (SELECT DISTINCT queue AS q FROM ins WHERE state = 'ready') AS r
)
SELECT ins.id, ins.key, (SELECT n FROM woke) FROM ins

-- name: job_insert_batch
-- dialect-only: PostgreSQL's bulk insert of calls (Dialect.insert_calls)
-- The common bulk case: one task, one set of options, no keys. Only the arguments vary,
-- so only they travel per row, as two JSON arrays. Jobs enqueued into a batch get the
-- items %(item_prefix)s || 0, 1, 2…
WITH v AS (
    SELECT COALESCE(%(run_at)s::timestamptz,
                    now() + %(delay)s::float8 * interval '1 second') AS due
), ins AS (
    INSERT INTO justonce_jobs (queue, task, args, kwargs, state, priority, run_at,
                               max_attempts, timeout, partition_key, batch_item, partition_hash)
    SELECT %(queue)s, %(task)s, a.value, k.value,
           CASE WHEN v.due > now() THEN 'scheduled' ELSE 'ready' END,
           %(priority)s, v.due, %(max_attempts)s, %(timeout)s, %(partition_key)s,
           %(item_prefix)s::text || (a.ord - 1), %(partition_hash)s
      FROM jsonb_array_elements(%(args)s::jsonb) WITH ORDINALITY AS a(value, ord)
      JOIN jsonb_array_elements(%(kwargs)s::jsonb) WITH ORDINALITY AS k(value, ord)
           USING (ord)
     CROSS JOIN v
     ORDER BY ord
    RETURNING id, state
), woke AS (
    SELECT count(pg_notify(%(channel)s, %(queue)s)) AS n
      FROM (SELECT 1 FROM ins WHERE state = 'ready' LIMIT 1) AS r
)
SELECT ins.id, NULL::text, (SELECT n FROM woke) FROM ins

-- name: job_live_by_keys
SELECT * FROM justonce_jobs
 WHERE key = ANY(%(keys)s::text[]) AND state IN ('scheduled','ready','running')

-- name: job_get
SELECT * FROM justonce_jobs WHERE id = %(id)s

-- name: claim_lease
-- (A fragment of the claims below: lease the picked jobs.)
UPDATE justonce_jobs j
   SET state = 'running',
       attempts = j.attempts + 1,
       lease_token = j.lease_token + 1,
       lease_owner = %(owner)s,
       lease_expires_at = now() + %(lease)s::float8 * interval '1 second',
       started_at = now()

-- name: claim_returning
-- queue_wait: seconds since the job became due (run_at), by the database's clock.
RETURNING j.id, j.queue, j.task, j.args::text, j.kwargs::text, j.attempts, j.max_attempts,
          j.timeout, j.lease_token, j.priority, j.batch_item, j.partition_hash,
          greatest(0, extract(epoch FROM now() - j.run_at))::float8 AS queue_wait

-- name: job_claim
-- Lock up to %(limit)s ready jobs of ONE queue in (priority, id) order, skipping rows
-- another worker is claiming right now, and lease them. One queue per statement so the
-- planner can walk justonce_jobs_claim in order instead of sorting the queue. The picked
-- ids are handed over as an array, so the update is a primary-key lookup in every plan
-- (a join with the CTE can turn into a hash join over the whole table in a generic plan).
{{claim_lease}}
 WHERE j.id = ANY(ARRAY(
           SELECT id FROM justonce_jobs
            WHERE state = 'ready' AND queue = %(queue)s AND partition_hash IS NULL
              AND NOT EXISTS (SELECT 1 FROM justonce_queue_pauses p WHERE p.queue = %(queue)s)
            ORDER BY priority, id
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED))
{{claim_returning}}

-- name: job_claim_partitioned
-- The claim of a worker that holds slots %(slots)s of set %(set)s (n = %(n)s) with tokens
-- %(tokens)s. The fence is in this statement: only slots whose token is still the caller's
-- and whose lease has not expired by the database's clock count, and their rows are held
-- FOR SHARE until commit, so a standby's takeover (lease_take skips locked rows) cannot
-- commit before this claim does, however long the claimer is paused in between. A claim
-- that commits late leases jobs whose lease (from the transaction's start) may already
-- have run out: the worker drops those unstarted by its own monotonic clock.
-- Then: ready jobs of those slots, oldest first, and only the first live job of each key:
-- a job waits while any job of its key runs (whatever its id: ids are drawn at insert,
-- jobs become visible at commit) or an earlier one is scheduled or ready. One job per key
-- at a time, in enqueue order, retries included.
{{claim_lease}}
 WHERE j.id = ANY(ARRAY(
           SELECT c.id FROM justonce_jobs c
            WHERE c.state = 'ready' AND c.queue = %(queue)s AND c.partition_hash IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM justonce_queue_pauses p WHERE p.queue = %(queue)s)
              AND mod(mod(c.partition_hash, %(n)s) + %(n)s, %(n)s) = ANY(ARRAY(
                    SELECT l.slot FROM justonce_partition_leases l
                      JOIN unnest(%(slots)s::int[], %(tokens)s::bigint[]) AS m(slot, token)
                        ON l.slot = m.slot AND l.token = m.token
                     WHERE l.set_name = %(set)s AND l.owner IS NOT NULL
                       AND l.expires_at > clock_timestamp()
                       FOR SHARE OF l))
              AND NOT EXISTS (SELECT 1 FROM justonce_jobs e
                               WHERE e.partition_key = c.partition_key AND e.partition_hash IS NOT NULL
                                 AND e.state IN ('scheduled','ready','running')  -- the partial index's own condition
                                 AND (e.state = 'running' OR e.id < c.id))
            ORDER BY c.id
            LIMIT %(limit)s
              FOR UPDATE SKIP LOCKED))
{{claim_returning}}

-- name: job_any_ready
-- (Dialect.claim_precheck: not used on PostgreSQL, whose empty claim costs one statement.)
SELECT 1 FROM justonce_jobs
 WHERE state = 'ready' AND queue = %(queue)s AND partition_hash IS NULL
   AND NOT EXISTS (SELECT 1 FROM justonce_queue_pauses p WHERE p.queue = %(queue)s)
 LIMIT 1

-- name: job_complete_many
-- The completion of a partitioned job may make the next job of its key claimable: wake the
-- partitioned workers (Postgres sends one notification per queue per transaction).
UPDATE justonce_jobs j
   SET state = 'succeeded', result = d.result::jsonb, last_error = COALESCE(d.note, j.last_error),
       finished_at = now(), lease_owner = NULL, lease_expires_at = NULL
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::text[], %(notes)s::text[])
       AS d(id, token, result, note)
 WHERE j.id = d.id AND j.lease_token = d.token AND j.state = (SELECT 'running'::text)
RETURNING j.id, CASE WHEN j.partition_hash IS NOT NULL THEN pg_notify(%(channel)s, j.queue) END

-- name: job_complete_and_claim
-- dialect-only: PostgresBackend's fused fast path
-- Both updates run in one statement and one commit; they touch disjoint rows (running
-- ones are completed, ready ones are claimed). Completed rows come back with kind 'done'.
WITH done AS (
{{job_complete_many}}
), claimed AS (
{{job_claim}}
)
SELECT 'done' AS kind, id, NULL::text AS queue, NULL::text AS task, NULL::text AS args,
       NULL::text AS kwargs, NULL::int AS attempts, NULL::int AS max_attempts,
       NULL::float8 AS timeout, NULL::bigint AS lease_token, NULL::smallint AS priority,
       NULL::text AS batch_item, NULL::bigint AS partition_hash, NULL::float8 AS queue_wait
  FROM done
UNION ALL
SELECT 'claimed', id, queue, task, args, kwargs, attempts, max_attempts, timeout,
       lease_token, priority, batch_item, partition_hash, queue_wait
  FROM claimed

-- name: job_fail
-- A retry due now is ready at once: wake idle workers for it.
WITH up AS (
UPDATE justonce_jobs
   SET state = CASE WHEN %(retry_in)s::float8 IS NULL OR attempts >= max_attempts THEN 'dead'
                    WHEN %(retry_in)s::float8 > 0 THEN 'scheduled'
                    ELSE 'ready' END,
       run_at = CASE WHEN %(retry_in)s::float8 IS NULL OR attempts >= max_attempts THEN run_at
                     ELSE now() + %(retry_in)s::float8 * interval '1 second' END,
       finished_at = CASE WHEN %(retry_in)s::float8 IS NULL OR attempts >= max_attempts
                          THEN now() END,
       last_error = %(error)s,
       errors = errors || jsonb_build_array(jsonb_build_object(
                    'attempt', attempts, 'at', now(), 'kind', %(kind)s::text,
                    'error', %(error)s::text, 'owner', lease_owner,
                    'retry_in', CASE WHEN attempts < max_attempts THEN %(retry_in)s::float8 END)),
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
RETURNING state, queue
)
SELECT state, CASE WHEN state = 'ready' THEN pg_notify(%(channel)s, queue) END FROM up

-- name: job_settled
-- A worker whose write raised (its connection broke, perhaps after the COMMIT, before the
-- reply) and whose retry was refused asks which of its (id, token) pairs an earlier try did
-- settle: lease_token is the job's own count of claims, so a row that still carries the
-- token and is no longer running was last leased by that claim. A plain read: such a row
-- changes only by a later claim (a new token), an operator, or its pruning.
SELECT j.id, j.state, j.attempts, j.last_error
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS d(id, token)
  JOIN justonce_jobs j ON j.id = d.id
 WHERE j.lease_token = d.token AND j.state <> 'running'

-- name: job_heartbeat
UPDATE justonce_jobs j
   SET lease_expires_at = now() + %(lease)s::float8 * interval '1 second'
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS d(id, token)
 WHERE j.id = d.id AND j.lease_token = d.token AND j.state = (SELECT 'running'::text)
RETURNING j.id

-- name: job_release
-- Give leased jobs back untouched (graceful shutdown). %(refund)s: the job never started,
-- so its attempt does not count. Released jobs are ready: wake idle workers.
WITH up AS (
UPDATE justonce_jobs j
   SET state = 'ready',
       attempts = CASE WHEN %(refund)s THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
       lease_owner = NULL, lease_expires_at = NULL
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS d(id, token)
 WHERE j.id = d.id AND j.lease_token = d.token AND j.state = (SELECT 'running'::text)
RETURNING j.id, j.queue
)
SELECT id, (SELECT count(pg_notify(%(channel)s, q)) FROM (SELECT DISTINCT queue AS q FROM up) r)
  FROM up

-- name: job_cancel
UPDATE justonce_jobs
   SET state = 'cancelled', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL
 WHERE id = %(id)s AND state IN ('scheduled','ready','running')
RETURNING *

-- name: job_retry
WITH up AS (
UPDATE justonce_jobs
   SET state = 'ready', attempts = 0, run_at = now(), finished_at = NULL,
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id = %(id)s AND state IN ('dead','cancelled')
RETURNING *
)
SELECT up.*, pg_notify(%(channel)s, up.queue) FROM up

-- name: jobs_promote
WITH due AS (
    SELECT id FROM justonce_jobs
     WHERE state = 'scheduled' AND run_at <= now()
     ORDER BY run_at LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED
), up AS (
    UPDATE justonce_jobs j SET state = 'ready' FROM due WHERE j.id = due.id
    RETURNING j.id, j.queue
)
SELECT up.id, (SELECT count(pg_notify(%(channel)s, q)) FROM (SELECT DISTINCT queue AS q FROM up) r)
  FROM up

-- name: jobs_any_expired
-- Housekeeping's first look: almost always nothing expired, and then a read is all it costs.
SELECT 1 FROM justonce_jobs WHERE state = 'running' AND lease_expires_at < now() LIMIT 1

-- name: jobs_rescue
-- Leases that ran out: the worker died or froze. The attempt it made still counts, so a
-- job that kills its worker every time ends dead after max_attempts.
WITH expired AS (
    SELECT id FROM justonce_jobs
     WHERE state = 'running' AND lease_expires_at < now()
     ORDER BY lease_expires_at LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED
), up AS (
    UPDATE justonce_jobs j
       SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
           finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
           last_error = 'lease expired: worker ' || coalesce(j.lease_owner, '?')
                        || ' stopped renewing it during attempt ' || j.attempts,
           errors = j.errors || jsonb_build_array(jsonb_build_object(
                        'attempt', j.attempts, 'at', now(), 'kind', 'lease_expired',
                        'error', 'lease expired', 'owner', j.lease_owner)),
           lease_owner = NULL, lease_expires_at = NULL
      FROM expired WHERE j.id = expired.id
    RETURNING j.state, j.queue, j.batch_item
)
-- One row per job: (state, batch_item); the workers of queues with rescued ready jobs are woken.
SELECT up.state, up.batch_item,
       (SELECT count(pg_notify(%(channel)s, q))
          FROM (SELECT DISTINCT queue AS q FROM up WHERE state = 'ready') r)
  FROM up

-- name: jobs_prune
WITH old AS (
    SELECT id FROM justonce_jobs
     WHERE (state IN ('succeeded','cancelled')
            AND finished_at < now() - %(keep_succeeded)s::float8 * interval '1 second')
        OR (state = 'dead' AND finished_at < now() - %(keep_dead)s::float8 * interval '1 second')
     LIMIT %(limit)s
)
-- The state is checked again on the row being deleted: a job retried since the pick (ready
-- again, committed while this statement waited on its row) is live, and stays.
DELETE FROM justonce_jobs j USING old WHERE j.id = old.id
   AND ((j.state IN ('succeeded','cancelled')
         AND j.finished_at < now() - %(keep_succeeded)s::float8 * interval '1 second')
        OR (j.state = 'dead' AND j.finished_at < now() - %(keep_dead)s::float8 * interval '1 second'))
RETURNING j.id

-- name: queue_counts
SELECT queue, state, count(*) FROM justonce_jobs GROUP BY queue, state ORDER BY queue, state

-- name: queue_pause
-- Pause %(queue)s: a no-op when it is paused already (the first pause's time, actor and
-- note stay). queue_pause_get then reads the pause in force, in the same transaction.
INSERT INTO justonce_queue_pauses (queue, actor, note) VALUES (%(queue)s, %(actor)s, %(note)s)
ON CONFLICT (queue) DO NOTHING
RETURNING queue

-- name: queue_pause_get
SELECT queue, paused_at, actor, note FROM justonce_queue_pauses WHERE queue = %(queue)s

-- name: queue_resume
-- Resume %(queue)s (no row: it was not paused), and wake the workers that listen for it.
WITH gone AS (DELETE FROM justonce_queue_pauses WHERE queue = %(queue)s RETURNING queue)
SELECT queue, pg_notify(%(channel)s, queue) FROM gone

-- name: database_mark
-- dialect-only: each dialect reads its own mark (Dialect.database_mark)
-- Which database a connection reaches (Dialect.same_database): the database, the
-- justonce_migrations its search_path finds (NULL: none), and the cluster's identifier
-- where the role may read it. Needs no privilege on any table and cannot fail (an error
-- would end the caller's transaction). Then the caller's session settings that are
-- checked in the same round trip (_check_session), and the isolation level (tx).
SELECT current_database(), to_regclass('justonce_migrations')::oid::bigint,
       CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE')
            THEN (SELECT system_identifier FROM pg_control_system()) END,
       current_setting('DateStyle'), current_setting('client_encoding'),
       current_setting('transaction_isolation');

-- name: queue_pauses
SELECT queue, paused_at, actor, note FROM justonce_queue_pauses ORDER BY queue

-- name: maintenance_try
-- next_run_at holds when the last round began (its name is older than this meaning): a
-- caller takes the round when its own interval has passed since, so a worker with a long
-- --housekeeping-interval never holds back the others (it set "next run" for everyone).
INSERT INTO justonce_maintenance AS m (name, next_run_at, last_owner)
VALUES (%(name)s, now(), %(owner)s)
ON CONFLICT (name) DO UPDATE
   SET next_run_at = EXCLUDED.next_run_at, last_owner = EXCLUDED.last_owner
 WHERE m.next_run_at <= now() - %(interval)s::float8 * interval '1 second'
RETURNING name

-- Dashboard (backends/dashstore.py, web/snapshot.py). Each statement stays bounded on a
-- big jobs table: it reads the planner's statistics, walks a partial index, or stops
-- after %(cap)s rows. They run once per refresh per server process, never per viewer.

-- The planner's row count (kept by autovacuum / ANALYZE): -1 before the first ANALYZE.
-- name: dash_jobs_estimate
SELECT c.reltuples::bigint FROM pg_class c WHERE c.oid = to_regclass('justonce_jobs')

-- Exact counts of a small table, reading at most %(cap)s rows: when it returns %(cap)s
-- rows in all, the table is bigger and the caller switches to the bounded counts below.
-- name: dash_counts_exact
SELECT queue, state, count(*) FROM (SELECT queue, state FROM justonce_jobs LIMIT %(cap)s) j
 GROUP BY queue, state

-- (queue, state) pairs as ANALYZE saw them: the multivariate MCV list of the statistics
-- object created in 0006 (each pair's share of the sample) times the row estimate.
-- name: dash_counts_estimated
SELECT s.most_common_vals[i][1], s.most_common_vals[i][2],
       round(s.most_common_freqs[i] * greatest(c.reltuples, 0))::bigint
  FROM pg_stats_ext s
  JOIN pg_class c ON c.oid = to_regclass('justonce_jobs'),
       LATERAL generate_subscripts(s.most_common_vals, 1) AS i
 WHERE s.schemaname = current_schema() AND s.statistics_name = 'justonce_jobs_queue_state'

-- The newest %(cap)s jobs by id (the primary key, backwards), per (queue, state): the
-- sample that stands in for the statistics before the first ANALYZE.
-- name: dash_counts_sample
SELECT queue, state, count(*)
  FROM (SELECT queue, state FROM justonce_jobs ORDER BY id DESC LIMIT %(cap)s) j
 GROUP BY queue, state

-- As many running jobs as workers run them: exact, on the leases' partial index.
-- name: dash_counts_running
SELECT queue, 'running', count(*) FROM justonce_jobs WHERE state = 'running' GROUP BY queue

-- Scheduled and dead jobs per queue, at most %(cap)s of each state: their partial indexes
-- in index order (ORDER BY keeps the planner on the index whatever its estimates), dead
-- ones index-only (queue is INCLUDEd in 0006's index).
-- name: dash_counts_capped
SELECT queue, state, count(*) FROM (
    (SELECT queue, state FROM justonce_jobs WHERE state = 'scheduled'
      ORDER BY run_at LIMIT %(cap)s)
    UNION ALL
    (SELECT queue, 'dead' FROM justonce_jobs WHERE state = 'dead'
      ORDER BY finished_at LIMIT %(cap)s)
) j GROUP BY queue, state

-- The queues that have ready jobs: a loose index scan of both claim indexes (one descent
-- per queue, at most %(limit)s queues), not a scan of their entries.
-- name: dash_ready_queues
WITH RECURSIVE plain(queue, n) AS (
    (SELECT queue, 1 FROM justonce_jobs
      WHERE state = 'ready' AND partition_hash IS NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM justonce_jobs j
             WHERE j.state = 'ready' AND j.partition_hash IS NULL AND j.queue > p.queue
             ORDER BY j.queue LIMIT 1), p.n + 1
      FROM plain p WHERE p.queue IS NOT NULL AND p.n < %(limit)s
), parted(queue, n) AS (
    (SELECT queue, 1 FROM justonce_jobs
      WHERE state = 'ready' AND partition_hash IS NOT NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM justonce_jobs j
             WHERE j.state = 'ready' AND j.partition_hash IS NOT NULL AND j.queue > p.queue
             ORDER BY j.queue LIMIT 1), p.n + 1
      FROM parted p WHERE p.queue IS NOT NULL AND p.n < %(limit)s
)
SELECT queue FROM plain WHERE queue IS NOT NULL
UNION
SELECT queue FROM parted WHERE queue IS NOT NULL

-- Ready jobs of each queue in %(queues)s (a JSON list), at most %(cap)s per queue: index-
-- only scans of the claim indexes (plain and partitioned jobs), stopping at the cap.
-- name: dash_count_ready
SELECT q.queue,
       (SELECT count(*) FROM (
           (SELECT 1 FROM justonce_jobs
             WHERE state = 'ready' AND partition_hash IS NULL AND queue = q.queue
             ORDER BY priority, id LIMIT %(cap)s)
           UNION ALL
           (SELECT 1 FROM justonce_jobs
             WHERE state = 'ready' AND partition_hash IS NOT NULL AND queue = q.queue
             ORDER BY id LIMIT %(cap)s)
           LIMIT %(cap)s) r)
  FROM jsonb_array_elements_text(%(queues)s::jsonb) AS q(queue)

-- The finished-jobs index from %(since)s on: as many rows as jobs finished since then.
-- name: dash_finished_since
SELECT floor(extract(epoch FROM finished_at))::bigint, state, count(*)
  FROM justonce_jobs
 WHERE finished_at >= to_timestamp(%(since)s::float8) AND state IN ('succeeded','dead')
 GROUP BY 1, 2

-- name: dash_clock
SELECT extract(epoch FROM now())::float8

-- name: dash_running
SELECT id, queue, task, state, attempts, max_attempts, lease_owner, lease_expires_at,
       started_at, finished_at, last_error
  FROM justonce_jobs WHERE state = 'running'
 ORDER BY lease_expires_at
 LIMIT %(limit)s

-- name: dash_dead
SELECT id, queue, task, state, attempts, max_attempts, lease_owner, lease_expires_at,
       started_at, finished_at, last_error
  FROM justonce_jobs WHERE state = 'dead'
 ORDER BY finished_at DESC
 LIMIT %(limit)s

-- name: db_now
SELECT now()

-- Behind PgBouncer (?pgbouncer=1) the schema cannot ride on the connection: set it for
-- the current transaction only (is_local = true), so it never outlives our transaction on
-- a server connection that PgBouncer hands to another client next.
-- name: idle_timeout_local
-- dialect-only: a session setting of PostgreSQL's
-- For this transaction only: the server ends the session if the client leaves it idle
-- (frozen, say) for longer than this, releasing its row locks.
SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true)

-- name: fence_idle_local
-- dialect-only: a session setting of PostgreSQL's
-- idle_timeout_local for the caller's transaction under a fence, unless the caller's own
-- setting is already shorter.
SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true)
 WHERE current_setting('idle_in_transaction_session_timeout')::interval = interval '0'
    OR current_setting('idle_in_transaction_session_timeout')::interval > %(ms)s::interval

-- name: search_path_local
-- dialect-only: PgBouncer mode's per-transaction schema
SELECT set_config('search_path', %(schema)s, true)

-- name: planner_local
-- dialect-only: planner settings for one statement (backend.PLANNER_LOCAL), local to its
-- transaction
SELECT set_config(s.name, s.value, true)
  FROM unnest(%(names)s::text[], %(values)s::text[]) AS s(name, value)

-- The transaction that search_path_local is set in, when it spans several statements. The
-- level is named here as psycopg names it in its own BEGIN (see _read_committed).
-- name: tx_begin
-- dialect-only: PgBouncer mode's BEGIN
BEGIN ISOLATION LEVEL READ COMMITTED

-- Batches. The algorithm is shared by every dialect (backends/batchstore.py); these
-- statements are its PostgreSQL dialect. List parameters are JSON documents. The planner
-- guesses 100 rows for jsonb_array_elements, which can turn a look-up of two batches into
-- a scan of every chunk; ids are therefore handed over as ARRAY(SELECT …), an InitPlan
-- that `id = ANY(...)` looks up through the primary key.

-- name: batch_open
INSERT INTO justonce_batches (state, description, callbacks, expire_after)
VALUES ('open', %(description)s, %(callbacks)s::jsonb, %(expire_after)s)
RETURNING id

-- name: batch_state
SELECT state FROM justonce_batches WHERE id = %(id)s

-- name: batch_add
UPDATE justonce_batches
   SET total = total + %(count)s, groups = groups + 1, updated_at = now()
 WHERE id = %(id)s AND state = 'open'
RETURNING id

-- name: batch_chunks_insert
INSERT INTO justonce_batch_chunks (batch_id, group_id, chunk, size, pending, bits)
SELECT %(id)s, %(group_id)s, (s.ord - 1)::int, s.size::int, s.size::int,
       repeat('0', s.size::int)::bit varying
  FROM jsonb_array_elements_text(%(sizes)s::jsonb) WITH ORDINALITY AS s(size, ord)

-- name: batch_seal
UPDATE justonce_batches SET state = 'sealed', sealed_at = now(), updated_at = now()
 WHERE id = %(id)s AND state = 'open'
RETURNING id

-- name: batch_flip
-- dialect-only: bits are set by SQL on a bit string (the others set them in Python)
-- Set the bits of the asked items in one statement. %(chunks)s: [[batch id, group id, chunk,
-- [positions]], ...], one entry per chunk. Lock the chunks in key order (two bulk acks
-- cannot deadlock), OR one mask per chunk into its bits, and report per chunk: size, batch
-- state, pending before and after (NULL when nothing changed) and the asked positions that
-- were set already. All CTEs share one snapshot, but `old` locks with FOR UPDATE, which
-- returns the newest version of each row, and the UPDATE re-reads that same locked version.
WITH want AS (
    SELECT (w->>0)::bigint AS batch_id, w->>1 AS group_id, (w->>2)::int AS chunk,
           ARRAY(SELECT p::int FROM jsonb_array_elements_text(w->3) AS p) AS pos
      FROM jsonb_array_elements(%(chunks)s::jsonb) AS w
), old AS (
    SELECT c.batch_id, c.group_id, c.chunk, c.size, c.pending, c.bits, b.state, w.pos
      FROM want w
      JOIN justonce_batch_chunks c
        ON c.batch_id = w.batch_id AND c.group_id = w.group_id AND c.chunk = w.chunk
      JOIN justonce_batches b ON b.id = c.batch_id
     ORDER BY c.batch_id, c.group_id, c.chunk
       FOR UPDATE OF c
), asked AS (
    SELECT o.batch_id, o.group_id, o.chunk, o.size, o.state, o.pending,
           CASE WHEN o.state <> 'expired' THEN
               (SELECT bit_or(set_bit(o.bits # o.bits, p, 1)) FROM unnest(o.pos) AS p
                 WHERE p < o.size) END AS mask,
           ARRAY(SELECT p FROM unnest(o.pos) AS p
                  WHERE p < o.size AND get_bit(o.bits, p) = 1) AS was_set
      FROM old o
), up AS (
    UPDATE justonce_batch_chunks c
       SET bits = c.bits | a.mask,
           pending = c.pending - bit_count(a.mask & ~c.bits)::int,
           updated_at = now()
      FROM asked a
     WHERE c.batch_id = a.batch_id AND c.group_id = a.group_id AND c.chunk = a.chunk
       AND a.mask IS NOT NULL AND bit_count(a.mask & ~c.bits) > 0
    RETURNING c.batch_id, c.group_id, c.chunk, c.pending
)
SELECT a.batch_id, a.group_id, a.chunk, a.size, a.state, a.pending, up.pending, a.was_set
  FROM asked a
  LEFT JOIN up ON up.batch_id = a.batch_id AND up.group_id = a.group_id AND up.chunk = a.chunk

-- name: batch_failure_insert
INSERT INTO justonce_batch_failures (batch_id, item, reason)
VALUES (%(batch_id)s, %(item)s, %(reason)s)
ON CONFLICT DO NOTHING

-- name: batch_group_size
SELECT sum(size) FROM justonce_batch_chunks WHERE batch_id = %(id)s AND group_id = %(group_id)s

-- name: batch_lock
SELECT id, state, description, callbacks, total FROM justonce_batches
 WHERE id = ANY(ARRAY(SELECT value::bigint FROM jsonb_array_elements_text(%(ids)s::jsonb)))
 ORDER BY id
   FOR UPDATE

-- name: batch_pending
-- Runs under the batch lock: one early-exit probe per batch.
SELECT i.id FROM unnest(ARRAY(SELECT value::bigint
                                FROM jsonb_array_elements_text(%(ids)s::jsonb))) AS i(id)
 WHERE EXISTS (SELECT 1 FROM justonce_batch_chunks c WHERE c.batch_id = i.id AND c.pending > 0)

-- name: batch_failure_counts
SELECT batch_id, count(*) FROM justonce_batch_failures
 WHERE batch_id = ANY(ARRAY(SELECT value::bigint FROM jsonb_array_elements_text(%(ids)s::jsonb)))
 GROUP BY batch_id

-- name: batch_complete
UPDATE justonce_batches
   SET state = 'completed', finished_at = now(), updated_at = now(),
       acked = %(acked)s, failed = %(failed)s
 WHERE id = %(id)s AND state = 'sealed'

-- name: batch_get
SELECT b.id, b.state, b.description, b.callbacks, b.total, b.groups, b.expire_after,
       b.created_at, b.updated_at, b.sealed_at, b.finished_at,
       COALESCE((SELECT sum(pending) FROM justonce_batch_chunks c WHERE c.batch_id = b.id), 0),
       (SELECT count(*) FROM justonce_batch_failures f WHERE f.batch_id = b.id)
  FROM justonce_batches b
 WHERE b.id = %(id)s

-- name: batch_list
SELECT b.id, b.state, b.description, b.callbacks, b.total, b.groups, b.expire_after,
       b.created_at, b.updated_at, b.sealed_at, b.finished_at,
       COALESCE((SELECT sum(pending) FROM justonce_batch_chunks c WHERE c.batch_id = b.id), 0),
       (SELECT count(*) FROM justonce_batch_failures f WHERE f.batch_id = b.id)
  FROM justonce_batches b
 WHERE %(state)s::text IS NULL OR b.state = %(state)s
 ORDER BY b.id DESC
 LIMIT %(limit)s

-- name: batch_failures
SELECT item, reason, failed_at FROM justonce_batch_failures
 WHERE batch_id = %(id)s
 ORDER BY failed_at, item
 LIMIT %(limit)s

-- name: batches_expire
-- Orphans: open batches with no add or ack for their expire_after. (A sealed batch waits
-- for its items, however long their jobs are delayed or backed off.)
UPDATE justonce_batches b
   SET state = 'expired', finished_at = now()
 WHERE b.id IN (
        SELECT x.id FROM justonce_batches x
         WHERE x.state = 'open'
           AND x.updated_at < now() - x.expire_after * interval '1 second'
           AND NOT EXISTS (SELECT 1 FROM justonce_batch_chunks c
                            WHERE c.batch_id = x.id
                              AND c.updated_at >= now() - x.expire_after * interval '1 second')
         ORDER BY x.updated_at
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED)
   AND b.state = 'open'
RETURNING b.id

-- name: batches_old
SELECT id FROM justonce_batches
 WHERE state IN ('completed','expired')
   AND finished_at <= now() - %(retention)s::float8 * interval '1 second'
 ORDER BY finished_at
 LIMIT %(limit)s

-- name: batch_delete_chunks
DELETE FROM justonce_batch_chunks WHERE batch_id = %(id)s

-- name: batch_delete_failures
DELETE FROM justonce_batch_failures WHERE batch_id = %(id)s

-- name: batch_delete
DELETE FROM justonce_batches WHERE id = %(id)s

-- Partition leases. Acquiring holds the set's row for the whole transaction, so acquires
-- of one set take turns (they are rare) and a change of n is checked and made atomically.

-- name: lease_set_lock
INSERT INTO justonce_partition_sets (set_name, n) VALUES (%(set)s, %(n)s)
ON CONFLICT (set_name) DO UPDATE SET updated_at = now()
RETURNING n

-- name: lease_set_fence_all
-- (PostgreSQL fences in lease_set_resize; this twin of SQLite's statement does nothing.)
-- unused: set
SELECT 1

-- name: lease_set_held
SELECT count(*) FROM justonce_partition_leases
 WHERE set_name = %(set)s AND owner IS NOT NULL AND expires_at > now()

-- name: lease_set_resize
-- A new n: every slot's token moves on, so a holder of the old n (its lease expired, it is
-- paused) can neither renew nor pass a fence, whichever slot it had.
WITH fenced AS (
    UPDATE justonce_partition_leases SET owner = NULL, expires_at = NULL, token = token + 1
     WHERE set_name = %(set)s
)
UPDATE justonce_partition_sets SET n = %(n)s, updated_at = now() WHERE set_name = %(set)s
RETURNING n

-- name: lease_slots_ensure
INSERT INTO justonce_partition_leases (set_name, slot)
SELECT %(set)s, s FROM generate_series(0, %(n)s - 1) AS s
ON CONFLICT DO NOTHING
RETURNING slot

-- name: lease_take
-- The first free or expired slot; the token grows with every new holder.
UPDATE justonce_partition_leases l
   SET owner = %(owner)s, token = l.token + 1,
       expires_at = clock_timestamp() + %(lease)s::float8 * interval '1 second',
       acquired_at = clock_timestamp(), renewed_at = clock_timestamp()
 WHERE l.set_name = %(set)s
   AND l.slot = (SELECT slot FROM justonce_partition_leases
                  WHERE set_name = %(set)s AND slot < %(n)s
                    AND (owner IS NULL OR expires_at <= now())
                  ORDER BY slot
                  LIMIT 1
                    FOR UPDATE SKIP LOCKED)
RETURNING l.slot, l.token, l.expires_at

-- name: lease_hold
-- The slot's row locked for a renewal (LeaseStore.lease_renew), if the lease looked live
-- when the statement began; lease_renew then tests the expiry again, after any wait here.
SELECT slot FROM justonce_partition_leases
 WHERE set_name = %(set)s AND slot = %(slot)s AND token = %(token)s AND owner IS NOT NULL
   AND expires_at > clock_timestamp()
   FOR UPDATE

-- name: lease_renew
-- Only a live lease is renewed: once it has expired by the database's clock its token is
-- spent (a standby may be taking the slot right now), and the holder must acquire anew.
-- Each token's tenure is then one unbroken interval.
UPDATE justonce_partition_leases
   SET expires_at = clock_timestamp() + %(lease)s::float8 * interval '1 second',
       renewed_at = clock_timestamp()
 WHERE set_name = %(set)s AND slot = %(slot)s AND token = %(token)s AND owner IS NOT NULL
   AND expires_at > clock_timestamp()
RETURNING expires_at

-- name: lease_release
UPDATE justonce_partition_leases SET owner = NULL, expires_at = NULL
 WHERE set_name = %(set)s AND slot = %(slot)s AND token = %(token)s AND owner IS NOT NULL
RETURNING slot

-- name: lease_fence
-- FOR SHARE: a takeover (an UPDATE of this row) waits until the caller's transaction ends.
-- An expired lease fails the fence even before anyone took the slot over.
SELECT 1 FROM justonce_partition_leases
 WHERE set_name = %(set)s AND slot = %(slot)s AND token = %(token)s AND owner IS NOT NULL
   AND expires_at > clock_timestamp()
   FOR SHARE

-- name: lease_list
SELECT l.set_name, s.n, l.slot, l.owner, l.token, l.expires_at,
       (l.owner IS NOT NULL AND l.expires_at > now())
  FROM justonce_partition_leases l
  JOIN justonce_partition_sets s ON s.set_name = l.set_name
 WHERE (%(set)s::text IS NULL OR l.set_name = %(set)s) AND l.slot < s.n
 ORDER BY l.set_name, l.slot

-- Effects ("just once"). Claims run in a transaction with a lock timeout.

-- name: effect_ensure
INSERT INTO justonce_effects (scope, key, state, policy)
VALUES (%(scope)s, %(key)s, 'pending', %(policy)s)
ON CONFLICT (scope, key) DO NOTHING

-- name: effect_lock
-- "Check state": the entry's row lock, held until the claim's transaction ends, and the
-- chunk of run_many that holds it, if one does. Such an entry stays 'running' with no
-- lease of its own: its state is its chunk's ('done' once the chunk is marked done, else
-- running until the chunk's lease, then in doubt), read by effect_chunks_read once the
-- entries are locked (a statement of its own: one that began before the lock's wait would
-- not see a chunk committed during it).
SELECT state, policy, token, (lease_expires_at <= now()) AS expired, chunk_id
  FROM justonce_effects WHERE scope = %(scope)s AND key = %(key)s
   FOR UPDATE

-- name: effect_take
-- "Change state": this caller's claim, with a new token (the entry leaves any chunk).
UPDATE justonce_effects
   SET state = 'running', token = token + 1, owner = %(owner)s, attempts = attempts + 1,
       lease_expires_at = now() + %(lease)s::float8 * interval '1 second', updated_at = now(),
       chunk_id = NULL
 WHERE scope = %(scope)s AND key = %(key)s
RETURNING token

-- name: effect_done
UPDATE justonce_effects
   SET state = 'done', done_at = now(), updated_at = now(), lease_expires_at = NULL,
       result = %(result)s::jsonb
 WHERE scope = %(scope)s AND key = %(key)s AND token = %(token)s AND state = 'running'
   AND chunk_id IS NULL
RETURNING 1

-- name: effect_release
UPDATE justonce_effects
   SET state = 'pending', updated_at = now(), lease_expires_at = NULL, last_error = %(error)s
 WHERE scope = %(scope)s AND key = %(key)s AND token = %(token)s AND state = 'running'
   AND chunk_id IS NULL
RETURNING 1

-- name: effect_resolve_lock
-- An operator's verdict, first step: the running entries among %(keys)s (sorted), locked
-- in list order (the lock order of every bulk statement): (key, lease expired, the chunk
-- that holds it). The caller share-locks those chunks, then picks the entries in doubt.
SELECT e.key, e.expired, e.chunk_id
  FROM unnest(%(keys)s::text[]) AS k(key)
 CROSS JOIN LATERAL (
        SELECT key, (lease_expires_at <= now()) AS expired, chunk_id FROM justonce_effects
         WHERE scope = %(scope)s AND key = k.key AND state = 'running'
        OFFSET 0
           FOR UPDATE) AS e

-- name: effect_resolve_set
-- The verdict on the entries picked (locked by this transaction): done, or pending (to be
-- redone), on each entry itself.
UPDATE justonce_effects
   SET state = %(state)s, updated_at = now(), lease_expires_at = NULL, chunk_id = NULL,
       done_at = CASE WHEN %(state)s = 'done' THEN now() END,
       last_error = COALESCE(%(note)s, last_error)
 WHERE ctid = ANY(ARRAY(
         SELECT e.ctid FROM unnest(%(keys)s::text[]) AS k(key)
          CROSS JOIN LATERAL (SELECT ctid FROM justonce_effects
                               WHERE scope = %(scope)s AND key = k.key AND state = 'running'
                              OFFSET 0) AS e))
RETURNING key

-- name: effect_columns
-- (A fragment of effect_get and effects_list: an entry as its chunk makes it, e the entry,
-- c its chunk or NULLs.)
e.scope, e.key, CASE WHEN c.state = 'done' THEN 'done' ELSE e.state END, e.policy,
       e.token, e.owner, e.attempts,
       CASE WHEN c.state = 'done' THEN NULL ELSE COALESCE(e.lease_expires_at, c.lease_expires_at) END,
       e.last_error, COALESCE(e.result, c.result), e.created_at, COALESCE(c.done_at, e.updated_at),
       COALESCE(e.done_at, c.done_at),
       (e.state = 'running' AND c.state IS DISTINCT FROM 'done'
        AND COALESCE(e.lease_expires_at, c.lease_expires_at) <= now())

-- name: effect_get
SELECT {{effect_columns}}
  FROM justonce_effects e LEFT JOIN justonce_effect_chunks c ON c.id = e.chunk_id
 WHERE e.scope = %(scope)s AND e.key = %(key)s

-- name: effects_in_doubt
-- Entries in doubt: those whose own lease ran out while running, and those held by a
-- chunk whose lease ran out before it was done (the chunk's lease is theirs).
SELECT * FROM (
    SELECT scope, key, state, policy, token, owner, attempts, lease_expires_at, last_error,
           result, created_at, updated_at, done_at, true
      FROM justonce_effects
     WHERE state = 'running' AND lease_expires_at <= now()
       AND (%(scope)s::text IS NULL OR scope = %(scope)s)
    UNION ALL
    SELECT e.scope, e.key, e.state, e.policy, e.token, e.owner, e.attempts, c.lease_expires_at,
           e.last_error, e.result, e.created_at, e.updated_at, e.done_at, true
      FROM justonce_effect_chunks c JOIN justonce_effects e ON e.chunk_id = c.id
     WHERE c.state = 'running' AND c.lease_expires_at <= now()
       AND (%(scope)s::text IS NULL OR c.scope = %(scope)s)
) AS d
 ORDER BY 8
 LIMIT %(limit)s

-- name: effects_list
-- A page of a scope by key: the keys after %(after)s ('' when it is NULL: every key is
-- non-empty), a range of the primary key, so a page deep in a big scope costs what the
-- first one does (an `IS NULL OR key >` form left SQLite filtering the whole scope).
SELECT {{effect_columns}}
  FROM justonce_effects e LEFT JOIN justonce_effect_chunks c ON c.id = e.chunk_id
 WHERE e.scope = %(scope)s
   AND (%(state)s::text IS NULL OR (CASE WHEN c.state = 'done' THEN 'done' ELSE e.state END) = %(state)s)
   AND e.key > COALESCE(%(after)s::text, '')
 ORDER BY e.key
 LIMIT %(limit)s

-- name: effects_count
-- Counted per (state, chunk) first: a chunk's entries take their state from one look-up.
SELECT CASE WHEN c.state = 'done' THEN 'done' ELSE g.state END,
       (g.state = 'running' AND c.state IS DISTINCT FROM 'done'
        AND COALESCE(g.lease_expires_at, c.lease_expires_at) <= now()),
       sum(g.n)::bigint
  FROM (SELECT state, chunk_id, lease_expires_at, count(*) AS n
          FROM justonce_effects WHERE scope = %(scope)s
         GROUP BY state, chunk_id, lease_expires_at) AS g
  LEFT JOIN justonce_effect_chunks c ON c.id = g.chunk_id
 GROUP BY 1, 2

-- Effects in bulk (Effects.run_many): per chunk of keys, one claim transaction (the chunk's
-- row; ensure, lock, take: decided between lock and take by the same rules as
-- effect_claim) and one finishing transaction. %(keys)s arrives sorted; every statement
-- that locks entries locks them in that order (the list drives a nested loop of
-- primary-key look-ups, each locking its row): two chunks that overlap, or a claim and a
-- finish, then wait for each other instead of deadlocking. Entries are locked before
-- chunks, by every caller.
--
-- The entries a chunk claims point at its row (chunk_id) and have no lease of their own:
-- the chunk's lease is theirs, and so is its done mark. Marking a chunk of 500 done is one
-- row update instead of 500 (each an index change too): in a Push, the server's time per
-- email fell by about half (bench/README.md).
--
-- Shape: each key is looked up by itself (LATERAL ... OFFSET 0, which the planner cannot
-- flatten into a join). Given `scope = $1 AND key = ANY($2)` on a table not analyzed since
-- a scope grew (a Push inserts its whole list), the planner estimated a few hundred rows
-- for the scope and read all of them for each chunk: 15-25 ms a statement in a 60,000-entry
-- scope, growing with it, against 1-2 ms. Updates then go to the rows found, by ctid
-- (stable: this transaction holds their locks).

-- name: effect_chunk_open
INSERT INTO justonce_effect_chunks (scope, state, lease_expires_at)
VALUES (%(scope)s, 'running', now() + %(lease)s::float8 * interval '1 second')
RETURNING id

-- name: effect_chunk_drop
-- A chunk that claimed nothing.
DELETE FROM justonce_effect_chunks WHERE id = %(chunk)s RETURNING id

-- name: effect_chunks_read
-- Chunks by id, read after the entries they hold are locked: (id, state, lease expired).
SELECT id, state, (lease_expires_at <= now())
  FROM justonce_effect_chunks WHERE id = ANY(%(ids)s::bigint[])

-- name: effect_chunks_share
-- Chunks by id, share-locked in id order (after the entries they hold): an at-least-once
-- claim of an entry in doubt, or an operator's verdict, keeps the chunk's finisher from
-- marking it done meanwhile. (id, state, lease expired).
SELECT id, state, (lease_expires_at <= now())
  FROM justonce_effect_chunks WHERE id = ANY(%(ids)s::bigint[])
 ORDER BY id
   FOR SHARE

-- name: effect_chunk_done
-- The chunk's done mark, with the result its entries share.
UPDATE justonce_effect_chunks SET state = 'done', done_at = now(), result = %(result)s::jsonb
 WHERE id = %(chunk)s AND scope = %(scope)s AND state = 'running'
RETURNING 1

-- name: effect_chunk_keys
-- The entries a chunk still holds (none taken over by another claim or an operator), with
-- their tokens. Read by the chunk's index alone (the subquery, which OFFSET 0 keeps from
-- being flattened, then the scope): given `chunk_id = %(chunk)s AND scope = %(scope)s`,
-- on a table not analyzed since the scope grew, the planner ANDed both indexes and read
-- every entry of the scope for each chunk (15 ms for a chunk of 500 in a scope of
-- 100,000, against 0.4 ms; a Push's finish time grew with its list).
SELECT key, token
  FROM (SELECT key, token, scope FROM justonce_effects WHERE chunk_id = %(chunk)s OFFSET 0) AS e
 WHERE scope = %(scope)s

-- name: effect_chunk_held
-- How many entries a chunk still holds (by its index alone, as effect_chunk_keys).
SELECT count(*)
  FROM (SELECT scope FROM justonce_effects WHERE chunk_id = %(chunk)s OFFSET 0) AS e
 WHERE scope = %(scope)s

-- name: effect_claim_new_many
-- The missing entries of the chunk, inserted already claimed (running, token 1) by it in
-- list order: a Push's first pass over its list makes and claims each entry with one tuple
-- instead of an insert and an update (measured: see effects.py's run_many). Returns the
-- keys inserted, with their token; the others exist and go through lock and take. An
-- insert waits for another transaction's uncommitted insert of the same key (one order
-- keeps those waits acyclic); existing entries are not locked here.
INSERT INTO justonce_effects (scope, key, state, policy, token, owner, attempts, chunk_id)
SELECT %(scope)s, k, 'running', %(policy)s, 1, %(owner)s, 1, %(chunk)s
  FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS u(k, ord)
 ORDER BY ord
ON CONFLICT (scope, key) DO NOTHING
RETURNING key, token

-- name: effect_lock_many
-- "Check state": the chunk's entries locked in list order, with the chunk that holds each
-- (whose state effect_chunks_read reads next, in a statement of its own). Done entries
-- are left out, and so are those of chunks that are done (a key missing from the answer
-- is done), so a re-run over a finished scope locks no entry and dirties no page of
-- them (only the chunk row it opened, dropped again); those of another policy come back
-- anyway, so that the caller refuses the chunk. A row that changed while this waited for
-- its lock is re-read and re-checked (READ COMMITTED): the state seen is the one the lock
-- protects.
SELECT e.key, e.state, e.policy, e.token, e.expired, e.chunk_id
  FROM unnest(%(keys)s::text[]) AS k(key)
 CROSS JOIN LATERAL (
        SELECT key, state, policy, token, (lease_expires_at <= now()) AS expired, chunk_id
          FROM justonce_effects x
         WHERE scope = %(scope)s AND key = k.key
           AND ((state <> 'done' AND NOT EXISTS (
                    SELECT 1 FROM justonce_effect_chunks d
                     WHERE d.id = x.chunk_id AND d.state = 'done'))
                OR policy <> %(policy)s)
        OFFSET 0
           FOR UPDATE) AS e

-- name: effect_take_many
-- "Change state": the claimable keys of the chunk (locked by this transaction already),
-- each with a new token, held by the chunk.
UPDATE justonce_effects
   SET state = 'running', token = token + 1, owner = %(owner)s, attempts = attempts + 1,
       lease_expires_at = NULL, chunk_id = %(chunk)s, updated_at = now()
 WHERE ctid = ANY(ARRAY(
         SELECT e.ctid FROM unnest(%(keys)s::text[]) AS k(key)
          CROSS JOIN LATERAL (SELECT ctid FROM justonce_effects
                               WHERE scope = %(scope)s AND key = k.key OFFSET 0) AS e))
RETURNING key, token

-- name: effect_finish_many
-- Entries of a chunk marked one by one (results that differ, or failures released), in
-- one statement: %(rows)s is one JSON list of [key, token, result, error] (result: JSON
-- text or null; error: null when fn returned, so done; text when fn raised, so pending
-- again; one JSON text is sent at once, where psycopg dumps Python lists element by
-- element). Fenced by each key's token and the chunk: a key whose claim was taken over is
-- not in the answer. Each entry marked leaves the chunk. The rows are locked in list order
-- first (the materialised CTE, whose look-ups check the token and state under the lock),
-- then updated by ctid: restating scope and state here brought back the scan of the scope.
WITH d AS MATERIALIZED (
    SELECT r->>0 AS key, (r->>1)::bigint AS token, r->>2 AS result, r->>3 AS error
      FROM json_array_elements(%(rows)s::json) AS r
), locked AS MATERIALIZED (
    SELECT e.ctid AS row_id
      FROM d
     CROSS JOIN LATERAL (
            SELECT ctid FROM justonce_effects
             WHERE scope = %(scope)s AND key = d.key AND token = d.token AND state = 'running'
               AND chunk_id = %(chunk)s
            OFFSET 0
               FOR UPDATE) AS e
)
UPDATE justonce_effects e
   SET state = CASE WHEN d.error IS NULL THEN 'done' ELSE 'pending' END,
       done_at = CASE WHEN d.error IS NULL THEN now() END,
       result = CASE WHEN d.error IS NULL THEN d.result::jsonb ELSE e.result END,
       last_error = COALESCE(d.error, e.last_error),
       updated_at = now(), lease_expires_at = NULL, chunk_id = NULL
  FROM d
 WHERE e.ctid = ANY(ARRAY(SELECT row_id FROM locked)) AND e.key = d.key
RETURNING e.key, e.state

-- Metrics

-- name: metrics_snapshot
-- What /metrics shows beside queue_counts, in one statement whose cost does not grow with
-- the backlog: per queue, the age of the longest-waiting job at the head of each priority
-- (and of the partitioned jobs), and the batches not finished. The heads come from skip
-- scans of the two claim indexes (one index probe per queue and priority): a plain
-- min(run_at) over the ready rows would read every ready row and its heap page.
-- rows: (queue, age in seconds) per queue with ready jobs, then (NULL, open batches).
WITH RECURSIVE heads AS (
    (SELECT queue, priority, id FROM justonce_jobs
      WHERE state = 'ready' AND partition_hash IS NULL
      ORDER BY queue, priority, id LIMIT 1)
  UNION ALL
    SELECT n.queue, n.priority, n.id FROM heads h CROSS JOIN LATERAL (
        SELECT queue, priority, id FROM justonce_jobs
         WHERE state = 'ready' AND partition_hash IS NULL
           AND (queue, priority) > (h.queue, h.priority)
         ORDER BY queue, priority, id LIMIT 1) n
), partitioned_heads AS (
    (SELECT queue, id FROM justonce_jobs
      WHERE state = 'ready' AND partition_hash IS NOT NULL
      ORDER BY queue, id LIMIT 1)
  UNION ALL
    SELECT n.queue, n.id FROM partitioned_heads h CROSS JOIN LATERAL (
        SELECT queue, id FROM justonce_jobs
         WHERE state = 'ready' AND partition_hash IS NOT NULL AND queue > h.queue
         ORDER BY queue, id LIMIT 1) n
)
SELECT j.queue, max(greatest(0, extract(epoch FROM now() - j.run_at)))::float8
  FROM justonce_jobs j
 WHERE j.id = ANY(ARRAY(SELECT id FROM heads UNION ALL SELECT id FROM partitioned_heads))
   AND j.state = 'ready'
 GROUP BY j.queue
UNION ALL
SELECT NULL, count(*)::float8 FROM justonce_batches WHERE state IN ('open', 'sealed')
-- Service: tokens and audit --------------------------------------------------------------

-- name: token_create
INSERT INTO justonce_api_tokens (name, scope, secret_hash, prefix)
VALUES (%(name)s, %(scope)s, %(secret_hash)s, %(prefix)s)
RETURNING id, name, scope, prefix, created_at, last_used_at, revoked_at

-- name: token_find_by_hash
-- The UNIQUE index on secret_hash finds the row; tokens.py compares the hash again in
-- constant time.
SELECT id, name, scope, prefix, created_at, last_used_at, revoked_at, secret_hash
  FROM justonce_api_tokens WHERE secret_hash = %(secret_hash)s

-- name: token_get
SELECT id, name, scope, prefix, created_at, last_used_at, revoked_at
  FROM justonce_api_tokens WHERE id = %(id)s

-- name: token_list
SELECT id, name, scope, prefix, created_at, last_used_at, revoked_at
  FROM justonce_api_tokens ORDER BY id

-- name: token_revoke
UPDATE justonce_api_tokens SET revoked_at = now()
 WHERE id = %(id)s AND revoked_at IS NULL
RETURNING id

-- name: token_touch
-- At most one write a minute per token: the condition makes the other calls no-ops.
UPDATE justonce_api_tokens SET last_used_at = now()
 WHERE id = %(id)s AND (last_used_at IS NULL OR last_used_at < now() - interval '60 seconds')
RETURNING id

-- name: audit_record
INSERT INTO justonce_audit (token_id, actor, action, target, count, detail)
VALUES (%(token_id)s, %(actor)s, %(action)s, %(target)s, %(count)s, %(detail)s::jsonb)
RETURNING id

-- name: audit_list
SELECT id, at, token_id, actor, action, target, count, detail
  FROM justonce_audit
 WHERE (%(cursor)s::bigint IS NULL OR id < %(cursor)s)
 ORDER BY id DESC
 LIMIT %(limit)s

-- Service: job listings with filters, and actions on all matching jobs --------------------

-- name: job_filter
-- (A fragment: the filters of a listing, over the alias j.)
(%(state)s::text IS NULL OR j.state = %(state)s)
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
   AND (%(created_after)s::timestamptz IS NULL OR j.created_at >= %(created_after)s)
   AND (%(created_before)s::timestamptz IS NULL OR j.created_at < %(created_before)s)
   AND (%(max_id)s::bigint IS NULL OR j.id <= %(max_id)s)

-- name: match_cancel
-- (A fragment: the jobs "cancel all matching" acts on: live ones.)
j.state IN ('scheduled','ready','running') AND {{job_filter}}

-- name: match_retry
-- (A fragment: the jobs "retry all matching" acts on: dead or cancelled ones. A keyed job
-- is left out when a live job holds its key, and only the newest finished job of a key is
-- taken, so one chunk never makes two live jobs of one key.)
j.state IN ('dead','cancelled') AND {{job_filter}}
   AND (j.key IS NULL OR (
        NOT EXISTS (SELECT 1 FROM justonce_jobs l
                     WHERE l.key = j.key AND l.state IN ('scheduled','ready','running'))
        AND j.id = (SELECT max(k.id) FROM justonce_jobs k
                     WHERE k.key = j.key AND k.state IN ('dead','cancelled'))))

-- name: job_page
-- Newest first, keyset paging by id: the primary key walks backwards from the cursor.
SELECT * FROM justonce_jobs j
 WHERE {{job_filter}} AND (%(cursor)s::bigint IS NULL OR j.id < %(cursor)s)
 ORDER BY j.id DESC
 LIMIT %(limit)s

-- name: jobs_count_cancel
SELECT count(*), max(j.id) FROM justonce_jobs j WHERE {{match_cancel}}

-- name: jobs_count_retry
SELECT count(*), max(j.id) FROM justonce_jobs j WHERE {{match_retry}}

-- name: jobs_cancel_matching
-- One chunk, in id order. FOR UPDATE (not SKIP LOCKED): a job a worker is claiming right
-- now is waited for, not skipped, and its state is checked again once the lock is ours.
WITH picked AS (
    SELECT j.id FROM justonce_jobs j WHERE {{match_cancel}} AND j.id > %(after)s
     ORDER BY j.id LIMIT %(limit)s
       FOR UPDATE
)
UPDATE justonce_jobs t
   SET state = 'cancelled', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL
  FROM picked
 WHERE t.id = picked.id AND t.state IN ('scheduled','ready','running')
RETURNING t.id, t.batch_item

-- name: jobs_retry_matching
WITH picked AS (
    SELECT j.id FROM justonce_jobs j WHERE {{match_retry}} AND j.id > %(after)s
     ORDER BY j.id LIMIT %(limit)s
       FOR UPDATE
), up AS (
    UPDATE justonce_jobs t
       SET state = 'ready', attempts = 0, run_at = now(), finished_at = NULL,
           lease_owner = NULL, lease_expires_at = NULL
      FROM picked
     WHERE t.id = picked.id AND t.state IN ('dead','cancelled')
    RETURNING t.id, t.queue
)
SELECT up.id, (SELECT count(pg_notify(%(channel)s, q)) FROM (SELECT DISTINCT queue AS q FROM up) r)
  FROM up

-- name: jobs_size_estimate
-- dialect-only: planner statistics (Dialect.count_jobs)
-- The planner's row count (-1 before the first ANALYZE; then the size on disk says it).
SELECT reltuples::bigint, pg_relation_size(oid) FROM pg_class WHERE oid = 'justonce_jobs'::regclass

-- name: queue_counts_sampled
-- dialect-only: TABLESAMPLE (Dialect.count_jobs)
-- Above the threshold: a block sample instead of a full count (scaled in Python).
SELECT queue, state, count(*) FROM justonce_jobs TABLESAMPLE SYSTEM (%(percent)s)
 GROUP BY queue, state

-- name: queue_heads
-- The ready job each queue hands out next: the head of the claim index (lowest priority,
-- then id) and the oldest partitioned ready job, whichever waited longer. Two index
-- descents per queue (a subquery without "partition_hash IS NULL" cannot use the partial
-- claim index and scanned the whole table: 1.6 s for 10 queues over 1,000,000 jobs).
SELECT q, extract(epoch FROM now() - least(
         (SELECT j.run_at FROM justonce_jobs j
           WHERE j.state = 'ready' AND j.partition_hash IS NULL AND j.queue = q
           ORDER BY j.priority, j.id LIMIT 1),
         (SELECT j.run_at FROM justonce_jobs j
           WHERE j.state = 'ready' AND j.partition_hash IS NOT NULL AND j.queue = q
           ORDER BY j.id LIMIT 1)))
  FROM unnest(%(queues)s::text[]) q

-- Lists (backends/liststore.py). A reservation row's columns, everywhere: id, list_id,
-- secret, request_id, state, due_at, ranges, held, pending, attempt, ttr, error, created_at,
-- and whether its time has come by the database's clock (expired).

-- name: list_create
INSERT INTO justonce_lists (name, task, state, ttr, max_attempts, callbacks)
VALUES (%(name)s, %(task)s, 'loading', %(ttr)s, %(max_attempts)s, %(callbacks)s)
RETURNING id

-- name: list_lock
-- Every reserve, append, seal and kick of a list takes its row: reserves of one list take
-- turns for the one cursor step (completions never take it, but for the list's last one).
SELECT id, state, total, next_position, ttr, max_attempts, batch_id, group_id
  FROM justonce_lists WHERE name = %(name)s
   FOR UPDATE

-- name: list_task
-- What run_next needs of a list, read without the progress sums of list_get.
SELECT task, max_attempts FROM justonce_lists WHERE name = %(name)s

-- name: list_callbacks
SELECT callbacks FROM justonce_lists WHERE id = %(id)s

-- name: list_item_insert
-- PostgresBackend loads items with COPY instead (ListOps.insert_items).
INSERT INTO justonce_list_items (list_id, position, item) VALUES (%(list_id)s, %(position)s, %(item)s)

-- name: list_grow
UPDATE justonce_lists SET total = %(total)s WHERE id = %(id)s

-- name: list_seal
UPDATE justonce_lists
   SET state = 'sealed', sealed_at = now(), batch_id = %(batch_id)s, group_id = %(group_id)s
 WHERE id = %(id)s

-- name: list_finish
UPDATE justonce_lists SET state = 'completed', finished_at = now()
 WHERE batch_id = %(batch_id)s AND state = 'sealed'

-- name: list_advance
UPDATE justonce_lists SET next_position = %(next_position)s WHERE id = %(id)s

-- name: list_drop_items
DELETE FROM justonce_list_items WHERE list_id = %(id)s

-- name: list_drop_reservations
DELETE FROM justonce_list_reservations WHERE list_id = %(id)s

-- name: list_drop
DELETE FROM justonce_lists WHERE id = %(id)s

-- name: list_due
-- The oldest row whose time has come (an active one past its TTR, a free one past its
-- delay), skipping one that its holder is completing right now: the partial index on
-- (list_id, due_at) holds only active and free rows, and the live ones are all in the
-- future, so this reads nothing when nothing is due.
SELECT id, list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr,
       error, created_at, true AS expired
  FROM justonce_list_reservations
 WHERE list_id = %(list_id)s AND due_at <= now()
 ORDER BY due_at
 LIMIT 1
   FOR UPDATE SKIP LOCKED

-- name: list_reservation_insert
INSERT INTO justonce_list_reservations
       (list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr, error)
VALUES (%(list_id)s, %(secret)s, %(request_id)s, %(state)s,
        now() + %(due_in)s::float8 * interval '1 second', %(ranges)s, %(held)s, %(pending)s,
        %(attempt)s, %(ttr)s, %(error)s)
RETURNING id, due_at

-- name: list_reservation_by_request
SELECT r.id, r.list_id, r.secret, r.request_id, r.state, r.due_at, r.ranges, r.held, r.pending,
       r.attempt, r.ttr, r.error, r.created_at, coalesce(r.due_at <= now(), false) AS expired
  FROM justonce_lists l
  JOIN justonce_list_reservations r ON r.list_id = l.id AND r.request_id = %(request_id)s
 WHERE l.name = %(name)s

-- name: list_reservation_lock
-- The holder's row, locked (a re-offer that wants it skips it; a completion waits); the
-- list's columns are read, not locked.
SELECT r.id, r.list_id, r.secret, r.request_id, r.state, r.due_at, r.ranges, r.held, r.pending,
       r.attempt, r.ttr, r.error, r.created_at, coalesce(r.due_at <= now(), false) AS expired,
       l.id, l.state, l.total, l.next_position, l.ttr, l.max_attempts, l.batch_id, l.group_id
  FROM justonce_list_reservations r
  JOIN justonce_lists l ON l.id = r.list_id
 WHERE r.id = %(id)s AND l.name = %(name)s
   FOR UPDATE OF r

-- name: list_reservation_pending
UPDATE justonce_list_reservations SET pending = %(pending)s, updated_at = now() WHERE id = %(id)s

-- name: list_reservation_touch
UPDATE justonce_list_reservations
   SET due_at = now() + %(due_in)s::float8 * interval '1 second', updated_at = now()
 WHERE id = %(id)s

-- name: list_reservation_due
SELECT due_at FROM justonce_list_reservations WHERE id = %(id)s

-- name: list_reservation_hold
UPDATE justonce_list_reservations SET held = %(held)s, pending = %(pending)s, updated_at = now()
 WHERE id = %(id)s

-- name: list_reservation_set
UPDATE justonce_list_reservations
   SET state = %(state)s, due_at = now() + %(due_in)s::float8 * interval '1 second',
       held = %(held)s, pending = %(pending)s, attempt = %(attempt)s, error = %(error)s,
       updated_at = now()
 WHERE id = %(id)s

-- name: list_reservation_delete
DELETE FROM justonce_list_reservations WHERE id = %(id)s

-- name: list_buried_lock
SELECT id, list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr,
       error, created_at, false AS expired
  FROM justonce_list_reservations
 WHERE list_id = %(list_id)s AND state = 'buried'
 ORDER BY id
 LIMIT %(limit)s
   FOR UPDATE

-- name: list_buried
SELECT r.held, r.attempt, r.error, r.updated_at
  FROM justonce_lists l
  JOIN justonce_list_reservations r ON r.list_id = l.id AND r.state = 'buried'
 WHERE l.name = %(name)s
 ORDER BY r.id
 LIMIT %(limit)s

-- name: list_items
-- The items at the ranges (JSON [[lo, hi], ...]: half-open, sorted) in position order, as
-- many as fit, from the first, in the budget's bytes of item text. The running sum is over
-- the items' lengths alone (octet_length reads a TOASTed text's header, not the text), and
-- only the items within the budget are joined in and sent: an answer's memory is bounded by
-- the budget whatever the mix of sizes, and positions between the ranges are not read at
-- all.
-- unused: positions
SELECT i.position, i.item
  FROM (SELECT s.list_id, s.position,
               sum(s.n) OVER (ORDER BY s.position ROWS UNBOUNDED PRECEDING) AS upto
          FROM (SELECT i.list_id, i.position, octet_length(i.item) AS n
                  FROM justonce_lists l
                 CROSS JOIN jsonb_array_elements(%(ranges)s::jsonb) AS r
                  JOIN justonce_list_items i ON i.list_id = l.id
                   AND i.position >= (r->>0)::bigint AND i.position < (r->>1)::bigint
                 WHERE l.name = %(name)s) s) w
  JOIN justonce_list_items i ON i.list_id = w.list_id AND i.position = w.position
 WHERE w.upto <= %(budget)s
 ORDER BY w.position

-- name: list_get
SELECT l.id, l.name, l.task, l.state, l.total, l.next_position, l.ttr, l.max_attempts,
       l.batch_id, l.callbacks, l.created_at, l.sealed_at, l.finished_at,
       (SELECT sum(c.pending) FROM justonce_batch_chunks c WHERE c.batch_id = l.batch_id) AS undone
  FROM justonce_lists l
 WHERE l.name = %(name)s

-- name: list_all
SELECT l.id, l.name, l.task, l.state, l.total, l.next_position, l.ttr, l.max_attempts,
       l.batch_id, l.callbacks, l.created_at, l.sealed_at, l.finished_at,
       (SELECT sum(c.pending) FROM justonce_batch_chunks c WHERE c.batch_id = l.batch_id) AS undone
  FROM justonce_lists l
 ORDER BY l.name
 LIMIT %(limit)s

-- name: list_reservation_counts
SELECT state, coalesce(state = 'active' AND due_at <= now(), false) AS expired, sum(pending)
  FROM justonce_list_reservations
 WHERE list_id = %(id)s AND state IN ('active', 'free', 'buried')
 GROUP BY 1, 2

-- name: list_bits
SELECT chunk, bits FROM justonce_batch_chunks
 WHERE batch_id = %(batch_id)s AND group_id = %(group_id)s AND chunk BETWEEN %(lo)s AND %(hi)s

-- name: lists_prune_done
DELETE FROM justonce_list_reservations
 WHERE id IN (SELECT id FROM justonce_list_reservations
               WHERE state = 'done' AND updated_at <= now() - %(retention)s * interval '1 second'
               LIMIT %(limit)s)

-- name: list_reserve_fresh
-- dialect-only: PostgresListOps' reserve of fresh positions in one autocommit statement
-- The list's row locked (reserves of one list take turns for the cursor), and, when the
-- list is sealed, has fresh positions and no row is due to be handed out again, the cursor
-- moved by up to %(k)s and the reservation inserted. No row: the generic path (re-offers,
-- errors, an empty list) decides.
WITH l AS (
    SELECT id, next_position, total, coalesce(%(ttr)s::float8, ttr) AS ttr
      FROM justonce_lists
     WHERE name = %(name)s AND state = 'sealed'
       FOR UPDATE
), go AS (
    SELECT l.* FROM l
     WHERE l.next_position < l.total
       AND NOT EXISTS (SELECT 1 FROM justonce_list_reservations r
                        WHERE r.list_id = l.id AND r.due_at <= now())
), adv AS (
    UPDATE justonce_lists x SET next_position = least(go.total, go.next_position + %(k)s)
      FROM go
     WHERE x.id = go.id
    RETURNING x.id, go.next_position AS lo, x.next_position AS hi, go.ttr
)
INSERT INTO justonce_list_reservations
       (list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr)
SELECT adv.id, %(secret)s, %(request_id)s, 'active', now() + adv.ttr * interval '1 second',
       '[[' || adv.lo || ',' || adv.hi || ']]', '[[' || adv.lo || ',' || adv.hi || ']]',
       adv.hi - adv.lo, 1, adv.ttr
  FROM adv
RETURNING id, due_at, ranges, ttr

-- name: list_complete
-- dialect-only: PostgresListOps' completion in one autocommit statement
-- The holder's row locked and checked (its secret, active, its time to run not passed by
-- the database's clock, of this list); every asked range (%(ranges)s: [[lo, hi], ...], or
-- NULL for all it holds) inside one of its held ranges; the chunks the ranges touch locked
-- in key order, their bits ORed with one mask per chunk built from the ranges (no
-- per-position work), the row's pending
-- count lowered, the row deleted when nothing is left (or kept as done for its request id).
-- Nothing is written unless every check passes AND (%(last)s or) no chunk reaches 0
-- pending: a completion that empties a chunk may complete the list, and the batch's
-- completion check must run in its transaction: status 'last' says to run it again, with
-- %(last)s, in a transaction that then runs the check. 'refused': the generic path finds
-- out why and raises. Answers the status, the number of positions newly done, the ranges
-- held, the touched chunks with their bits as they were, whether a chunk was emptied, the
-- list's batch id, and the number of rows written (the caller
-- lists the positions done before: a join of every position with its bit here made the
-- planner's estimates, and with them the cost, large enough for JIT, 1.3 s a call). A
-- range (at most 10,000 positions) spans at most 6 chunks: LIMIT 8 keeps that estimate
-- small too.
WITH r AS (
    -- By primary key (the checks come after: in this WHERE, the planner may walk the due
    -- index of every live reservation instead).
    SELECT r.id, r.request_id, r.held::jsonb AS held, r.pending, l.batch_id, l.group_id,
           r.secret = %(secret)s AND r.state = 'active' AND r.due_at > now() AS holds
      FROM justonce_list_reservations r
      JOIN justonce_lists l ON l.id = r.list_id
     WHERE r.id = %(id)s AND l.name = %(name)s
       FOR UPDATE OF r
), asked AS (
    SELECT (a->>0)::bigint AS lo, (a->>1)::bigint AS hi
      FROM r, jsonb_array_elements(coalesce(%(ranges)s::jsonb, r.held)) AS a
     WHERE r.holds
), fits AS (
    SELECT coalesce(bool_and(EXISTS (
               SELECT 1 FROM r, jsonb_array_elements(r.held) AS h
                WHERE (h->>0)::bigint <= a.lo AND a.hi <= (h->>1)::bigint)), false) AS ok
      FROM asked a
), pieces AS (
    SELECT c.n::int AS chunk,
           (greatest(a.lo, c.n * 2048) - c.n * 2048)::int AS b0,
           (least(a.hi, (c.n + 1) * 2048) - c.n * 2048)::int AS b1
      FROM asked a
     CROSS JOIN LATERAL (SELECT g.n FROM generate_series(a.lo / 2048, (a.hi - 1) / 2048) AS g(n)
                          LIMIT 8) AS c
     WHERE (SELECT ok FROM fits)
), old AS (
    -- Each chunk looked up by its whole key (= ANY of an array: a join with the pieces
    -- read every chunk of the list through the key's prefix, O(n) a call).
    SELECT ch.chunk, ch.size, ch.pending, ch.bits
      FROM justonce_batch_chunks ch, r
     WHERE ch.batch_id = r.batch_id AND ch.group_id = r.group_id
       AND ch.chunk = ANY ((SELECT array_agg(DISTINCT chunk) FROM pieces)::int[])
     ORDER BY ch.chunk
       FOR UPDATE OF ch
), plan AS (
    SELECT m.chunk, m.mask, bit_count(m.mask & ~m.bits)::int AS newly,
           m.pending - bit_count(m.mask & ~m.bits)::int AS after
      FROM (SELECT o.chunk, o.pending, o.bits,
                   bit_or((repeat('0', p.b0) || repeat('1', p.b1 - p.b0)
                           || repeat('0', o.size - p.b1))::varbit) AS mask
              FROM old o JOIN pieces p ON p.chunk = o.chunk
             GROUP BY o.chunk, o.pending, o.bits, o.size) AS m
), go AS (
    SELECT (SELECT ok FROM fits)
           AND (%(last)s OR NOT EXISTS (SELECT 1 FROM plan WHERE after = 0)) AS yes,
           (SELECT r.pending FROM r) - coalesce((SELECT sum(newly) FROM plan), 0) AS left_over,
           coalesce((SELECT sum(newly) FROM plan), 0) AS newly
), up AS (
    UPDATE justonce_batch_chunks ch
       SET bits = ch.bits | p.mask, pending = p.after, updated_at = now()
      FROM plan p, r, go
     WHERE go.yes AND p.newly > 0
       AND (ch.batch_id, ch.group_id, ch.chunk) = (r.batch_id, r.group_id, p.chunk)
    RETURNING ch.chunk
), gone AS (
    DELETE FROM justonce_list_reservations x
     USING r, go
     WHERE go.yes AND x.id = r.id AND go.left_over <= 0 AND r.request_id IS NULL
    RETURNING x.id
), kept AS (
    UPDATE justonce_list_reservations x
       SET pending = greatest(go.left_over, 0), updated_at = now(),
           state = CASE WHEN go.left_over <= 0 THEN 'done' ELSE x.state END,
           due_at = CASE WHEN go.left_over <= 0 THEN NULL ELSE x.due_at END,
           held = CASE WHEN go.left_over <= 0 THEN '[]' ELSE x.held END
      FROM r, go
     WHERE go.yes AND go.newly > 0 AND x.id = r.id
       AND NOT (go.left_over <= 0 AND r.request_id IS NULL)
    RETURNING x.id
)
SELECT CASE WHEN NOT (SELECT ok FROM fits) THEN 'refused'
            WHEN NOT (SELECT yes FROM go) THEN 'last' ELSE 'ok' END,
       (SELECT newly FROM go), (SELECT r.held FROM r)::text,
       ARRAY(SELECT o.chunk FROM old o ORDER BY o.chunk),
       ARRAY(SELECT o.bits::text FROM old o ORDER BY o.chunk),
       EXISTS (SELECT 1 FROM plan WHERE after = 0), (SELECT r.batch_id FROM r),
       (SELECT count(*) FROM up) + (SELECT count(*) FROM gone) + (SELECT count(*) FROM kept)
