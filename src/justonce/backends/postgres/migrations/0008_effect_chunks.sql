-- justonce schema v8: the chunks of run_many. A chunk's keys are claimed together and end
-- together: instead of a done mark on each of its entries (a row update and an index
-- change per key, most of the ledger's cost in a Push), the chunk's own row is marked done
-- once, with the result its keys share. An entry that a chunk holds points at it
-- (chunk_id), keeps state 'running' and no lease of its own: its state is the chunk's
-- ('done' once the chunk is, else running until the chunk's lease, then in doubt). Every
-- other change of an entry (a failure released, an operator's verdict, a claim of one key)
-- is written on the entry itself and clears chunk_id. Existing entries have none: nothing
-- to convert.
CREATE TABLE justonce_effect_chunks (
    id               bigserial   PRIMARY KEY,
    scope            text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('running','done')),
    lease_expires_at timestamptz NOT NULL,
    result           jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    done_at          timestamptz
);
-- In-doubt listings: the chunks whose lease ran out before they were done.
CREATE INDEX justonce_effect_chunks_running ON justonce_effect_chunks (lease_expires_at)
    WHERE state = 'running';
ALTER TABLE justonce_effects ADD COLUMN chunk_id bigint;
CREATE INDEX justonce_effects_chunk ON justonce_effects (chunk_id) WHERE chunk_id IS NOT NULL;
