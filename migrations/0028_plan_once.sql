-- The money path's PL/pgSQL functions plan their statements once per session.
--
-- PL/pgSQL runs each statement through the plan cache with the function's variables as
-- parameters, and the plan cache plans a statement afresh for its first five runs and
-- then keeps doing so whenever a custom plan looks cheaper than the generic one, which
-- for statements over arrays (unnest, = ANY) it nearly always does. meter_settle_all's
-- ten statements were so planned on every call: a job's position spent 1.96 ms of
-- PostgreSQL in meter_settle, of which 1.3 ms was planning (pg_stat_statements with
-- track = all, `make bench`); forced generic plans, 0.9 ms. Every statement here looks
-- rows up by primary key or a unique index, so the generic plan is the plan.
--
-- A function later replaced (CREATE OR REPLACE) loses this setting unless its new
-- definition repeats it: postgres.TestFunctionsPlanOnce checks that every PL/pgSQL
-- function but the two bulk refreshes has it.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure
               FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
              WHERE l.lanname = 'plpgsql' AND p.pronamespace = current_schema()::regnamespace
                AND p.proname NOT IN ('usage_refresh', 'usage_hours_refresh')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', f);
    END LOOP;
END $$;
