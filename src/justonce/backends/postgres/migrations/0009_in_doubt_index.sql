-- justonce schema v9: the in-doubt index keeps to the entries it is for. An entry that a
-- chunk holds keeps state 'running' with no lease of its own (migration 0008), so the
-- index of v4 (running entries by lease) also held every entry of every chunk, finished
-- ones included: an index write for each key of a bulk run, and an index as big as the
-- ledger where the in-doubt listing reads only entries with a lease of their own (a
-- chunk's are found through justonce_effect_chunks_running). Rebuilt once here: the
-- ledger's table is locked (reads too: DROP INDEX) until the migration commits, seconds
-- for millions of entries.
DROP INDEX justonce_effects_running;
CREATE INDEX justonce_effects_running ON justonce_effects (lease_expires_at)
    WHERE state = 'running' AND lease_expires_at IS NOT NULL;
