-- The one money path (docs/BILLING.md): reserve before work, settle after, in batches.
--
-- A lease reserves units against a key's budgets (units and USD) and its account's daily
-- allowance, in one step that is the whole budget rule (meter_lease). A server serves
-- calls from its leases in memory and settles the answered ones in group commits
-- (meter_settle moves reserved units to spent). A lease that is not renewed expires and
-- any server gives its units back (meter_release): a server that dies forgives what it
-- answered and had not settled, and never charges twice nor crosses a budget. A job's
-- hold is a lease owned by the job.
--
-- Invariants: key_balances.held_units = sum of its leases' units (held_usd the same at
-- the unit price); account_days.held_units likewise per account, env and day; spent plus
-- held never exceeds a budget or an allowance.
-- The per-call charge functions of 0005-0008 (budget checked after the search, in
-- several places) and the job holds of 0006 give way to the meter.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT oid::regprocedure FROM pg_proc
              WHERE proname IN ('ledger_charge', 'ledger_charge_once', 'ledger_charge_strict', 'ledger_charge_checked',
                                'ledger_hold', 'ledger_charge_held', 'ledger_release') LOOP
        EXECUTE 'DROP FUNCTION ' || f;
    END LOOP;
END $$;

ALTER TABLE account_days ADD COLUMN held_units bigint NOT NULL DEFAULT 0;

CREATE TABLE leases (
    lease_id   text PRIMARY KEY,
    owner      text        NOT NULL, -- a server process (srv_...) or a job (job:<id>)
    key_id     text        NOT NULL,
    account_id text        NOT NULL,
    env        text        NOT NULL,
    day        date        NOT NULL, -- the daily allowance it draws on (UTC)
    units      bigint      NOT NULL CHECK (units >= 0), -- reserved, not yet settled
    expires_at timestamptz NOT NULL
);
CREATE INDEX leases_expiry ON leases (expires_at);
CREATE INDEX leases_owner ON leases (owner);

-- Idempotency-Key claims: a claim is taken (durably) before the answer and holds the
-- answer once the call is settled. A running claim whose owner stops renewing it expires
-- and a retry takes it over.
ALTER TABLE idempotency
    ADD COLUMN state      text NOT NULL DEFAULT 'done' CHECK (state IN ('running', 'done')),
    ADD COLUMN owner      text,
    ADD COLUMN expires_at timestamptz;

-- meter_lease reserves, for lease p_lease of p_owner, between p_min and p_want units:
-- at most a quarter of what each budget that applies has free (so that other servers
-- find some too), but always p_min when it fits. 'ok' with what was granted, or the
-- first budget without room for p_min: 'budget_units', 'budget_usd', 'allowance'.
CREATE FUNCTION meter_lease(p_lease text, p_owner text, p_key text, p_account text, p_env text, p_day date,
                            p_min bigint, p_want bigint, p_unit_usd numeric, p_allowance bigint, p_ttl interval,
                            OUT outcome text, OUT granted bigint)
LANGUAGE plpgsql AS $$
DECLARE
    b    key_balances%ROWTYPE;
    d    account_days%ROWTYPE;
    room bigint := p_want;
    free bigint;
BEGIN
    granted := 0;
    SELECT * INTO b FROM key_balances WHERE key_id = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no balance row for key %', p_key;
    END IF;
    IF b.budget_units IS NOT NULL THEN
        free := b.budget_units - b.spent_units - b.held_units;
        IF free < p_min THEN
            outcome := 'budget_units';
            RETURN;
        END IF;
        room := least(room, greatest(p_min, free / 4));
    END IF;
    IF b.budget_usd IS NOT NULL THEN
        free := floor((b.budget_usd - b.spent_usd - b.held_usd) / p_unit_usd)::bigint;
        IF free < p_min THEN
            outcome := 'budget_usd';
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
    UPDATE account_days SET held_units = held_units + room WHERE account_id = p_account AND env = p_env AND day = p_day;
    INSERT INTO leases (lease_id, owner, key_id, account_id, env, day, units, expires_at)
    VALUES (p_lease, p_owner, p_key, p_account, p_env, p_day, room, now() + p_ttl)
    ON CONFLICT (lease_id) DO UPDATE SET units = leases.units + excluded.units, expires_at = excluded.expires_at;
    outcome := 'ok';
    granted := room;
