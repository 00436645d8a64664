-- Webhooks: where an account wants to hear of what happens to it, and every delivery
-- made there (package webhook). The signing secret is kept as is: signing needs it.
CREATE TABLE webhook_endpoints (
    endpoint_id text PRIMARY KEY,
    account_id  text        NOT NULL,
    env         text        NOT NULL,
    url         text        NOT NULL,
    secret      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
);
CREATE INDEX webhook_endpoints_account ON webhook_endpoints (account_id, env) WHERE deleted_at IS NULL;

-- One row per message to one endpoint, tried until delivered (a 2xx answer) or out of
-- attempts; the row keeps how each try went.
CREATE TABLE webhook_deliveries (
    delivery_id     text PRIMARY KEY,
    endpoint_id     text        NOT NULL REFERENCES webhook_endpoints (endpoint_id),
    account_id      text        NOT NULL,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        int         NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    last_status     int,
    last_error      text,
    failed_at       timestamptz -- out of attempts
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE delivered_at IS NULL AND failed_at IS NULL;
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at);
