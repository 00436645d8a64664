-- A narrower rollup beside usage_hours: per account, key, env and UTC hour only. Most
-- reports group by key and time (GET /usage?group_by=key,day, the statement's totals
-- without an endpoint filter); an hour of those then reads one row per key instead of
-- one per key, endpoint, engine and cached. Kept by the same statements as usage_hours
-- (ledger.QueueReadModel), recomputed with it (usage_refresh).
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

-- usage_refresh recomputes both rollups: usage_hours from the charges and credits
-- (usage_hours_refresh, which holds the chain's head), then usage_key_hours from it.
CREATE FUNCTION usage_refresh() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM usage_hours_refresh();
    DELETE FROM usage_key_hours;
    INSERT INTO usage_key_hours (account_id, hour, key_id, env, calls, units, usd, credits, credited_units, credited_usd)
    SELECT account_id, hour, key_id, env, sum(calls), sum(units), sum(usd), sum(credits), sum(credited_units), sum(credited_usd)
      FROM usage_hours
     GROUP BY 1, 2, 3, 4;
END $$;

SELECT usage_refresh();
