-- A budget period never starts before the one it follows ended.
--
-- A period that has ended rolls into the period of its kind holding now(), in the
-- account's zone as it is now. After a change of zone that period's first local midnight
-- can lie before the old period's end: an hour before it for a zone one hour to the east,
-- most of a day before it for a zone to the west. A credit gives back to the current
-- period when its charge was made since that period's start, so refunding a charge the
-- old period had counted lowered the new period's spend, which it never held: the new
-- period could then charge past its budget by the refund. The roll, and the views that
-- read an ended period as the next one, now start the next period where the old ended.

-- CREATE OR REPLACE drops a function's settings: the rolls keep theirs, planned once
-- (0028) and looking up by key (0039).
CREATE OR REPLACE FUNCTION meter_roll(p_keys text[]) RETURNS void LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
BEGIN
    UPDATE key_balances
       SET (period_start, period_end) =
           (SELECT greatest(n.period_start, key_balances.period_end), n.period_end
              FROM budget_period_bounds(budget_period, account_tz(account_id), now()) n),
           period_units = 0, period_usd = 0
     WHERE key_id = ANY (p_keys) AND period_end <= now();
END $$;

CREATE OR REPLACE FUNCTION account_roll(p_accounts text[], p_envs text[]) RETURNS void LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
BEGIN
    UPDATE account_budgets a
       SET (period_start, period_end) =
           (SELECT greatest(n.period_start, a.period_end), n.period_end
              FROM budget_period_bounds(a.budget_period, account_tz(a.account_id), now()) n),
           period_units = 0, period_usd = 0
      FROM unnest(p_accounts, p_envs) AS p(account_id, env)
     WHERE a.account_id = p.account_id AND a.env = p.env AND a.period_end <= now();
END $$;

CREATE OR REPLACE VIEW key_periods AS
SELECT b.key_id, b.account_id, b.env, b.budget_units, b.budget_usd, b.spent_units, b.spent_usd,
       b.held_units, b.held_usd, b.last_used_at, b.budget_period,
       CASE WHEN b.period_end <= now() THEN greatest(n.period_start, b.period_end) ELSE b.period_start END AS period_start,
       CASE WHEN b.period_end <= now() THEN n.period_end ELSE b.period_end END AS period_end,
       CASE WHEN b.period_end <= now() THEN 0 ELSE b.period_units END AS period_units,
       CASE WHEN b.period_end <= now() THEN 0 ELSE b.period_usd END AS period_usd
  FROM key_balances b
  LEFT JOIN LATERAL budget_period_bounds(b.budget_period, account_tz(b.account_id), now()) n ON b.period_end <= now();

CREATE OR REPLACE VIEW account_periods AS
SELECT a.account_id, a.env, a.budget_units, a.budget_usd, a.budget_period, a.held_units,
       CASE WHEN a.period_end <= now() THEN greatest(n.period_start, a.period_end) ELSE a.period_start END AS period_start,
       CASE WHEN a.period_end <= now() THEN n.period_end ELSE a.period_end END AS period_end,
       CASE WHEN a.period_end <= now() THEN 0 ELSE a.period_units END AS period_units,
       CASE WHEN a.period_end <= now() THEN 0 ELSE a.period_usd END AS period_usd
  FROM account_budgets a
  LEFT JOIN LATERAL budget_period_bounds(a.budget_period, account_tz(a.account_id), now()) n ON a.period_end <= now();
