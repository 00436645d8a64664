-- usage_fill fills usage_hours and usage_key_hours, both empty, from the charges and
-- credits, and takes no lock. A rebuild of the ledger's read model fills the copies of
-- its shadow with it while the appends go on, and then adds what they appended since,
-- as they do, holding the chain's head only for that and the swap
-- (projections/shadow.go); before, it recomputed the rollups holding the head, which
-- stopped every append for as long as summing all the charges takes. usage_refresh
-- keeps its meaning (the head, both rollups emptied and filled again): a rebuild in
-- place, the benchmarks' seeding. usage_hours_refresh, which only usage_refresh called,
-- is gone.
CREATE FUNCTION usage_fill() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_hours (account_id, hour, key_id, env, endpoint, engine, cached,
                             calls, units, usd, credits, credited_units, credited_usd)
    SELECT account_id, date_trunc('hour', charged_at, 'UTC'), key_id, env, endpoint, engine, cached,
           count(*), sum(units), sum(usd), 0, 0, 0
      FROM charges
     GROUP BY 1, 2, 3, 4, 5, 6, 7;
    INSERT INTO usage_hours AS u (account_id, hour, key_id, env, endpoint, engine, cached,
                                  calls, units, usd, credits, credited_units, credited_usd)
    SELECT c.account_id, date_trunc('hour', r.credited_at, 'UTC'), c.key_id, c.env, c.endpoint, c.engine, c.cached,
           0, 0, 0, count(*), sum(r.units), sum(r.usd)
      FROM credits r JOIN charges c ON c.position = r.charge_position
     GROUP BY 1, 2, 3, 4, 5, 6, 7
    ON CONFLICT (account_id, hour, key_id, env, endpoint, engine, cached) DO UPDATE
       SET credits = excluded.credits, credited_units = excluded.credited_units, credited_usd = excluded.credited_usd;
    INSERT INTO usage_key_hours (account_id, hour, key_id, env, calls, units, usd, credits, credited_units, credited_usd)
    SELECT account_id, hour, key_id, env, sum(calls), sum(units), sum(usd), sum(credits), sum(credited_units), sum(credited_usd)
      FROM usage_hours
     GROUP BY 1, 2, 3, 4;
END $$;

CREATE OR REPLACE FUNCTION usage_refresh() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM event_chain FOR UPDATE;
    DELETE FROM usage_hours;
    DELETE FROM usage_key_hours;
    PERFORM usage_fill();
END $$;

DROP FUNCTION usage_hours_refresh();
