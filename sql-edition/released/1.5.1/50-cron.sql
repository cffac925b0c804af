-- pg_cron scheduling. pg_cron lives in one database (cron.database_name); these functions work
-- when that is this database, and otherwise say what to run there.
CREATE FUNCTION @extschema@.idem_schedule_reaper(schedule text DEFAULT '* * * * *')
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_name text := pg_catalog.left('idempotency reaper: ' || pg_catalog.current_database(), 63);
    command  text := pg_catalog.format('CALL %I.idem_reap_all()', '@extschema@');
    job      bigint;
BEGIN
    IF schedule IS NULL THEN
        RAISE EXCEPTION 'argument "schedule" must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database "%"', pg_catalog.current_database()
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = pg_catalog.format(
                      'In the database where pg_cron is installed (cron.database_name), run: '
                      'SELECT cron.schedule_in_database(%L, %L, %L, %L);',
                      job_name, schedule, command, pg_catalog.current_database());
    END IF;
    EXECUTE 'SELECT cron.schedule_in_database($1, $2, $3, $4)'
        INTO job USING job_name, schedule, command, pg_catalog.current_database();
    RETURN job;
END
$$;

CREATE FUNCTION @extschema@.idem_unschedule_reaper()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_name text := pg_catalog.left('idempotency reaper: ' || pg_catalog.current_database(), 63);
    job      bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database "%"', pg_catalog.current_database()
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = pg_catalog.format(
                      'In the database where pg_cron is installed (cron.database_name), run: '
                      'SELECT cron.unschedule(%L);', job_name);
    END IF;
    EXECUTE 'SELECT jobid FROM cron.job WHERE jobname = $1 AND username = current_user'
        INTO job USING job_name;
    IF job IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT cron.unschedule($1)' USING job;
    RETURN true;
END
$$;

