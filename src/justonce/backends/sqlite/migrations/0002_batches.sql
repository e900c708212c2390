-- justonce schema v2: batches. A batch has groups of items; each group is stored as
-- chunks of 2048 items, one bit per item (1 = acked or failed) and a count of pending items.
CREATE TABLE justonce_batches (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    state        TEXT    NOT NULL CHECK (state IN ('open','sealed','completed','expired')),
    description  TEXT,
    callbacks    TEXT    NOT NULL DEFAULT '{}',
    total        INTEGER NOT NULL DEFAULT 0,
    groups       INTEGER NOT NULL DEFAULT 0,
    acked        INTEGER,
    failed       INTEGER,
    expire_after REAL    NOT NULL,
    created_at   REAL    NOT NULL,
    updated_at   REAL    NOT NULL,
    sealed_at    REAL,
    finished_at  REAL
);
CREATE INDEX justonce_batches_idle ON justonce_batches (updated_at) WHERE state = 'open';
CREATE INDEX justonce_batches_finished ON justonce_batches (finished_at)
    WHERE state IN ('completed','expired');

-- A rowid table: rows of about 300 bytes are a poor fit for WITHOUT ROWID.
CREATE TABLE justonce_batch_chunks (
    batch_id   INTEGER NOT NULL,
    group_id   TEXT    NOT NULL,
    chunk      INTEGER NOT NULL,
    size       INTEGER NOT NULL CHECK (size BETWEEN 1 AND 2048),
    pending    INTEGER NOT NULL CHECK (pending BETWEEN 0 AND size),
    bits       BLOB    NOT NULL,
    updated_at REAL    NOT NULL
);
CREATE UNIQUE INDEX justonce_batch_chunks_key ON justonce_batch_chunks (batch_id, group_id, chunk);

CREATE TABLE justonce_batch_failures (
    batch_id  INTEGER NOT NULL,
    item      TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    failed_at REAL    NOT NULL,
    PRIMARY KEY (batch_id, item)
) WITHOUT ROWID;

ALTER TABLE justonce_jobs ADD COLUMN batch_item TEXT;
