-- The event store: the single source of truth. Everything else is derived from it.
--
-- Global order: appends serialise on the one row of event_chain for the few statements
-- before their commit, so `position` is assigned in commit order with no gaps. A reader
-- can follow `position` as a plain integer and never miss an event that committed late;
-- the same lock lets each event's hash cover the previous event's hash.
CREATE TABLE streams (
    stream_id   text PRIMARY KEY,
    stream_type text   NOT NULL,
    version     bigint NOT NULL CHECK (version > 0)
);

CREATE TABLE events (
    position       bigint      PRIMARY KEY,
    stream_id      text        NOT NULL,
    stream_type    text        NOT NULL,
    version        bigint      NOT NULL,
    event_type     text        NOT NULL,
    schema_version int         NOT NULL,
    payload        json        NOT NULL, -- json, not jsonb: the stored text is what was hashed
    metadata       json        NOT NULL,
    recorded_at    timestamptz NOT NULL,
    hash           bytea       NOT NULL,
    UNIQUE (stream_id, version)
);

-- Secrets are found by their HMAC when the keys read model has not caught up yet
-- (read-your-writes for authentication).
CREATE INDEX events_secret_hash ON events ((payload ->> 'secret_hash'))
    WHERE event_type IN ('KeyCreated', 'KeyRotated');

-- The head of the chain: the last position and its hash.
CREATE TABLE event_chain (
    id       boolean PRIMARY KEY DEFAULT true CHECK (id),
    position bigint NOT NULL,
    hash     bytea  NOT NULL
);
INSERT INTO event_chain (position, hash) VALUES (0, '\x');

-- Where each projection stands, written in the same transaction as its read model.
CREATE TABLE projection_checkpoints (
    name     text PRIMARY KEY,
    position bigint NOT NULL
);
