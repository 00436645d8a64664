-- The events that are not charges or credits, in log order: what a rebuild of every
-- projection but the ledger reads (projections.readTopic).
--
-- Charges are nearly all of the log (200,000 of 207,039 events in the bench's), so a
-- rebuild of the accounts, jobs or disputes read model walked the whole log to find its
-- few events: 0.2 to 0.3 s of PostgreSQL for 650 job events or none at all, beside the
-- ledger's own rebuild on the same cores. The index is partial, so an append of a
-- charge, the hot path, does not write it.
CREATE INDEX events_not_ledger ON events (position) WHERE stream_type <> 'ledger';
