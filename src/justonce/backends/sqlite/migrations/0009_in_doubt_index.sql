-- justonce schema v9: the in-doubt index keeps to the entries with a lease of their own
-- (see the PostgreSQL migration): not every entry a chunk holds or has finished.
DROP INDEX justonce_effects_running;
CREATE INDEX justonce_effects_running ON justonce_effects (lease_expires_at)
    WHERE state = 'running' AND lease_expires_at IS NOT NULL;
