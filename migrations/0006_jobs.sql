-- Jobs: read models (projection "jobs_v1"), the job event stream for SSE, executor
-- leases, the bus topics, and the ledger's holds.

CREATE TABLE jobs (
    job_id          text PRIMARY KEY,
    account_id      text           NOT NULL,
    key_id          text           NOT NULL,
    kind            text           NOT NULL,
    state           text           NOT NULL,
    positions_total int            NOT NULL,
    positions_done  int            NOT NULL,
    cost_units      bigint         NOT NULL,
    cost_usd        numeric(20, 6) NOT NULL,
    created_at      timestamptz    NOT NULL,
    started_at      timestamptz,
    finished_at     timestamptz,
    version         bigint         NOT NULL
);
CREATE INDEX jobs_account ON jobs (account_id, created_at);
CREATE INDEX jobs_queued ON jobs (created_at) WHERE state = 'queued';

-- What GET /jobs/{id}/events sends, in order: seq is the SSE event id.
CREATE TABLE job_stream (
    job_id   text   NOT NULL,
    seq      int    NOT NULL,
    version  bigint NOT NULL, -- the job event this SSE event came from
    kind     text   NOT NULL, -- state | position | progress | end
    data     jsonb  NOT NULL,
    PRIMARY KEY (job_id, seq)
);

-- Which worker runs a job, until when. A running job whose lease ran out is taken over.
CREATE TABLE job_leases (
    job_id      text PRIMARY KEY,
    worker      text        NOT NULL,
    lease_until timestamptz NOT NULL
);

CREATE TABLE watermill_jobs (
    "offset"       bigserial,
    uuid           varchar(36) NOT NULL,
    created_at     timestamp   NOT NULL DEFAULT CURRENT_TIMESTAMP,
    payload        bytea DEFAULT NULL, -- the event envelope, JSON; bytea: stored as sent, not re-parsed
    metadata       json DEFAULT NULL,
    transaction_id xid8        NOT NULL,
    PRIMARY KEY (transaction_id, "offset")
);
CREATE TABLE watermill_offsets_jobs (
    consumer_group                varchar(255) NOT NULL,
    offset_acked                  bigint,
    last_processed_transaction_id xid8 NOT NULL,
    PRIMARY KEY (consumer_group)
);
-- the command bus: SubmitJob commands for the executors
CREATE TABLE watermill_job_commands (
    "offset"       bigserial,
    uuid           varchar(36) NOT NULL,
    created_at     timestamp   NOT NULL DEFAULT CURRENT_TIMESTAMP,
    payload        bytea DEFAULT NULL, -- the event envelope, JSON; bytea: stored as sent, not re-parsed
    metadata       json DEFAULT NULL,
    transaction_id xid8        NOT NULL,
    PRIMARY KEY (transaction_id, "offset")
);
CREATE TABLE watermill_offsets_job_commands (
    consumer_group                varchar(255) NOT NULL,
    offset_acked                  bigint,
    last_processed_transaction_id xid8 NOT NULL,
    PRIMARY KEY (consumer_group)
);

-- Reserve a job's whole price on the key's budget: 'ok', or which budget it would pass.
CREATE FUNCTION ledger_hold(p_key text, p_units bigint, p_usd numeric)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    b key_balances%ROWTYPE;
BEGIN
    UPDATE key_balances SET held_units = held_units + p_units, held_usd = held_usd + p_usd
     WHERE key_id = p_key
       AND (budget_units IS NULL OR spent_units + held_units + p_units <= budget_units)
       AND (budget_usd IS NULL OR spent_usd + held_usd + p_usd <= budget_usd);
    IF FOUND THEN
        RETURN 'ok';
    END IF;
    SELECT * INTO b FROM key_balances WHERE key_id = p_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no balance row for key %', p_key;
    END IF;
    IF b.budget_units IS NOT NULL AND b.spent_units + b.held_units + p_units > b.budget_units THEN
        RETURN 'budget_units';
    END IF;
    RETURN 'budget_usd';
END $$;

-- Charge one position of a job against its hold: the budget was reserved, so only the
-- daily allowance is checked.
CREATE FUNCTION ledger_charge_held(p_key text, p_account text, p_env text, p_day date,
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

-- Give back what is left of a hold when its job ends.
CREATE FUNCTION ledger_release(p_key text, p_units bigint, p_usd numeric)
RETURNS void LANGUAGE sql AS $$
    UPDATE key_balances SET held_units = greatest(0, held_units - p_units), held_usd = greatest(0, held_usd - p_usd)
     WHERE key_id = p_key;
$$;
