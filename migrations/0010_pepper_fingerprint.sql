-- Every replica must hash API-key secrets under the same pepper, or it answers 401 to
-- every valid key. The first server records a fingerprint of its pepper (an HMAC of a
-- fixed label, which reveals nothing of the pepper); a server whose pepper gives another
-- fingerprint refuses to start (commands.ClaimPepper).
CREATE TABLE service_settings (
    name       text PRIMARY KEY,
    value      text NOT NULL,
    set_at     timestamptz NOT NULL DEFAULT now()
);
