-- A webhook delivery is deleted once it finished (delivered, or failed: out of tries
-- or its endpoint deleted) longer ago than the retention age (30 days:
-- webhook.Expire, in chessd serve's sweep); every delivery, its payload included, was
-- kept for good. The finished ones, nearly every row, are found by this index, without
-- a scan of the whole table at each sweep. A delivery is finished by one of the two
-- times (a delivery that arrives after all clears failed_at), so one index holds both.
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries ((coalesce(delivered_at, failed_at)))
    WHERE delivered_at IS NOT NULL OR failed_at IS NOT NULL;
