-- stream_watchers: one row per server that keeps keys and accounts in memory and
-- answers calls from it without reading their versions (eventstore/watch.go). A
-- watcher listens on chessd_streams, where every append to a watched stream is
-- announced at commit, and writes here the last position it has applied (seen) and how
-- long it may go on trusting its memory without writing again (valid_until). A
-- transaction that changed a watched stream returns to its caller only once every
-- watcher still valid has seen it or has let its row expire, so the next call, on any
-- server, sees the change.
CREATE TABLE stream_watchers (
    watcher     text PRIMARY KEY,
    seen        bigint NOT NULL,
    valid_until timestamptz NOT NULL
);
