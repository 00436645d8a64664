-- GET /usage buckets charges by when they were charged, in the caller's time zone
-- (hour, day, month), over [from, to) instants: this index answers that range per
-- account.
CREATE INDEX charges_account_charged_at ON charges (account_id, charged_at);
