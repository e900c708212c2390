-- justonce schema v7: lists (lists.py, backends/liststore.py). A list's items have dense
-- positions 0..total-1 and are immutable once it is sealed. Fresh positions are handed out
-- by moving next_position (one row update, no scan); the done positions are the bits of the
-- list's batch (one group of `total` items), so a list finishes once, as a batch does.
CREATE TABLE justonce_lists (
    id            bigserial PRIMARY KEY,
    name          text             NOT NULL UNIQUE,
    task          text,
    state         text             NOT NULL CHECK (state IN ('loading','sealed','completed')),
    total         bigint           NOT NULL DEFAULT 0,
    next_position bigint           NOT NULL DEFAULT 0,
    ttr           double precision NOT NULL,
    max_attempts  integer          NOT NULL,
    batch_id      bigint,
    group_id      text,
    callbacks     text             NOT NULL DEFAULT '{}',
    created_at    timestamptz      NOT NULL DEFAULT now(),
    sealed_at     timestamptz,
    finished_at   timestamptz
);

-- The items, as JSON text (decoded by the reader; text loads fastest with COPY).
CREATE TABLE justonce_list_items (
    list_id  bigint NOT NULL,
    position bigint NOT NULL,
    item     text   NOT NULL,
    PRIMARY KEY (list_id, position)
);

-- Who holds which positions that are handed out and not yet done. `held` (JSON [[lo, hi),
-- ...]) is what the row owns now; the rows of a list never hold a position twice, so a
-- completion checks its positions against its own row only. `ranges` is what the reserve
-- answered (a repeated request id gets it again). state: active (a reservation: the holder
-- of id + secret until due_at), free (given back or timed out: re-offered from due_at on),
-- buried (parked until kicked), done (kept only for its request id). `pending` counts the
-- held positions not done.
CREATE TABLE justonce_list_reservations (
    id         bigserial PRIMARY KEY,
    list_id    bigint           NOT NULL,
    secret     text             NOT NULL,
    request_id text,
    state      text             NOT NULL CHECK (state IN ('active','free','buried','done')),
    due_at     timestamptz,
    ranges     text             NOT NULL,
    held       text             NOT NULL,
    pending    integer          NOT NULL,
    attempt    integer          NOT NULL,
    ttr        double precision NOT NULL,
    error      text,
    created_at timestamptz      NOT NULL DEFAULT now(),
    updated_at timestamptz      NOT NULL DEFAULT now()
);
-- Re-offers: the rows whose time has come (active ones past their TTR, free ones past their
-- delay), oldest first. Only active and free rows have a due_at.
CREATE INDEX justonce_list_reservations_due ON justonce_list_reservations (list_id, due_at)
    WHERE due_at IS NOT NULL;
CREATE UNIQUE INDEX justonce_list_reservations_request ON justonce_list_reservations (list_id, request_id)
    WHERE request_id IS NOT NULL;
CREATE INDEX justonce_list_reservations_buried ON justonce_list_reservations (list_id, id)
    WHERE state = 'buried';
CREATE INDEX justonce_list_reservations_done ON justonce_list_reservations (updated_at)
    WHERE state = 'done';
