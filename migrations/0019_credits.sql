-- Credits (refunds): a charge is corrected by a reversing transaction that points at
-- it, never by editing it.
--
-- credited_charges is write-side state: one row per credited charge, written in the
-- transaction that appends its UnitsCredited event, so a charge is credited once
-- however many operators or disputes ask at the same time.
CREATE TABLE credited_charges (
    charge_id  text PRIMARY KEY,
    credit_id  text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The read model of the credits (inline, with the ledger's: written with the event).
CREATE TABLE credits (
    position        bigint PRIMARY KEY, -- the UnitsCredited event
    credit_id       text           NOT NULL UNIQUE,
    charge_id       text           NOT NULL UNIQUE,
    charge_position bigint         NOT NULL,
    account_id      text           NOT NULL,
    key_id          text           NOT NULL,
    env             text           NOT NULL,
    day             date           NOT NULL, -- the charge's allowance day, given back
    credited_at     timestamptz    NOT NULL,
    units           bigint         NOT NULL,
    usd             numeric(20, 6) NOT NULL,
    reason          text           NOT NULL,
    actor           text           NOT NULL,
    dispute_id      text
);
CREATE INDEX credits_account_credited_at ON credits (account_id, credited_at);
