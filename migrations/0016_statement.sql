-- The customer's statement (GET /usage/charges, GET /charges/{id}).
--
-- Pages of an account's charges follow the event position, the one order that new
-- charges only ever extend: a page is `position > cursor ORDER BY position LIMIT n`,
-- which this index answers by reading n rows, however long the account's history. It
-- also sums a key's spend up to one charge (the explanation's before and after).
CREATE INDEX charges_account_position ON charges (account_id, position);

-- One charge by its public id.
CREATE INDEX charges_charge_id ON charges (charge_id);

-- A request's other events (the explanation of a charge). Charges themselves, most of
-- the log, are left out, and so are events without a request id (a job's positions),
-- so the hot append paths do not pay for it.
CREATE INDEX events_request_id ON events ((metadata ->> 'request_id'))
    WHERE event_type <> 'UnitsCharged' AND (metadata ->> 'request_id') IS NOT NULL;
