-- justonce schema v6: what the dashboard reads on a big jobs table (backends/dashstore.py).
-- PostgreSQL adds a partial index of dead jobs that INCLUDEs queue. Here the finished-jobs
-- index (state, finished_at) takes queue as a third column instead: it then serves dead
-- jobs newest first and counted per queue from the index alone, and a second index would
-- only repeat its first two columns. There are no multivariate statistics to create.
DROP INDEX justonce_jobs_finished ON justonce_jobs;
CREATE INDEX justonce_jobs_finished ON justonce_jobs (state, finished_at, queue);
