-- Verification and key-recovery tokens (email_verifications, each with the address it
-- went to) are deleted once used, or expired unused, longer ago than the retention age
-- (30 days: commands.ExpireTokens, in chessd serve's sweep); they were kept for good.
-- A token is used only before it expires, so coalesce(used_at, expires_at) is when it
-- stopped being usable; the sweep finds the old ones by this index, without a scan of
-- the whole table at each pass.
CREATE INDEX email_verifications_ended ON email_verifications ((coalesce(used_at, expires_at)));
