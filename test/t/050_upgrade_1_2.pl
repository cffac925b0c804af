# ALTER EXTENSION idempotency UPDATE from 1.1 to 1.2, run for real, with keys in every state
# (docs/contract.md §9, §9.6).
#
# Under 1.1 (this library serving a database whose extension is still 1.1): keys pending with a
# live lease, pending with an ended lease, succeeded, failed (retryable and not), one claimed with
# an explicit fingerprint and one with no request; several with requests whose numbers have
# trailing fraction zeros (42.0, 1.50), whose 1.1 fingerprint differs from 1.2's.  The 1.1
# fingerprints are checked to be exactly 1.1's formula (SHA-256 of scope, 0x00, jsonb text).
# Grants on the functions whose signatures change are kept across the update.
#
# After the update: every key is kept as it was; the retry of each request gets what 1.1 would
# have answered (replay, in_progress, takeover), never a false IK001; a different request still
# gets IK001; the other spelling of a number (42 for a key stored with 42.0) is the one case that
# cannot be recognised (a hash cannot be undone) and gets IK001, as under 1.1; 1.2's functions
# work on the kept keys; a key claimed after the update gets 1.2's fingerprint.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemSqlstate;

my $node = PostgreSQL::Test::Cluster->new('upgrade12');
$node->init;
$node->start;

sub sql { return $node->safe_psql('postgres', $_[0]); }

sub sqlstate { return sqlstate_of($node, $_[0]); }

sql(q{CREATE EXTENSION idempotency VERSION '1.1'});
is(sql(q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), '1.1', 'installed 1.1');
sql(q{CREATE ROLE app; CREATE ROLE auditor;
      REVOKE EXECUTE ON FUNCTION idem_claim(text, jsonb, text, interval, interval, bytea) FROM PUBLIC;
      GRANT EXECUTE ON FUNCTION idem_claim(text, jsonb, text, interval, interval, bytea) TO app;
      GRANT EXECUTE ON FUNCTION idem_complete(text, jsonb, integer, text, integer) TO auditor WITH GRANT OPTION});

my $total = q{'{"total": 42.0, "items": [1.50, 2]}'};
sql(qq{
	SELECT idem_claim('live', $total, lease => '1 hour');
	SELECT idem_claim('lapsed', $total, lease => '1 millisecond');
	SELECT idem_claim('done', $total, 'shop');
	SELECT idem_complete('done', '{"id": 7, "amount": 42.0}', 201, 'shop');
	SELECT idem_claim('failed-retry', '{"n": 10.0}');
	SELECT idem_fail('failed-retry', '{"e": 1}', 503, true);
	SELECT idem_claim('failed-final', '{"n": 10.0}');
	SELECT idem_fail('failed-final', '{"e": 2}', 402, false);
	SELECT idem_claim('plain', '{"n": 10}');
	SELECT idem_complete('plain', '{"ok": true}');
	SELECT idem_claim('given-fp', fingerprint => '\\xcafe');
	SELECT idem_complete('given-fp', '"ok"');
	SELECT idem_claim('no-request');
});
is(sql(q{SELECT count(*) FROM idem_keys
         WHERE fingerprint = sha256(convert_to(scope, 'UTF8') || '\x00'::bytea
                                    || convert_to('{"items": [1.50, 2], "total": 42.0}', 'UTF8'))}),
	3, 'under 1.1, fingerprints are 1.1\'s: the jsonb text as written (42.0, 1.50)');
