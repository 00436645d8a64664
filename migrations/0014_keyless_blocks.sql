-- Keyless calls take their address's daily allowance in blocks held in a server's memory
-- (ledger.Meter.ReserveKeyless), as keyed calls take leases: one statement per block
-- instead of one per call. A block's unused calls are given back when idle; a server
-- that dies loses at most one block per address for the day (the client gets fewer
-- free calls, never more than the allowance).
CREATE FUNCTION meter_keyless(p_ip inet, p_day date, p_want int, p_per_day int)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    used  int;
    n     int;
BEGIN
    INSERT INTO keyless_usage (ip, day, calls) VALUES (p_ip, p_day, 0) ON CONFLICT (ip, day) DO NOTHING;
    SELECT calls INTO used FROM keyless_usage WHERE ip = p_ip AND day = p_day FOR UPDATE;
    n := least(p_want, greatest(1, (p_per_day - used) / 4), p_per_day - used);
    IF n <= 0 THEN
        RETURN 0;
    END IF;
    UPDATE keyless_usage SET calls = calls + n WHERE ip = p_ip AND day = p_day;
    RETURN n;
END $$;
