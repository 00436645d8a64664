-- The settler's charges, one event per key per group commit (ledger.ChargesSettled).
--
-- A UnitsCharged event per call cost each call an events row, its hash, a charges row
-- with five indexes and its rollup rows: ~60 µs of PostgreSQL's time per charged call,
-- in the settler's serial commit, which bound a server's charged calls per second
-- (docs/BENCHMARKS.md, session 23). A ChargesSettled carries all of one key's calls of
-- a commit as its lines. Its read model is one row per event, with the lines' sums and
-- the bounds of their times and days; the lines are read from the event itself, as the
-- postings are (ledger_entries, migration 0032). A line's charge id is derived from the
-- event's position and the line's index (chg_<position>_<line>), so it needs no index.
--
-- UnitsCharged events and their charges rows stay as they are (a job's positions are
-- still charged one event each): charge_lines() reads both, one row per charge.
CREATE TABLE charge_batches (
    position   bigint PRIMARY KEY, -- the ChargesSettled event
    account_id text           NOT NULL,
    key_id     text           NOT NULL,
    env        text           NOT NULL,
    lines      bigint         NOT NULL,
    units      bigint         NOT NULL,
    usd        numeric(20, 6) NOT NULL,
    first_at   timestamptz    NOT NULL, -- the earliest and latest charged_at of its lines
    last_at    timestamptz    NOT NULL,
    first_day  date           NOT NULL, -- the lines' allowance days
    last_day   date           NOT NULL
);
-- a statement pages an account's charges in position order; a range of times finds
-- the batches whose lines may fall in it
CREATE INDEX charge_batches_account_position ON charge_batches (account_id, position);
CREATE INDEX charge_batches_account_last_at ON charge_batches (account_id, last_at);

-- A batch's lines summed by UTC hour, endpoint, engine and cached: what the hourly
-- rollups add for it, so that filling them again (a rebuild) sums rows, not the lines
-- in the log. Only ever read whole (usage_fill), and written with its batch's row, only
-- when that row is new: no index to keep.
CREATE TABLE charge_batch_hours (
    position bigint         NOT NULL, -- the ChargesSettled event
    hour     timestamptz    NOT NULL,
    endpoint text           NOT NULL,
    engine   text           NOT NULL,
    cached   boolean        NOT NULL,
    calls    bigint         NOT NULL,
    units    bigint         NOT NULL,
    usd      numeric(20, 6) NOT NULL
);

-- A credit names its charge by the event's position and the line in it (0 for a
-- UnitsCharged).
ALTER TABLE credits ADD COLUMN charge_line int NOT NULL DEFAULT 0;

-- charge_lines is every charge, one row each: the charges rows, and the lines of the
-- events charge_batches indexes. first_at and last_at bound charged_at over the row's
-- event (a charges row's own charged_at), first_day and last_day its day: a reader
-- filtering on charged_at or day also filters on them, which the planner pushes down
-- to the batches' rows before their lines are read. Unqualified names, read
-- when a query is planned, so a rebuild's copies on the search_path are read instead.
CREATE FUNCTION charge_lines()
RETURNS TABLE ("position" bigint, line int, charge_id text, request_id text, account_id text, key_id text, env text,
               day date, charged_at timestamptz, endpoint text, engine text, path text, cached boolean,
               units bigint, usd numeric, params json, first_at timestamptz, last_at timestamptz,
               first_day date, last_day date)
LANGUAGE sql STABLE AS $$
SELECT c.position, 0, c.charge_id, c.request_id, c.account_id, c.key_id, c.env, c.day, c.charged_at,
       c.endpoint, c.engine, c.path, c.cached, c.units, c.usd, c.params, c.charged_at, c.charged_at, c.day, c.day
  FROM charges c
UNION ALL
SELECT b.position, (l.n - 1)::int, 'chg_' || b.position || '_' || (l.n - 1), l.j ->> 'request_id',
       b.account_id, b.key_id, b.env, (l.j ->> 'day')::date, (l.j ->> 'charged_at')::timestamptz,
       l.j ->> 'endpoint', l.j ->> 'engine', l.j ->> 'path', (l.j ->> 'cached')::boolean,
       (l.j ->> 'units')::bigint, (l.j ->> 'usd')::numeric, l.j -> 'params', b.first_at, b.last_at,
       b.first_day, b.last_day
  FROM charge_batches b
  JOIN events e ON e.position = b.position
 CROSS JOIN LATERAL json_array_elements(e.payload -> 'lines') WITH ORDINALITY AS l(j, n)
$$;

-- The budget and rollup functions read every charge, of both kinds.
CREATE OR REPLACE FUNCTION charged_since(p_account text, p_env text, p_key text, p_since timestamptz,
                                         OUT units bigint, OUT usd numeric)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(c.units), 0) - coalesce(sum(r.units), 0), coalesce(sum(c.usd), 0) - coalesce(sum(r.usd), 0)
      FROM charge_lines() c LEFT JOIN credits r ON r.charge_position = c.position AND r.charge_line = c.line
     WHERE c.account_id = p_account AND c.env = p_env AND (p_key IS NULL OR c.key_id = p_key)
       AND (p_since IS NULL OR (c.charged_at >= p_since AND c.last_at >= p_since))
