# Differential test of the two editions (docs/editions.md): the same random operations, from the
# same three sessions, against the C edition (CREATE EXTENSION idempotency in one database) and
# the SQL edition (its plain-SQL install, sql-edition/build, in another database of the same
# cluster), and every answer compared: the result rows (outcome, inserted, attempt, state,
# response, response code, body, headers, fingerprint, reap and batch counts), the error fields
# (SQLSTATE, message, DETAIL, HINT, COLUMN_NAME; not CONTEXT and LOCATION, which name each
# edition's own code) and, after every operation, the whole of idem_keys as the session sees it.
#
# Nothing is preloaded: the SQL edition has no shared memory, and the contract makes the C edition
# without preloading answer as it does (retry_after_s = ceil(retry_after), lease-mode waits only
# for a lease that ends within `wait`; docs/contract.md §9.3, §9.5).
#
# Operations: idem_claim (key among 6, scope among 2; a request in several spellings, another
# request, an explicit fingerprint or none; ttl, lease and wait given or not), idem_complete and
# idem_fail (attempt right, stale, ahead or none; response, code, retryable, ttl, body, headers),
# idem_lookup, idem_extend, idem_release, idem_forget (force or not), idem_reap (max_rows or not),
# idem_claim_batch (repeats, requests, fingerprints, applied) and idem_complete_batch, and bad
# inputs of each (NULLs, bytes outside printable ASCII, lengths, intervals out of range, bad
# arrays, a key repeated with two requests).  Now and then one session opens a transaction and
# calls under savepoints; the other sessions then claim the keys it wrote with a bounded wait
# (in_progress with nothing visible) or work on other keys, and one of them may call on a key it
# wrote without a bounded wait (claim, complete, fail, extend, release, forget, a one-key batch):
# that call must still be waiting when the transaction ends, and then answers from what it left.
# Any difference fails the test.
#
# Time.  The two editions run at different wall-clock moments, so a timestamp cannot be compared
# as a value.  Every interval the test gives is either short (at most 2 ms) or long (an hour or
# more, longer than the test), and after an operation that gave a short one the test waits until
# the database clock has passed it: a lease or a key is then live or over for both editions alike,
# whatever the load.  A timestamp is compared as (the operation that wrote it, its distance from
# that operation's start within the operation's own duration, and its exact distance from every
# other timestamp of the row that the same operation wrote); retry_after is compared the same way
# and retry_after_s must be ceil(retry_after) in both.
#
# Reap with max_rows: the contract promises no order among expired keys, so after comparing the
# counts both editions reap the rest (idem_reap() again, also compared) and the states meet again.
#
# The seed is printed; IDEMPOTENCY_DIFF_SEED=<seed> replays it, IDEMPOTENCY_DIFF_OPS sets the
# number of operations (default 800).  The first difference stops the run and is printed: the
# operation's index, its SQL, and both editions' answers.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use File::Temp qw(tempdir);
use FindBin;
use Time::HiRes qw(time);
use List::Util qw(first shuffle);

my $root = "$FindBin::RealBin/../..";
my $seed = $ENV{IDEMPOTENCY_DIFF_SEED} || (int(time * 1000) ^ ($$ << 10)) % 2_000_000_000;
my $nops = $ENV{IDEMPOTENCY_DIFF_OPS} || 800;
srand($seed);
diag "differential seed $seed ($nops operations; replay: IDEMPOTENCY_DIFF_SEED=$seed)";

# ---- the SQL edition's plain-SQL install, made by its generator (missing: the test fails)
my $build = "$root/sql-edition/build";
my $gen = tempdir(CLEANUP => 1);
ok(-f $build, 'the SQL edition generator sql-edition/build exists')
  or do { done_testing(); exit; };    # fails, and the other test files still run
my ($build_out, $build_err) = ('', '');
IPC::Run::run([ 'bash', $build, $gen ], '>', \$build_out, '2>', \$build_err);
my ($plain) = glob("$gen/plain/idempotency-*.sql");
ok(defined $plain && -s $plain, 'sql-edition/build made the plain-SQL install file')
  or do { diag $build_err; done_testing(); exit; };

my $node = PostgreSQL::Test::Cluster->new('editions');
$node->init(extra => [ '--encoding=UTF8', '--locale=C' ]);
$node->append_conf('postgresql.conf', q{
log_statement = none
log_min_messages = warning
});
$node->start;

my %db = (c => 'edition_c', sql => 'edition_sql');
my @editions = ('c', 'sql');
$node->safe_psql('postgres', "CREATE DATABASE $db{c}");
$node->safe_psql('postgres', "CREATE DATABASE $db{sql}");
$node->safe_psql($db{c}, 'CREATE EXTENSION idempotency');
{
	my ($out, $err) = ('', '');
	local $ENV{PGOPTIONS} = '-c client_min_messages=warning';
	IPC::Run::run([ 'psql', '-X', '-q', '-d', $node->connstr($db{sql}), '-f', $plain ], '>', \$out, '2>', \$err);
	is($err, '', 'the SQL edition installs with psql -f');
}

# which edition answers: the SQL edition says so; the C edition's functions are C functions
is($node->safe_psql($db{sql}, 'SELECT idem_edition()'), 'sql', 'SQL edition database: idem_edition() is sql');
is($node->safe_psql($db{sql}, q{SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = 'idem_claim'::regproc}),
	'plpgsql', 'SQL edition database: idem_claim is PL/pgSQL');
is($node->safe_psql($db{c}, q{SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = 'idem_claim'::regproc}),
	'c', 'C edition database: idem_claim is a C function');
if ($node->safe_psql($db{c}, q{SELECT to_regproc('idem_edition') IS NOT NULL}) eq 't')
{
	is($node->safe_psql($db{c}, 'SELECT idem_edition()'), 'c', 'C edition database: idem_edition() is c');
}

my $US = chr(31);
for my $e (@editions)
{
	$node->safe_psql($db{$e}, q{
CREATE FUNCTION us(timestamptz) RETURNS bigint LANGUAGE sql IMMUTABLE
    AS $$ SELECT (extract(epoch FROM $1) * 1000000)::bigint $$;
CREATE FUNCTION usi(interval) RETURNS bigint LANGUAGE sql IMMUTABLE
    AS $$ SELECT (extract(epoch FROM $1) * 1000000)::bigint $$;
CREATE FUNCTION fmt(k idem_keys) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT concat_ws(chr(31), k.scope, k.key, k.state, k.attempt,
                     coalesce(encode(k.fingerprint, 'hex'), '\N'), coalesce(k.response::text, '\N'),
                     coalesce(k.response_code::text, '\N'), coalesce(k.retryable::text, '\N'),
                     us(k.created_at), coalesce(us(k.locked_until)::text, '\N'),
                     coalesce(us(k.completed_at)::text, '\N'), us(k.expires_at),
                     coalesce(encode(k.response_body, 'hex'), '\N'), coalesce(k.response_headers::text, '\N'),
                     coalesce(us(k.claimed_at)::text, '\N')) $$;
});
}

