--
-- The extension's 42501 (a caller without the table privileges its function needs) keeps
-- PostgreSQL's message and SQLSTATE and adds a HINT: the function, the privileges it needs, and
-- the GRANT that gives them (docs/security.md, "Granting access"). Each case below runs the GRANT
-- the hint names, as a superuser would, and the same call then works: the hint is the fix. A role
-- whose name is an injection attempt gets a quoted name in the hint, and its GRANT grants to it
-- and does nothing else. A 42501 that PostgreSQL itself raises (plain SQL on idem_keys) has no
-- such hint. Roles are named regress_idem_* and dropped at the end; keys live in scope 'ph'.
--
CREATE PROCEDURE pg_temp.follow_hint(role text, call text)
LANGUAGE plpgsql AS $proc$
DECLARE
    code text;
    msg  text;
    hnt  text;
BEGIN
    EXECUTE format('SET ROLE %I', role);
    BEGIN
        EXECUTE call;
        RAISE EXCEPTION 'no error from %', call;
    EXCEPTION WHEN insufficient_privilege THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, hnt = PG_EXCEPTION_HINT;
    END;
    RESET ROLE;
    RAISE NOTICE '%: %', code, msg USING HINT = hnt;
    EXECUTE substring(hnt FROM ': (GRANT .*) \(or to a role it inherits from');
    EXECUTE format('SET ROLE %I', role);
    EXECUTE call;
    RESET ROLE;
    RAISE NOTICE 'after that GRANT: no error';
END
$proc$;

CREATE ROLE regress_idem_hint_app;
CREATE ROLE regress_idem_hint_reader;
CREATE ROLE regress_idem_hint_reaper;
CREATE ROLE regress_idem_hint_forget;
CREATE ROLE "regress_idem_hint "") TO PUBLIC; DROP TABLE idem_keys; --";

SELECT outcome FROM idem_claim('ph-pending', scope => 'ph', lease => '1 hour');

CALL pg_temp.follow_hint('regress_idem_hint_app', $$SELECT idem_claim('ph-1', scope => 'ph')$$);
-- the same grants serve complete, fail and the batch calls
SET ROLE regress_idem_hint_app;
SELECT state FROM idem_complete('ph-1', '{}', scope => 'ph');
SELECT count(*) FROM idem_claim_batch(ARRAY['ph-2', 'ph-3'], 'ph');
RESET ROLE;
CALL pg_temp.follow_hint('regress_idem_hint_reader', $$SELECT idem_lookup('ph-1', 'ph')$$);
CALL pg_temp.follow_hint('regress_idem_hint_reaper', $$SELECT idem_reap()$$);
CALL pg_temp.follow_hint('regress_idem_hint_forget', $$SELECT idem_forget('ph-missing', 'ph')$$);
CALL pg_temp.follow_hint('regress_idem_hint ") TO PUBLIC; DROP TABLE idem_keys; --',
                         $$SELECT idem_extend('ph-pending', 1, '2 hours', 'ph')$$);

-- each hint names its own call and what that call needs
SET ROLE regress_idem_hint_reader;
SELECT idem_claim_batch(ARRAY['ph-4'], 'ph');
SELECT idem_release('ph-pending', 1, 'ph');
RESET ROLE;

-- the hostile name got its grants and nothing else: idem_keys is there, PUBLIC has nothing
SELECT to_regclass('idem_keys') IS NOT NULL AS idem_keys_kept,
       has_table_privilege('regress_idem_hint ") TO PUBLIC; DROP TABLE idem_keys; --', 'idem_keys',
                           'SELECT, UPDATE') AS hostile_role_granted,
       has_table_privilege('public', 'idem_keys', 'SELECT, INSERT, UPDATE, DELETE') AS public_has_any;

-- PostgreSQL's own 42501, for SQL on the table: its message, no hint from the extension
SET ROLE regress_idem_hint_reaper;
SELECT count(*) FROM idem_keys;
RESET ROLE;

DELETE FROM idem_keys WHERE scope = 'ph';
REVOKE ALL ON idem_keys FROM regress_idem_hint_app, regress_idem_hint_reader, regress_idem_hint_reaper,
    regress_idem_hint_forget, "regress_idem_hint "") TO PUBLIC; DROP TABLE idem_keys; --";
DROP ROLE regress_idem_hint_app, regress_idem_hint_reader, regress_idem_hint_reaper, regress_idem_hint_forget,
    "regress_idem_hint "") TO PUBLIC; DROP TABLE idem_keys; --";
