-- justonce schema v1: the job queue (MySQL 8.0.23+ / MariaDB 10.6+). JSON documents are
-- LONGTEXT, stored as justonce wrote them (it validates them itself): MariaDB's JSON type
-- checks JSON_VALID, which refuses nesting deeper than 31, and justonce accepts 64. Times are DATETIME(6)
-- in UTC: every session runs with time_zone '+00:00' and reads the clock with NOW(6).
-- Text is utf8mb4 with a binary NO PAD collation, so 'a', 'a ' and 'A' are three keys, as
-- in PostgreSQL. Name sizes follow justonce/validate.py: queue 63, task 200, keys 512.
CREATE TABLE justonce_jobs (
    id               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue            VARCHAR(63)  NOT NULL,
    task             VARCHAR(200) NOT NULL,
    args             LONGTEXT         NOT NULL DEFAULT ('[]'),
    kwargs           LONGTEXT         NOT NULL DEFAULT ('{}'),
    state            VARCHAR(16)  NOT NULL
                     CHECK (state IN ('scheduled','ready','running','succeeded','dead','cancelled')),
    priority         SMALLINT     NOT NULL DEFAULT 0,
    run_at           DATETIME(6)  NOT NULL DEFAULT NOW(6),
    attempts         INT          NOT NULL DEFAULT 0,
    max_attempts     INT          NOT NULL CHECK (max_attempts > 0),
    timeout          DOUBLE       NOT NULL,
    `key`            VARCHAR(512),
    partition_key    VARCHAR(512),
    -- An owner is any string a worker names itself by (host:pid:random by default).
    lease_owner      TEXT,
    lease_token      BIGINT       NOT NULL DEFAULT 0,
    lease_expires_at DATETIME(6),
    last_error       TEXT,
    errors           LONGTEXT         NOT NULL DEFAULT ('[]'),
    result           JSON,
    created_at       DATETIME(6)  NOT NULL DEFAULT NOW(6),
    started_at       DATETIME(6),
    finished_at      DATETIME(6),
    -- There are no partial indexes: the key of a live job is copied here (NULL otherwise),
    -- and the unique index below holds the rule "a key belongs to at most one live job"
    -- (NULLs never collide). INVISIBLE: SELECT * returns PostgreSQL's columns.
    live_key         VARCHAR(512) AS (CASE WHEN state IN ('scheduled','ready','running')
                                          THEN `key` END) STORED INVISIBLE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

-- Each partial index of PostgreSQL becomes an index that starts with the state it was
-- restricted to. The claim reads one queue's ready jobs in (priority, id) order from it:
-- no sort, and the scan stops at the LIMIT (a sort would lock every ready row it read).
CREATE INDEX justonce_jobs_claim ON justonce_jobs (state, queue, priority, id);
-- Promotion of due scheduled jobs; rescue of expired leases and the running-jobs listing.
CREATE INDEX justonce_jobs_scheduled ON justonce_jobs (state, run_at);
CREATE INDEX justonce_jobs_leases ON justonce_jobs (state, lease_expires_at);
-- Pruning and listings of finished jobs.
CREATE INDEX justonce_jobs_finished ON justonce_jobs (state, finished_at);
-- A unique index, not lock-then-query: a rolled back enqueue can never suppress the real one.
CREATE UNIQUE INDEX justonce_jobs_live_key ON justonce_jobs (live_key);

-- One row per housekeeping duty; the worker whose upsert moves next_run_at does the round.
CREATE TABLE justonce_maintenance (
    name        VARCHAR(63) NOT NULL PRIMARY KEY,
    next_run_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00',
    last_owner  TEXT
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;
