-- Budgets by period (docs/BILLING.md, "Budgets by period"), and the account's budgets.
--
-- A key's budgets last its whole life ('total', as before) or start again at each
-- calendar day or month of its account's time zone. An account has budgets too, per
-- env, over all its keys (account_budgets, below). key_balances keeps, beside the
-- lifetime spend (spent_*, what audits recompute), the spend of the current period
-- (period_*, what the budget rule checks) and the period's bounds. A period ends at
-- period_end; the first money step on the key after that (meter_roll) starts the next
-- one at zero. Until then every read sees the new period through key_periods.
--
-- A time zone change moves the boundaries from the next period on: the current period
-- keeps its end, so changing zones can never start a budget over early.
-- A lease reserved in one period and settled in the next counts in the next: spend
-- plus what leases hold stays within the budget of every period.
ALTER TABLE key_balances
    ADD COLUMN budget_period text NOT NULL DEFAULT 'total' CHECK (budget_period IN ('total', 'day', 'month')),
    ADD COLUMN period_start  timestamptz, -- null for 'total'
    ADD COLUMN period_end    timestamptz,
    ADD COLUMN period_units  bigint NOT NULL DEFAULT 0,
    ADD COLUMN period_usd    numeric(20, 6) NOT NULL DEFAULT 0;
UPDATE key_balances SET period_units = spent_units, period_usd = spent_usd;

-- account_zones is each account's time zone, the calendar of its periods (TimezoneSet).
-- No money step locks it: a change of zone touches neither balances nor budgets, so it
-- can wait on no lock the money path holds.
CREATE TABLE account_zones (
    account_id text PRIMARY KEY,
    tz         text NOT NULL
);

CREATE FUNCTION account_tz(p_account text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT tz FROM account_zones WHERE account_id = p_account), 'UTC')
$$;

-- budget_period_bounds is the period of kind p_period ('day' or 'month') of zone p_tz
-- that holds p_at: from its first local midnight to the next period's.
CREATE FUNCTION budget_period_bounds(p_period text, p_tz text, p_at timestamptz,
                                     OUT period_start timestamptz, OUT period_end timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT date_trunc(p_period, p_at AT TIME ZONE p_tz) AT TIME ZONE p_tz,
           (date_trunc(p_period, p_at AT TIME ZONE p_tz) + ('1 ' || p_period)::interval) AT TIME ZONE p_tz
     WHERE p_period IN ('day', 'month')
$$;

-- key_periods is key_balances as of now: a period that has ended reads as the next
-- one, with nothing spent yet.
CREATE VIEW key_periods AS
SELECT b.key_id, b.account_id, b.env, b.budget_units, b.budget_usd, b.spent_units, b.spent_usd,
       b.held_units, b.held_usd, b.last_used_at, b.budget_period,
       CASE WHEN b.period_end <= now() THEN n.period_start ELSE b.period_start END AS period_start,
       CASE WHEN b.period_end <= now() THEN n.period_end ELSE b.period_end END AS period_end,
       CASE WHEN b.period_end <= now() THEN 0 ELSE b.period_units END AS period_units,
       CASE WHEN b.period_end <= now() THEN 0 ELSE b.period_usd END AS period_usd
  FROM key_balances b
  LEFT JOIN LATERAL budget_period_bounds(b.budget_period, account_tz(b.account_id), now()) n ON b.period_end <= now();

-- meter_roll starts key p_key's next period when its current one has ended. Callers
-- hold the key's row lock.
CREATE FUNCTION meter_roll(p_key text) RETURNS void LANGUAGE sql AS $$
    UPDATE key_balances
       SET (period_start, period_end) =
           (SELECT n.period_start, n.period_end FROM budget_period_bounds(budget_period, account_tz(account_id), now()) n),
           period_units = 0, period_usd = 0
     WHERE key_id = p_key AND period_end <= now()
$$;

-- charged_since is what an account was charged in env p_env (by key p_key, when given)
-- since p_since (ever, when null), net of credits: a period's spend counted afresh from
-- the charges read model, which is written with the charges themselves.
CREATE FUNCTION charged_since(p_account text, p_env text, p_key text, p_since timestamptz,
                              OUT units bigint, OUT usd numeric)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(c.units), 0) - coalesce(sum(r.units), 0), coalesce(sum(c.usd), 0) - coalesce(sum(r.usd), 0)
      FROM charges c LEFT JOIN credits r ON r.charge_position = c.position
     WHERE c.account_id = p_account AND c.env = p_env AND (p_key IS NULL OR c.key_id = p_key)
       AND (p_since IS NULL OR c.charged_at >= p_since)
