-- justonce schema v4: the effect ledger (see the PostgreSQL migration).
CREATE TABLE justonce_effects (
    scope            TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('pending','running','done')),
    policy           TEXT    NOT NULL CHECK (policy IN ('at_most_once','at_least_once')),
    token            INTEGER NOT NULL DEFAULT 0,
    owner            TEXT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    lease_expires_at REAL,
    last_error       TEXT,
    result           TEXT,
    created_at       REAL    NOT NULL,
    updated_at       REAL    NOT NULL,
    done_at          REAL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX justonce_effects_running ON justonce_effects (lease_expires_at) WHERE state = 'running';
