-- The outbox's rows are deleted once sent or given up longer ago than the retention
-- age (30 days: mail.Expire, in chessd serve's sweep); they were kept for good, and
-- with them every recipient and subject. The sent ones, nearly every row, are found by
-- this index, without a scan of the whole table at each sweep; the unsent ones by
-- mail_outbox_due_at (0047).
CREATE INDEX mail_outbox_sent ON mail_outbox (sent_at) WHERE sent_at IS NOT NULL;
