-- A batch recorded from now on whose lines are all of one UTC hour, endpoint, engine
-- and cached (nearly every group commit's: one key's calls over 100 ms) carries that
-- one group on its row, and charge_batch_hours keeps only the groups of the other
-- batches. A rebuild of the bench's log (200,000 one-line events) spent 0.45 s copying
-- a charge_batch_hours row per batch that only repeated its batch (docs/BENCHMARKS.md,
-- session 24).
--
-- endpoint, engine and cached are NULL on a batch of several groups. The group's hour
-- is first_at's: every line of a one-group batch is charged in that hour.
--
-- Batches already recorded keep their groups in charge_batch_hours (their endpoint
-- NULL), which charge_batch_groups() reads as it reads any batch of several groups; a
-- rebuild moves them onto their rows. Not moved here: the statement would rewrite every
-- row under the lock ALTER TABLE takes, and every server's settles would wait for it.
ALTER TABLE charge_batches ADD COLUMN endpoint text, ADD COLUMN engine text, ADD COLUMN cached boolean;

-- charge_batch_groups is every batch's lines summed per hour, endpoint, engine and
-- cached, from whichever of the two tables holds them. A function, not a view: its
-- names are read when a query is planned, so a rebuild's copies are read instead.
CREATE FUNCTION charge_batch_groups()
RETURNS TABLE ("position" bigint, account_id text, key_id text, env text, hour timestamptz, endpoint text,
               engine text, cached boolean, calls bigint, units bigint, usd numeric)
LANGUAGE sql STABLE AS $$
SELECT b.position, b.account_id, b.key_id, b.env, date_trunc('hour', b.first_at, 'UTC'), b.endpoint, b.engine,
       b.cached, b.lines, b.units, b.usd
  FROM charge_batches b
 WHERE b.endpoint IS NOT NULL
UNION ALL
SELECT b.position, b.account_id, b.key_id, b.env, h.hour, h.endpoint, h.engine, h.cached, h.calls, h.units, h.usd
  FROM charge_batch_hours h JOIN charge_batches b ON b.position = h.position
$$;

-- As in migration 0035, with the batches' groups read through charge_batch_groups().
CREATE OR REPLACE FUNCTION usage_fill() RETURNS void LANGUAGE plpgsql SET jit = off AS $$
BEGIN
    INSERT INTO usage_hours (account_id, hour, key_id, env, endpoint, engine, cached,
                             calls, units, usd, credits, credited_units, credited_usd)
    SELECT account_id, hour, key_id, env, endpoint, engine, cached, sum(calls), sum(units), sum(usd), 0, 0, 0
      FROM (SELECT account_id, date_trunc('hour', charged_at, 'UTC') AS hour, key_id, env, endpoint, engine, cached,
                   1 AS calls, units, usd
              FROM charges
            UNION ALL
            SELECT account_id, hour, key_id, env, endpoint, engine, cached, calls, units, usd
              FROM charge_batch_groups()) c
     GROUP BY 1, 2, 3, 4, 5, 6, 7;
    INSERT INTO usage_hours AS u (account_id, hour, key_id, env, endpoint, engine, cached,
                                  calls, units, usd, credits, credited_units, credited_usd)
    SELECT c.account_id, date_trunc('hour', r.credited_at, 'UTC'), c.key_id, c.env, c.endpoint, c.engine, c.cached,
           0, 0, 0, count(*), sum(r.units), sum(r.usd)
      FROM credits r JOIN charge_lines() c ON c.position = r.charge_position AND c.line = r.charge_line
     GROUP BY 1, 2, 3, 4, 5, 6, 7
    ON CONFLICT (account_id, hour, key_id, env, endpoint, engine, cached) DO UPDATE
       SET credits = excluded.credits, credited_units = excluded.credited_units, credited_usd = excluded.credited_usd;
    INSERT INTO usage_key_hours (account_id, hour, key_id, env, calls, units, usd, credits, credited_units, credited_usd)
    SELECT account_id, hour, key_id, env, sum(calls), sum(units), sum(usd), sum(credits), sum(credited_units), sum(credited_usd)
      FROM usage_hours
     GROUP BY 1, 2, 3, 4;
END $$;
