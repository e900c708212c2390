-- justonce schema v4: the effect ledger (see the PostgreSQL migration). Scopes are at most
-- 200 characters (effects.py), keys 512: the primary key stays under 3072 bytes.
CREATE TABLE justonce_effects (
    scope            VARCHAR(200) NOT NULL,
    `key`            VARCHAR(512) NOT NULL,
    state            VARCHAR(16)  NOT NULL CHECK (state IN ('pending','running','done')),
    policy           VARCHAR(16)  NOT NULL CHECK (policy IN ('at_most_once','at_least_once')),
    token            BIGINT       NOT NULL DEFAULT 0,
    owner            TEXT,
    attempts         INT          NOT NULL DEFAULT 0,
    lease_expires_at DATETIME(6),
    last_error       TEXT,
    result           JSON,
    created_at       DATETIME(6)  NOT NULL DEFAULT NOW(6),
    updated_at       DATETIME(6)  NOT NULL DEFAULT NOW(6),
    done_at          DATETIME(6),
    PRIMARY KEY (scope, `key`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;
-- In-doubt listings.
CREATE INDEX justonce_effects_running ON justonce_effects (state, lease_expires_at);
