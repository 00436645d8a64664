-- Each account's queued positions in the order a worker takes them (oldest job first,
-- input order within a job): commands.TakePositions reads the first few free ones of
-- each account with queued positions, instead of numbering every free position of the
-- queue on each take (15.7 ms per take at 5,000 queued positions, 98 ms at 20,000).
CREATE INDEX job_queue_account_order ON job_queue (account_id, submitted_at, job_id, idx);
