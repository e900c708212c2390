-- justonce schema v7: lists (see the PostgreSQL migration).
CREATE TABLE justonce_lists (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT    NOT NULL UNIQUE,
    task          TEXT,
    state         TEXT    NOT NULL CHECK (state IN ('loading','sealed','completed')),
    total         INTEGER NOT NULL DEFAULT 0,
    next_position INTEGER NOT NULL DEFAULT 0,
    ttr           REAL    NOT NULL,
    max_attempts  INTEGER NOT NULL,
    batch_id      INTEGER,
    group_id      TEXT,
    callbacks     TEXT    NOT NULL DEFAULT '{}',
    created_at    REAL    NOT NULL,
    sealed_at     REAL,
    finished_at   REAL
);

CREATE TABLE justonce_list_items (
    list_id  INTEGER NOT NULL,
    position INTEGER NOT NULL,
    item     TEXT    NOT NULL,
    PRIMARY KEY (list_id, position)
) WITHOUT ROWID;

CREATE TABLE justonce_list_reservations (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    list_id    INTEGER NOT NULL,
    secret     TEXT    NOT NULL,
    request_id TEXT,
    state      TEXT    NOT NULL CHECK (state IN ('active','free','buried','done')),
    due_at     REAL,
    ranges     TEXT    NOT NULL,
    held       TEXT    NOT NULL,
    pending    INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    ttr        REAL    NOT NULL,
    error      TEXT,
    created_at REAL    NOT NULL,
    updated_at REAL    NOT NULL
);
CREATE INDEX justonce_list_reservations_due ON justonce_list_reservations (list_id, due_at)
    WHERE due_at IS NOT NULL;
CREATE UNIQUE INDEX justonce_list_reservations_request ON justonce_list_reservations (list_id, request_id)
    WHERE request_id IS NOT NULL;
CREATE INDEX justonce_list_reservations_buried ON justonce_list_reservations (list_id, id)
    WHERE state = 'buried';
CREATE INDEX justonce_list_reservations_done ON justonce_list_reservations (updated_at)
    WHERE state = 'done';
