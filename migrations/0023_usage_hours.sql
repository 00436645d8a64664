-- GET /usage over long ranges: an hourly rollup of the ledger's read model.
--
-- usage_hours holds, per account, key, env, endpoint, engine, cached and UTC hour, the
-- charges charged in that hour and the credits credited in it (a credit under its
-- charge's key, endpoint, engine, env and cached, as GET /usage counts it). It is part
-- of the ledger's inline read model: the statement that inserts a charge or a credit
-- adds the rows it inserted here, in the same transaction, so it is never behind the
-- charges. A month of an account's usage is then at most 744 rows per combination
-- instead of a row per charge; GET /usage reads it for the whole UTC hours of its
-- range (and the charges themselves for a ragged start or end) whenever every hour of
-- the asked zone's calendar is a whole UTC hour (ledger/rollup.go).
CREATE TABLE usage_hours (
    account_id     text           NOT NULL,
    hour           timestamptz    NOT NULL, -- the UTC hour's start
    key_id         text           NOT NULL,
    env            text           NOT NULL,
    endpoint       text           NOT NULL,
    engine         text           NOT NULL,
    cached         boolean        NOT NULL,
    calls          bigint         NOT NULL,
    units          bigint         NOT NULL,
    usd            numeric(20, 6) NOT NULL,
    credits        bigint         NOT NULL,
    credited_units bigint         NOT NULL,
    credited_usd   numeric(20, 6) NOT NULL,
    -- an account's hours in order: the range of a GET /usage is one index range
    PRIMARY KEY (account_id, hour, key_id, env, endpoint, engine, cached)
);

-- usage_hours_refresh recomputes usage_hours from charges and credits: this
-- migration's backfill, the end of a rebuild of the ledger's read model, a benchmark's
-- seeding. It first takes the chain's head, which every append holds while it writes
-- its inline rows, so no charge is added meanwhile; the appends wait for it.
CREATE FUNCTION usage_hours_refresh() RETURNS void LANGUAGE plpgsql AS $$
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
END $$;

SELECT usage_hours_refresh();

-- The statement shows each charge's credit: found by the charge's position.
CREATE INDEX credits_charge_position ON credits (charge_position);
