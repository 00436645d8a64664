-- Read models for accounts and API keys. Written only by the projections package from the
-- events; `chessd rebuild` truncates and refills them.
CREATE TABLE accounts (
    account_id     text PRIMARY KEY,
    email          text        NOT NULL,
    name           text        NOT NULL,
    agent          text        NOT NULL,
    source         text        NOT NULL,
    plan           text        NOT NULL,
    email_verified boolean     NOT NULL,
    created_at     timestamptz NOT NULL,
    version        bigint      NOT NULL
);

CREATE TABLE api_keys (
    key_id       text PRIMARY KEY,
    account_id   text        NOT NULL,
    label        text        NOT NULL,
    scopes       text[]      NOT NULL,
    env          text        NOT NULL,
    budget_units bigint,
    budget_usd   numeric(20, 6),
    status       text        NOT NULL,
    prefix       text        NOT NULL,
    created_at   timestamptz NOT NULL,
    rotated_at   timestamptz,
    revoked_at   timestamptz,
    version      bigint      NOT NULL -- the key stream's version this row reflects
);
CREATE INDEX api_keys_account ON api_keys (account_id, created_at);

-- Every secret a key has had that may still authenticate: the current one (expires_at
-- null) and rotated-out ones inside their grace period.
CREATE TABLE key_secrets (
    secret_hash bytea PRIMARY KEY,
    key_id      text NOT NULL,
    expires_at  timestamptz
);
CREATE INDEX key_secrets_key ON key_secrets (key_id);

-- Outgoing mail. A real transport is a later plug-in that sends and marks rows.
CREATE TABLE mail_outbox (
    id         bigserial PRIMARY KEY,
    account_id text        NOT NULL,
    to_email   text        NOT NULL,
    subject    text        NOT NULL,
    body       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz
);