# ---------------------------------------------------------------------------------------------
# Sessions: psql processes fed through pipes, errors in verbose form (every field)
# ---------------------------------------------------------------------------------------------
package Sess
{
	sub new
	{
		my ($class, $connstr, $name, $settings) = @_;
		my $s = bless { name => $name, in => '', out => '', err => '', n => 0 }, $class;
		$s->{timer} = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);
		$s->{h} = IPC::Run::start([ 'psql', '-X', '-A', '-t', '-q', '-v', 'VERBOSITY=verbose', '-d', $connstr, '-f', '-' ],
			'<', \$s->{in}, '>', \$s->{out}, '2>', \$s->{err}, $s->{timer});
		my ($out, $err) = $s->run("SET client_min_messages = warning; SET TimeZone = 'UTC'; $settings");
		die "session $name setup failed: $err" if $err ne '';
		return $s;
	}

	sub send
	{
		my ($s, $sql) = @_;
		$s->{n}++;
		$s->{out} = $s->{err} = '';
		$s->{in} .= "$sql\n;\n\\echo __END_$s->{n}\n\\warn __END_$s->{n}\n";
		$s->{timer}->start;
		$s->{h}->pump_nb;
		return;
	}

	sub done
	{
		my ($s) = @_;
		my $n = $s->{n};
		return $s->{out} =~ /^__END_$n\n/m && $s->{err} =~ /^__END_$n\n/m;
	}

	sub wait
	{
		my ($s) = @_;
		$s->{h}->pump until $s->done;
		my $n = $s->{n};
		(my $out = $s->{out}) =~ s/^__END_$n\n//m;
		(my $err = $s->{err}) =~ s/^__END_$n\n//m;
		return ($out, $err);
	}

	sub run { my ($s, $sql) = @_; $s->send($sql); return $s->wait; }

	sub quit { my ($s) = @_; $s->{in} .= "\\q\n"; $s->{h}->finish; return; }
}

package main;

# Session defaults, long or short as everything else (see Time above), in the forms the settings
# take: a time with a unit, and a bare number in the setting's unit.  Session 2's default lease is
# short.
my @settings = (
	q{SET idempotency.default_lease = '1h'; SET idempotency.default_ttl = '1d';},
	q{SET idempotency.default_lease = 7200000;},
	q{SET idempotency.default_lease = 1; SET idempotency.default_ttl = 10800;});
