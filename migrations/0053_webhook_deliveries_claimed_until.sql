-- A delivery's try is under way until claimed_until: the sender's claim sets it to the
-- claim's lease (as next_attempt_at), and the try's record clears it. A claim skips an
-- endpoint with a try under way and an account with three of them (webhook.Sender), on
-- any server: each server kept its own count, so two servers held six tries of one
-- account at once and an endpoint got a try from each. A server that dies mid-try
-- holds the endpoint until the lease lapses, no longer. Servers older than this
-- migration neither set nor read it: their tries are counted by themselves alone.
ALTER TABLE webhook_deliveries ADD COLUMN claimed_until timestamptz;
-- The tries under way, read at each claim: a few rows (a server's slots at most per
-- server), and the lapsed claims of servers that died mid-try.
CREATE INDEX webhook_deliveries_claimed ON webhook_deliveries (claimed_until) WHERE claimed_until IS NOT NULL;
