-- A settle of many leases in one statement, and the rolls in PL/pgSQL.
--
-- A server's group commit settled each lease of the batch by its own meter_settle call,
-- and each call rolled its key's and its account's budget periods through LANGUAGE sql
-- functions, which PostgreSQL plans afresh on every call (an UPDATE is never inlined).
-- With calls of 64 accounts under load that was 0.8 ms of PostgreSQL per lease and
-- batch (pg_stat_statements: meter_settle 2.6 s, meter_roll and account_roll 0.7 s each,
-- of a 5 s run), so charges per second fell as the accounts grew. meter_settle_all
-- settles every lease of a batch with one statement per table, and takes the locks in
-- one global order: the keys' balances (by key), the accounts' budgets (by account and
-- env), the days (by account, env and day), then the leases, so that two servers'
-- batches, top-ups and releases, which all lock a key's balance first, cannot deadlock.
-- meter_settle (one lease: a job's hold) is meter_settle_all of one lease.

-- meter_roll starts the next period of every key of p_keys whose period has ended; the
-- caller holds their balance rows.
CREATE FUNCTION meter_roll(p_keys text[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE key_balances
       SET (period_start, period_end) =
           (SELECT n.period_start, n.period_end FROM budget_period_bounds(budget_period, account_tz(account_id), now()) n),
           period_units = 0, period_usd = 0
     WHERE key_id = ANY (p_keys) AND period_end <= now();
END $$;

CREATE OR REPLACE FUNCTION meter_roll(p_key text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM meter_roll(ARRAY[p_key]);
END $$;

-- account_roll is meter_roll for the accounts' budgets: one (account, env) pair per index.
CREATE FUNCTION account_roll(p_accounts text[], p_envs text[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE account_budgets a
       SET (period_start, period_end) =
           (SELECT n.period_start, n.period_end FROM budget_period_bounds(a.budget_period, account_tz(a.account_id), now()) n),
           period_units = 0, period_usd = 0
      FROM unnest(p_accounts, p_envs) AS p(account_id, env)
     WHERE a.account_id = p.account_id AND a.env = p.env AND a.period_end <= now();
END $$;

CREATE OR REPLACE FUNCTION account_roll(p_account text, p_env text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM account_roll(ARRAY[p_account], ARRAY[p_env]);
END $$;

-- meter_settle_all settles answered calls, one per index: call i drew p_units[i] from
-- lease p_leases[i] of owner p_owner and, when p_keys[i] is set, stores its answer
-- under its Idempotency-Key claim (p_scopes[i], p_keys[i]). It returns which calls are
-- charged: not those whose claim a retry took over, nor those whose lease is gone. With
-- p_strict either of those raises serialization_failure instead, and nothing is settled.
CREATE FUNCTION meter_settle_all(p_owner text, p_leases text[], p_units bigint[], p_scopes text[], p_keys text[],
                                 p_statuses int[], p_responses bytea[], p_unit_usd numeric, p_at timestamptz,
                                 p_strict boolean)
RETURNS boolean[] LANGUAGE plpgsql AS $$
DECLARE
    n         int := coalesce(array_length(p_units, 1), 0);
    claimed   int[];
    kept      boolean[];
    s_lease   text[];
    s_key     text[];
    s_account text[];
    s_env     text[];
    s_day     date[];
    s_total   bigint[];
BEGIN
    IF n = 0 THEN
        RETURN '{}';
    END IF;
    PERFORM 1 FROM key_balances
     WHERE key_id IN (SELECT key_id FROM leases WHERE lease_id = ANY (p_leases))
     ORDER BY key_id FOR UPDATE;
    PERFORM 1 FROM account_budgets
     WHERE (account_id, env) IN (SELECT account_id, env FROM leases WHERE lease_id = ANY (p_leases))
     ORDER BY account_id, env FOR UPDATE;
    PERFORM 1 FROM account_days
     WHERE (account_id, env, day) IN (SELECT account_id, env, day FROM leases WHERE lease_id = ANY (p_leases))
     ORDER BY account_id, env, day FOR UPDATE;

    WITH done AS (
        UPDATE idempotency d
           SET state = 'done', status = p_statuses[c.i], response = p_responses[c.i], expires_at = NULL
          FROM unnest(p_scopes, p_keys) WITH ORDINALITY AS c(scope, idem_key, i)
         WHERE c.idem_key IS NOT NULL AND d.scope = c.scope AND d.idem_key = c.idem_key
           AND d.owner = p_owner AND d.state = 'running'
        RETURNING c.i)
    SELECT coalesce(array_agg(i::int), '{}') INTO claimed FROM done;
    SELECT array_agg(p_keys[i] IS NULL OR i = ANY (claimed) ORDER BY i) INTO kept FROM generate_series(1, n) i;
    IF p_strict AND NOT (true = ALL (kept)) THEN
        RAISE EXCEPTION 'an Idempotency-Key claim was taken over' USING ERRCODE = 'serialization_failure';
    END IF;

    -- what each lease gives: the units of its kept calls
    WITH t AS (
        SELECT p_leases[i] AS lease_id, sum(CASE WHEN kept[i] THEN p_units[i] ELSE 0 END) AS total
          FROM generate_series(1, n) i GROUP BY 1),
    s AS (
        UPDATE leases l SET units = l.units - t.total
          FROM t
         WHERE l.lease_id = t.lease_id AND l.owner = p_owner AND l.units >= t.total
        RETURNING l.lease_id, l.key_id, l.account_id, l.env, l.day, t.total)
    SELECT coalesce(array_agg(lease_id), '{}'), array_agg(key_id), array_agg(account_id), array_agg(env),
           array_agg(day), array_agg(total)
      INTO s_lease, s_key, s_account, s_env, s_day, s_total FROM s;
    IF (SELECT count(DISTINCT l) FROM unnest(p_leases) l) <> coalesce(array_length(s_lease, 1), 0) THEN
        IF p_strict THEN
            RAISE EXCEPTION 'a lease was lost' USING ERRCODE = 'serialization_failure';
        END IF;
        SELECT array_agg(kept[i] AND p_leases[i] = ANY (s_lease) ORDER BY i) INTO kept FROM generate_series(1, n) i;
    END IF;

    PERFORM meter_roll(s_key);
    UPDATE key_balances b
       SET spent_units = spent_units + s.total, spent_usd = spent_usd + s.total * p_unit_usd,
           period_units = period_units + s.total, period_usd = period_usd + s.total * p_unit_usd,
           held_units = held_units - s.total, held_usd = held_usd - s.total * p_unit_usd,
           last_used_at = greatest(last_used_at, p_at)
      FROM (SELECT key_id, sum(total) AS total FROM unnest(s_key, s_total) AS u(key_id, total) GROUP BY 1) s
     WHERE b.key_id = s.key_id;
    PERFORM account_roll(s_account, s_env);
    UPDATE account_budgets a
       SET period_units = period_units + s.total, period_usd = period_usd + s.total * p_unit_usd,
           held_units = held_units - s.total
      FROM (SELECT account_id, env, sum(total) AS total
              FROM unnest(s_account, s_env, s_total) AS u(account_id, env, total) GROUP BY 1, 2) s
     WHERE a.account_id = s.account_id AND a.env = s.env;
    UPDATE account_days d
       SET units = units + s.total, held_units = held_units - s.total
      FROM (SELECT account_id, env, day, sum(total) AS total
              FROM unnest(s_account, s_env, s_day, s_total) AS u(account_id, env, day, total) GROUP BY 1, 2, 3) s
     WHERE d.account_id = s.account_id AND d.env = s.env AND d.day = s.day;
    RETURN kept;
END $$;

-- meter_settle is meter_settle_all of one lease's calls (a job's hold).
CREATE OR REPLACE FUNCTION meter_settle(p_lease text, p_owner text, p_units bigint[], p_scopes text[], p_keys text[],
                             p_statuses int[], p_responses bytea[], p_unit_usd numeric, p_at timestamptz,
                             p_strict boolean)
RETURNS boolean[] LANGUAGE plpgsql AS $$
BEGIN
    RETURN meter_settle_all(p_owner, array_fill(p_lease, ARRAY[coalesce(array_length(p_units, 1), 0)]), p_units,
                            p_scopes, p_keys, p_statuses, p_responses, p_unit_usd, p_at, p_strict);
END $$;
