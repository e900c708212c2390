-- justonce: every SQL statement of the SQLite backend, one named block each.
-- Parameters are sqlite3 :name placeholders, always bound. NOW() is replaced when the file
-- is loaded by the database clock in epoch seconds:
--     ((julianday('now') - 2440587.5) * 86400.0)
-- Every write runs inside BEGIN IMMEDIATE (see backend.py). Every write of a worker names
-- (id, lease_token) and state = 'running': a worker whose lease was lost touches 0 rows.

-- name: job_insert
INSERT INTO justonce_jobs (queue, task, args, kwargs, state, priority, run_at, max_attempts,
                           timeout, key, partition_key, batch_item, partition_hash, created_at)
VALUES (:queue, :task, :args, :kwargs,
        CASE WHEN COALESCE(:run_at, NOW() + :delay) > NOW() THEN 'scheduled' ELSE 'ready' END,
        :priority, COALESCE(:run_at, NOW() + :delay), :max_attempts, :timeout, :key,
        :partition_key, :batch_item, :partition_hash, NOW())
ON CONFLICT (key) WHERE key IS NOT NULL AND state IN ('scheduled','ready','running')
DO NOTHING
RETURNING id, state, run_at, created_at

-- name: job_insert_pairs
-- dialect-only: SQLite's bulk insert of calls (Dialect.insert_calls)
-- One task, one set of options, no keys: one row per [args, kwargs] pair of :rows (one
-- array of pairs: joining two json_each tables would compare every row with every row).
-- Jobs enqueued into a batch get the items :item_prefix || 0, 1, 2…
INSERT INTO justonce_jobs (queue, task, args, kwargs, state, priority, run_at, max_attempts,
                           timeout, partition_key, batch_item, partition_hash, created_at)
SELECT :queue, :task, json_extract(r.value, '$[0]'), json_extract(r.value, '$[1]'),
       CASE WHEN COALESCE(:run_at, NOW() + :delay) > NOW() THEN 'scheduled' ELSE 'ready' END,
       :priority, COALESCE(:run_at, NOW() + :delay), :max_attempts, :timeout, :partition_key,
       :item_prefix || r.key, :partition_hash, NOW()
  FROM json_each(:rows) AS r
 ORDER BY r.key
RETURNING id

-- name: job_live_by_keys
SELECT * FROM justonce_jobs
 WHERE key IN (SELECT value FROM json_each(:keys)) AND state IN ('scheduled','ready','running')

-- name: job_get
SELECT * FROM justonce_jobs WHERE id = :id

-- name: claim_lease
-- (A fragment of the claims below: lease the picked jobs.)
UPDATE justonce_jobs
   SET state = 'running',
       attempts = attempts + 1,
       lease_token = lease_token + 1,
       lease_owner = :owner,
       lease_expires_at = NOW() + :lease,
       started_at = NOW()

-- name: claim_returning
RETURNING id, queue, task, args, kwargs, attempts, max_attempts, timeout, lease_token, priority, batch_item,
          partition_hash, MAX(0, NOW() - run_at) AS queue_wait

-- name: job_claim
{{claim_lease}}
 WHERE id IN (SELECT id FROM justonce_jobs
               WHERE state = 'ready' AND queue = :queue AND partition_hash IS NULL
                 AND NOT EXISTS (SELECT 1 FROM justonce_queue_pauses p WHERE p.queue = :queue)
               ORDER BY priority, id
               LIMIT :limit)
{{claim_returning}}

-- name: job_claim_partitioned
-- A worker holding :slots with :tokens (JSON arrays, aligned) of set :set (n = :n): see the
-- PostgreSQL twin for the rule. The fence needs no row lock here: this statement runs
-- under the file's one write lock, so no takeover can commit until it has.
{{claim_lease}}
 WHERE id IN (SELECT c.id FROM justonce_jobs c
               WHERE c.state = 'ready' AND c.queue = :queue AND c.partition_hash IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM justonce_queue_pauses p WHERE p.queue = :queue)
                 AND (((c.partition_hash % :n) + :n) % :n) IN (
                       SELECT l.slot FROM justonce_partition_leases l
                         JOIN json_each(:slots) AS m ON l.slot = m.value
                         JOIN json_each(:tokens) AS t ON t.key = m.key AND l.token = t.value
                        WHERE l.set_name = :set AND l.owner IS NOT NULL AND l.expires_at > NOW())
                 AND NOT EXISTS (SELECT 1 FROM justonce_jobs e
                                  WHERE e.partition_key = c.partition_key AND e.partition_hash IS NOT NULL
                                    AND e.state IN ('scheduled','ready','running')  -- the partial index's own condition
                                    AND (e.state = 'running' OR e.id < c.id))
               ORDER BY c.id
               LIMIT :limit)
{{claim_returning}}

-- name: job_any_ready
-- The read before a claim where an empty claim costs a write lock (Dialect.claim_precheck).
SELECT 1 FROM justonce_jobs WHERE state = 'ready' AND queue = :queue AND partition_hash IS NULL
   AND NOT EXISTS (SELECT 1 FROM justonce_queue_pauses p WHERE p.queue = :queue)
 LIMIT 1

-- name: job_complete_many
-- :ids, :tokens, :results (JSON text or null), :notes (or null): JSON arrays, aligned. One
-- statement for the whole batch keeps the write lock short.
UPDATE justonce_jobs
   SET state = 'succeeded', result = d.result, last_error = COALESCE(d.note, last_error),
       finished_at = NOW(), lease_owner = NULL, lease_expires_at = NULL
  FROM (SELECT i.value AS id, t.value AS token, r.value AS result, n.value AS note
          FROM json_each(:ids) i
          JOIN json_each(:tokens) t ON t.key = i.key
          JOIN json_each(:results) r ON r.key = i.key
          JOIN json_each(:notes) n ON n.key = i.key) AS d
 WHERE justonce_jobs.id = d.id AND justonce_jobs.lease_token = d.token
   AND justonce_jobs.state = 'running'
RETURNING justonce_jobs.id

