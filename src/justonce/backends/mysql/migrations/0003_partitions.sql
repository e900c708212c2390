-- justonce schema v3: partitions (see the PostgreSQL migration for the why of each part).
-- Text keys hash with the built-in CRC32(), the same number as Python's zlib.crc32.
CREATE TABLE justonce_partition_sets (
    set_name   VARCHAR(63) NOT NULL PRIMARY KEY,
    n          INT         NOT NULL CHECK (n > 0),
    updated_at DATETIME(6) NOT NULL DEFAULT NOW(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

CREATE TABLE justonce_partition_leases (
    set_name    VARCHAR(63) NOT NULL,
    slot        INT         NOT NULL CHECK (slot >= 0),
    owner       TEXT,
    token       BIGINT      NOT NULL DEFAULT 0,
    expires_at  DATETIME(6),
    acquired_at DATETIME(6),
    renewed_at  DATETIME(6),
    PRIMARY KEY (set_name, slot)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

-- The plain claim looks its jobs up with partition_hash IS NULL (an equality in the index)
-- and reads them in (priority, id) order. The partitioned claim reads a queue's ready jobs
-- in id order and filters the hash in the index entry (index condition pushdown) before
-- it reads, or locks, a row.
ALTER TABLE justonce_jobs ADD COLUMN partition_hash BIGINT;
DROP INDEX justonce_jobs_claim ON justonce_jobs;
CREATE INDEX justonce_jobs_claim ON justonce_jobs (state, queue, partition_hash, priority, id);
CREATE INDEX justonce_jobs_claim_partitioned ON justonce_jobs (state, queue, id, partition_hash);
-- "Is an earlier job of this key still live?" for the partitioned claim.
CREATE INDEX justonce_jobs_partition_live ON justonce_jobs (partition_key, state, id);
