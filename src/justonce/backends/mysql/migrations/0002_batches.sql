-- justonce schema v2: batches. A batch has groups of items; each group is stored as
-- chunks of 2048 items, one bit per item (1 = acked or failed) and a count of pending items.
CREATE TABLE justonce_batches (
    id           BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    state        VARCHAR(16) NOT NULL CHECK (state IN ('open','sealed','completed','expired')),
    description  TEXT,
    -- {"complete": job, "success": job}: the callback jobs to insert on completion.
    callbacks    LONGTEXT        NOT NULL DEFAULT ('{}'),
    total        BIGINT      NOT NULL DEFAULT 0,
    `groups`     INT         NOT NULL DEFAULT 0,
    -- Frozen when the batch completes (live progress is summed from the chunks).
    acked        BIGINT,
    failed       BIGINT,
    expire_after DOUBLE      NOT NULL,
    created_at   DATETIME(6) NOT NULL DEFAULT NOW(6),
    updated_at   DATETIME(6) NOT NULL DEFAULT NOW(6),
    sealed_at    DATETIME(6),
    finished_at  DATETIME(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;
CREATE INDEX justonce_batches_idle ON justonce_batches (state, updated_at);
CREATE INDEX justonce_batches_finished ON justonce_batches (state, finished_at);

-- bits: item n of the chunk is bit n % 8 (least significant first) of byte n DIV 8, set by
-- the application under the chunk's row lock (batch_chunks_lock, batch_chunk_update).
-- Group ids are 12 hex digits (items.py).
CREATE TABLE justonce_batch_chunks (
    batch_id   BIGINT         NOT NULL,
    group_id   VARCHAR(32)    NOT NULL,
    chunk      INT            NOT NULL,
    size       INT            NOT NULL CHECK (size BETWEEN 1 AND 2048),
    pending    INT            NOT NULL,
    bits       VARBINARY(256) NOT NULL,
    updated_at DATETIME(6)    NOT NULL DEFAULT NOW(6),
    PRIMARY KEY (batch_id, group_id, chunk),
    -- Table constraints: MySQL refuses a column constraint that names another column.
    CHECK (pending BETWEEN 0 AND size),
    CHECK (LENGTH(bits) = (size + 7) DIV 8)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

-- Items that failed (a job that ended dead or was cancelled, or fail() by hand): rare, so
-- a row each, with the reason. An item id is "batch:group:index" (at most 42 characters).
CREATE TABLE justonce_batch_failures (
    batch_id  BIGINT      NOT NULL,
    item      VARCHAR(64) NOT NULL,
    reason    TEXT        NOT NULL,
    failed_at DATETIME(6) NOT NULL DEFAULT NOW(6),
    PRIMARY KEY (batch_id, item)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

ALTER TABLE justonce_jobs ADD COLUMN batch_item VARCHAR(64);
