-- justonce schema v3: partitions (see the PostgreSQL migration for the why of each part).
-- The CRC-32 for text keys is the application function justonce_crc32(), registered on
-- every connection justonce opens (and by justonce.partitions.register_sqlite_functions).
CREATE TABLE justonce_partition_sets (
    set_name   TEXT    PRIMARY KEY,
    n          INTEGER NOT NULL CHECK (n > 0),
    updated_at REAL    NOT NULL
);

CREATE TABLE justonce_partition_leases (
    set_name    TEXT    NOT NULL,
    slot        INTEGER NOT NULL CHECK (slot >= 0),
    owner       TEXT,
    token       INTEGER NOT NULL DEFAULT 0,
    expires_at  REAL,
    acquired_at REAL,
    renewed_at  REAL,
    PRIMARY KEY (set_name, slot)
);

ALTER TABLE justonce_jobs ADD COLUMN partition_hash INTEGER;
DROP INDEX justonce_jobs_claim;
CREATE INDEX justonce_jobs_claim ON justonce_jobs (queue, priority, id)
    WHERE state = 'ready' AND partition_hash IS NULL;
CREATE INDEX justonce_jobs_claim_partitioned ON justonce_jobs (queue, id)
    WHERE state = 'ready' AND partition_hash IS NOT NULL;
CREATE INDEX justonce_jobs_partition_live ON justonce_jobs (partition_key, id)
    WHERE partition_hash IS NOT NULL AND state IN ('scheduled','ready','running');
