-- Disputes: a customer questions charges; an operator accepts (the charges are
-- credited) or rejects (with a reason). Every step is an event on the dispute's stream.
--
-- disputed_charges is write-side state: a charge is disputed once, whatever races.
CREATE TABLE disputed_charges (
    charge_id  text PRIMARY KEY,
    dispute_id text NOT NULL
);

-- The disputes read model (inline: written with the events).
CREATE TABLE disputes (
    dispute_id  text PRIMARY KEY,
    account_id  text        NOT NULL,
    key_id      text        NOT NULL,
    env         text        NOT NULL,
    state       text        NOT NULL, -- open | accepted | rejected
    charge_ids  text[]      NOT NULL,
    reason      text        NOT NULL,
    opened_at   timestamptz NOT NULL,
    resolved_at timestamptz,
    resolved_by text,
    resolution  text,                 -- the operator's note (accepted) or reason (rejected)
    credit_ids  text[]      NOT NULL DEFAULT '{}',
    version     bigint      NOT NULL
);
CREATE INDEX disputes_account ON disputes (account_id, opened_at);