my %sess;
for my $e (@editions)
{
	$sess{$e} = [ map { Sess->new($node->connstr($db{$e}), "$e/$_", $settings[$_]) } 0 .. $#settings ];
}

# ---------------------------------------------------------------------------------------------
# The vocabulary
# ---------------------------------------------------------------------------------------------
sub lit { my ($s) = @_; return "'" . ($s =~ s/'/''/gr) . "'"; }
sub pick { return $_[ int(rand(@_)) ]; }

my @scopes = ('', 'tenant-a');
my @keys = ('k1', 'k2', 'k3', 'k4', "o'k", 'K 7');
my @ids;
for my $sc (@scopes) { push @ids, map { "$sc\0$_" } @keys; }

my @requests = (
	[ '{"amount": 100, "currency": "EUR"}', '{"currency":"EUR","amount":100}' ],
	[ '{"a": [1, 2, {"b": null}]}', '{ "a" : [1,2,{"b":null}] }' ],
	[ '"just a string"' ],
	[ '{"a": 1, "a": 2}', '{"a": 2}' ],
	[ '{"name": "Zoë", "note": "tab\there"}' ],
	[ '12345', '12345.0', '1.2345e4' ],
	[ '{"total": 42.0, "n": [1.50, 2]}', '{"n": [1.5, 2.00], "total": 42}', '{"total": 4.2e1, "n": [15e-1, 2]}' ],
	[ '{"s": "1.50", "x": 0.10}', '{"x": 0.1, "s": "1.50"}' ],
	[ '[1.10, "a.10", {"k": 2.000}]', '[1.1, "a.10", {"k": 2}]' ],
	[ '{"\u00e9.0": 2.50, "q": "a\\"b.10"}', '{"q": "a\\"b.10", "\u00e9.0": 2.5}' ],
	[ '-0.0', '-0', '0.000' ],
	[ '1e-7', '0.00000010' ],
	[ '{}', ' { } ' ]);

# the requests a key is usually claimed with; a key outside @ids (the longest good key, met as a
# random key argument) gets its set when first used
sub requests_of
{
	my ($id) = @_;
	return @{ $requests[ $main::identity{$id} //= int(rand(@requests)) ] };
}
my @responses = ('{"id": 1}', '{"id": 2, "tags": ["x", "y"]}', '[]', '"ok"', 'null', '0', '1.50',
	'{"err": "declined", "retry": false}', '{"big": "' . ('x' x 3000) . '"}');
my @fingerprints = ('01', '0102', 'deadbeef', 'ff' x 64);
my @bodies = ('', '00ff0d0a', unpack('H*', '<ok id="1"/>'));
my @headers = ('{}', '{"Location": "/x/1"}', '{"Content-Type": "text/plain", "X-N": ["a", "b"]}');

# intervals: [sql, class] with class short, long or bad
my @short = ("'1 millisecond'", "'2 milliseconds'", "'500 microseconds'");
my @long = ("'1 hour'", "'3 hours'", "'1 day'", "'2 days'", "'1 mon'", "'-1 day 25 hours'", "'100 years'");
# (36100 days and 876000 hours end within 100 calendar years, yet both editions refuse every
# interval above 100 years by interval comparison, where a month is 30 days: refused alike)
my @bad = ("'0 seconds'", "'-5 seconds'", "'101 years'", "'100 years 1 second'", "'36600 days'", "'36100 days'",
	"'876000 hours'");

sub interval_arg
{
	my $x = rand();
	return [ pick(@short), 'short' ] if $x < 0.35;
	return [ pick(@long), 'long' ] if $x < 0.97;
	return [ pick(@bad), 'bad' ];
}

# ---------------------------------------------------------------------------------------------
# Random operations: one SQL text, run as it is on both editions.  Every result line starts with
# R; `short` says the call may have set a short lease or ttl.
# ---------------------------------------------------------------------------------------------
my $CLAIM_COLS = "concat_ws(chr(31), 'R', outcome, inserted::text, coalesce(attempt::text, '\\N'), "
  . "coalesce(state::text, '\\N'), coalesce(response::text, '\\N'), coalesce(response_code::text, '\\N'), "
  . "coalesce(usi(retry_after)::text, '\\N'), coalesce(us(expires_at)::text, '\\N'), "
  . "coalesce(retry_after_s::text, '\\N'), coalesce(encode(response_body, 'hex'), '\\N'), "
  . "coalesce(response_headers::text, '\\N'))";
my $BATCH_COLS = "concat_ws(chr(31), 'B', key, outcome, inserted::text, coalesce(attempt::text, '\\N'), "
  . "coalesce(state::text, '\\N'), coalesce(response::text, '\\N'), coalesce(response_code::text, '\\N'), "
  . "coalesce(retry_after_s::text, '\\N'), coalesce(us(expires_at)::text, '\\N'))";

# the attempt a call names: the key's (as the C edition's session sees it), stale, ahead, 0
sub attempt_of
{
	my ($id) = @_;
	my $row = $main::view{c}{$id};
	my $cur = $row ? $row->{attempt} : 1 + int(rand(2));
	my $y = rand();
	return $y < 0.65 ? $cur : $y < 0.80 ? $cur - 1 : $y < 0.95 ? $cur + 1 : 0;
}

# a bad key, or the longest good one: (sql, the key when it is good)
sub bad_key
{
	return (lit('y' x 255), 'y' x 255) if rand() < 0.15;
	return (pick('NULL', q{E'a\nb'}, q{''}, lit('x' x 256), q{'caf' || chr(233)}, q{E'tab\there'}, q{E'\x7f'}), undef);
}

# the key and scope arguments of a call on $id (now and then a bad one); a good key other than
# $id's changes $op->{id}
sub key_args
{
	my ($op, $id) = @_;
	my ($scope, $key) = split /\0/, $id, -1;
	my $k = lit($key);
	my $sc = $scope eq '' && rand() < 0.5 ? '' : ', scope => ' . lit($scope);
	if (rand() < 0.03)
	{
		my $x = rand();
		if ($x < 0.6)
		{
			my ($sql, $good) = bad_key();
			$k = $sql;
			$op->{id} = "$scope\0$good" if defined $good;
		}
		elsif ($x < 0.8) { $sc = ', scope => NULL' }
		else { $sc = ', scope => ' . lit('s' x 256) }
	}
	return ($k, $sc);
}

sub random_op
{
	my ($si, %opt) = @_;
	my $x = rand();
	my $fn = $opt{fn} // ($x < 0.32 ? 'claim' : $x < 0.44 ? 'complete' : $x < 0.53 ? 'fail' : $x < 0.59 ? 'extend'
		: $x < 0.64 ? 'release' : $x < 0.68 ? 'forget' : $x < 0.78 ? 'lookup' : $x < 0.84 ? 'reap'
		: $x < 0.93 ? 'claim_batch' : 'complete_batch');
	$fn = 'lookup' if $fn eq 'reap' && $opt{no_reap};
	my %op = (fn => $fn, si => $si);
	# the owner's calls mostly on a pending key, so that they succeed often enough
	my @pending = grep { $main::view{c}{$_}{state} eq 'pending' } sort keys %{ $main::view{c} };
	my $owner_call = $fn =~ /^(complete|fail|extend|release)$/;
	my $id = $op{id} = $opt{id} // ($owner_call && @pending && rand() < 0.6 ? pick(@pending) : pick(@ids));
	my ($k, $sc) = key_args(\%op, $id);
	my ($scope) = split /\0/, $id, -1;
	if ($fn eq 'claim')
	{
		my @args = ($k);
		my $y = rand();
		if ($y < 0.75) { push @args, 'request => ' . lit(pick(requests_of($id))) }
		elsif ($y < 0.83) { push @args, 'request => ' . lit(pick(map { @$_ } @requests)) }
		elsif ($y < 0.90) { push @args, "fingerprint => '\\x" . pick(@fingerprints) . "'::bytea" }
		elsif ($y < 0.92) { push @args, pick(q{fingerprint => '\x'::bytea}, "fingerprint => '\\x" . ('ab' x 65) . "'::bytea") }
		elsif ($y < 0.94) { push @args, 'request => NULL' }
		for my $arg ('ttl', 'lease')
		{
			next if rand() < 0.4;
			my $i = interval_arg();
			push @args, "$arg => $i->[0]";
			$op{short} = 1 if $i->[1] eq 'short';
		}
		$op{short} = 1 if $si == 2 && !grep { /^lease/ } @args;
		my $w = rand();
		if ($opt{wait}) { push @args, "wait => $opt{wait}" }
		elsif ($w < 0.08) { push @args, "wait => '0'" }
		elsif ($w < 0.14) { push @args, "wait => '3 milliseconds'" }
		elsif ($w < 0.16) { push @args, 'wait => NULL' }
		elsif ($w < 0.17) { push @args, 'wait => ' . pick("'-1 millisecond'", "'61 minutes'", "'1 hour 1 microsecond'") }
		$op{sql} = "SELECT $CLAIM_COLS FROM idem_claim(" . join(', ', @args) . "$sc)";
		return \%op;
	}
	if ($fn eq 'lookup')
	{
		$op{sql} = "SELECT 'R' || chr(31) || CASE WHEN r.key IS NULL THEN 'NULL' ELSE fmt(r) END FROM idem_lookup($k$sc) r";
		return \%op;
	}
	if ($fn eq 'forget')
	{
		my $f = pick('', ', force => true', ', force => false');
		$f = ', force => NULL' if rand() < 0.02;
		$op{sql} = "SELECT 'R' || chr(31) || r::text FROM idem_forget($k$sc$f) r";
		return \%op;
	}
	if ($fn eq 'reap')
	{
		my $y = rand();
		my $arg = $y < 0.05 ? pick('0', '-1') : $y < 0.45 ? pick('', 'NULL') : 1 + int(rand(3));
		$op{limited} = 1 if $arg =~ /^[1-9]/;
		$op{sql} = "SELECT 'R' || chr(31) || idem_reap($arg)";
		return \%op;
	}
	if ($fn eq 'extend' || $fn eq 'release')
	{
		my @args = ($k, 'attempt => ' . (rand() < 0.02 ? 'NULL' : attempt_of($id)));
		if ($fn eq 'extend')
		{
			my $i = rand() < 0.02 ? [ 'NULL', 'bad' ] : interval_arg();
			push @args, "lease => $i->[0]";
			$op{short} = 1 if $i->[1] eq 'short';
		}
		$op{sql} = "SELECT 'R' || chr(31) || fmt(r) FROM idem_$fn(" . join(', ', @args) . "$sc) r";
		return \%op;
	}
	if ($fn eq 'complete' || $fn eq 'fail')
	{
		my @args = ($k);
		if ($fn eq 'complete')
		{
			push @args, rand() < 0.1 ? 'NULL' : lit(pick(@responses));
			push @args, 'response_code => ' . pick(200, 201, 204, 409, 'NULL') if rand() < 0.5;
		}
		else
		{
			push @args, 'response => ' . lit(pick(@responses)) if rand() < 0.7;
			push @args, 'response_code => ' . pick(402, 500, 503, 'NULL') if rand() < 0.5;
			push @args, 'retryable => ' . pick('true', 'false', 'false', 'NULL') if rand() < 0.8;
		}
		push @args, 'attempt => ' . attempt_of($id) if rand() < 0.7;
		if (rand() < 0.3)
		{
			my $i = interval_arg();
			push @args, "ttl => $i->[0]";
			$op{short} = 1 if $i->[1] eq 'short';
		}
		push @args, "body => '\\x" . pick(@bodies) . "'::bytea" if rand() < 0.3;
		push @args, 'headers => ' . (rand() < 0.1 ? pick(q{'[]'}, q{'"x"'}, q{'null'}) : lit(pick(@headers))) if rand() < 0.3;
		$op{sql} = "SELECT 'R' || chr(31) || fmt(r) FROM idem_$fn(" . join(', ', @args) . "$sc) r";
		return \%op;
	}
	# batches: 0 to 4 keys of one scope, in any order, sometimes repeated; or (big) 3 to 6
	# distinct keys in any order, claimed with their usual requests: such a batch mixes new or
	# expired keys with finished and pending ones (the SQL edition answers some set-wise and hands
	# the others to its per-key path, docs/editions.md)
	my $big = rand() < 0.4;
	my @bkeys = $big ? (shuffle(@keys))[ 0 .. 2 + int(rand(4)) ] : map { pick(@keys) } 1 .. int(rand(5));
	my $bscope = pick(@scopes);
	my @bad_arrays = ('NULL', q{ARRAY['k1', NULL]}, q{'{{k1,k2},{k3,k4}}'::text[]}, q{ARRAY['k1', E'b\x01d']},
		q{ARRAY['k1', '']});
	my $keys_sql = 'ARRAY[' . join(', ', map { lit($_) } @bkeys) . ']::text[]';
	$keys_sql = pick(@bad_arrays) if rand() < 0.04;
	my @args = ($keys_sql);
	push @args, 'scope => ' . lit($bscope) if $bscope ne '' || rand() < 0.5;
	if ($fn eq 'claim_batch')
	{
		my $y = $big ? 0 : rand();
		if ($y < 0.6)
		{
			# each key's usual request; a repeated key now and then with another one (IK001)
			my @r = map { my $id2 = "$bscope\0$_"; lit(pick(requests_of($id2))) } @bkeys;
			@r = map { rand() < 0.05 ? lit(pick(map { @$_ } @requests)) : $_ } @r if rand() < 0.3;
			push @r, 'NULL' if rand() < 0.03;    # one too many
			push @args, 'requests => ARRAY[' . join(', ', @r) . ']::jsonb[]';
		}
		elsif ($y < 0.7)
		{
			my @f = map { rand() < 0.2 ? 'NULL' : "'\\x" . pick(@fingerprints) . "'::bytea" } @bkeys;
			$f[0] = q{'\x'::bytea} if @f && rand() < 0.1;
			push @args, 'fingerprints => ARRAY[' . join(', ', @f) . ']::bytea[]';
		}
		for my $arg ('ttl', 'lease')
		{
			next if rand() < 0.5;
			my $i = interval_arg();
			push @args, "$arg => $i->[0]";
			$op{short} = 1 if $i->[1] eq 'short';
		}
		$op{short} = 1 if $si == 2 && !grep { /^lease/ } @args;
		push @args, "wait => '" . pick('0', '2 milliseconds') . "'" if rand() < 0.2;
		push @args, 'applied => ' . pick('true', 'false', 'NULL') if rand() < 0.25;
		$op{sql} = "SELECT $BATCH_COLS FROM idem_claim_batch(" . join(', ', @args) . ')';
		return \%op;
	}
	# complete_batch: distinct keys mostly
	if (rand() < 0.7)
	{
		my %seen;
		@bkeys = grep { !$seen{$_}++ } @bkeys;
		$args[0] = 'ARRAY[' . join(', ', map { lit($_) } @bkeys) . ']::text[]' if $args[0] =~ /^ARRAY\[.*\]::text\[\]$/;
	}
	if (rand() < 0.5)
	{
		my @a = map { rand() < 0.2 ? 'NULL' : attempt_of("$bscope\0$_") } @bkeys;
		push @a, 1 if rand() < 0.05;
		push @args, 'attempts => ARRAY[' . join(', ', @a) . ']::integer[]';
	}
	if (rand() < 0.5)
	{
		my @r = map { rand() < 0.2 ? 'NULL' : lit(pick(@responses)) } @bkeys;
		push @args, 'responses => ARRAY[' . join(', ', @r) . ']::jsonb[]';
	}
	push @args, 'response_code => ' . pick(200, 202, 'NULL') if rand() < 0.3;
	if (rand() < 0.3)
	{
		my $i = interval_arg();
		push @args, "ttl => $i->[0]";
		$op{short} = 1 if $i->[1] eq 'short';
	}
	$op{sql} = "SELECT 'R' || chr(31) || idem_complete_batch(" . join(', ', @args) . ')';
	return \%op;
}

# ---------------------------------------------------------------------------------------------
# Running one operation on both editions and comparing
# ---------------------------------------------------------------------------------------------
my $CLOCK = "SELECT 'T' || chr(31) || us(clock_timestamp());";
my $DUMP = "SELECT 'D' || chr(31) || fmt(k) FROM idem_keys k ORDER BY scope, key;";
my @fields = qw(scope key state attempt fp resp code retry created locked completed expires body headers claimed);
my @ts_fields = qw(created locked completed expires claimed);
my %is_ts = map { $_ => 1 } @ts_fields;
my $N = '\N';

our %view;      # edition -> id -> row, as the last dump showed it (the session's view)
our %writer;    # edition -> id -> field -> [op index, value - t0 of that op, duration of that op]
my %written;    # edition -> id -> field -> value -> the same, for every value seen
our %identity = map { $_ => int(rand(@requests)) } @ids;
my $opno = 0;
my $failure;
my %stats;
my $short_until = 0;    # database clock (µs) before which a short interval may still run

# The error fields of the first error: SQLSTATE, message, DETAIL, HINT, COLUMN NAME, ... but not
# CONTEXT and LOCATION (they name each edition's code: docs/editions.md)
sub parse_error
{
	my ($err) = @_;
	my (%f, $cur);
	for my $line (split /\n/, $err)
	{
		if ($line =~ /^(?:psql:[^:]*:\d+: )?(ERROR|WARNING|FATAL):\s+(\S{5}): (.*)$/)
		{
			last if %f;
			%f = (level => $1, sqlstate => $2, message => $3);
			$cur = 'message';
		}
		elsif ($line =~ /^([A-Z][A-Z ]*[A-Z]):  (.*)$/ && %f)
		{
			$cur = $1;
			$f{$cur} = $2;
		}
		elsif (%f && defined $cur) { $f{$cur} .= "\n$line" }
		elsif ($line ne '') { $f{junk} .= "$line\n" }
	}
	delete @f{ 'CONTEXT', 'LOCATION' };
	return \%f;
}

sub error_text
{
	my ($f) = @_;
	return join('; ', map { "$_=$f->{$_}" } sort keys %$f);
}

sub parse_output
{
	my ($out, $err) = @_;
	my %res = (rows => {}, r => [], b => [], err => parse_error($err));
	my @t;
	for my $line (split /\n/, $out)
	{
		my ($tag, $rest) = split /$US/, $line, 2;
		if ($tag eq 'T') { push @t, $rest }
		elsif ($tag eq 'R') { push @{ $res{r} }, [ split /$US/, $rest, -1 ] }
		elsif ($tag eq 'B') { push @{ $res{b} }, [ split /$US/, $rest, -1 ] }
		elsif ($tag eq 'D')
		{
			my %r;
			@r{@fields} = split /$US/, $rest, -1;
			$res{rows}{"$r{scope}\0$r{key}"} = \%r;
		}
		elsif ($line eq '') { push @{ $res{r} }, ['(an empty line)'] }
		else { $res{junk} .= "$line\n" }
	}
	@res{qw(t0 t1)} = @t[ 0, 1 ];
	$res{t2} = $t[2];
	return \%res;
}

# Records which operation wrote each timestamp of the rows, per edition
# (by value: a value seen before, in any session's view, keeps its writer; a new one was written
# by this operation)
sub note_writers
{
	my ($e, $res) = @_;
	my %now;
	for my $id (keys %{ $res->{rows} })
	{
		my $row = $res->{rows}{$id};
		for my $f (@ts_fields)
		{
			my $v = $row->{$f};
			next if $v eq $N;
			$written{$e}{$id}{$f}{$v} //= [ $opno, $v - $res->{t0}, $res->{t1} - $res->{t0} ];
			$now{$id}{$f} = $written{$e}{$id}{$f}{$v};
		}
	}
	$writer{$e} = \%now;
	$view{$e} = $res->{rows};
	return;
}

sub show_row
{
	my ($r) = @_;
	return 'NULL' unless $r;
	return join(' | ', map { "$_=$r->{$_}" } @fields);
}

# Compares the rows both editions' sessions see after an operation
sub compare_rows
{
	my %all = map { $_ => 1 } keys %{ $view{c} }, keys %{ $view{sql} };
	for my $id (sort keys %all)
	{
		my ($a, $b) = ($view{c}{$id}, $view{sql}{$id});
		my $name = $id =~ s/\0/\//r;
		return "row $name: c has " . show_row($a) . "\n  sql has " . show_row($b) if !$a != !$b;
		for my $f (@fields)
		{
			if (!$is_ts{$f})
			{
				return "row $name, $f: c $a->{$f}, sql $b->{$f}" if $a->{$f} ne $b->{$f};
				next;
			}
			return "row $name, $f: c $a->{$f}, sql $b->{$f}" if ($a->{$f} eq $N) != ($b->{$f} eq $N);
			next if $a->{$f} eq $N;
			my ($wa, $wb) = ($writer{c}{$id}{$f}, $writer{sql}{$id}{$f});
			return "row $name, $f: written by operation $wa->[0] in c, $wb->[0] in sql" if $wa->[0] != $wb->[0];
			my $tol = $wa->[2] > $wb->[2] ? $wa->[2] : $wb->[2];
			return "row $name, $f: $wa->[1] µs after its operation began in c, $wb->[1] µs in sql (more than the operations' $tol µs apart)"
			  if abs($wa->[1] - $wb->[1]) > $tol;
			for my $g (@ts_fields)
			{
				next if $g eq $f || $a->{$g} eq $N || $b->{$g} eq $N;
				next if $writer{c}{$id}{$g}[0] != $wa->[0] || $writer{sql}{$id}{$g}[0] != $wa->[0];
				my ($da, $db) = ($a->{$f} - $a->{$g}, $b->{$f} - $b->{$g});
				return "row $name: $f - $g is $da µs in c, $db µs in sql" if $da != $db;
			}
		}
	}
	return undef;
}

# Compares the result lines of an operation (claim results: timestamps as above)
sub compare_results
{
	my ($op, $rc, $rs) = @_;
	if ($op->{fn} eq 'claim' && @{ $rc->{r} } && @{ $rs->{r} })
	{
		my ($a, $b) = ($rc->{r}[0], $rs->{r}[0]);
		# outcome inserted attempt state response code | retry_after expires_at retry_after_s | body headers
		for my $i (0 .. 5, 9, 10)
		{
			return "claim result column $i: c $a->[$i], sql $b->[$i]" if $a->[$i] ne $b->[$i];
		}
		for my $i (6, 7, 8)
		{
			return "claim result column $i: c $a->[$i], sql $b->[$i]" if ($a->[$i] eq $N) != ($b->[$i] eq $N);
		}
		my $id = $op->{id};
		for my $pair ([ 'c', $a, $rc ], [ 'sql', $b, $rs ])
		{
			my ($e, $r, $res) = @$pair;
			my $row = $view{$e}{$id};
			if ($r->[7] ne $N)
			{
				return "$e: the claim's expires_at $r->[7] is not the row's " . ($row ? $row->{expires} : 'NULL')
				  if !$row || $row->{expires} ne $r->[7];
			}
			if ($r->[6] ne $N)
			{
				# (an integer: a lease of a century gives its largest value)
				my $ceil = int(($r->[6] + 999_999) / 1_000_000);
				$ceil = 2147483647 if $ceil > 2147483647;
				return "$e: retry_after_s $r->[8] is not ceil(retry_after $r->[6] µs)" if $r->[8] != $ceil;
				return "$e: retry_after $r->[6] µs is not locked_until - clock within the call"
				  if !$row || $row->{locked} eq $N || $r->[6] < $row->{locked} - $res->{t1} || $r->[6] > $row->{locked} - $res->{t0};
			}
		}
		if ($a->[8] ne $N)
		{
			my $tol = 1 + int(($rc->{t1} - $rc->{t0} + $rs->{t1} - $rs->{t0}) / 1_000_000);
			return "claim retry_after_s: c $a->[8], sql $b->[8]" if abs($a->[8] - $b->[8]) > $tol;
		}
		return undef;
	}
	if ($op->{fn} eq 'claim_batch')
	{
		my ($ra, $rb) = ($rc->{b}, $rs->{b});
		return 'claim_batch: c returned ' . scalar(@$ra) . ' rows, sql ' . scalar(@$rb) if @$ra != @$rb;
		for my $i (0 .. $#$ra)
		{
			my ($a, $b) = ($ra->[$i], $rb->[$i]);
			for my $j (0 .. 6)
			{
				return "claim_batch row $i column $j: c $a->[$j], sql $b->[$j]" if $a->[$j] ne $b->[$j];
			}
			for my $j (7, 8)
			{
				return "claim_batch row $i column $j: c $a->[$j], sql $b->[$j]" if ($a->[$j] eq $N) != ($b->[$j] eq $N);
			}
			my $scope = $op->{sql} =~ /scope => '([^']*)'/ ? $1 : '';
			for my $pair ([ 'c', $a ], [ 'sql', $b ])
			{
				my ($e, $r) = @$pair;
				my $row = $view{$e}{"$scope\0$r->[0]"};
				return "$e: claim_batch row $i expires_at $r->[8] is not the row's"
				  if $r->[8] ne $N && (!$row || $row->{expires} ne $r->[8]);
			}
		}
		return undef;
	}
	# every other result: a row of idem_keys (compared with the dumps), a count, a boolean
	my ($ra, $rb) = ($rc->{r}, $rs->{r});
	return 'c returned ' . scalar(@$ra) . ' result lines, sql ' . scalar(@$rb) if @$ra != @$rb;
	for my $i (0 .. $#$ra)
	{
		my ($a, $b) = ($ra->[$i], $rb->[$i]);
		if (@$a == @fields)
		{
			my (%ra, %rb);
			@ra{@fields} = @$a;
			@rb{@fields} = @$b;
			my $id = "$ra{scope}\0$ra{key}";
			for my $f (@fields)
			{
				next if $is_ts{$f};
				return "result $f: c $ra{$f}, sql $rb{$f}" if $ra{$f} ne $rb{$f};
			}
			for my $pair ([ 'c', \%ra ], [ 'sql', \%rb ])
			{
				my ($e, $r) = @$pair;
				my $row = $view{$e}{$id};
				return "$e: the returned row is not the row in idem_keys:\n  returned " . show_row($r) . "\n  stored   " . show_row($row)
				  if $op->{fn} ne 'lookup' && $row && show_row($row) ne show_row($r);
				return "$e: lookup returned a row other than the stored one" if $op->{fn} eq 'lookup' && show_row($row) ne show_row($r);
			}
			next;
		}
		return "result: c " . join(',', @$a) . ", sql " . join(',', @$b) if join($US, @$a) ne join($US, @$b);
	}
	return undef;
}

sub answers
{
	my ($op, $res) = @_;
	return join('', map { "    R " . join(' | ', @$_) . "\n" } @{ $res->{r} }, @{ $res->{b} })
	  . (%{ $res->{err} } ? '    error: ' . error_text($res->{err}) . "\n" : '')
	  . ($res->{junk} ? "    other output: $res->{junk}" : '');
}

sub fail_with
{
	my ($what, $op, $rc, $rs) = @_;
	return if $failure;
	$failure = "operation $opno (session $op->{si}" . ($op->{in_tx} ? ', in a transaction' : '') . "): $what\n"
	  . "  call: $op->{sql}\n  c answered:\n" . answers($op, $rc) . "  sql answered:\n" . answers($op, $rs)
	  . "  c rows after:\n" . join('', map { '    ' . show_row($view{c}{$_}) . "\n" } sort keys %{ $view{c} })
	  . "  sql rows after:\n" . join('', map { '    ' . show_row($view{sql}{$_}) . "\n" } sort keys %{ $view{sql} });
	return;
}

my $tx;    # the open transaction: { si, left, written => {id} }
my $async;    # a call that waits for the open transaction: { si, op }

# Runs $sql in session $si of both editions (one after the other) and returns both results
sub both
{
	my ($si, $sql) = @_;
	my %res;
	for my $e (@editions)
	{
		my ($out, $err) = $sess{$e}[$si]->run($sql);
		$res{$e} = parse_output($out, $err);
		$res{$e}{raw_err} = $err;
	}
	return @res{@editions};
}

# waits until every short interval given so far has run out, on the database clock
sub let_short_intervals_end
{
	return if !$short_until;
	# (in a session that is not waiting for a transaction)
	my $free = first { !($async && $_ == $async->{si}) } 0 .. 2;
	my ($out) = $sess{c}[$free]->run("SELECT pg_sleep(greatest(0, ($short_until - us(clock_timestamp())) / 1e6 + 0.0001)); $CLOCK");
	$short_until = 0;
	return;
}

sub do_op
{
	my ($op) = @_;
	my $si = $op->{si};
	my $in_tx = $tx && $tx->{si} == $si;
	$op->{in_tx} = $in_tx;
	let_short_intervals_end();
	my ($rc, $rs);
	if ($in_tx)
	{
		($rc, $rs) = both($si, "$CLOCK SAVEPOINT sp; $op->{sql}; $CLOCK");
		my $ec = !!%{ $rc->{err} };
		my $es = !!%{ $rs->{err} };
		# each edition ends its savepoint by its own answer; a difference there is reported below
		for my $pair ([ 'c', $rc, $ec ], [ 'sql', $rs, $es ])
		{
			my ($e, $res, $errored) = @$pair;
			my ($out, $err) = $sess{$e}[$si]->run(($errored ? 'ROLLBACK TO' : 'RELEASE') . " SAVEPOINT sp; $CLOCK $DUMP");
			my $after = parse_output($out, $err);
			$res->{rows} = $after->{rows};
			# after an error the statement's second clock reading failed: the next one bounds it
			$res->{t1} //= $after->{t0};
			$res->{junk} .= $after->{junk} // '';
			$res->{junk} .= $err if $err ne '';
		}
		# the keys this call wrote: their rows changed in the transaction's view
		my %ids = map { $_ => 1 } keys %{ $tx->{rows} }, keys %{ $rc->{rows} };
		for my $id (keys %ids)
		{
			$tx->{written}{$id} = 1 if show_row($tx->{rows}{$id}) ne show_row($rc->{rows}{$id});
		}
		$tx->{rows} = { %{ $rc->{rows} } };
	}
	else
	{
		($rc, $rs) = both($si, "$CLOCK $op->{sql}; $CLOCK $DUMP");
	}
	return check_op($op, $rc, $rs);
}

# Records an operation's results ($rc: the C edition's, $rs: the SQL edition's) and compares them
sub check_op
{
	my ($op, $rc, $rs) = @_;
	my $si = $op->{si};
	$opno++;
	for my $e (@editions)
	{
		my $res = $e eq 'c' ? $rc : $rs;
		note_writers($e, $res);
	}
	if ($tx && !$op->{in_tx})
	{
		# what other sessions commit shows in the transaction (READ COMMITTED), but for its own keys
		my %ids = map { $_ => 1 } keys %{ $tx->{rows} }, keys %{ $rc->{rows} };
		for my $id (grep { !$tx->{written}{$_} } keys %ids)
		{
			if ($rc->{rows}{$id}) { $tx->{rows}{$id} = $rc->{rows}{$id} }
			else { delete $tx->{rows}{$id} }
		}
	}
	if ($op->{short})
	{
		my $t = $rc->{t1} > $rs->{t1} ? $rc->{t1} : $rs->{t1};
		$short_until = $t + 2000 if $t + 2000 > $short_until;
	}
	$stats{"$op->{fn}: " . (%{ $rc->{err} } ? "error $rc->{err}{sqlstate}" : 'ok')}++;
	$stats{"claim: $rc->{r}[0][0]" . ($rc->{r}[0][1] eq 'true' ? ' (inserted)' : '')}++ if $op->{fn} eq 'claim' && @{ $rc->{r} };
	if ($op->{fn} eq 'claim_batch' && $rc->{b} && @{ $rc->{b} })
	{
		# the batch's rows by outcome, and batches mixing new keys with existing ones (the SQL
		# edition inserts the new ones together and hands some existing ones to its per-key path)
		my %kinds;
		$kinds{ "$_->[1]" . ($_->[2] eq 'true' ? ' (inserted)' : ' (existing)') }++ for @{ $rc->{b} };
		$stats{"claim_batch row: $_"} += $kinds{$_} for keys %kinds;
		$stats{'claim_batch: new and existing keys'}++
		  if $kinds{'claimed (inserted)'} && grep { !/inserted/ } keys %kinds;
	}
	return fail_with('unexpected output', $op, $rc, $rs) if $rc->{junk} || $rs->{junk};
	my $ea = error_text($rc->{err});
	my $eb = error_text($rs->{err});
	return fail_with("errors differ:\n    c:   $ea\n    sql: $eb", $op, $rc, $rs) if $ea ne $eb;
	my $msg = compare_results($op, $rc, $rs);
	return fail_with($msg, $op, $rc, $rs) if $msg;
	if ($op->{limited} && !%{ $rc->{err} })
	{
		# any max_rows of the expired keys may go (no order is promised): both reap the rest, and
		# the rows meet again
		my $rest = { fn => 'reap', si => $si, sql => "SELECT 'R' || chr(31) || idem_reap()", id => $op->{id} };
		return do_op($rest);
	}
	$msg = compare_rows();
	return fail_with("idem_keys differs: $msg", $op, $rc, $rs) if $msg;
	return;
}


sub end_tx
{
	my $commit = rand() < 0.6;
	my $si = $tx->{si};
	$tx = undef;
	let_short_intervals_end();
	my %early;
	if ($async)
	{
		# it must still be waiting (an answer now would be one given without waiting)
		for my $e (@editions)
		{
			my $s = $sess{$e}[ $async->{si} ];
			$s->{h}->pump_nb;
			next unless $s->done;
			my ($out, $err) = $s->wait;
			$early{$e} = parse_output($out, $err);
		}
		my $op = $async->{op};
		my $none = { r => [], b => [], err => {} };
		if ($early{c})
		{
			$opno++;
			return fail_with('the C edition answered a call on a key an open transaction wrote before the transaction ended',
				$op, $early{c}, $early{sql} // $none);
		}
		if ($early{sql})
		{
			$opno++;
			return fail_with('the SQL edition answered a call on a key an open transaction wrote before the transaction ended',
				$op, $none, $early{sql});
		}
	}
	my ($rc, $rs) = both($si, ($commit ? 'COMMIT;' : 'ROLLBACK;') . " $CLOCK $CLOCK");
	$stats{ $commit ? 'transaction: committed' : 'transaction: rolled back' }++;
	my $op = { si => $si, sql => $commit ? 'COMMIT' : 'ROLLBACK', fn => 'end' };
	return fail_with('unexpected output', $op, $rc, $rs) if $rc->{junk} || $rs->{junk} || %{ $rc->{err} } || %{ $rs->{err} };
	my $msg;
	if ($async)
	{
		# the waiting call decides on what the transaction left
		my $a = $async;
		$async = undef;
		my %res;
		for my $e (@editions)
		{
			my ($out, $err) = $sess{$e}[ $a->{si} ]->wait;
			$res{$e} = parse_output($out, $err);
		}
		$stats{ 'call that waited for a transaction: ' . ($commit ? 'after COMMIT' : 'after ROLLBACK') }++;
		check_op($a->{op}, @res{@editions});
		return if $failure;
	}
	# (after the waiting call: it may write as soon as the transaction ends)
	($rc, $rs) = both($si, "$CLOCK $CLOCK $DUMP");
	$opno++;
	note_writers($_, $_ eq 'c' ? $rc : $rs) for @editions;
	$msg = compare_rows();
	return fail_with("idem_keys differs: $msg", $op, $rc, $rs) if $msg;
	# the other sessions see the same again
	my $other = ($si + 1) % 3;
	my ($oc, $os) = both($other, "$CLOCK $CLOCK $DUMP");
	note_writers($_, $_ eq 'c' ? $oc : $os) for @editions;
	$msg = compare_rows();
	return fail_with("idem_keys differs (seen from session $other): $msg", $op, $oc, $os) if $msg;
	return;
}

my $started = time;
while ($opno < $nops && !$failure)
{
	if (!$tx)
	{
		my $si = int(rand(3));
		if (rand() < 0.04)
		{
			my ($rc, $rs) = both($si, 'BEGIN;');
			die "BEGIN failed" if %{ $rc->{err} } || %{ $rs->{err} };
			# base: the keys that had a committed row when it began
			# rows: the rows the transaction sees (C edition)
			$tx = { si => $si, left => 2 + int(rand(5)), written => {}, base => { map { $_ => 1 } keys %{ $view{c} } },
				rows => { %{ $view{c} } } };
			next;
		}
		do_op(random_op($si));
		next;
	}
	if ($tx->{left} <= 0)
	{
		end_tx();
		next;
	}
	if (rand() < 0.6)
	{
		$tx->{left}--;
		do_op(random_op($tx->{si}, no_reap => 1, (%{ $tx->{written} } && rand() < 0.4 ? (id => pick(sort keys %{ $tx->{written} })) : ())));
		next;
	}
	# another session: a bounded-wait claim of a key the transaction wrote (it must answer
	# in_progress with nothing visible), or a lookup of one, or any call on another key
	my $si = pick(grep { $_ != $tx->{si} && !($async && $_ == $async->{si}) } 0 .. 2);
	my @held = sort keys %{ $tx->{written} };
	if (@held && !$async && rand() < 0.25)
	{
		# a call without a bounded wait on a key the transaction wrote: it waits for the end of
		# the transaction (sent now, checked then); one key only, so that it locks nothing else
		my $id = pick(@held);
		my ($scope, $key) = split /\0/, $id, -1;
		# (complete, fail, extend, release and forget find a row as UPDATE and DELETE do: a row the
		# transaction inserted is not there for them, nothing to wait for)
		my $fn = $tx->{base}{$id} ? pick('claim', 'claim', 'complete', 'fail', 'extend', 'release', 'forget', 'claim_batch')
		  : pick('claim', 'claim_batch');
		my $op;
		if ($fn eq 'claim_batch')
		{
			my $req = lit(pick(requests_of($id)));
			$op = { fn => $fn, si => $si, id => $id,
				sql => "SELECT $BATCH_COLS FROM idem_claim_batch(ARRAY[" . lit($key) . "], scope => " . lit($scope)
				  . ", requests => ARRAY[$req]::jsonb[])" };
		}
		else
		{
			# valid arguments only: a bad one is refused before the key is read, without waiting
			my $bad = join('|', map { quotemeta } @bad, q{'\x'::bytea}, 'ab' x 65, q{'[]'}, q{'"x"'}, q{'null'});
			# (a switch to another key, the longest good one included, shows as another id)
			my $tries = 0;
			do
			{
				die "no valid $fn call on the key the transaction wrote after 10000 tries" if ++$tries > 10000;
				$op = random_op($si, fn => $fn, id => $id);
			} while $op->{sql} =~ /wait => '|(scope|response_code|retryable|attempt|lease|force) => NULL|scope => 'sss/
			  || $op->{id} ne $id || $op->{sql} =~ /idem_\w+\((NULL|E'|''|'x{256}|'caf)/ || $op->{sql} =~ /$bad/;
			$op->{sql} =~ s/force => false/force => true/;
			$op->{sql} =~ s/(idem_forget\([^)]*)\)/$1, force => true)/ unless $op->{sql} =~ /force =>/;
		}
		$op->{async} = 1;
		$sess{$_}[$si]->send("$CLOCK $op->{sql}; $CLOCK $DUMP") for @editions;
		$async = { si => $si, op => $op };
		$stats{'call sent to wait for a transaction'}++;
		next;
	}
	if (@held && rand() < 0.5)
	{
		my $id = pick(@held);
		my $op = rand() < 0.7
		  ? random_op($si, fn => 'claim', id => $id, wait => pick("'0'", "'1 millisecond'", "'3 milliseconds'"))
		  : random_op($si, fn => 'lookup', id => $id);
		$stats{'call on a key an open transaction wrote'}++;
		do_op($op);
		next;
	}
	my %held = map { $_ => 1 } @held;
	my $op;
	do { $op = random_op($si, no_reap => 1) } while ($held{ $op->{id} } && $op->{fn} ne 'lookup')
	  || $op->{fn} =~ /batch/;
	do_op($op);
}
end_tx() if $tx && !$failure;
my $random_ops = $opno;

# What the run must have exercised for its verdict to mean something. An item this seed's
# operations missed gets more random operations of its function, each compared in both editions
# as the others, until it is covered (at most 3000): the verdict depends on the generator reaching
# it, not on one seed's luck.
my @must_cover = ('claim: claimed (inserted)', 'claim: replay', 'claim: in_progress', 'claim: claimed',
	'complete: ok', 'fail: ok', 'extend: ok', 'release: ok', 'forget: ok', 'lookup: ok', 'reap: ok',
	'claim_batch: ok', 'claim_batch: new and existing keys', 'claim_batch row: replay (existing)',
	'claim_batch row: in_progress (existing)', 'complete_batch: ok', 'claim: error IK001', 'complete: error IK002',
	'complete: error IK003', 'complete: error IK004', 'claim: error 22023',
	'claim_batch: error 22023', 'transaction: committed');
if (!$failure && $nops >= 800)
{
	for my $what (@must_cover)
	{
		my ($fn) = $what =~ /^(\w+)/;
		next if $fn eq 'transaction';
		for (my $extra = 0; !$failure && !$stats{$what} && $extra < 3000; $extra++)
		{
			do_op(random_op(int(rand(3)), fn => $fn));
			$stats{"coverage: more $fn operations"}++;
		}
	}
}
my $elapsed = time - $started;

note sprintf('%d operations in %.1f s', $opno, $elapsed);
note "  $_: $stats{$_}" for sort keys %stats;
diag $failure if $failure;
ok(!$failure, "the C and SQL editions agree on all $opno operations (seed $seed)");
cmp_ok($random_ops, '>=', $nops, "all $nops random operations ran");
if (!$failure && $nops >= 800)
{
	cmp_ok($stats{$_} // 0, '>', 0, "covered: $_ (" . ($stats{$_} // 0) . ')') for @must_cover;
}

$_->quit for map { @{ $sess{$_} } } @editions;
$node->stop;
done_testing();