$$;

-- meter_set_budget sets key p_key's budgets and period. A new period kind starts with
-- what the key was charged (less credits) since the start of its current period, from
-- the charges read model, which is written with the charges themselves.
CREATE FUNCTION meter_set_budget(p_key text, p_units bigint, p_usd numeric, p_period text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    b key_balances%ROWTYPE;
    s timestamptz;
    e timestamptz;
BEGIN
    SELECT * INTO b FROM key_balances WHERE key_id = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no balance row for key %', p_key;
    END IF;
    IF b.budget_period = p_period THEN
        UPDATE key_balances SET budget_units = p_units, budget_usd = p_usd WHERE key_id = p_key;
        RETURN;
    END IF;
    SELECT n.period_start, n.period_end INTO s, e FROM budget_period_bounds(p_period, account_tz(b.account_id), now()) n;
    UPDATE key_balances k
       SET budget_units = p_units, budget_usd = p_usd, budget_period = p_period, period_start = s, period_end = e,
           period_units = CASE WHEN s IS NULL THEN k.spent_units ELSE x.units END,
           period_usd = CASE WHEN s IS NULL THEN k.spent_usd ELSE x.usd END
      FROM charged_since(b.account_id, b.env, p_key, s) x
     WHERE k.key_id = p_key;
END $$;

-- account_budgets caps what all the keys of an account spend in one env. Its row
-- exists for every account and env that ever took a lease (created by meter_lease), so
-- held_units always counts every lease, budget or not. A row without a budget has no
-- period (period_end null): its period spend is then the spend since the row began and
-- is recounted from the charges when a budget is set.
CREATE TABLE account_budgets (
    account_id    text           NOT NULL,
    env           text           NOT NULL,
    budget_units  bigint,
    budget_usd    numeric(20, 6),
    budget_period text           NOT NULL DEFAULT 'month' CHECK (budget_period IN ('total', 'day', 'month')),
    period_start  timestamptz,
    period_end    timestamptz,
    period_units  bigint         NOT NULL DEFAULT 0,
    period_usd    numeric(20, 6) NOT NULL DEFAULT 0,
    held_units    bigint         NOT NULL DEFAULT 0, -- what the account's leases hold
    PRIMARY KEY (account_id, env)
);
INSERT INTO account_budgets (account_id, env, held_units)
SELECT b.account_id, b.env, coalesce((SELECT sum(l.units) FROM leases l WHERE l.account_id = b.account_id AND l.env = b.env), 0)
  FROM (SELECT DISTINCT account_id, env FROM key_balances) b;

-- account_periods is account_budgets as of now (key_periods' rule).
CREATE VIEW account_periods AS
SELECT a.account_id, a.env, a.budget_units, a.budget_usd, a.budget_period, a.held_units,
       CASE WHEN a.period_end <= now() THEN n.period_start ELSE a.period_start END AS period_start,
       CASE WHEN a.period_end <= now() THEN n.period_end ELSE a.period_end END AS period_end,
       CASE WHEN a.period_end <= now() THEN 0 ELSE a.period_units END AS period_units,
       CASE WHEN a.period_end <= now() THEN 0 ELSE a.period_usd END AS period_usd
  FROM account_budgets a
  LEFT JOIN LATERAL budget_period_bounds(a.budget_period, account_tz(a.account_id), now()) n ON a.period_end <= now();

-- account_roll is meter_roll for an account's budgets in one env.
CREATE FUNCTION account_roll(p_account text, p_env text) RETURNS void LANGUAGE sql AS $$
    UPDATE account_budgets
       SET (period_start, period_end) =
           (SELECT n.period_start, n.period_end FROM budget_period_bounds(budget_period, account_tz(p_account), now()) n),
           period_units = 0, period_usd = 0
     WHERE account_id = p_account AND env = p_env AND period_end <= now()
$$;

-- meter_set_account_budget sets an account's budgets in env p_env (null: none). A new
-- period kind, or a first budget, starts with what the account was charged (less
-- credits) in that env since the start of the current period.
CREATE FUNCTION meter_set_account_budget(p_account text, p_env text, p_units bigint, p_usd numeric, p_period text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    a account_budgets%ROWTYPE;
    s timestamptz;
    e timestamptz;
BEGIN
    INSERT INTO account_budgets (account_id, env) VALUES (p_account, p_env) ON CONFLICT DO NOTHING;
    SELECT * INTO a FROM account_budgets WHERE account_id = p_account AND env = p_env FOR UPDATE;
    IF a.budget_period = p_period AND (a.period_end IS NOT NULL OR p_period = 'total')
       AND (a.budget_units IS NOT NULL OR a.budget_usd IS NOT NULL) THEN
        UPDATE account_budgets SET budget_units = p_units, budget_usd = p_usd WHERE account_id = p_account AND env = p_env;
        RETURN;
    END IF;
    SELECT n.period_start, n.period_end INTO s, e FROM budget_period_bounds(p_period, account_tz(p_account), now()) n;
    UPDATE account_budgets t
       SET budget_units = p_units, budget_usd = p_usd, budget_period = p_period, period_start = s, period_end = e,
           period_units = x.units, period_usd = x.usd
      FROM charged_since(p_account, p_env, NULL, s) x
     WHERE t.account_id = p_account AND t.env = p_env;
END $$;

-- meter_release also gives the account's hold back (0013's function otherwise).
CREATE OR REPLACE FUNCTION meter_release(p_lease text, p_owner text, p_unit_usd numeric)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    l leases%ROWTYPE;
BEGIN
    PERFORM 1 FROM key_balances WHERE key_id = (SELECT key_id FROM leases WHERE lease_id = p_lease) FOR UPDATE;
    DELETE FROM leases
     WHERE lease_id = p_lease AND (owner = p_owner OR (p_owner IS NULL AND expires_at < now()))
    RETURNING * INTO l;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    UPDATE key_balances SET held_units = held_units - l.units, held_usd = held_usd - l.units * p_unit_usd
     WHERE key_id = l.key_id;
    UPDATE account_budgets SET held_units = held_units - l.units WHERE account_id = l.account_id AND env = l.env;
    UPDATE account_days SET held_units = held_units - l.units
     WHERE account_id = l.account_id AND env = l.env AND day = l.day;
    RETURN l.units;
END $$;

-- meter_lease checks the current period's spend of the key and of the account (it
-- rolls their periods first); the rest is 0013's rule unchanged. Locks: the key's
-- balance, then the account's budgets, then the day, then the lease.
CREATE OR REPLACE FUNCTION meter_lease(p_lease text, p_owner text, p_key text, p_account text, p_env text, p_day date,
                            p_min bigint, p_want bigint, p_unit_usd numeric, p_allowance bigint, p_ttl interval,
                            OUT outcome text, OUT granted bigint)
LANGUAGE plpgsql AS $$
DECLARE
    b    key_balances%ROWTYPE;
    a    account_budgets%ROWTYPE;
    d    account_days%ROWTYPE;
    room bigint := p_want;
    free bigint;
BEGIN
    granted := 0;
    PERFORM 1 FROM key_balances WHERE key_id = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no balance row for key %', p_key;
    END IF;
    PERFORM meter_roll(p_key);
    SELECT * INTO b FROM key_balances WHERE key_id = p_key;
    IF b.budget_units IS NOT NULL THEN
        free := b.budget_units - b.period_units - b.held_units;
        IF free < p_min THEN
            outcome := 'budget_units';
            RETURN;
        END IF;
        room := least(room, greatest(p_min, free / 4));
    END IF;
    IF b.budget_usd IS NOT NULL THEN
        free := floor((b.budget_usd - b.period_usd - b.held_usd) / p_unit_usd)::bigint;
        IF free < p_min THEN
            outcome := 'budget_usd';
            RETURN;
        END IF;
        room := least(room, greatest(p_min, free / 4));
    END IF;
    INSERT INTO account_budgets (account_id, env) VALUES (p_account, p_env) ON CONFLICT DO NOTHING;
    PERFORM 1 FROM account_budgets WHERE account_id = p_account AND env = p_env FOR UPDATE;
    PERFORM account_roll(p_account, p_env);
    SELECT * INTO a FROM account_budgets WHERE account_id = p_account AND env = p_env;
    IF a.budget_units IS NOT NULL THEN
        free := a.budget_units - a.period_units - a.held_units;
        IF free < p_min THEN
            outcome := 'account_budget_units';
            RETURN;
        END IF;
        room := least(room, greatest(p_min, free / 4));
    END IF;
    IF a.budget_usd IS NOT NULL THEN
        free := floor((a.budget_usd - a.period_usd) / p_unit_usd)::bigint - a.held_units;
        IF free < p_min THEN
            outcome := 'account_budget_usd';
            RETURN;
        END IF;
        room := least(room, greatest(p_min, free / 4));
    END IF;
    INSERT INTO account_days (account_id, env, day, units) VALUES (p_account, p_env, p_day, 0)
        ON CONFLICT (account_id, env, day) DO NOTHING;
    SELECT * INTO d FROM account_days WHERE account_id = p_account AND env = p_env AND day = p_day FOR UPDATE;
    free := p_allowance - d.units - d.held_units;
    IF free < p_min THEN
        outcome := 'allowance';
        RETURN;
    END IF;
    room := least(room, greatest(p_min, free / 4));
    UPDATE key_balances SET held_units = held_units + room, held_usd = held_usd + room * p_unit_usd WHERE key_id = p_key;
    UPDATE account_budgets SET held_units = held_units + room WHERE account_id = p_account AND env = p_env;
    UPDATE account_days SET held_units = held_units + room WHERE account_id = p_account AND env = p_env AND day = p_day;
    INSERT INTO leases (lease_id, owner, key_id, account_id, env, day, units, expires_at)
    VALUES (p_lease, p_owner, p_key, p_account, p_env, p_day, room, now() + p_ttl)
    ON CONFLICT (lease_id) DO UPDATE SET units = leases.units + excluded.units, expires_at = excluded.expires_at;
    outcome := 'ok';
    granted := room;
END $$;

-- meter_settle also counts the settled units in the key's and the account's current
-- periods (rolled first).
CREATE OR REPLACE FUNCTION meter_settle(p_lease text, p_owner text, p_units bigint[], p_scopes text[], p_keys text[],
                             p_statuses int[], p_responses bytea[], p_unit_usd numeric, p_at timestamptz,
                             p_strict boolean)
RETURNS boolean[] LANGUAGE plpgsql AS $$
DECLARE
    l     leases%ROWTYPE;
    kept  boolean[] := '{}';
    total bigint := 0;
    n     int := coalesce(array_length(p_units, 1), 0);
BEGIN
    -- every function here locks the key's balance first, then the day, then the lease
    PERFORM 1 FROM key_balances WHERE key_id = (SELECT key_id FROM leases WHERE lease_id = p_lease) FOR UPDATE;
    FOR i IN 1 .. n LOOP
        IF p_keys[i] IS NULL THEN
            kept := kept || true;
        ELSE
            UPDATE idempotency SET state = 'done', status = p_statuses[i], response = p_responses[i], expires_at = NULL
             WHERE scope = p_scopes[i] AND idem_key = p_keys[i] AND owner = p_owner AND state = 'running';
            IF NOT FOUND AND p_strict THEN
                RAISE EXCEPTION 'claim of % taken over', p_keys[i] USING ERRCODE = 'serialization_failure';
            END IF;
            kept := kept || FOUND;
        END IF;
        IF kept[i] THEN
            total := total + p_units[i];
        END IF;
    END LOOP;
    UPDATE leases SET units = units - total
     WHERE lease_id = p_lease AND owner = p_owner AND units >= total
    RETURNING * INTO l;
    IF NOT FOUND THEN
        IF p_strict THEN
            RAISE EXCEPTION 'lease % lost', p_lease USING ERRCODE = 'serialization_failure';
        END IF;
        RETURN array_fill(false, ARRAY[n]);
    END IF;
    PERFORM meter_roll(l.key_id);
    UPDATE key_balances SET spent_units = spent_units + total, spent_usd = spent_usd + total * p_unit_usd,
           period_units = period_units + total, period_usd = period_usd + total * p_unit_usd,
           held_units = held_units - total, held_usd = held_usd - total * p_unit_usd,
           last_used_at = greatest(last_used_at, p_at)
     WHERE key_id = l.key_id;
    PERFORM account_roll(l.account_id, l.env);
    UPDATE account_budgets SET period_units = period_units + total, period_usd = period_usd + total * p_unit_usd,
           held_units = held_units - total
     WHERE account_id = l.account_id AND env = l.env;
    UPDATE account_days SET units = units + total, held_units = held_units - total
     WHERE account_id = l.account_id AND env = l.env AND day = l.day;
    RETURN kept;
END $$;

-- Budget alerts are told once per period: a crossing remembers the period it was in.
ALTER TABLE budget_alerts ADD COLUMN period_start timestamptz;

-- budget_holders is every budget alerts watch, as of now: each key's (held under its
-- key id) and each account's per env (under 'account:<account>:<env>', key_id null).
CREATE VIEW budget_holders AS
SELECT key_id AS holder, key_id, account_id, env, budget_units, period_units, budget_period, period_start FROM key_periods
UNION ALL
SELECT 'account:' || account_id || ':' || env, NULL, account_id, env, budget_units, period_units, budget_period, period_start
  FROM account_periods;

-- The keys read model shows the period (filled by the projection from the events).
ALTER TABLE api_keys ADD COLUMN budget_period text NOT NULL DEFAULT 'total';
