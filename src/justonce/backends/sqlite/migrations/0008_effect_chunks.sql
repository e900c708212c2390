-- justonce schema v8: the chunks of run_many (see the PostgreSQL migration).
-- AUTOINCREMENT: an id is never given again, not even after its row is deleted (a plain
-- INTEGER PRIMARY KEY reuses the highest id freed, and entries still pointing at a deleted
-- chunk would belong to the next one).
CREATE TABLE justonce_effect_chunks (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    scope            TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('running','done')),
    lease_expires_at REAL    NOT NULL,
    result           TEXT,
    created_at       REAL    NOT NULL,
    done_at          REAL
);
CREATE INDEX justonce_effect_chunks_running ON justonce_effect_chunks (lease_expires_at)
    WHERE state = 'running';
ALTER TABLE justonce_effects ADD COLUMN chunk_id INTEGER;
CREATE INDEX justonce_effects_chunk ON justonce_effects (chunk_id) WHERE chunk_id IS NOT NULL;
