-- chain_at raises serialization_failure unless the chain's head is still at p_position.
-- A fast append (eventstore.Fast) asks it first, before its statements do their work:
-- with two servers appending, the head has usually moved, and finding that out at
-- advance_chain, after the settle and the charge rows were written, wasted that work
-- (PostgreSQL spent about half again per charge with two servers). It takes no lock:
-- advance_chain still guards the move itself.
CREATE FUNCTION chain_at(p_position bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM event_chain WHERE position = p_position) THEN
        RAISE EXCEPTION 'the chain moved on from position %', p_position USING ERRCODE = 'serialization_failure';
    END IF;
END $$;
