-- Appends in fewer round trips (eventstore/pipeline.go).
--
-- A pipelined append reads the chain's head and its streams' versions in one round trip
-- and writes the events in the next; a fast append sends everything in one, from a head
-- and versions it remembers. Either way the transaction must fail, not write, when what
-- it relied on has moved: these functions check and move in one step and raise
-- serialization_failure otherwise (the pipelined append retries; the fast one falls back).

-- advance_streams moves each stream from the version read to the new one (creating it
-- when it was read as absent, version 0).
CREATE FUNCTION advance_streams(p_ids text[], p_types text[], p_from bigint[], p_to bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    n int;
BEGIN
    INSERT INTO streams AS s (stream_id, stream_type, version)
    SELECT * FROM unnest(p_ids, p_types, p_to)
    ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version
     WHERE s.version = (SELECT x.f FROM unnest(p_ids, p_from) AS x (id, f) WHERE x.id = s.stream_id);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> cardinality(p_ids) THEN
        RAISE EXCEPTION 'a stream moved during a pipelined append' USING ERRCODE = 'serialization_failure';
    END IF;
END $$;

-- advance_chain moves the chain's head from the remembered one, taking its lock.
CREATE FUNCTION advance_chain(p_from bigint, p_from_hash bytea, p_to bigint, p_to_hash bytea)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE event_chain SET position = p_to, hash = p_to_hash WHERE position = p_from AND hash = p_from_hash;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the chain moved on from position %', p_from USING ERRCODE = 'serialization_failure';
    END IF;
END $$;

-- ledger_charge_strict is ledger_charge_once for a fast append, which has sent the
-- charge's event already: anything but 'ok' must undo the whole transaction.
CREATE FUNCTION ledger_charge_strict(p_key text, p_account text, p_env text, p_day date,
                                     p_units bigint, p_usd numeric, p_allowance bigint,
                                     p_scope text, p_idem text, p_hash bytea, p_status int, p_response bytea)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    outcome text;
BEGIN
    outcome := ledger_charge_once(p_key, p_account, p_env, p_day, p_units, p_usd, p_allowance,
                                  p_scope, p_idem, p_hash, p_status, p_response);
    IF outcome <> 'ok' THEN
        RAISE EXCEPTION 'charge refused: %', outcome USING ERRCODE = 'serialization_failure';
    END IF;
END $$;
