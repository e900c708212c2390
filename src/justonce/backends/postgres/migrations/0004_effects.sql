-- justonce schema v4: the effect ledger. One row per (scope, key): pending (claimable),
-- running (claimed by the holder of token until lease_expires_at) or done. A running
-- entry whose lease expired is "in doubt": its holder died mid-effect, or is late.
CREATE TABLE justonce_effects (
    scope            text        NOT NULL,
    key              text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('pending','running','done')),
    policy           text        NOT NULL CHECK (policy IN ('at_most_once','at_least_once')),
    token            bigint      NOT NULL DEFAULT 0,
    owner            text,
    attempts         integer     NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    last_error       text,
    result           jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    done_at          timestamptz,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 90);
-- In-doubt listings and the count of done effects per scope.
CREATE INDEX justonce_effects_running ON justonce_effects (lease_expires_at) WHERE state = 'running';
