-- justonce schema v6: dead jobs newest first and per queue (see the PostgreSQL migration).
CREATE INDEX justonce_jobs_dead ON justonce_jobs (finished_at, queue) WHERE state = 'dead';
