-- Costed calls authenticate from memory (projections.Authenticator.Remembered) and the
-- charge checks, in its own transaction, that the key and its account are still at the
-- versions the caller authenticated at. A key revoked, rotated or changed, or an account
-- whose plan changed, is refused with 'stale' (nothing charged) and the caller
-- authenticates afresh. Version 0: no check (the caller authenticated from the database).
CREATE FUNCTION ledger_charge_checked(p_key_version bigint, p_account_version bigint,
                                      p_key text, p_account text, p_env text, p_day date,
                                      p_units bigint, p_usd numeric, p_allowance bigint,
                                      p_scope text, p_idem text, p_hash bytea, p_status int, p_response bytea)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF p_key_version > 0 AND (
           (SELECT version FROM streams WHERE stream_id = 'key-' || p_key) IS DISTINCT FROM p_key_version
        OR (SELECT version FROM streams WHERE stream_id = 'account-' || p_account) IS DISTINCT FROM p_account_version) THEN
        RETURN 'stale';
    END IF;
    RETURN ledger_charge_once(p_key, p_account, p_env, p_day, p_units, p_usd, p_allowance,
                              p_scope, p_idem, p_hash, p_status, p_response);
END $$;

-- The fast append's form (see 0007): anything but 'ok' undoes the whole transaction.
DROP FUNCTION ledger_charge_strict(text, text, text, date, bigint, numeric, bigint, text, text, bytea, int, bytea);
CREATE FUNCTION ledger_charge_strict(p_key_version bigint, p_account_version bigint,
                                     p_key text, p_account text, p_env text, p_day date,
                                     p_units bigint, p_usd numeric, p_allowance bigint,
                                     p_scope text, p_idem text, p_hash bytea, p_status int, p_response bytea)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    outcome text;
BEGIN
    outcome := ledger_charge_checked(p_key_version, p_account_version, p_key, p_account, p_env, p_day,
                                     p_units, p_usd, p_allowance, p_scope, p_idem, p_hash, p_status, p_response);
    IF outcome <> 'ok' THEN
        RAISE EXCEPTION 'charge refused: %', outcome USING ERRCODE = 'serialization_failure';
    END IF;
END $$;
