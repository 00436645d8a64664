-- A revoked key's balance is closed: revoked_at is set in the revocation's own
-- transaction (ledger.CloseKeyBalance), so the open balances of an account's env are
-- exactly its active keys, which key creation counts under a per-account lock to hold
-- the cap on active keys (domain.MaxActiveKeys). Keys revoked before this migration
-- get the time of their KeyRevoked event.
ALTER TABLE key_balances ADD COLUMN revoked_at timestamptz;

UPDATE key_balances kb SET revoked_at = e.recorded_at
  FROM events e
 WHERE e.stream_id = 'key-' || kb.key_id AND e.event_type = 'KeyRevoked';

CREATE INDEX key_balances_open ON key_balances (account_id, env) WHERE revoked_at IS NULL;
