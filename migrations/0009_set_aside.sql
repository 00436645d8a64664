-- Events a projection could not apply (a payload its read model refuses, such as a NUL
-- in a text field), set aside so the projection goes on with every other stream.
-- Later events of the same stream are set aside behind it (held_by) rather than applied
-- out of order. Nothing here touches the events table: the log and its hash chain stay
-- as appended. `chessd setaside` lists, retries and skips these rows.
CREATE TABLE set_aside_events (
    id         bigserial   PRIMARY KEY,
    projection text        NOT NULL, -- the projection's name (its consumer group)
    position   bigint      NOT NULL, -- the event's position in the log
    stream_id  text        NOT NULL,
    event_type text        NOT NULL,
    error      text        NOT NULL, -- why it was not applied (the latest attempt)
    held_by    bigint,               -- the earlier set-aside event of the stream it waits behind; NULL: it failed itself
    attempts   int         NOT NULL DEFAULT 1,
    first_seen timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL DEFAULT now(),
    state      text        NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'retried', 'skipped')),
    UNIQUE (projection, position)
);
CREATE INDEX set_aside_events_open ON set_aside_events (projection, stream_id, position) WHERE state = 'open';

-- Every operator action on a set-aside event (and every event a rebuild found applicable
-- again): who, when, what, and how it went. Rows are only ever added.
CREATE TABLE set_aside_actions (
    id           bigserial   PRIMARY KEY,
    set_aside_id bigint      NOT NULL REFERENCES set_aside_events (id),
    action       text        NOT NULL CHECK (action IN ('retry', 'skip', 'rebuild')),
    outcome      text        NOT NULL, -- applied | skipped | failed: <error>
    actor        text        NOT NULL,
    reason       text        NOT NULL DEFAULT '',
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX set_aside_actions_event ON set_aside_actions (set_aside_id, id);
