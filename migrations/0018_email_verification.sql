-- E-mail verification: tokens sent in the verification message, kept as HMACs (as
-- key secrets are), one use each, valid for a day.
CREATE TABLE email_verifications (
    token_hash bytea PRIMARY KEY,
    account_id text        NOT NULL,
    email      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at    timestamptz
);
CREATE INDEX email_verifications_account ON email_verifications (account_id, created_at);

-- The outbox's sender (package mail): each row is tried until sent, with a growing
-- wait after each failure; how it went is kept on the row.
ALTER TABLE mail_outbox
    ADD COLUMN attempts        int         NOT NULL DEFAULT 0,
    ADD COLUMN next_attempt_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN last_error      text,
    ADD COLUMN sent_via        text; -- smtp | log
CREATE INDEX mail_outbox_due ON mail_outbox (next_attempt_at) WHERE sent_at IS NULL;
