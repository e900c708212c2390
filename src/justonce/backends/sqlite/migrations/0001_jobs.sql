-- justonce schema v1: the job queue. Times are REAL seconds since the epoch, read from
-- the database's clock (julianday('now')).
CREATE TABLE justonce_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    args             TEXT    NOT NULL DEFAULT '[]',
    kwargs           TEXT    NOT NULL DEFAULT '{}',
    state            TEXT    NOT NULL
                     CHECK (state IN ('scheduled','ready','running','succeeded','dead','cancelled')),
    priority         INTEGER NOT NULL DEFAULT 0,
    run_at           REAL    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL CHECK (max_attempts > 0),
    timeout          REAL    NOT NULL,
    key              TEXT,
    partition_key    TEXT,
    lease_owner      TEXT,
    lease_token      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at REAL,
    last_error       TEXT,
    errors           TEXT    NOT NULL DEFAULT '[]',
    result           TEXT,
    created_at       REAL    NOT NULL,
    started_at       REAL,
    finished_at      REAL
);

CREATE INDEX justonce_jobs_claim ON justonce_jobs (queue, priority, id) WHERE state = 'ready';
CREATE INDEX justonce_jobs_scheduled ON justonce_jobs (run_at) WHERE state = 'scheduled';
CREATE INDEX justonce_jobs_leases ON justonce_jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX justonce_jobs_finished ON justonce_jobs (finished_at)
    WHERE state IN ('succeeded','dead','cancelled');
CREATE UNIQUE INDEX justonce_jobs_live_key ON justonce_jobs (key)
    WHERE key IS NOT NULL AND state IN ('scheduled','ready','running');

CREATE TABLE justonce_maintenance (
    name        TEXT PRIMARY KEY,
    next_run_at REAL NOT NULL DEFAULT 0,
    last_owner  TEXT
);