-- name: job_fail
UPDATE justonce_jobs
   SET state = CASE WHEN :retry_in IS NULL OR attempts >= max_attempts THEN 'dead'
                    WHEN :retry_in > 0 THEN 'scheduled'
                    ELSE 'ready' END,
       run_at = CASE WHEN :retry_in IS NULL OR attempts >= max_attempts THEN run_at
                     ELSE NOW() + :retry_in END,
       finished_at = CASE WHEN :retry_in IS NULL OR attempts >= max_attempts THEN NOW() END,
       last_error = :error,
       errors = json_insert(errors, '$[#]', json_object(
                    'attempt', attempts, 'at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), 'kind', :kind,
                    'error', :error, 'owner', lease_owner,
                    'retry_in', CASE WHEN attempts < max_attempts THEN :retry_in END)),
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id = :id AND lease_token = :token AND state = 'running'
RETURNING state

-- name: job_settled
-- :ids and :tokens: JSON arrays, aligned.
-- A worker whose write raised (its connection broke, perhaps after the COMMIT, before the
-- reply) and whose retry was refused asks which of its (id, token) pairs an earlier try did
-- settle: lease_token is the job's own count of claims, so a row that still carries the
-- token and is no longer running was last leased by that claim. A plain read: such a row
-- changes only by a later claim (a new token), an operator, or its pruning.
SELECT j.id, j.state, j.attempts, j.last_error
  FROM json_each(:ids) i
  JOIN json_each(:tokens) t ON t.key = i.key
  JOIN justonce_jobs j ON j.id = i.value
 WHERE j.lease_token = t.value AND j.state <> 'running'

-- name: job_heartbeat
-- :ids and :tokens: JSON arrays, aligned.
UPDATE justonce_jobs
   SET lease_expires_at = NOW() + :lease
 WHERE state = 'running'
   AND (id, lease_token) IN (SELECT i.value, t.value FROM json_each(:ids) i
                               JOIN json_each(:tokens) t ON t.key = i.key)
RETURNING id

-- name: job_release
UPDATE justonce_jobs
   SET state = 'ready',
       attempts = CASE WHEN :refund THEN max(attempts - 1, 0) ELSE attempts END,
       lease_owner = NULL, lease_expires_at = NULL
 WHERE state = 'running'
   AND (id, lease_token) IN (SELECT i.value, t.value FROM json_each(:ids) i
                               JOIN json_each(:tokens) t ON t.key = i.key)
RETURNING id

-- name: job_cancel
UPDATE justonce_jobs
   SET state = 'cancelled', finished_at = NOW(), lease_owner = NULL, lease_expires_at = NULL
 WHERE id = :id AND state IN ('scheduled','ready','running')
RETURNING *

-- name: job_retry
UPDATE justonce_jobs
   SET state = 'ready', attempts = 0, run_at = NOW(), finished_at = NULL,
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id = :id AND state IN ('dead','cancelled')
RETURNING *

-- name: jobs_promote
UPDATE justonce_jobs SET state = 'ready'
 WHERE id IN (SELECT id FROM justonce_jobs
               WHERE state = 'scheduled' AND run_at <= NOW()
               ORDER BY run_at LIMIT :limit)
RETURNING id

-- name: jobs_any_expired
-- Housekeeping's first look: almost always nothing expired, and then no write lock is taken.
SELECT 1 FROM justonce_jobs WHERE state = 'running' AND lease_expires_at < NOW() LIMIT 1

-- name: jobs_rescue
UPDATE justonce_jobs
   SET state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'ready' END,
       finished_at = CASE WHEN attempts >= max_attempts THEN NOW() END,
       last_error = 'lease expired: worker ' || coalesce(lease_owner, '?')
                    || ' stopped renewing it during attempt ' || attempts,
       errors = json_insert(errors, '$[#]', json_object(
                    'attempt', attempts, 'at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), 'kind', 'lease_expired',
                    'error', 'lease expired', 'owner', lease_owner)),
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id IN (SELECT id FROM justonce_jobs
               WHERE state = 'running' AND lease_expires_at < NOW()
               ORDER BY lease_expires_at LIMIT :limit)
RETURNING state, batch_item

-- name: jobs_prune
DELETE FROM justonce_jobs
 WHERE id IN (SELECT id FROM justonce_jobs
               WHERE (state IN ('succeeded','cancelled') AND finished_at < NOW() - :keep_succeeded)
                  OR (state = 'dead' AND finished_at < NOW() - :keep_dead)
               LIMIT :limit)
RETURNING id

-- name: queue_counts
SELECT queue, state, count(*) FROM justonce_jobs GROUP BY queue, state ORDER BY queue, state

-- name: queue_pause
-- Pause :queue: a no-op when it is paused already (the first pause's time, actor and note
-- stay). queue_pause_get then reads the pause in force, in the same transaction.
INSERT INTO justonce_queue_pauses (queue, paused_at, actor, note) VALUES (:queue, NOW(), :actor, :note)
ON CONFLICT (queue) DO NOTHING
RETURNING queue

-- name: queue_pause_get
SELECT queue, paused_at, actor, note FROM justonce_queue_pauses WHERE queue = :queue

-- name: queue_resume
-- Resume :queue (no row: it was not paused). Idle workers see the commit (data_version).
DELETE FROM justonce_queue_pauses WHERE queue = :queue RETURNING queue

-- name: database_mark
-- dialect-only: each dialect reads its own mark (Dialect.database_mark)
-- Which file a connection reaches (Dialect.same_database): no read of the file itself,
-- so no snapshot taken before the caller's first write.
PRAGMA database_list;

-- name: queue_pauses
SELECT queue, paused_at, actor, note FROM justonce_queue_pauses ORDER BY queue

-- name: maintenance_try
-- next_run_at holds when the last round began: see the PostgreSQL file.
INSERT INTO justonce_maintenance (name, next_run_at, last_owner)
VALUES (:name, NOW(), :owner)
ON CONFLICT (name) DO UPDATE
   SET next_run_at = excluded.next_run_at, last_owner = excluded.last_owner
 WHERE justonce_maintenance.next_run_at <= NOW() - :interval
RETURNING name

-- Batches. The algorithm is shared by every dialect (backends/batchstore.py); these
-- statements are its SQLite dialect. List parameters are JSON documents.

-- name: batch_open
INSERT INTO justonce_batches (state, description, callbacks, expire_after, created_at, updated_at)
VALUES ('open', :description, :callbacks, :expire_after, NOW(), NOW())
RETURNING id

