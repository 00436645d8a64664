-- The job queue: one row per position of a queued or running job that is not yet
-- recorded. Workers take positions, not jobs: a row's worker holds it until lease_until
-- and renews it while it searches; a row whose lease ran out is taken by any worker
-- (its first one was killed or cut off). Recording a position deletes its row in the
-- transaction that appends its result and charge, and only while the recorder still
-- holds it, so a position is recorded and charged once however many workers tried.
-- The end of a job (success, failure, cancel) deletes what is left.
CREATE TABLE job_queue (
    job_id       text        NOT NULL,
    idx          int         NOT NULL,
    account_id   text        NOT NULL, -- fair share between accounts
    submitted_at timestamptz NOT NULL, -- oldest first within an account
    worker       text,                 -- who holds it; NULL: nobody yet
    lease_until  timestamptz,
    PRIMARY KEY (job_id, idx)
);
CREATE INDEX job_queue_worker ON job_queue (worker) WHERE worker IS NOT NULL;

-- Jobs accepted before per-position leases: every position not yet recorded goes back
-- on the queue (a recorder skips and drops one that was already recorded).
INSERT INTO job_queue (job_id, idx, account_id, submitted_at)
SELECT j.job_id, i, j.account_id, j.created_at
  FROM jobs j, generate_series(0, j.positions_total - 1) AS i
 WHERE j.state IN ('queued', 'running');

-- Job-level leases are gone: a job is held position by position.
DROP TABLE job_leases;
