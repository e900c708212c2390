-- justonce schema v6: what the dashboard reads on a big jobs table (backends/dashstore.py).
-- Dead jobs, newest first, and counted per queue without touching the heap (INCLUDE): the
-- finished-jobs index mixes them with every succeeded job. Only jobs that die are written
-- to it, so workers that succeed pay nothing for it.
CREATE INDEX justonce_jobs_dead ON justonce_jobs (finished_at) INCLUDE (queue) WHERE state = 'dead';
-- Jobs per (queue, state) above 100,000 rows are estimated from ANALYZE's sample: with this
-- statistics object the sample keeps the frequent (queue, state) pairs (pg_stats_ext),
-- instead of one list per column.
CREATE STATISTICS justonce_jobs_queue_state (mcv) ON queue, state FROM justonce_jobs;
