-- justonce schema v10: paused queues. A queue with a row here is paused: the claim
-- statements read this table (one primary-key probe per claim, a one-time filter in the
-- plan), so no claim that starts after the row commits takes a job of the queue. Jobs are
-- still enqueued into a paused queue; resuming deletes the row.
CREATE TABLE justonce_queue_pauses (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor     text,
    note      text
);
