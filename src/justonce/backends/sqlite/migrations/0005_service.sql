-- justonce schema v5: the service's API tokens and its audit trail (see the PostgreSQL
-- migration). Times are REAL seconds since the epoch.
CREATE TABLE justonce_api_tokens (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    name         TEXT    NOT NULL,
    scope        TEXT    NOT NULL CHECK (scope IN ('read','admin')),
    secret_hash  TEXT    NOT NULL UNIQUE,
    prefix       TEXT    NOT NULL,
    created_at   REAL    NOT NULL,
    last_used_at REAL,
    revoked_at   REAL
);

CREATE TABLE justonce_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       REAL    NOT NULL,
    token_id INTEGER,
    actor    TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    target   TEXT,
    count    INTEGER,
    detail   TEXT    NOT NULL DEFAULT '{}'
);
