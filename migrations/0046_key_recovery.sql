-- Key recovery: a token mailed to an account's address issues a new key (POST
-- /v1/recover, /v1/recover/confirm). Its tokens live beside the verification ones, as
-- HMACs, one use each, and share their limits per account (one a minute, five a day);
-- each kind is accepted only where it was meant for.
ALTER TABLE email_verifications
    ADD COLUMN purpose text NOT NULL DEFAULT 'verify' CHECK (purpose IN ('verify', 'recover'));