END $$;

-- meter_settle charges the answered calls of lease p_lease (p_units[i] each): reserved
-- becomes spent, and the answer of a call with an Idempotency-Key (p_keys[i] not null)
-- is stored with its charge. It returns, per call, whether it was charged. A call whose
-- claim is no longer p_owner's (taken over by a retry after its claim expired) is not:
-- the retry answers and charges it. A lease that is gone (it expired and was released)
-- or holds less than the total settles nothing. With p_strict any of these raises a
-- serialization failure that rolls the whole one-round-trip batch back (the caller then
-- takes the checked path).
CREATE FUNCTION meter_settle(p_lease text, p_owner text, p_units bigint[], p_scopes text[], p_keys text[],
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
    UPDATE key_balances SET spent_units = spent_units + total, spent_usd = spent_usd + total * p_unit_usd,
           held_units = held_units - total, held_usd = held_usd - total * p_unit_usd,
           last_used_at = greatest(last_used_at, p_at)
     WHERE key_id = l.key_id;
    UPDATE account_days SET units = units + total, held_units = held_units - total
     WHERE account_id = l.account_id AND env = l.env AND day = l.day;
    RETURN kept;
END $$;

-- meter_release gives back what lease p_lease still reserves and deletes it: its owner's
-- when p_owner is given, or anyone's once expired when it is null. Returns the units.
CREATE FUNCTION meter_release(p_lease text, p_owner text, p_unit_usd numeric)
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
    UPDATE account_days SET held_units = held_units - l.units
     WHERE account_id = l.account_id AND env = l.env AND day = l.day;
    RETURN l.units;
END $$;

-- meter_claim takes an Idempotency-Key for a request whose body hashes to p_hash:
-- 'claimed' (a new key, or one whose running owner stopped renewing it), 'done' with the
-- stored answer, 'idempotency_mismatch' (used with another request) or
-- 'idempotency_running' (the first request still runs). Answers are kept 24 hours.
CREATE FUNCTION meter_claim(p_scope text, p_key text, p_hash bytea, p_owner text, p_ttl interval,
                            OUT outcome text, OUT status int, OUT response bytea)
LANGUAGE plpgsql AS $$
DECLARE
    i idempotency%ROWTYPE;
BEGIN
    DELETE FROM idempotency
     WHERE scope = p_scope AND idem_key = p_key AND state = 'done' AND created_at < now() - interval '24 hours';
    LOOP
        INSERT INTO idempotency (scope, idem_key, request_hash, status, response, state, owner, expires_at)
        VALUES (p_scope, p_key, p_hash, 0, '', 'running', p_owner, now() + p_ttl)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            outcome := 'claimed';
            RETURN;
        END IF;
        SELECT * INTO i FROM idempotency WHERE scope = p_scope AND idem_key = p_key FOR UPDATE;
        EXIT WHEN FOUND; -- else the claim we collided with was given back: try again
    END LOOP;
    IF i.request_hash <> p_hash THEN
        outcome := 'idempotency_mismatch';
    ELSIF i.state = 'done' THEN
        outcome := 'done';
        status := i.status;
        response := i.response;
    ELSIF i.expires_at < now() THEN
        UPDATE idempotency SET owner = p_owner, expires_at = now() + p_ttl WHERE scope = p_scope AND idem_key = p_key;
        outcome := 'claimed';
    ELSE
        outcome := 'idempotency_running';
    END IF;
END $$;
