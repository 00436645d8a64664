-- The workers that are alive, each for as long as it last said (commands.WorkerAlive),
-- whether or not they hold positions: a take's share of the free positions
-- (commands.TakePositions) divides them among these and the workers holding leases.
-- Counting only the holders gave a worker that held nothing no share: one whose recent
-- searches were fast took a whole small job before an idle worker took any of it.
-- UNLOGGED: liveness is not worth a WAL record, and a crash of the database empties
-- the table, which the live workers fill again within a third of their lease.
CREATE UNLOGGED TABLE job_workers (
    worker      text PRIMARY KEY,
    alive_until timestamptz NOT NULL
);
