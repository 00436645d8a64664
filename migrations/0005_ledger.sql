-- Metering and the ledger.
--
-- Write side (checked and changed atomically by the commands that charge):
--   key_balances: each key's budget, spend and holds; a charge is one conditional
--     UPDATE here, so concurrent calls can never overspend a budget.
--   account_days: units charged per account, env and UTC day, against the plan's daily
--     allowance.
--   idempotency: the first response to each Idempotency-Key, stored in the transaction
--     that charged it.
-- Read side (projection "ledger_v1", rebuilt from UnitsCharged events by `chessd replay`):
--   charges, ledger_entries.
CREATE TABLE key_balances (
    key_id       text PRIMARY KEY,
    account_id   text           NOT NULL,
    env          text           NOT NULL,
    budget_units bigint,
    budget_usd   numeric(20, 6),
    spent_units  bigint         NOT NULL DEFAULT 0,
    spent_usd    numeric(20, 6) NOT NULL DEFAULT 0,
    held_units   bigint         NOT NULL DEFAULT 0,
    held_usd     numeric(20, 6) NOT NULL DEFAULT 0,
    -- the key's last charged call (free calls do not move it: a write per request
    -- would cost more than the field is worth)
    last_used_at timestamptz
);

CREATE TABLE account_days (
    account_id text   NOT NULL,
    env        text   NOT NULL,
    day        date   NOT NULL,
    units      bigint NOT NULL,
    PRIMARY KEY (account_id, env, day)
);

CREATE TABLE idempotency (
    scope        text        NOT NULL, -- key id, or ip:<address> for keyless calls
    idem_key     text        NOT NULL,
    request_hash bytea       NOT NULL, -- SHA-256 of method, path and body
    status       int         NOT NULL,
    response     bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, idem_key)
);
CREATE INDEX idempotency_age ON idempotency (created_at);

-- One charge: everything needed to explain it later.
CREATE TABLE charges (
    position    bigint PRIMARY KEY, -- the UnitsCharged event
    charge_id   text           NOT NULL,
    request_id  text           NOT NULL,
    account_id  text           NOT NULL,
    key_id      text           NOT NULL,
    env         text           NOT NULL,
    day         date           NOT NULL,
    charged_at  timestamptz    NOT NULL,
    endpoint    text           NOT NULL,
    engine      text           NOT NULL,
    path        text           NOT NULL,
    cached      boolean        NOT NULL,
    units       bigint         NOT NULL,
    usd         numeric(20, 6) NOT NULL,
    params      json           NOT NULL
);
-- GET /usage reads by account and day; audits read the key's ledger stream instead.
CREATE INDEX charges_account_day ON charges (account_id, day);

-- Double-entry postings: per event, per currency, debits equal credits.
CREATE TABLE ledger_entries (
    position bigint         NOT NULL,
    line     int            NOT NULL,
    book     text           NOT NULL, -- <account id>/<env>
    account  text           NOT NULL, -- e.g. key:<key id>, allowance, revenue
    currency text           NOT NULL, -- UNITS or USD
    debit    numeric(20, 6) NOT NULL,
    credit   numeric(20, 6) NOT NULL,
    PRIMARY KEY (position, line)
);

CREATE TABLE watermill_ledger (
    "offset"       bigserial,
    uuid           varchar(36) NOT NULL,
    created_at     timestamp   NOT NULL DEFAULT CURRENT_TIMESTAMP,
    payload        bytea DEFAULT NULL, -- the event envelope, JSON; bytea: stored as sent, not re-parsed
    metadata       json DEFAULT NULL,
    transaction_id xid8        NOT NULL,
    PRIMARY KEY (transaction_id, "offset")
);
CREATE TABLE watermill_offsets_ledger (
    consumer_group                varchar(255) NOT NULL,
    offset_acked                  bigint,
    last_processed_transaction_id xid8 NOT NULL,
    PRIMARY KEY (consumer_group)
);

-- The atomic check-and-charge: the key's budget (spend plus holds) and the account's
-- daily allowance are checked and moved in one step; either both move or neither.
-- Returns 'ok', 'budget_units', 'budget_usd' or 'allowance'.
CREATE FUNCTION ledger_charge(p_key text, p_account text, p_env text, p_day date,
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
        UPDATE key_balances SET spent_units = spent_units - p_units, spent_usd = spent_usd - p_usd WHERE key_id = p_key;
        RETURN 'allowance';
    END IF;
    RETURN 'ok';
END $$;

-- ledger_charge with an Idempotency-Key: the first response is stored with the charge,
-- a second use of the key is reported as 'duplicate' and charges nothing. A refused
-- charge stores nothing, so a retry after raising the budget can succeed.
CREATE FUNCTION ledger_charge_once(p_key text, p_account text, p_env text, p_day date,
                                   p_units bigint, p_usd numeric, p_allowance bigint,
                                   p_scope text, p_idem text, p_hash bytea, p_status int, p_response bytea)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    outcome text;
BEGIN
    IF p_idem <> '' THEN
        INSERT INTO idempotency (scope, idem_key, request_hash, status, response)
        VALUES (p_scope, p_idem, p_hash, p_status, p_response) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN 'duplicate';
        END IF;
    END IF;
    outcome := ledger_charge(p_key, p_account, p_env, p_day, p_units, p_usd, p_allowance);
    IF outcome <> 'ok' AND p_idem <> '' THEN
        DELETE FROM idempotency WHERE scope = p_scope AND idem_key = p_idem;
    END IF;
    RETURN outcome;
END $$;
