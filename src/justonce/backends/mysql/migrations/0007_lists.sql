-- justonce schema v7: lists (see the PostgreSQL migration). InnoDB has no partial indexes:
-- due_at is NULL for buried and done rows, and the re-offer reads `due_at <= now`, which
-- never reaches the NULLs; the request index holds NULLs, which a unique index allows many of.
CREATE TABLE justonce_lists (
    id            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name          VARCHAR(200) NOT NULL,
    task          VARCHAR(200),
    state         VARCHAR(16)  NOT NULL CHECK (state IN ('loading','sealed','completed')),
    total         BIGINT       NOT NULL DEFAULT 0,
    next_position BIGINT       NOT NULL DEFAULT 0,
    ttr           DOUBLE       NOT NULL,
    max_attempts  INT          NOT NULL,
    batch_id      BIGINT,
    group_id      VARCHAR(32),
    callbacks     LONGTEXT     NOT NULL,
    created_at    DATETIME(6)  NOT NULL DEFAULT NOW(6),
    sealed_at     DATETIME(6),
    finished_at   DATETIME(6),
    UNIQUE KEY justonce_lists_name (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

CREATE TABLE justonce_list_items (
    list_id  BIGINT   NOT NULL,
    position BIGINT   NOT NULL,
    item     LONGTEXT NOT NULL,
    PRIMARY KEY (list_id, position)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

CREATE TABLE justonce_list_reservations (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    list_id    BIGINT       NOT NULL,
    secret     VARCHAR(32)  NOT NULL,
    request_id VARCHAR(200),
    state      VARCHAR(16)  NOT NULL CHECK (state IN ('active','free','buried','done')),
    due_at     DATETIME(6),
    ranges     LONGTEXT     NOT NULL,
    held       LONGTEXT     NOT NULL,
    pending    INT          NOT NULL,
    attempt    INT          NOT NULL,
    ttr        DOUBLE       NOT NULL,
    error      TEXT,
    created_at DATETIME(6)  NOT NULL DEFAULT NOW(6),
    updated_at DATETIME(6)  NOT NULL DEFAULT NOW(6),
    KEY justonce_list_reservations_due (list_id, due_at),
    UNIQUE KEY justonce_list_reservations_request (list_id, request_id),
    KEY justonce_list_reservations_state (list_id, state, id),
    KEY justonce_list_reservations_done (state, updated_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;
