-- A failed job's problem in the jobs read model, so that GET /jobs shows why a job in
-- the list failed (GET /jobs/{id} folds it from the events). Rows of jobs that failed
-- before this migration get it from their JobFailed event; the jobs projection writes
-- it from now on, and a rebuild writes it for every job.
ALTER TABLE jobs ADD COLUMN error_code text, ADD COLUMN error_message text;

UPDATE jobs j
   SET error_code = e.payload ->> 'code', error_message = e.payload ->> 'message'
  FROM events e
 WHERE e.stream_id = 'job-' || j.job_id AND e.event_type = 'JobFailed';
