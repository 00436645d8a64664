-- A narrower rollup beside usage_hours: per account, key, env and UTC hour only. Most
-- reports group by key and time (GET /usage?group_by=key,day, the statement's totals
-- without an endpoint filter); an hour of those then reads one row per key instead of
-- one per key, endpoint, engine and cached. Kept by the same statements as usage_hours
-- (ledger.QueueReadModel), recomputed with it (usage_hours_refresh).
CREATE TABLE usage_key_hours (
    account_id     text           NOT NULL,
    hour           timestamptz    NOT NULL,
    key_id         text           NOT NULL,
    env            text           NOT NULL,
    calls          bigint         NOT NULL,
    units          bigint         NOT NULL,
    usd            numeric(20, 6) NOT NULL,
    credits        bigint         NOT NULL,
    credited_units bigint         NOT NULL,
    credited_usd   numeric(20, 6) NOT NULL,
    PRIMARY KEY (account_id, hour, key_id, env)
);

CREATE OR REPLACE FUNCTION usage_hours_refresh() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM event_chain FOR UPDATE;
    DELETE FROM usage_hours;
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
    DELETE FROM usage_key_hours;
    INSERT INTO usage_key_hours (account_id, hour, key_id, env, calls, units, usd, credits, credited_units, credited_usd)
    SELECT account_id, hour, key_id, env, sum(calls), sum(units), sum(usd), sum(credits), sum(credited_units), sum(credited_usd)
      FROM usage_hours
     GROUP BY 1, 2, 3, 4;
END $$;

SELECT usage_hours_refresh();
