-- When each key was last charged for a call: the key record's last_used_at. Set by the
-- charge functions in the charging transaction; free calls do not move it (a write per
-- request would cost more than the field is worth).
ALTER TABLE key_balances ADD COLUMN last_used_at timestamptz;

CREATE OR REPLACE FUNCTION ledger_charge(p_key text, p_account text, p_env text, p_day date,
                                         p_units bigint, p_usd numeric, p_allowance bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    b key_balances%ROWTYPE;
BEGIN
    UPDATE key_balances SET spent_units = spent_units + p_units, spent_usd = spent_usd + p_usd, last_used_at = now()
     WHERE key_id = p_key
       AND (budget_units IS NULL OR spent_units + held_units + p_units <= budget_units)
       AND (budget_usd IS NULL OR spent_usd + held_usd + p_usd <= budget_usd)
    RETURNING * INTO b;
    IF NOT FOUND THEN
        SELECT * INTO b FROM key_balances WHERE key_id = p_key;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no balance row for key %', p_key;
        END IF;
        IF b.budget_units IS NOT NULL AND b.spent_units + b.held_units + p_units > b.budget_units THEN
            RETURN 'budget_units';
        END IF;
        RETURN 'budget_usd';
    END IF;
    IF p_units <= p_allowance THEN
        INSERT INTO account_days AS d (account_id, env, day, units) VALUES (p_account, p_env, p_day, p_units)
        ON CONFLICT (account_id, env, day) DO UPDATE SET units = d.units + excluded.units
         WHERE d.units + excluded.units <= p_allowance;
    END IF;
    IF p_units > p_allowance OR NOT FOUND THEN
        -- undo the spend (last_used_at stays: the key was used, even if refused)
        UPDATE key_balances SET spent_units = spent_units - p_units, spent_usd = spent_usd - p_usd WHERE key_id = p_key;
        RETURN 'allowance';
    END IF;
    RETURN 'ok';
END $$;

CREATE OR REPLACE FUNCTION ledger_charge_held(p_key text, p_account text, p_env text, p_day date,
                                              p_units bigint, p_usd numeric, p_allowance bigint)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF p_units > p_allowance THEN
        RETURN 'allowance';
    END IF;
    INSERT INTO account_days AS d (account_id, env, day, units) VALUES (p_account, p_env, p_day, p_units)
    ON CONFLICT (account_id, env, day) DO UPDATE SET units = d.units + excluded.units
     WHERE d.units + excluded.units <= p_allowance;
    IF NOT FOUND THEN
        RETURN 'allowance';
    END IF;
    UPDATE key_balances SET spent_units = spent_units + p_units, spent_usd = spent_usd + p_usd,
        held_units = greatest(0, held_units - p_units), held_usd = greatest(0, held_usd - p_usd), last_used_at = now()
     WHERE key_id = p_key;
    RETURN 'ok';
END $$;