is(sqlstate(q{SELECT idem_complete('live', NULL)}), '22004', 'under 1.1, 1.1\'s rules: a NULL response is refused');
like(sql(q{SELECT idem_claim('live', '{"total": 42.0, "items": [1.50, 2]}')}), qr/^\(in_progress,f,1,pending,,,/,
	'under 1.1, idem_claim_result has 1.1\'s eight attributes');

my $keys_sql = q{SELECT string_agg(concat_ws('|', scope, key, state, attempt, encode(fingerprint, 'hex'), response,
	response_code, retryable, created_at, locked_until, completed_at, expires_at), E'\n' ORDER BY scope, key) FROM idem_keys};
my $before = sql($keys_sql);

sql(q{ALTER EXTENSION idempotency UPDATE TO '1.2'});
is(sql(q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), '1.2', 'ALTER EXTENSION UPDATE reaches 1.2');
is(sql($keys_sql), $before, 'every key kept, column for column');
is(sql(q{SELECT count(*) FROM idem_keys WHERE response_body IS NULL AND response_headers IS NULL AND claimed_at IS NULL}),
	sql(q{SELECT count(*) FROM idem_keys}), 'the new columns are NULL for keys stored by 1.1');
is(sql(q{SELECT reloptions::text FROM pg_class WHERE relname = 'idem_keys_expires_at_idx'}),
	'{pages_per_range=32,autosummarize=off}', 'the BRIN index no longer asks autovacuum to summarize');

# grants moved to the new signatures
is(sql(q{SELECT has_function_privilege('app', 'idem_claim(text,jsonb,text,interval,interval,bytea,interval)', 'EXECUTE')
             || ',' || has_function_privilege('auditor', 'idem_claim(text,jsonb,text,interval,interval,bytea,interval)', 'EXECUTE')
             || ',' || has_function_privilege('auditor', 'idem_complete(text,jsonb,integer,text,integer,interval,bytea,jsonb)', 'EXECUTE WITH GRANT OPTION')
             || ',' || has_function_privilege('auditor', 'idem_fail(text,jsonb,integer,boolean,text,integer,interval,bytea,jsonb)', 'EXECUTE')}),
	'true,false,true,true', 'EXECUTE grants and revokes of the replaced functions are kept (fail: PUBLIC, as before)');
is(sql(q{SELECT count(*) FROM pg_proc WHERE proname IN ('idem_claim', 'idem_complete', 'idem_fail')}), 3,
	'the old signatures are gone');

# retries of the keys stored by 1.1
is(sql(q{SELECT concat_ws(',', outcome, response_code, response) FROM idem_claim('done', '{"items": [1.50, 2], "total": 42.0}', 'shop')}),
	'replay,201,{"id": 7, "amount": 42.0}', 'a key claimed under 1.1 with numbers, retried after the update: replay, not IK001');
is(sql(q{SELECT concat_ws(',', outcome, attempt, retry_after_s > 0) FROM idem_claim('live', '{"total": 42.0, "items": [1.50, 2]}')}),
	'in_progress,1,t', 'a live lease from 1.1: in_progress, with retry_after_s');
is(sql(q{SELECT concat_ws(',', outcome, inserted, attempt) FROM idem_claim('lapsed', '{"total": 42.0, "items": [1.50, 2]}')}),
	'claimed,f,2', 'an ended lease from 1.1: taken over');
is(sql(q{SELECT concat_ws(',', outcome, attempt) FROM idem_claim('failed-retry', '{"n": 10.0}')}),
	'claimed,2', 'a retryable failure from 1.1: taken over');
is(sql(q{SELECT concat_ws(',', outcome, response_code) FROM idem_claim('failed-final', '{"n": 10.0}')}),
	'replay,402', 'a final failure from 1.1: replay');
is(sql(q{SELECT outcome FROM idem_claim('plain', '{"n": 10.00}')}), 'replay',
	'a key stored by 1.1 with 10: 10.00 now matches it (1.2 hashes numbers in their shortest form)');
is(sql(q{SELECT outcome FROM idem_claim('given-fp', fingerprint => '\xcafe')}), 'replay', 'an explicit fingerprint: as stored');
is(sql(q{SELECT outcome FROM idem_claim('no-request')}), 'in_progress', 'no request: as before');
is(sqlstate(q{SELECT idem_claim('done', '{"items": [1.50, 2], "total": 43}', 'shop')}), 'IK001',
	'a different request is still IK001');
is(sqlstate(q{SELECT idem_claim('done', '{"items": [1.5, 2], "total": 42}', 'shop')}), 'IK001',
	'the other spelling of a number stored by 1.1 cannot be recognised: IK001, as under 1.1');
is(sqlstate(q{SELECT idem_claim('failed-final', '{"n": 10}')}), 'IK001', '... the same for 10 against a stored 10.0');
is(sql(q{SELECT concat_ws(',', outcome, inserted) FROM idem_claim('done', '{"items": [1.50, 2], "total": 42.0}', 'other scope')}),
	'claimed,t', 'another scope is another key');

# 1.2's functions on keys stored by 1.1
is(sql(q{SELECT concat_ws(',', state, attempt) FROM idem_extend('live', 1, '2 hours')}), 'pending,1', 'idem_extend of a 1.1 key');
is(sql(q{SELECT concat_ws(',', state, response_code, coalesce(encode(response_body, 'escape'), '-'), response_headers)
         FROM idem_complete('live', NULL, 204, headers => '{"X-Done": "yes"}')}),
	'succeeded,204,-,{"X-Done": "yes"}', 'a 1.1 key completed with 1.2\'s arguments (no body: 204)');
is(sql(q{SELECT concat_ws(',', state, attempt) FROM idem_release('lapsed', 2)}), 'pending,2', 'idem_release of a taken-over 1.1 key');
is(sql(q{SELECT idem_forget('plain')}), 't', 'idem_forget of a 1.1 key');

# a key claimed after the update: 1.2's fingerprint
sql(q{SELECT idem_claim('new', '{"total": 42.0}')});
is(sql(q{SELECT fingerprint = sha256('\x00'::bytea || convert_to('{"total": 42}', 'UTF8')) FROM idem_keys WHERE key = 'new'}),
	't', 'a key claimed after the update gets 1.2\'s fingerprint');
is(sql(q{SELECT outcome FROM idem_claim('new', '{"total": 42}')}), 'in_progress', '... which 42 and 42.0 share');

$node->stop;
done_testing();
