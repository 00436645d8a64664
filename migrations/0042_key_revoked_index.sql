-- Which keys are revoked, by their events: the cap on active keys counts a key's open
-- balance only without a KeyRevoked event (ledger.OpenKeyBalances), and `chessd replay`
-- lists the revoked keys. Without this index both read the whole log (the planner does
-- not trust the (stream_id, version) index for it, ledger streams being long).
CREATE INDEX events_key_revoked ON events (stream_id) WHERE event_type = 'KeyRevoked';
