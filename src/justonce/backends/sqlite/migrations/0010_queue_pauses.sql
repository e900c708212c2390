-- justonce schema v10: paused queues (see the PostgreSQL migration). A claim runs under
-- the file's one write lock, so a pause that has committed is seen by every later claim.
CREATE TABLE justonce_queue_pauses (
    queue     TEXT PRIMARY KEY,
    paused_at REAL NOT NULL,
    actor     TEXT,
    note      TEXT
);
