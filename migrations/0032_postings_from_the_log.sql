-- ledger_entries becomes a view of the postings in the ledger's events.
--
-- Every charge and credit event carries its double-entry postings (ledger.Posting), and
-- the events are the record: hash-chained, never edited. The ledger_entries table held a
-- copy of them, four rows per charge, which nothing in the service read (only checks of
-- the books: everything balances to zero, each event balances). Writing the copy was
-- about 40 % of PostgreSQL's work per charge in the settler's group commit (pg_stat_
-- statements: 21.5 µs of 58) and 800,000 of a rebuild's 1,000,000 rows for 200,000
-- charges. The view gives the same rows, read from the events themselves, so the books
-- are checked against the log rather than against a copy of it. A charge whose postings
-- do not balance is still refused with the transaction that would append it (the
-- ledger's read model checks them before it writes the charge's row).
--
-- An event the ledger's read model set aside (open or skipped, see set_aside_events)
-- is left out, as it is of charges and credits.
DROP TABLE ledger_entries;

CREATE VIEW ledger_entries AS
SELECT e.position,
       (p.line - 1)::int                      AS line,
       p.posting ->> 'book'                   AS book,
       p.posting ->> 'account'                AS account,
       p.posting ->> 'currency'               AS currency,
       (p.posting ->> 'debit')::numeric(20, 6)  AS debit,
       (p.posting ->> 'credit')::numeric(20, 6) AS credit
  FROM events e
 CROSS JOIN LATERAL json_array_elements(e.payload -> 'postings') WITH ORDINALITY AS p(posting, line)
 WHERE e.stream_type = 'ledger' AND e.event_type IN ('UnitsCharged', 'UnitsCredited')
   AND NOT EXISTS (SELECT 1 FROM set_aside_events s
                    WHERE s.projection = 'ledger_v1' AND s.position = e.position AND s.state <> 'retried');
