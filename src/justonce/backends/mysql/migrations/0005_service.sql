-- justonce schema v5: the service's API tokens and its audit trail (see the PostgreSQL
-- migration). Sizes follow tokens.py: names 100, actions 100, actors 200, targets 1000.
CREATE TABLE justonce_api_tokens (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name         VARCHAR(100) NOT NULL,
    scope        VARCHAR(16)  NOT NULL CHECK (scope IN ('read','admin')),
    secret_hash  VARCHAR(128) NOT NULL UNIQUE,
    prefix       VARCHAR(32)  NOT NULL,
    created_at   DATETIME(6)  NOT NULL DEFAULT NOW(6),
    last_used_at DATETIME(6),
    revoked_at   DATETIME(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

CREATE TABLE justonce_audit (
    id       BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at       DATETIME(6)   NOT NULL DEFAULT NOW(6),
    token_id BIGINT,
    actor    VARCHAR(200)  NOT NULL,
    action   VARCHAR(100)  NOT NULL,
    target   VARCHAR(1000),
    count    BIGINT,
    detail   LONGTEXT          NOT NULL DEFAULT ('{}')
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;
