-- Watermill (watermill-sql v4, DefaultPostgreSQLSchema and DefaultPostgreSQLOffsetsAdapter)
-- tables for the event bus topics. Created here rather than by Watermill at run time
-- because appends publish inside their own transaction, where Watermill may not create
-- tables; the shape is that of watermill-sql v4.0.0 (pinned in go.mod), with the
-- payload as bytea (the schema adapter's documented alternative to JSON) so PostgreSQL
-- does not parse each envelope again: the events table already holds it as json.
CREATE TABLE watermill_accounts (
    "offset"       bigserial,
    uuid           varchar(36) NOT NULL,
    created_at     timestamp   NOT NULL DEFAULT CURRENT_TIMESTAMP,
    payload        bytea DEFAULT NULL, -- the event envelope, JSON; bytea: stored as sent, not re-parsed
    metadata       json DEFAULT NULL,
    transaction_id xid8        NOT NULL,
    PRIMARY KEY (transaction_id, "offset")
);
CREATE TABLE watermill_offsets_accounts (
    consumer_group                varchar(255) NOT NULL,
    offset_acked                  bigint,
    last_processed_transaction_id xid8 NOT NULL,
    PRIMARY KEY (consumer_group)
);
