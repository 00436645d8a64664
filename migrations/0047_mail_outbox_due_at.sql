-- The outbox's messages are scheduled by due_at, which an older chessd's sender does
-- not read (package mail).
--
-- An older server still running during a rolling upgrade keeps its mail sender, which
-- claims by next_attempt_at and knows nothing of sealed bodies: it would mail a sealed
-- body as the message's text and mark it sent, losing its token. So a row queued from
-- now on keeps next_attempt_at at 'infinity', where the older claim never finds it, and
-- is claimed, retried and released by due_at. A row with no due_at was queued by an
-- older server: this release's sender takes it over (seals its body, moves its time to
-- due_at, with any claim an older sender holds on it), and clears the bodies of the
-- messages older senders sent. The check keeps every row this release holds out of the
-- older claim's reach.
ALTER TABLE mail_outbox
    ADD COLUMN due_at timestamptz,
    ADD CONSTRAINT mail_outbox_due_at_only CHECK (due_at IS NULL OR next_attempt_at = 'infinity');
CREATE INDEX mail_outbox_due_at ON mail_outbox (due_at) WHERE sent_at IS NULL;
-- sent bodies an older sender left: cleared at each pass, found without a scan
CREATE INDEX mail_outbox_sent_body ON mail_outbox (id) WHERE sent_at IS NOT NULL AND body <> '';