-- name: batch_state
SELECT state FROM justonce_batches WHERE id = :id

-- name: batch_add
UPDATE justonce_batches
   SET total = total + :count, groups = groups + 1, updated_at = NOW()
 WHERE id = :id AND state = 'open'
RETURNING id

-- name: batch_chunks_insert
INSERT INTO justonce_batch_chunks (batch_id, group_id, chunk, size, pending, bits, updated_at)
SELECT :id, :group_id, s.key, s.value, s.value, zeroblob((s.value + 7) / 8), NOW()
  FROM json_each(:sizes) AS s

-- name: batch_seal
UPDATE justonce_batches SET state = 'sealed', sealed_at = NOW(), updated_at = NOW()
 WHERE id = :id AND state = 'open'
RETURNING id

-- name: batch_chunks_lock
-- dialect-only: bits set in Python (Dialect.flip's default)
-- The write transaction (BEGIN IMMEDIATE) already excludes every other writer.
-- A join on all three key columns, so each key is one look-up in the unique index.
SELECT c.batch_id, c.group_id, c.chunk, c.size, c.pending, c.bits, b.state
  FROM json_each(:keys) AS k
  JOIN justonce_batch_chunks c
    ON c.batch_id = json_extract(k.value, '$[0]') AND c.group_id = json_extract(k.value, '$[1]')
   AND c.chunk = json_extract(k.value, '$[2]')
  JOIN justonce_batches b ON b.id = c.batch_id
 ORDER BY c.batch_id, c.group_id, c.chunk

-- name: batch_chunk_update
-- dialect-only: bits set in Python (Dialect.flip's default)
-- Run once per chunk that changed.
UPDATE justonce_batch_chunks
   SET bits = :bits, pending = :pending, updated_at = NOW()
 WHERE batch_id = :batch_id AND group_id = :group_id AND chunk = :chunk

-- name: batch_failure_insert
INSERT INTO justonce_batch_failures (batch_id, item, reason, failed_at)
VALUES (:batch_id, :item, :reason, NOW())
ON CONFLICT DO NOTHING

-- name: batch_group_size
SELECT sum(size) FROM justonce_batch_chunks WHERE batch_id = :id AND group_id = :group_id

-- name: batch_lock
SELECT id, state, description, callbacks, total FROM justonce_batches
 WHERE id IN (SELECT value FROM json_each(:ids))
 ORDER BY id

-- name: batch_pending
SELECT DISTINCT batch_id FROM justonce_batch_chunks
 WHERE batch_id IN (SELECT value FROM json_each(:ids)) AND pending > 0

-- name: batch_failure_counts
SELECT batch_id, count(*) FROM justonce_batch_failures
 WHERE batch_id IN (SELECT value FROM json_each(:ids))
 GROUP BY batch_id

-- name: batch_complete
UPDATE justonce_batches
   SET state = 'completed', finished_at = NOW(), updated_at = NOW(),
       acked = :acked, failed = :failed
 WHERE id = :id AND state = 'sealed'

-- name: batch_get
SELECT b.id, b.state, b.description, b.callbacks, b.total, b.groups, b.expire_after,
       b.created_at, b.updated_at, b.sealed_at, b.finished_at,
       COALESCE((SELECT sum(pending) FROM justonce_batch_chunks c WHERE c.batch_id = b.id), 0),
       (SELECT count(*) FROM justonce_batch_failures f WHERE f.batch_id = b.id)
  FROM justonce_batches b
 WHERE b.id = :id

-- name: batch_list
SELECT b.id, b.state, b.description, b.callbacks, b.total, b.groups, b.expire_after,
       b.created_at, b.updated_at, b.sealed_at, b.finished_at,
       COALESCE((SELECT sum(pending) FROM justonce_batch_chunks c WHERE c.batch_id = b.id), 0),
       (SELECT count(*) FROM justonce_batch_failures f WHERE f.batch_id = b.id)
  FROM justonce_batches b
 WHERE :state IS NULL OR b.state = :state
 ORDER BY b.id DESC
 LIMIT :limit

-- name: batch_failures
SELECT item, reason, failed_at FROM justonce_batch_failures
 WHERE batch_id = :id
 ORDER BY failed_at, item
 LIMIT :limit

-- name: batches_expire
-- Orphans: open batches with no add or ack for their expire_after. (A sealed batch waits
-- for its items, however long their jobs are delayed or backed off.)
UPDATE justonce_batches
   SET state = 'expired', finished_at = NOW()
 WHERE id IN (
        SELECT x.id FROM justonce_batches x
         WHERE x.state = 'open'
           AND x.updated_at < NOW() - x.expire_after
           AND NOT EXISTS (SELECT 1 FROM justonce_batch_chunks c
                            WHERE c.batch_id = x.id AND c.updated_at >= NOW() - x.expire_after)
         ORDER BY x.updated_at
         LIMIT :limit)
RETURNING id

-- name: batches_old
SELECT id FROM justonce_batches
 WHERE state IN ('completed','expired') AND finished_at <= NOW() - :retention
 ORDER BY finished_at
 LIMIT :limit

-- name: batch_delete_chunks
DELETE FROM justonce_batch_chunks WHERE batch_id = :id

-- name: batch_delete_failures
DELETE FROM justonce_batch_failures WHERE batch_id = :id

-- name: batch_delete
DELETE FROM justonce_batches WHERE id = :id

-- Partition leases (every write runs in BEGIN IMMEDIATE: acquires take turns).

-- name: lease_set_lock
INSERT INTO justonce_partition_sets (set_name, n, updated_at) VALUES (:set, :n, NOW())
ON CONFLICT (set_name) DO UPDATE SET updated_at = NOW()
RETURNING n

-- name: lease_set_held
SELECT count(*) FROM justonce_partition_leases
 WHERE set_name = :set AND owner IS NOT NULL AND expires_at > NOW()

-- name: lease_set_fence_all
-- A new n: every slot's token moves on (see the PostgreSQL twin).
UPDATE justonce_partition_leases SET owner = NULL, expires_at = NULL, token = token + 1
 WHERE set_name = :set
RETURNING slot

-- name: lease_set_resize
UPDATE justonce_partition_sets SET n = :n, updated_at = NOW() WHERE set_name = :set
RETURNING n

-- name: lease_slots_ensure
WITH RECURSIVE s(slot) AS (SELECT 0 UNION ALL SELECT slot + 1 FROM s WHERE slot + 1 < :n)
INSERT INTO justonce_partition_leases (set_name, slot) SELECT :set, slot FROM s WHERE true
ON CONFLICT DO NOTHING
RETURNING slot

-- name: lease_take
UPDATE justonce_partition_leases
   SET owner = :owner, token = token + 1, expires_at = NOW() + :lease,
       acquired_at = NOW(), renewed_at = NOW()
 WHERE set_name = :set
   AND slot = (SELECT slot FROM justonce_partition_leases
                WHERE set_name = :set AND slot < :n AND (owner IS NULL OR expires_at <= NOW())
                ORDER BY slot
                LIMIT 1)
RETURNING slot, token, expires_at

-- name: lease_hold
-- (see the PostgreSQL twin: SQLite's write transaction already holds the file, so this
-- only reads whether the lease looked live)
SELECT slot FROM justonce_partition_leases
 WHERE set_name = :set AND slot = :slot AND token = :token AND owner IS NOT NULL
   AND expires_at > NOW()

-- name: lease_renew
-- Only a live lease is renewed (see the PostgreSQL twin).
UPDATE justonce_partition_leases SET expires_at = NOW() + :lease, renewed_at = NOW()
 WHERE set_name = :set AND slot = :slot AND token = :token AND owner IS NOT NULL
   AND expires_at > NOW()
RETURNING expires_at

-- name: lease_release
UPDATE justonce_partition_leases SET owner = NULL, expires_at = NULL
 WHERE set_name = :set AND slot = :slot AND token = :token AND owner IS NOT NULL
RETURNING slot

-- name: lease_fence
-- In the caller's write transaction no takeover can commit before it ends.
SELECT 1 FROM justonce_partition_leases
 WHERE set_name = :set AND slot = :slot AND token = :token AND owner IS NOT NULL
   AND expires_at > NOW()

-- name: lease_list
SELECT l.set_name, s.n, l.slot, l.owner, l.token, l.expires_at,
       (l.owner IS NOT NULL AND l.expires_at > NOW())
  FROM justonce_partition_leases l
  JOIN justonce_partition_sets s ON s.set_name = l.set_name
 WHERE (:set IS NULL OR l.set_name = :set) AND l.slot < s.n
 ORDER BY l.set_name, l.slot

-- Effects ("just once"). Claims run in BEGIN IMMEDIATE, whose write lock is the row lock.

-- name: effect_ensure
INSERT INTO justonce_effects (scope, key, state, policy, created_at, updated_at)
VALUES (:scope, :key, 'pending', :policy, NOW(), NOW())
ON CONFLICT (scope, key) DO NOTHING

-- name: effect_lock
-- The entry and the chunk of run_many that holds it, if one does (the entry's state is
-- then the chunk's: see the PostgreSQL file).
SELECT state, policy, token, (lease_expires_at <= NOW()) AS expired, chunk_id
  FROM justonce_effects WHERE scope = :scope AND key = :key

-- name: effect_take
UPDATE justonce_effects
   SET state = 'running', token = token + 1, owner = :owner, attempts = attempts + 1,
       lease_expires_at = NOW() + :lease, updated_at = NOW(), chunk_id = NULL
 WHERE scope = :scope AND key = :key
RETURNING token

-- name: effect_done
UPDATE justonce_effects
   SET state = 'done', done_at = NOW(), updated_at = NOW(), lease_expires_at = NULL,
       result = :result
 WHERE scope = :scope AND key = :key AND token = :token AND state = 'running'
   AND chunk_id IS NULL
RETURNING 1

-- name: effect_release
UPDATE justonce_effects
   SET state = 'pending', updated_at = NOW(), lease_expires_at = NULL, last_error = :error
 WHERE scope = :scope AND key = :key AND token = :token AND state = 'running'
   AND chunk_id IS NULL
RETURNING 1

-- name: effect_resolve_lock
-- The running entries among :keys (one writer at a time: no lock order to keep): (key,
-- lease expired, the chunk that holds it).
SELECT key, (lease_expires_at <= NOW()), chunk_id
  FROM justonce_effects
 WHERE scope = :scope AND key IN (SELECT value FROM json_each(:keys)) AND state = 'running'
 ORDER BY key

-- name: effect_resolve_set
-- An operator's verdict on the entries picked (in doubt, or running with force): done, or
-- pending (to be redone), on each entry itself.
UPDATE justonce_effects
   SET state = :state, updated_at = NOW(), lease_expires_at = NULL, chunk_id = NULL,
       done_at = CASE WHEN :state = 'done' THEN NOW() END,
       last_error = COALESCE(:note, last_error)
 WHERE scope = :scope AND key IN (SELECT value FROM json_each(:keys)) AND state = 'running'
RETURNING key

-- name: effect_columns
-- (A fragment of effect_get and effects_list: an entry as its chunk makes it, e the entry,
-- c its chunk or NULLs.)
e.scope, e.key, CASE WHEN c.state = 'done' THEN 'done' ELSE e.state END, e.policy,
       e.token, e.owner, e.attempts,
       CASE WHEN c.state = 'done' THEN NULL ELSE COALESCE(e.lease_expires_at, c.lease_expires_at) END,
       e.last_error, COALESCE(e.result, c.result), e.created_at, COALESCE(c.done_at, e.updated_at),
       COALESCE(e.done_at, c.done_at),
       (e.state = 'running' AND COALESCE(c.state, '') <> 'done'
        AND COALESCE(e.lease_expires_at, c.lease_expires_at) <= NOW())

-- name: effect_get
SELECT {{effect_columns}}
  FROM justonce_effects e LEFT JOIN justonce_effect_chunks c ON c.id = e.chunk_id
 WHERE e.scope = :scope AND e.key = :key

-- name: effects_in_doubt
-- Entries in doubt: those whose own lease ran out while running, and those held by a
-- chunk whose lease ran out before it was done (the chunk's lease is theirs).
SELECT * FROM (
    SELECT scope, key, state, policy, token, owner, attempts, lease_expires_at, last_error,
           result, created_at, updated_at, done_at, 1
      FROM justonce_effects
     WHERE state = 'running' AND lease_expires_at <= NOW()
       AND (:scope IS NULL OR scope = :scope)
    UNION ALL
    SELECT e.scope, e.key, e.state, e.policy, e.token, e.owner, e.attempts, c.lease_expires_at,
           e.last_error, e.result, e.created_at, e.updated_at, e.done_at, 1
      FROM justonce_effect_chunks c JOIN justonce_effects e ON e.chunk_id = c.id
     WHERE c.state = 'running' AND c.lease_expires_at <= NOW()
       AND (:scope IS NULL OR c.scope = :scope)
) ORDER BY 8
 LIMIT :limit

-- name: effects_list
-- A page of a scope by key: the keys after :after ('' when it is NULL: every key is
-- non-empty), a range of the primary key, so a page deep in a big scope costs what the
-- first one does (an `IS NULL OR key >` form left SQLite filtering the whole scope).
SELECT {{effect_columns}}
  FROM justonce_effects e LEFT JOIN justonce_effect_chunks c ON c.id = e.chunk_id
 WHERE e.scope = :scope
   AND (:state IS NULL OR (CASE WHEN c.state = 'done' THEN 'done' ELSE e.state END) = :state)
   AND e.key > COALESCE(:after, '')
 ORDER BY e.key
 LIMIT :limit

-- name: effects_count
-- Counted per (state, chunk) first: a chunk's entries take their state from one look-up.
SELECT CASE WHEN c.state = 'done' THEN 'done' ELSE g.state END,
       (g.state = 'running' AND COALESCE(c.state, '') <> 'done'
        AND COALESCE(g.lease_expires_at, c.lease_expires_at) <= NOW()),
       sum(g.n)
  FROM (SELECT state, chunk_id, lease_expires_at, count(*) AS n
          FROM justonce_effects WHERE scope = :scope
         GROUP BY state, chunk_id, lease_expires_at) g
  LEFT JOIN justonce_effect_chunks c ON c.id = g.chunk_id
 GROUP BY 1, 2

-- Effects in bulk (Effects.run_many): per chunk, one claim transaction (the chunk's row,
-- ensure, lock, take) and one finishing transaction. :keys arrive as a JSON list sorted by
-- key; BEGIN IMMEDIATE's write lock stands for the rows' locks, so the order matters only
-- on the other dialects. The entries a chunk claims point at its row (chunk_id) and have
-- no lease of their own: the chunk's lease is theirs, and its done mark is theirs.

-- name: effect_chunk_open
INSERT INTO justonce_effect_chunks (scope, state, lease_expires_at, created_at)
VALUES (:scope, 'running', NOW() + :lease, NOW())
RETURNING id

-- name: effect_chunk_drop
-- A chunk that claimed nothing.
DELETE FROM justonce_effect_chunks WHERE id = :chunk RETURNING id

-- name: effect_chunks_read
-- Chunks by id: (id, state, lease expired).
SELECT id, state, (lease_expires_at <= NOW())
  FROM justonce_effect_chunks WHERE id IN (SELECT value FROM json_each(:ids))

-- name: effect_chunks_share
-- Chunks by id (their share lock, on the other dialects): (id, state, lease expired).
SELECT id, state, (lease_expires_at <= NOW())
  FROM justonce_effect_chunks WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id

-- name: effect_chunk_done
-- The chunk's done mark, with the result its entries share.
UPDATE justonce_effect_chunks SET state = 'done', done_at = NOW(), result = :result
 WHERE id = :chunk AND scope = :scope AND state = 'running'
RETURNING 1

-- name: effect_chunk_keys
-- The entries a chunk still holds (none taken over by another claim or an operator), with
-- their tokens.
SELECT key, token FROM justonce_effects WHERE chunk_id = :chunk AND scope = :scope

-- name: effect_chunk_held
-- How many entries a chunk still holds.
SELECT count(*) FROM justonce_effects WHERE chunk_id = :chunk AND scope = :scope

-- name: effect_claim_new_many
-- The missing entries of the chunk, inserted already claimed (running, token 1) by it, in
-- one statement; returns the keys inserted (the others exist and go through lock and take).
-- (WHERE true: SQLite's parser would otherwise read ON CONFLICT as a join constraint.)
INSERT INTO justonce_effects (scope, key, state, policy, token, owner, attempts, chunk_id,
                              created_at, updated_at)
SELECT :scope, value, 'running', :policy, 1, :owner, 1, :chunk, NOW(), NOW()
  FROM json_each(:keys) WHERE true
ON CONFLICT (scope, key) DO NOTHING
RETURNING key, token

-- name: effect_lock_many
-- "Check state" for the chunk, as effect_lock reads it (then effect_chunks_read). Done entries are left out (a key
-- missing from the answer is done), and so are those of chunks that are done: a re-run
-- over a finished scope then reads rather than locks on every dialect; those of another
-- policy come back anyway, so that the caller refuses the chunk.
SELECT e.key, e.state, e.policy, e.token, (e.lease_expires_at <= NOW()), e.chunk_id
  FROM justonce_effects e LEFT JOIN justonce_effect_chunks c ON c.id = e.chunk_id
 WHERE e.scope = :scope AND e.key IN (SELECT value FROM json_each(:keys))
   AND ((e.state <> 'done' AND COALESCE(c.state, '') <> 'done') OR e.policy <> :policy)
 ORDER BY e.key

-- name: effect_take_many
-- "Change state": the claimable keys of the chunk (all locked by this transaction), each
-- with a new token, held by the chunk.
UPDATE justonce_effects
   SET state = 'running', token = token + 1, owner = :owner, attempts = attempts + 1,
       lease_expires_at = NULL, chunk_id = :chunk, updated_at = NOW()
 WHERE scope = :scope AND key IN (SELECT value FROM json_each(:keys))
RETURNING key, token

-- name: effect_finish_many
-- Entries of a chunk marked one by one (results that differ, or failures released):
-- :rows is one JSON list of [key, token, result, error] (result: JSON text or null; error:
-- null when fn returned, so done; text when fn raised, so pending again). Fenced by each
-- key's token and the chunk: a key whose claim was taken over is not in the answer. Each
-- entry marked leaves the chunk. Shape: the rows are read once into a materialised table,
-- which then drives primary-key look-ups. Joined to the ledger directly, the planner walked
-- the whole scope and the list for each entry (22 ms a chunk of 500 in a 5,000-entry
-- scope, growing with it); four parallel lists joined on their positions compared every
-- row with every row (54 ms). Now ~3 ms, the 500 updates included.
WITH d AS MATERIALIZED (
    SELECT json_extract(r.value, '$[0]') AS key, json_extract(r.value, '$[1]') AS token,
           json_extract(r.value, '$[2]') AS result, json_extract(r.value, '$[3]') AS error
      FROM json_each(:rows) r
)
UPDATE justonce_effects
   SET state = CASE WHEN d.error IS NULL THEN 'done' ELSE 'pending' END,
       done_at = CASE WHEN d.error IS NULL THEN NOW() END,
       result = CASE WHEN d.error IS NULL THEN d.result ELSE justonce_effects.result END,
       last_error = COALESCE(d.error, justonce_effects.last_error),
       updated_at = NOW(), lease_expires_at = NULL, chunk_id = NULL
  FROM d
 WHERE justonce_effects.scope = :scope AND justonce_effects.key = d.key
   AND justonce_effects.token = d.token AND justonce_effects.state = 'running'
   AND justonce_effects.chunk_id = :chunk
RETURNING justonce_effects.key, justonce_effects.state

-- Dashboard (backends/dashstore.py, web/snapshot.py): see the PostgreSQL file. SQLite has
-- no planner row estimate; the span of ids (two rowid look-ups) stands in for one.

-- name: dash_jobs_estimate
SELECT COALESCE((SELECT max(id) FROM justonce_jobs) - (SELECT min(id) FROM justonce_jobs) + 1, 0)

-- name: dash_counts_exact
SELECT queue, state, count(*) FROM (SELECT queue, state FROM justonce_jobs LIMIT :cap)
 GROUP BY queue, state

-- SQLite keeps no per-value statistics (sqlite_stat1 has averages per index prefix, not
-- counts per state): the sample below stands in for them, always.
-- name: dash_counts_estimated
SELECT NULL, NULL, 0 WHERE 0

-- name: dash_counts_sample
SELECT queue, state, count(*)
  FROM (SELECT queue, state FROM justonce_jobs ORDER BY id DESC LIMIT :cap)
 GROUP BY queue, state

-- name: dash_counts_running
SELECT queue, 'running', count(*) FROM justonce_jobs WHERE state = 'running' GROUP BY queue

-- name: dash_counts_capped
SELECT queue, state, count(*) FROM (
    SELECT * FROM (SELECT queue, state FROM justonce_jobs WHERE state = 'scheduled'
                    ORDER BY run_at LIMIT :cap)
    UNION ALL
    SELECT * FROM (SELECT queue, 'dead' AS state FROM justonce_jobs WHERE state = 'dead'
                    ORDER BY finished_at LIMIT :cap)
) GROUP BY queue, state

-- One descent of each claim index per queue (at most :limit queues).
-- name: dash_ready_queues
WITH RECURSIVE plain(queue, n) AS (
    SELECT (SELECT queue FROM justonce_jobs
             WHERE state = 'ready' AND partition_hash IS NULL ORDER BY queue LIMIT 1), 1
    UNION ALL
    SELECT (SELECT j.queue FROM justonce_jobs j
             WHERE j.state = 'ready' AND j.partition_hash IS NULL AND j.queue > p.queue
             ORDER BY j.queue LIMIT 1), p.n + 1
      FROM plain p WHERE p.queue IS NOT NULL AND p.n < :limit
), parted(queue, n) AS (
    SELECT (SELECT queue FROM justonce_jobs
             WHERE state = 'ready' AND partition_hash IS NOT NULL ORDER BY queue LIMIT 1), 1
    UNION ALL
    SELECT (SELECT j.queue FROM justonce_jobs j
             WHERE j.state = 'ready' AND j.partition_hash IS NOT NULL AND j.queue > p.queue
             ORDER BY j.queue LIMIT 1), p.n + 1
      FROM parted p WHERE p.queue IS NOT NULL AND p.n < :limit
)
SELECT queue FROM plain WHERE queue IS NOT NULL
UNION
SELECT queue FROM parted WHERE queue IS NOT NULL

-- name: dash_count_ready
SELECT q.value,
       (SELECT count(*) FROM (
           SELECT * FROM (SELECT 1 FROM justonce_jobs
                           WHERE state = 'ready' AND partition_hash IS NULL AND queue = q.value
                           ORDER BY priority, id LIMIT :cap)
           UNION ALL
           SELECT * FROM (SELECT 1 FROM justonce_jobs
                           WHERE state = 'ready' AND partition_hash IS NOT NULL AND queue = q.value
                           ORDER BY id LIMIT :cap)
           LIMIT :cap))
  FROM json_each(:queues) AS q

-- name: dash_finished_since
SELECT CAST(finished_at AS INTEGER), state, count(*)
  FROM justonce_jobs
 WHERE finished_at >= :since AND state IN ('succeeded','dead')
   AND state IN ('succeeded','dead','cancelled')  -- the finished index's own condition
 GROUP BY 1, 2

-- name: dash_clock
SELECT NOW()

-- name: dash_running
SELECT id, queue, task, state, attempts, max_attempts, lease_owner, lease_expires_at,
       started_at, finished_at, last_error
  FROM justonce_jobs WHERE state = 'running'
 ORDER BY lease_expires_at
 LIMIT :limit

-- name: dash_dead
SELECT id, queue, task, state, attempts, max_attempts, lease_owner, lease_expires_at,
       started_at, finished_at, last_error
  FROM justonce_jobs WHERE state = 'dead'
 ORDER BY finished_at DESC
 LIMIT :limit

-- name: db_now
SELECT NOW()

-- Metrics

-- name: metrics_snapshot
-- See the PostgreSQL twin. SQLite reads the heads off the claim indexes (a covering scan
-- of the ready entries, no table rows), then looks up only the heads' run_at.
SELECT j.queue, MAX(NOW() - j.run_at)
  FROM justonce_jobs j
 WHERE j.id IN (SELECT min(id) FROM justonce_jobs
                 WHERE state = 'ready' AND partition_hash IS NULL GROUP BY queue, priority
                UNION ALL
                SELECT min(id) FROM justonce_jobs
                 WHERE state = 'ready' AND partition_hash IS NOT NULL GROUP BY queue)
   AND j.state = 'ready'
 GROUP BY j.queue
UNION ALL
SELECT NULL, count(*) FROM justonce_batches WHERE state IN ('open', 'sealed')
-- Service: tokens and audit --------------------------------------------------------------

-- name: token_create
INSERT INTO justonce_api_tokens (name, scope, secret_hash, prefix, created_at)
VALUES (:name, :scope, :secret_hash, :prefix, NOW())
RETURNING id, name, scope, prefix, created_at, last_used_at, revoked_at

-- name: token_find_by_hash
-- The UNIQUE index on secret_hash finds the row; tokens.py compares the hash again in
-- constant time.
SELECT id, name, scope, prefix, created_at, last_used_at, revoked_at, secret_hash
  FROM justonce_api_tokens WHERE secret_hash = :secret_hash

-- name: token_get
SELECT id, name, scope, prefix, created_at, last_used_at, revoked_at
  FROM justonce_api_tokens WHERE id = :id

-- name: token_list
SELECT id, name, scope, prefix, created_at, last_used_at, revoked_at
  FROM justonce_api_tokens ORDER BY id

-- name: token_revoke
UPDATE justonce_api_tokens SET revoked_at = NOW()
 WHERE id = :id AND revoked_at IS NULL
RETURNING id

-- name: token_touch
-- At most one write a minute per token: the condition makes the other calls no-ops.
UPDATE justonce_api_tokens SET last_used_at = NOW()
 WHERE id = :id AND (last_used_at IS NULL OR last_used_at < NOW() - 60)
RETURNING id

-- name: audit_record
INSERT INTO justonce_audit (at, token_id, actor, action, target, count, detail)
VALUES (NOW(), :token_id, :actor, :action, :target, :count, :detail)
RETURNING id

-- name: audit_list
SELECT id, at, token_id, actor, action, target, count, detail
  FROM justonce_audit
 WHERE (:cursor IS NULL OR id < :cursor)
 ORDER BY id DESC
 LIMIT :limit

-- Service: job listings with filters, and actions on all matching jobs --------------------

-- name: job_filter
-- (A fragment: the filters of a listing, over the alias j.) The time bounds come as the
-- smallest epoch seconds shown at or after them (SQLiteDialect.at_bound).
(:state IS NULL OR j.state = :state)
   AND (:queue IS NULL OR j.queue = :queue)
   AND (:task IS NULL OR j.task = :task)
   AND (:created_after IS NULL OR j.created_at >= :created_after)
   AND (:created_before IS NULL OR j.created_at < :created_before)
   AND (:max_id IS NULL OR j.id <= :max_id)

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
 WHERE {{job_filter}} AND (:cursor IS NULL OR j.id < :cursor)
 ORDER BY j.id DESC
 LIMIT :limit

-- name: jobs_count_cancel
SELECT count(*), max(j.id) FROM justonce_jobs j WHERE {{match_cancel}}

-- name: jobs_count_retry
SELECT count(*), max(j.id) FROM justonce_jobs j WHERE {{match_retry}}

-- name: jobs_cancel_matching
UPDATE justonce_jobs
   SET state = 'cancelled', finished_at = NOW(), lease_owner = NULL, lease_expires_at = NULL
 WHERE id IN (SELECT j.id FROM justonce_jobs j WHERE {{match_cancel}} AND j.id > :after
                ORDER BY j.id LIMIT :limit)
RETURNING id, batch_item

-- name: jobs_retry_matching
UPDATE justonce_jobs
   SET state = 'ready', attempts = 0, run_at = NOW(), finished_at = NULL,
       lease_owner = NULL, lease_expires_at = NULL
 WHERE id IN (SELECT j.id FROM justonce_jobs j WHERE {{match_retry}} AND j.id > :after
                ORDER BY j.id LIMIT :limit)
RETURNING id

-- name: queue_heads
-- The ready job each queue hands out next: the head of the claim index (lowest priority,
-- then id) and the oldest partitioned ready job, whichever waited longer (one descent of
-- each partial index per queue; see the Postgres file).
SELECT h.q, NOW() - min(coalesce(h.a, h.b), coalesce(h.b, h.a))
  FROM (SELECT q.value AS q,
               (SELECT j.run_at FROM justonce_jobs j
                 WHERE j.state = 'ready' AND j.partition_hash IS NULL AND j.queue = q.value
                 ORDER BY j.priority, j.id LIMIT 1) AS a,
               (SELECT j.run_at FROM justonce_jobs j
                 WHERE j.state = 'ready' AND j.partition_hash IS NOT NULL AND j.queue = q.value
                 ORDER BY j.id LIMIT 1) AS b
          FROM json_each(:queues) q) h

-- Lists (backends/liststore.py; see the PostgreSQL queries). A reservation row's columns: id, list_id,
-- secret, request_id, state, due_at, ranges, held, pending, attempt, ttr, error, created_at,
-- and whether its time has come by the database's clock (expired).

-- name: list_create
INSERT INTO justonce_lists (name, task, state, ttr, max_attempts, callbacks, created_at)
VALUES (:name, :task, 'loading', :ttr, :max_attempts, :callbacks, NOW())
RETURNING id

-- name: list_lock
SELECT id, state, total, next_position, ttr, max_attempts, batch_id, group_id
  FROM justonce_lists WHERE name = :name

-- name: list_task
-- What run_next needs of a list, read without the progress sums of list_get.
SELECT task, max_attempts FROM justonce_lists WHERE name = :name

-- name: list_callbacks
SELECT callbacks FROM justonce_lists WHERE id = :id

-- name: list_item_insert
INSERT INTO justonce_list_items (list_id, position, item) VALUES (:list_id, :position, :item)

-- name: list_grow
UPDATE justonce_lists SET total = :total WHERE id = :id

-- name: list_seal
UPDATE justonce_lists
   SET state = 'sealed', sealed_at = NOW(), batch_id = :batch_id, group_id = :group_id
 WHERE id = :id

-- name: list_finish
UPDATE justonce_lists SET state = 'completed', finished_at = NOW()
 WHERE batch_id = :batch_id AND state = 'sealed'

-- name: list_advance
UPDATE justonce_lists SET next_position = :next_position WHERE id = :id

-- name: list_drop_items
DELETE FROM justonce_list_items WHERE list_id = :id

-- name: list_drop_reservations
DELETE FROM justonce_list_reservations WHERE list_id = :id

-- name: list_drop
DELETE FROM justonce_lists WHERE id = :id

-- name: list_due
-- The oldest row whose time has come (an active one past its TTR, a free one past its
-- delay). The write transaction excludes every other writer.
SELECT id, list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr,
       error, created_at, true AS expired
  FROM justonce_list_reservations
 WHERE list_id = :list_id AND due_at <= NOW()
 ORDER BY due_at
 LIMIT 1

-- name: list_reservation_insert
INSERT INTO justonce_list_reservations
       (list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr, error,
        created_at, updated_at)
VALUES (:list_id, :secret, :request_id, :state, NOW() + :due_in, :ranges, :held, :pending,
        :attempt, :ttr, :error, NOW(), NOW())
RETURNING id, due_at

-- name: list_reservation_by_request
SELECT r.id, r.list_id, r.secret, r.request_id, r.state, r.due_at, r.ranges, r.held, r.pending,
       r.attempt, r.ttr, r.error, r.created_at, coalesce(r.due_at <= NOW(), false) AS expired
  FROM justonce_lists l
  JOIN justonce_list_reservations r ON r.list_id = l.id AND r.request_id = :request_id
 WHERE l.name = :name

-- name: list_reservation_lock
SELECT r.id, r.list_id, r.secret, r.request_id, r.state, r.due_at, r.ranges, r.held, r.pending,
       r.attempt, r.ttr, r.error, r.created_at, coalesce(r.due_at <= NOW(), false) AS expired,
       l.id, l.state, l.total, l.next_position, l.ttr, l.max_attempts, l.batch_id, l.group_id
  FROM justonce_list_reservations r
  JOIN justonce_lists l ON l.id = r.list_id
 WHERE r.id = :id AND l.name = :name

-- name: list_reservation_pending
UPDATE justonce_list_reservations SET pending = :pending, updated_at = NOW() WHERE id = :id

-- name: list_reservation_touch
UPDATE justonce_list_reservations
   SET due_at = NOW() + :due_in, updated_at = NOW()
 WHERE id = :id

-- name: list_reservation_due
SELECT due_at FROM justonce_list_reservations WHERE id = :id

-- name: list_reservation_hold
UPDATE justonce_list_reservations SET held = :held, pending = :pending, updated_at = NOW()
 WHERE id = :id

-- name: list_reservation_set
UPDATE justonce_list_reservations
   SET state = :state, due_at = NOW() + :due_in,
       held = :held, pending = :pending, attempt = :attempt, error = :error,
       updated_at = NOW()
 WHERE id = :id

-- name: list_reservation_delete
DELETE FROM justonce_list_reservations WHERE id = :id

-- name: list_buried_lock
SELECT id, list_id, secret, request_id, state, due_at, ranges, held, pending, attempt, ttr,
       error, created_at, false AS expired
  FROM justonce_list_reservations
 WHERE list_id = :list_id AND state = 'buried'
 ORDER BY id
 LIMIT :limit

-- name: list_buried
SELECT r.held, r.attempt, r.error, r.updated_at
  FROM justonce_lists l
  JOIN justonce_list_reservations r ON r.list_id = l.id AND r.state = 'buried'
 WHERE l.name = :name
 ORDER BY r.id
 LIMIT :limit

-- name: list_items
-- The items at the ranges (JSON [[lo, hi], ...]: half-open, sorted) in position order, as
-- many as fit, from the first, in the budget's bytes of item text. The running sum is over
-- the items' lengths alone (the subquery's rows carry no item text), and only the items
-- within the budget are joined in and sent: an answer's memory is bounded by the budget
-- whatever the mix of sizes, and positions between the ranges are not read at all.
-- unused: positions
SELECT i.position, i.item
  FROM (SELECT s.list_id, s.position,
               sum(s.n) OVER (ORDER BY s.position ROWS UNBOUNDED PRECEDING) AS upto
          FROM (SELECT i.list_id, i.position, length(CAST(i.item AS BLOB)) AS n
                  FROM justonce_lists l
                  JOIN json_each(:ranges) AS r
                  JOIN justonce_list_items i ON i.list_id = l.id
                   AND i.position >= json_extract(r.value, '$[0]')
                   AND i.position < json_extract(r.value, '$[1]')
                 WHERE l.name = :name) s) w
  JOIN justonce_list_items i ON i.list_id = w.list_id AND i.position = w.position
 WHERE w.upto <= :budget
 ORDER BY w.position

-- name: list_get
SELECT l.id, l.name, l.task, l.state, l.total, l.next_position, l.ttr, l.max_attempts,
       l.batch_id, l.callbacks, l.created_at, l.sealed_at, l.finished_at,
       (SELECT sum(c.pending) FROM justonce_batch_chunks c WHERE c.batch_id = l.batch_id) AS undone
  FROM justonce_lists l
 WHERE l.name = :name

-- name: list_all
SELECT l.id, l.name, l.task, l.state, l.total, l.next_position, l.ttr, l.max_attempts,
       l.batch_id, l.callbacks, l.created_at, l.sealed_at, l.finished_at,
       (SELECT sum(c.pending) FROM justonce_batch_chunks c WHERE c.batch_id = l.batch_id) AS undone
  FROM justonce_lists l
 ORDER BY l.name
 LIMIT :limit

-- name: list_reservation_counts
SELECT state, coalesce(state = 'active' AND due_at <= NOW(), false) AS expired, sum(pending)
  FROM justonce_list_reservations
 WHERE list_id = :id AND state IN ('active', 'free', 'buried')
 GROUP BY 1, 2

-- name: list_bits
SELECT chunk, bits FROM justonce_batch_chunks
 WHERE batch_id = :batch_id AND group_id = :group_id AND chunk BETWEEN :lo AND :hi

-- name: lists_prune_done
DELETE FROM justonce_list_reservations
 WHERE id IN (SELECT id FROM justonce_list_reservations
               WHERE state = 'done' AND updated_at <= NOW() - :retention
               LIMIT :limit)