$$;

-- Without JIT: the planner takes each event for a hundred lines (what any function
-- returning rows is guessed at), and compiling the plan cost more than running it.
CREATE OR REPLACE FUNCTION usage_fill() RETURNS void LANGUAGE plpgsql SET jit = off AS $$
BEGIN
    INSERT INTO usage_hours (account_id, hour, key_id, env, endpoint, engine, cached,
                             calls, units, usd, credits, credited_units, credited_usd)
    SELECT account_id, hour, key_id, env, endpoint, engine, cached, sum(calls), sum(units), sum(usd), 0, 0, 0
      FROM (SELECT account_id, date_trunc('hour', charged_at, 'UTC') AS hour, key_id, env, endpoint, engine, cached,
                   1 AS calls, units, usd
              FROM charges
            UNION ALL
            SELECT b.account_id, h.hour, b.key_id, b.env, h.endpoint, h.engine, h.cached, h.calls, h.units, h.usd
              FROM charge_batch_hours h JOIN charge_batches b ON b.position = h.position) c
     GROUP BY 1, 2, 3, 4, 5, 6, 7;
    INSERT INTO usage_hours AS u (account_id, hour, key_id, env, endpoint, engine, cached,
                                  calls, units, usd, credits, credited_units, credited_usd)
    SELECT c.account_id, date_trunc('hour', r.credited_at, 'UTC'), c.key_id, c.env, c.endpoint, c.engine, c.cached,
           0, 0, 0, count(*), sum(r.units), sum(r.usd)
      FROM credits r JOIN charge_lines() c ON c.position = r.charge_position AND c.line = r.charge_line
     GROUP BY 1, 2, 3, 4, 5, 6, 7
    ON CONFLICT (account_id, hour, key_id, env, endpoint, engine, cached) DO UPDATE
       SET credits = excluded.credits, credited_units = excluded.credited_units, credited_usd = excluded.credited_usd;
    INSERT INTO usage_key_hours (account_id, hour, key_id, env, calls, units, usd, credits, credited_units, credited_usd)
    SELECT account_id, hour, key_id, env, sum(calls), sum(units), sum(usd), sum(credits), sum(credited_units), sum(credited_usd)
      FROM usage_hours
     GROUP BY 1, 2, 3, 4;
END $$;

-- A ChargesSettled carries its lines' postings together, as a UnitsCharged does its own.
CREATE OR REPLACE VIEW ledger_entries AS
SELECT e.position,
       (p.line - 1)::int                      AS line,
       p.posting ->> 'book'                   AS book,
       p.posting ->> 'account'                AS account,
       p.posting ->> 'currency'               AS currency,
       (p.posting ->> 'debit')::numeric(20, 6)  AS debit,
       (p.posting ->> 'credit')::numeric(20, 6) AS credit
  FROM events e
 CROSS JOIN LATERAL json_array_elements(e.payload -> 'postings') WITH ORDINALITY AS p(posting, line)
 WHERE e.stream_type = 'ledger' AND e.event_type IN ('UnitsCharged', 'ChargesSettled', 'UnitsCredited')
   AND NOT EXISTS (SELECT 1 FROM set_aside_events s
                    WHERE s.projection = 'ledger_v1' AND s.position = e.position AND s.state <> 'retried');
