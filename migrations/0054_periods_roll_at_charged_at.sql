-- A charge is counted in the budget period its charged_at falls in, or a later one.
--
-- A credit gives back to the current period when its charge was made since that
-- period's start (migrations 0024, 0043): it takes the charge's charged_at to say which
-- period counted it. But a settle decided the period by the database's now(), the start
-- of its transaction, while charged_at is stamped by the server that answered: a server
-- whose clock ran ahead of the database's, or a job's record stamped after it waited on
-- its locks, made a charge dated just after midnight that the settle counted in the day
-- before. Refunding it then lowered the new day's spend, which never held it, and the new
-- day could charge past its budget by the refund. The settle now rolls the periods at the
-- latest of now() and the batch's p_at (its lines' latest charged_at; at most a minute
-- ahead of now(), so that a server whose clock is far off cannot end a period early by
-- more), so a charge is never counted in a period that ended before its charged_at.
-- A charge counted in a later period than its charged_at's is never given back to that
-- period by a refund: conservative, the budget never crossed.

CREATE FUNCTION meter_roll(p_keys text[], p_at timestamptz) RETURNS void LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
BEGIN
    UPDATE key_balances
       SET (period_start, period_end) =
           (SELECT greatest(n.period_start, key_balances.period_end), n.period_end
              FROM budget_period_bounds(budget_period, account_tz(account_id), p_at) n),
           period_units = 0, period_usd = 0
     WHERE key_id = ANY (p_keys) AND period_end <= p_at;
END $$;

CREATE FUNCTION account_roll(p_accounts text[], p_envs text[], p_at timestamptz) RETURNS void LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
BEGIN
    UPDATE account_budgets a
       SET (period_start, period_end) =
           (SELECT greatest(n.period_start, a.period_end), n.period_end
              FROM budget_period_bounds(a.budget_period, account_tz(a.account_id), p_at) n),
           period_units = 0, period_usd = 0
      FROM unnest(p_accounts, p_envs) AS p(account_id, env)
     WHERE a.account_id = p.account_id AND a.env = p.env AND a.period_end <= p_at;
END $$;

-- As in 0038 (settings as 0028 and 0039 set them: CREATE OR REPLACE drops them), but
-- for the instant the periods roll at.
CREATE OR REPLACE FUNCTION meter_settle_all(p_owner text, p_leases text[], p_units bigint[], p_scopes text[], p_keys text[],
                                 p_statuses int[], p_responses bytea[], p_unit_usd numeric, p_at timestamptz,
                                 p_strict boolean)
RETURNS boolean[] LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
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
    -- the instant the batch's periods are decided at: its lines' latest charged_at when
    -- the server's clock runs ahead of the database's (at most a minute ahead)
    roll_at   timestamptz := greatest(now(), least(p_at, now() + interval '1 minute'));
    b_key     text[];
    b_account text[];
    b_env     text[];
    b_day     date[];
BEGIN
    IF n = 0 THEN
        RETURN '{}';
    END IF;
    -- the batch's leases, each once (p_leases names a lease once per call)
    SELECT array_agg(key_id), array_agg(account_id), array_agg(env), array_agg(day)
      INTO b_key, b_account, b_env, b_day
      FROM leases WHERE lease_id IN (SELECT DISTINCT unnest(p_leases));
    PERFORM 1 FROM key_balances WHERE key_id = ANY (b_key) ORDER BY key_id FOR UPDATE;
    PERFORM 1 FROM account_budgets
     WHERE (account_id, env) IN (SELECT * FROM unnest(b_account, b_env))
     ORDER BY account_id, env FOR UPDATE;
    PERFORM 1 FROM account_days
     WHERE (account_id, env, day) IN (SELECT * FROM unnest(b_account, b_env, b_day))
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

    PERFORM meter_roll(s_key, roll_at);
    UPDATE key_balances b
       SET spent_units = spent_units + s.total, spent_usd = spent_usd + s.total * p_unit_usd,
           period_units = period_units + s.total, period_usd = period_usd + s.total * p_unit_usd,
           held_units = held_units - s.total, held_usd = held_usd - s.total * p_unit_usd,
           last_used_at = greatest(last_used_at, p_at)
      FROM (SELECT key_id, sum(total) AS total FROM unnest(s_key, s_total) AS u(key_id, total) GROUP BY 1) s
     WHERE b.key_id = s.key_id;
    PERFORM account_roll(s_account, s_env, roll_at);
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
