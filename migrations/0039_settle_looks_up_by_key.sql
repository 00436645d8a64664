-- meter_settle_all, and the rolls it calls, read every row through its key, whatever the
-- planner makes of the tables' statistics.
--
-- Their statements join the batch's arrays (its calls' Idempotency-Keys, its keys and
-- accounts) to tables by primary key, and their plans are generic (0028), made from the
-- statistics of the moment for arrays of unknown length (taken as ten elements). With an
-- idempotency table that the statistics took for nearly empty, the claims' update was
-- planned as a scan of the owner's running claims, each compared with every key of the
-- batch: a settle of 512 calls with Idempotency-Keys spent 50 ms in it (262,000
-- comparisons, auto_explain), 13 ms in all with index lookups instead. Sequential scans
-- off here leave the planner the lookups by key these statements are written for (a table
-- without a usable index would still be scanned). meter_settle reaches meter_settle_all,
-- and the rolls inherit the setting but also carry it, as meter_lease calls them too.
ALTER FUNCTION meter_settle_all(text, text[], bigint[], text[], text[], int[], bytea[], numeric, timestamptz, boolean)
    SET enable_seqscan = off;
ALTER FUNCTION meter_roll(text[]) SET enable_seqscan = off;
ALTER FUNCTION account_roll(text[], text[]) SET enable_seqscan = off;
