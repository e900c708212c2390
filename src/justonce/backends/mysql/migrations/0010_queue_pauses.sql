-- justonce schema v10: paused queues (see the PostgreSQL migration). Sizes follow
-- justonce/validate.py and tokens.py: queue 63, actor 200, note 4000.
CREATE TABLE justonce_queue_pauses (
    queue     VARCHAR(63)   NOT NULL PRIMARY KEY,
    paused_at DATETIME(6)   NOT NULL DEFAULT NOW(6),
    actor     VARCHAR(200),
    note      TEXT
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;
