-- Rate limits shared by every server of one database (package ratelimit).
--
-- One row per (policy, key) bucket: its GCRA theoretical arrival time, in nanoseconds
-- since the Unix epoch by the database's clock. A row whose tat has passed is a full
-- bucket, the same as no row, so any server may delete it. UNLOGGED: limiter state
-- need not survive a crash (after one, every bucket starts full), and its writes skip
-- the WAL. No index on tat, so the updates of a hot bucket stay HOT.
CREATE UNLOGGED TABLE ratelimit_buckets (
    policy text   NOT NULL,
    key    text   NOT NULL,
    tat    bigint NOT NULL,
    PRIMARY KEY (policy, key)
);

-- ratelimit_take takes up to p_want tokens (at least one, or none) from the bucket of
-- (p_policy, p_key) under a limit of p_limit tokens refilled one per p_interval ns:
-- granted is how many it took, tat the bucket's theoretical arrival time afterwards and
-- now_ns the instant of the decision. The clock is the database's (clock_timestamp(),
-- read under the row's lock, so decisions on one bucket are in lock order); p_now
-- replaces it in tests. A denial writes nothing.
CREATE FUNCTION ratelimit_take(p_policy text, p_key text, p_interval bigint, p_limit int, p_want int,
                               p_now bigint, OUT granted int, OUT tat bigint, OUT now_ns bigint)
LANGUAGE plpgsql AS $$
DECLARE
    span  bigint := p_interval * p_limit;
    base  bigint;
    existed boolean;
BEGIN
    LOOP
        SELECT b.tat INTO tat FROM ratelimit_buckets b
         WHERE b.policy = p_policy AND b.key = p_key FOR NO KEY UPDATE;
        existed := FOUND;
        now_ns := coalesce(p_now, (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint);
        base := greatest(coalesce(tat, now_ns), now_ns);
        -- whole tokens free at now_ns; negative if the clock stepped back past a burst
        granted := greatest(0, least(p_want::bigint, (span - (base - now_ns)) / p_interval));
        IF granted = 0 THEN
            tat := base;
            RETURN;
        END IF;
        tat := base + granted * p_interval;
        IF existed THEN
            UPDATE ratelimit_buckets b SET tat = ratelimit_take.tat
             WHERE b.policy = p_policy AND b.key = p_key;
            RETURN;
        END IF;
        INSERT INTO ratelimit_buckets (policy, key, tat) VALUES (p_policy, p_key, tat)
            ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
        -- another server created the bucket meanwhile: take from it under its lock
    END LOOP;
END $$;
