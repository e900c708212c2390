-- justonce schema v9: the chunks of run_many (see the PostgreSQL migration, v8 there).
-- InnoDB has no partial index: justonce_effects_chunk holds an entry (NULL) for every
-- entry, written once when the entry is made.
CREATE TABLE justonce_effect_chunks (
    id               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    scope            VARCHAR(200) NOT NULL,
    state            VARCHAR(16)  NOT NULL CHECK (state IN ('running','done')),
    lease_expires_at DATETIME(6)  NOT NULL,
    result           JSON,
    created_at       DATETIME(6)  NOT NULL DEFAULT NOW(6),
    done_at          DATETIME(6),
    INDEX justonce_effect_chunks_running (state, lease_expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;
ALTER TABLE justonce_effects ADD COLUMN chunk_id BIGINT NULL;
CREATE INDEX justonce_effects_chunk ON justonce_effects (chunk_id);
