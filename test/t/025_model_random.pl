# Model-based randomized test: random operations from three sessions, each result checked against
# a small Perl model of the contract (docs/contract.md §2 and §9, docs/concepts.md).
#
# Operations: idem_claim (random key among 7, scope among 2, request: the key's usual one, an
# equivalent spelling of it, another one, none, or an explicit fingerprint; ttl and lease: the
# session default, 1 ms, a few ms to 2 s, an hour, or an invalid value), idem_complete and
# idem_fail (attempt: none, the right one, stale, ahead, 0; response, code, retryable random),
# idem_lookup, idem_reap (max_rows none, 1..4, or 0); and 1.2's: idem_complete / idem_fail with a
# ttl, a body and headers, idem_extend and idem_release (attempt right, stale or ahead; lease
# valid or not), idem_forget (with and without force), and idem_claim's wait (none, 0, a few ms,
# or an invalid value).  An expired key (past expires_at, no live
# lease) is absent for every function: claimed anew, IK003 for the owner's calls, NULL for
# lookup, whether or not it was reaped.  The three sessions have different
# idempotency.default_lease / default_ttl settings.
#
# Every operation's whole result is checked: outcome, inserted, attempt, state, response,
# response_code, retry_after, expires_at, the SQLSTATE of an error, the row that complete/fail
# return, the reap count; and after every operation the whole of idem_keys, as that session sees
# it, must equal the model, column by column (fingerprints recomputed in Perl as SHA-256 of scope,
# 0x00 and the canonical jsonb text, its numbers in their shortest form).
#
# Time.  The model is exact about time without guessing: each operation runs between two reads of
# the database clock (clock_timestamp() in the same session, before and after), so the clock the
# function used lies in [t0, t1].  A lease is live at the call when locked_until > t1, expired
# when locked_until <= t0; only in between is either answer right, and the model then follows the
# answer and checks that everything else agrees with it.  The same for expiry (expires_at against
# t0 and t1; being expired only ever starts, never ends, as the clock runs).  Timestamps the function writes are
# checked against the bracket and against each other (locked_until = clock + lease and
# expires_at = clock + ttl from one clock; a takeover's expires_at = greatest(old, clock + ttl)),
# and from then on known exactly.
#
# Waiting.  A claim with `wait` on a live lease that nobody acts on waits until the lease ends
# (then takes the key over) or until `wait` runs out (in_progress, and the call took at least
# `wait`): a lease ending before the call began plus `wait` must be taken over.  A claim with
# `wait` on a key that another session's open transaction has written gets in_progress with
# nothing visible (attempt, state, expires_at NULL; retry_after_s 1) and changes nothing.  And now
# and then, with no transaction open, one session claims a key held by a committed hour-long
# lease with a wait of a minute, in the background; the other sessions work on other keys (the
# waiter must still be waiting), then one of them completes, fails, releases or forgets the key:
# the waiter, woken, must answer from what that left (replay, takeover, or a new claim).
#
# Transactions.  Now and then one session opens a transaction and runs operations in it, each
# under a savepoint (an error rolls back to it; a few successful ones are rolled back too), and
# ends with COMMIT or ROLLBACK.  The model keeps that session's view (its own writes, everything
# else as committed: READ COMMITTED) apart from the committed state, and follows re-entrancy
# (a claim of a row this transaction wrote).  Meanwhile the other sessions keep working, on keys
# the transaction has not written; or, at most one at a time, they claim, complete or fail a key
# it HAS written: that call must wait for the transaction (checked: it has not returned when the
# transaction ends), and its result is then checked against what the transaction left behind.
#
# The seed is printed; IDEMPOTENCY_MODEL_SEED=<seed> replays the same random choices (outcomes
# that depend on timing may still differ), IDEMPOTENCY_MODEL_OPS sets the number of operations
# (default 10000).  The first disagreement stops the run and is printed in full.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Digest::SHA qw(sha256_hex);
use Time::HiRes qw(time);

my $seed = $ENV{IDEMPOTENCY_MODEL_SEED} || (int(time * 1000) ^ ($$ << 10)) % 2_000_000_000;
my $nops = $ENV{IDEMPOTENCY_MODEL_OPS} || 10000;
srand($seed);
diag "model seed $seed ($nops operations; replay: IDEMPOTENCY_MODEL_SEED=$seed)";

my $node = PostgreSQL::Test::Cluster->new('model');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
# the model does all the reaping: a background reaper would delete rows at unknown moments
idempotency.reaper_enabled = off
log_statement = none
log_min_messages = warning
});
$node->start;

my $US = chr(31);    # field separator in the result lines
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
-- test helpers (not part of the extension): microseconds, and one line per row
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

# ---------------------------------------------------------------------------------------------
# Sessions: psql processes fed through pipes (one batch of statements at a time)
# ---------------------------------------------------------------------------------------------
package Sess
{
	sub new
	{
		my ($class, $node, $id, $settings) = @_;
		my $s = bless { id => $id, in => '', out => '', err => '', n => 0 }, $class;
		$s->{timer} = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);
		$s->{h} = IPC::Run::start(
			[
				'psql', '-X', '-A', '-t', '-q', '-v', 'VERBOSITY=sqlstate',
				'-d', $node->connstr('postgres'), '-f', '-'
			],
			'<', \$s->{in}, '>', \$s->{out}, '2>', \$s->{err}, $s->{timer});
		my ($out, $err) = $s->run("SET client_min_messages = warning; SET TimeZone = 'UTC'; $settings");
		die "session $id setup failed: $err" if $err ne '';
		return $s;
	}

	sub send
	{
		my ($s, $sql) = @_;
		$s->{n}++;
		$s->{out} = $s->{err} = '';
		# a lone ";" ends a statement the batch left open; then the end markers
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

	sub ready
	{
		my ($s) = @_;
		$s->{h}->pump_nb;
		return $s->done;
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

# session defaults: lease (µs), ttl (µs)
my @sessions = (
	{ settings => '',                                          lease => 60_000_000, ttl => 86_400_000_000 },
	{ settings => q{SET idempotency.default_lease = '200ms'; SET idempotency.default_ttl = '2s';},
	  lease => 200_000, ttl => 2_000_000 },
	{ settings => q{SET idempotency.default_lease = 30; SET idempotency.default_ttl = 1;},
	  lease => 30_000, ttl => 1_000_000 });
for my $i (0 .. $#sessions)
{
	$sessions[$i]{s} = Sess->new($node, $i, $sessions[$i]{settings});
	my ($out) = $sessions[$i]{s}->run(q{SELECT usi(current_setting('idempotency.default_lease')::interval) || ',' ||
	                                           usi(current_setting('idempotency.default_ttl')::interval)});
	is($out, "$sessions[$i]{lease},$sessions[$i]{ttl}\n", "session $i: default lease and ttl as the model assumes");
}

# ---------------------------------------------------------------------------------------------
# The vocabulary
# ---------------------------------------------------------------------------------------------
sub lit { my ($s) = @_; return "'" . ($s =~ s/'/''/gr) . "'"; }

my @scopes = ('', 'tenant-a');
my @keys   = ('k1', 'k2', 'k3', 'k4', 'k5', "o'k", 'K 7');
my @ids;    # "scope\0key"
for my $sc (@scopes) { push @ids, map { "$sc\0$_" } @keys; }

# requests: [ spelling, spelling, ... ] of one canonical request each
my @requests = (
	[ '{"amount": 100, "currency": "EUR"}', '{"currency":"EUR","amount":100}' ],
	[ '{"a": [1, 2, {"b": null}]}', '{ "a" : [1,2,{"b":null}] }' ],
	[ '"just a string"' ],
	[ '{"a": 1, "a": 2}', '{"a": 2}' ],
	[ '{"name": "Zoë", "note": "tab\there"}' ],
	[ '12345', '12345.0' ],
	[ '{"total": 42.0, "n": [1.50, 2]}', '{"n": [1.5, 2.00], "total": 42}', '{"total": 4.2e1, "n": [15e-1, 2]}' ],
	[ '{}', ' { } ' ]);
my @responses = ('{"id": 1}', '{"id": 2, "tags": ["x", "y"]}', '[]', '"ok"', 'null', '0',
	'{"err": "declined", "retry": false}', '{"big": "' . ('x' x 3000) . '"}');
my @fingerprints = ('01', '0102', 'deadbeef', 'ff' x 64);    # valid explicit fingerprints (hex)
my @bodies = ('', '00ff0d0a', unpack('H*', '<ok id="1"/>'));   # response bodies (hex)
my @headers = ('{}', '{"Location": "/x/1"}', '{"Content-Type": "text/plain", "X-N": ["a", "b"]}');

# canonical texts, from jsonb itself
my %canon;
for my $lit ((map { @$_ } @requests), @responses, @headers)
{
	$canon{$lit} = $node->safe_psql('postgres', 'SELECT ' . lit($lit) . '::jsonb::text');
}
# what the fingerprint hashes: the canonical text with every number in its shortest form (no
# trailing fraction zeros); the vocabulary has no digits in strings, so a pattern does
sub numbers_shortest
{
	my ($text) = @_;
	$text =~ s/(\d)\.0+(?!\d)/$1/g;
	$text =~ s/(\.\d*?[1-9])0+(?!\d)/$1/g;
	return $text;
}
is(numbers_shortest('{"n": [1.50, 2.00, 10, 0.0], "total": 42.0}'), '{"n": [1.5, 2, 10, 0], "total": 42}',
	'the model writes numbers in their shortest form');
is($canon{'{"currency":"EUR","amount":100}'}, '{"amount": 100, "currency": "EUR"}',
	'jsonb canonicalises key order and spacing');
is($canon{'{"a": 1, "a": 2}'}, '{"a": 2}', 'jsonb keeps the last duplicate key');

# each key's usual identity: a request (index) or an explicit fingerprint
my %identity;
for my $id (@ids)
{
	$identity{$id} = rand() < 0.8 ? { req => int(rand(@requests)) } : { fp => $fingerprints[ int(rand(@fingerprints)) ] };
}

# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
my $N = '\N';
my %committed;    # id -> row (hash of strings, as fmt() prints them)
my $tx;           # open transaction: { sess, view => {id => row}, written => {id}, own => {id}, left }
my $async;        # a call that must wait for $tx: { sess, op, sql }
my %stats;
my $failure;      # the first disagreement
my $opno = 0;

my @fields = qw(scope key state attempt fp resp code retry created locked completed expires body headers claimed);

sub parse_row
{
	my ($line) = @_;
	my %r;
	@r{@fields} = split /$US/, $line, -1;
	return \%r;
}

sub row_text { my ($r) = @_; return defined $r ? join(' | ', map { "$_=" . ($r->{$_} // 'UNDEF') } @fields) : 'NULL'; }

sub copy_rows { my ($h) = @_; return { map { $_ => { %{ $h->{$_} } } } keys %$h }; }

# the rows a session sees
sub view_of
{
	my ($si) = @_;
	return $tx && $tx->{sess} == $si ? $tx->{view} : \%committed;
}

sub fingerprint_of
{
	my ($id, $call) = @_;
	my ($scope) = split /\0/, $id, -1;
	return $call->{fp} if defined $call->{fp};
	return sha256_hex($scope . "\0" . numbers_shortest($canon{ $call->{req} })) if defined $call->{req};
	return $N;
}

# docs/contract.md §9.1: past expires_at and no live lease, at clock $now.  Monotonic: once expired at some
# clock, expired at every later one.
sub expired_at
{
	my ($row, $now) = @_;
	return $row->{expires} <= $now && !($row->{state} eq 'pending' && $row->{locked} > $now);
}

# Whether a row counts as expired for a call whose clock lies in [t0, t1]: 1 or 0 when the bracket
# decides, undef when either answer is right.
sub expired_in
{
	my ($row, $t0, $t1) = @_;
	return 1 if expired_at($row, $t0);
	return 0 if !expired_at($row, $t1);
	$stats{'expiry during the call'}++;
	return undef;
}

# Checks the result of one call against the model and applies it.  $v: the view of the calling
# session (changed in place), $own: ids whose current row this session's transaction wrote (or
# undef), $res: { err, r (result line fields), t0, t1, rows (id -> row, the session's dump) }.
# Returns an error text, or undef.
sub check_call
{
	my ($op, $v, $own, $res) = @_;
	my ($t0, $t1, $err, $r) = @$res{qw(t0 t1 err r)};
	my $id = $op->{id};
	my $row = defined $id ? $v->{$id} : undef;
	my $want_err = sub {
		my ($code) = @_;
		return "expected error $code, got " . ($err || 'success: ' . join(',', @{ $r // [] })) if $err ne $code;
		$stats{"error $code"}++;
		return undef;
	};
	return "unexpected error $err" if $err ne '' && !$op->{may_fail};

	if ($op->{fn} eq 'claim')
	{
		return $want_err->('22023') if $op->{bad};
		if ($op->{held})
		{
			# another transaction's uncommitted write of the key, waited for until `wait` ran out
			return "unexpected error $err" if $err ne '';
			return 'the claim returned no row' unless $r;
			my @want = ('in_progress', 'false', ($N) x 6, 1, $N, $N);
			return "claim of a key held by an open transaction: (" . join(',', @$r) . ") expected (" . join(',', @want) . ")"
			  if join($US, @$r) ne join($US, @want);
			$stats{'claim: wait ran out on an uncommitted write'}++;
			return undef;
		}
		my $fp = fingerprint_of($id, $op);
		my $expect_new = sub {    # the row after an insert or a takeover; checks the clock
			my ($old) = @_;
			my $new = $res->{rows}{$id} or return (undef, 'the row is missing after the claim');
			my $clock = $new->{locked} - $op->{lease};
			return (undef, "clock of the claim ($clock = locked_until - lease) outside [$t0, $t1]")
			  if $clock < $t0 || $clock > $t1;
			my %w = (%$new, state => 'pending', resp => $N, code => $N, retry => $N, completed => $N, fp => $fp,
				body => $N, headers => $N, claimed => $clock);
			if ($old)
			{
				$w{attempt} = $old->{attempt} + 1;
				$w{created} = $old->{created};
				$w{fp} = $old->{fp};
				my $e = $clock + $op->{ttl};
				$w{expires} = $old->{expires} > $e ? $old->{expires} : $e;
			}
			else
			{
				$w{attempt} = 1;
				return (undef, "created_at $new->{created} is not the claim's clock $clock") if $new->{created} != $clock;
				$w{expires} = $clock + $op->{ttl};
			}
			return (\%w, undef);
		};
		my $result_is = sub {
			my ($outcome, $ins, $w) = @_;
			my @want = ($outcome, $ins, $w->{attempt}, $w->{state},
				$outcome eq 'replay' ? ($w->{resp}, $w->{code}) : ($N, $N));
			my @got = @$r[ 0 .. 5 ];
			my @want_bytes = $outcome eq 'replay' ? ($w->{body}, $w->{headers}) : ($N, $N);
			return "claim body, headers (" . join(',', @$r[ 9, 10 ]) . ") expected (" . join(',', @want_bytes) . ")"
			  if join($US, @$r[ 9, 10 ]) ne join($US, @want_bytes);
			return "claim result (" . join(',', @got) . ") expected (" . join(',', @want) . ")"
			  if join($US, @got) ne join($US, @want);
			return "claim expires_at $r->[7], row has $w->{expires}" if $r->[7] ne $w->{expires};
			if ($outcome eq 'in_progress')
			{
				my ($lo, $hi) = ($w->{locked} - $t1, $w->{locked} - $t0);
				return "retry_after $r->[6] not in ($lo, $hi] or not positive"
				  if $r->[6] eq $N || $r->[6] <= 0 || $r->[6] < $lo || $r->[6] > $hi;
				my $ceil = int(($r->[6] + 999_999) / 1_000_000);
				# docs/contract.md §9.5: an estimate (from the scope's work times, idem_scope_stats) within
				# [1, ceil(retry_after)]
				return "retry_after_s $r->[8] is not within [1, ceil(retry_after) = $ceil]"
				  if $r->[8] eq $N || $r->[8] < 1 || $r->[8] > $ceil;
			}
			elsif ($r->[6] ne $N || $r->[8] ne $N) { return "retry_after $r->[6] / $r->[8] for a $outcome answer" }
			return undef;
		};
		my $expired = $row && !($own && $own->{$id}) ? expired_in($row, $t0, $t1) : 0;
		# either answer is right: the one given decides (a new claim is attempt 1 and inserted)
		$expired = $err eq '' && $r && $r->[0] eq 'claimed' && $r->[1] eq 'true' ? 1 : 0 if !defined $expired;
		if (!$row || $expired)
		{
			return "unexpected error $err" if $err ne '';
			return 'the claim returned no row' unless $r;
			my ($w, $e) = $expect_new->(undef);
			return $e if $e;
			$e = $result_is->('claimed', 'true', $w);
			return $e if $e;
			$v->{$id} = $w;
			$own->{$id} = 1 if $own;
			$stats{ $row ? 'claim: an expired key, claimed anew' : 'claim: inserted' }++;
			return undef;
		}
		return $want_err->('IK001') if $row->{fp} ne $fp;
		return "unexpected error $err" if $err ne '';
		return 'the claim returned no row' unless $r;
		if ($own && $own->{$id})
		{
			$stats{'claim: re-entrant'}++;
			return $result_is->($row->{state} eq 'pending' ? 'claimed' : 'replay', 'false', $row);
		}
		if ($row->{state} eq 'succeeded' || ($row->{state} eq 'failed' && $row->{retry} eq 'false'))
		{
			$stats{'claim: replay'}++;
			return $result_is->('replay', 'false', $row);
		}
		my $live;
		my $wait = $op->{wait} // 0;
		if ($row->{state} eq 'pending')
		{
			if ($row->{locked} > $t1)
			{
				$live = 1;
				# in_progress only once `wait` ran out (its deadline is at least t0 + wait)
				return "in_progress after " . ($t1 - $t0) . " µs, before the wait of $wait µs ran out"
				  if $t1 - $t0 < $wait;
			}
			# a lease that ended by the wait's deadline is waited for, then taken over
			elsif ($row->{locked} <= $t0 + $wait) { $live = 0 }
			else
			{
				$live = $r->[0] eq 'in_progress' ? 1 : 0;
				$stats{'claim: lease ending during the call'}++;
			}
		}
		if ($live)
		{
			$stats{'claim: in_progress'}++;
			$stats{'claim: wait ran out on a live lease'}++ if $wait > 0;
			return $result_is->('in_progress', 'false', $row);
		}
		$stats{'claim: waited for the lease to end, took over'}++
		  if $wait > 0 && $row->{state} eq 'pending' && $row->{locked} > $t0;
		my ($w, $e) = $expect_new->($row);
		return $e if $e;
		$e = $result_is->('claimed', 'false', $w);
		return $e if $e;
		$stats{ 'claim: takeover of a ' . ($row->{state} eq 'pending' ? 'lapsed lease' : 'retryable failure') }++;
		$v->{$id} = $w;
		$own->{$id} = 1 if $own;
		return undef;
	}
	elsif ($op->{fn} eq 'complete' || $op->{fn} eq 'fail' || $op->{fn} eq 'extend' || $op->{fn} eq 'release')
	{
		return $want_err->('22023') if $op->{bad};
		return $want_err->('IK003') if !$row;
		my $expired = expired_in($row, $t0, $t1);
		$expired = $err eq 'IK003' ? 1 : 0 if !defined $expired;
		return $want_err->('IK003') if $expired;
		return $want_err->('IK002') if defined $op->{attempt} && $op->{attempt} != $row->{attempt};
		return $want_err->('IK004') if $row->{state} ne 'pending';
		return "unexpected error $err" if $err ne '';
		return "idem_$op->{fn} returned no row" unless $r;
		my $got = parse_row(join($US, @$r));
		if ($op->{fn} eq 'extend' || $op->{fn} eq 'release')
		{
			my $clock = $got->{locked} eq $N ? -1 : $got->{locked} - ($op->{fn} eq 'extend' ? $op->{lease} : 0);
			return "idem_$op->{fn}: clock (locked_until $got->{locked} - lease) outside [$t0, $t1]"
			  if $clock < $t0 || $clock > $t1;
			return "idem_$op->{fn} at clock $clock, when the key was expired" if expired_at($row, $clock);
			my %w = (%$row, locked => $got->{locked});
			return "returned row\n  " . row_text($got) . "\nexpected\n  " . row_text(\%w) if row_text($got) ne row_text(\%w);
			$v->{$id} = \%w;
			$own->{$id} = 1 if $own;
			$stats{"$op->{fn}: done"}++;
			return undef;
		}
		my $completed = $got->{completed};
		return "completed_at $completed outside [$t0, $t1]" if $completed eq $N || $completed < $t0 || $completed > $t1;
		return "idem_$op->{fn} at clock $completed, when the key was expired" if expired_at($row, $completed);
		my %w = (%$row, completed => $completed, locked => $N, body => $op->{body} // $N,
			headers => defined $op->{headers} ? $canon{ $op->{headers} } : $N);
		$w{expires} = $completed + $op->{ttl} if defined $op->{ttl};
		if ($op->{fn} eq 'complete')
		{
			@w{qw(state resp code retry)} = ('succeeded', defined $op->{response} ? $canon{ $op->{response} } : $N,
				$op->{code} // 200, $N);
		}
		else
		{
			@w{qw(state resp code retry)} = ('failed', defined $op->{response} ? $canon{ $op->{response} } : $N,
				$op->{code} // 500, ($op->{retryable} // 1) ? 'true' : 'false');
		}
		return "returned row\n  " . row_text($got) . "\nexpected\n  " . row_text(\%w) if row_text($got) ne row_text(\%w);
		$v->{$id} = \%w;
		$own->{$id} = 1 if $own;
		$stats{"$op->{fn}: done"}++;
		return undef;
	}
	elsif ($op->{fn} eq 'lookup')
	{
		return "unexpected error $err" if $err ne '';
		return 'idem_lookup returned nothing' unless $r;
		my $got = $r->[0] eq 'NULL' ? undef : parse_row(join($US, @$r));
		my $expired = $row ? expired_in($row, $t0, $t1) : 0;
		$expired = $got ? 0 : 1 if !defined $expired;
		my $want = $expired ? undef : $row;
		return "lookup returned\n  " . row_text($got) . "\nexpected\n  " . row_text($want) if row_text($got) ne row_text($want);
		$stats{ 'lookup: ' . ($want ? 'row' : $row ? 'NULL (expired)' : 'NULL') }++;
		return undef;
	}
	elsif ($op->{fn} eq 'forget')
	{
		return "unexpected error $err" if $err ne '' && $err ne 'IK005';
		if (!$row)
		{
			return "unexpected error $err" if $err ne '';
			return "idem_forget of no key returned " . join(',', @{ $r // [] }) if !$r || $r->[0] ne 'false';
			$stats{'forget: no key'}++;
			return undef;
		}
		my $live;
		if ($row->{state} ne 'pending' || $op->{force}) { $live = 0 }
		elsif ($row->{locked} > $t1) { $live = 1 }
		elsif ($row->{locked} <= $t0) { $live = 0 }
		else { $live = $err eq 'IK005' ? 1 : 0 }
		return $want_err->('IK005') if $live;
		return "unexpected error $err" if $err ne '';
		return "idem_forget returned " . join(',', @{ $r // [] }) if !$r || $r->[0] ne 'true';
		delete $v->{$id};
		$own->{$id} = 1 if $own;
		$stats{ 'forget: ' . ($op->{force} && $row->{state} eq 'pending' && $row->{locked} > $t0 ? 'forced' : 'deleted') }++;
		return undef;
	}
	elsif ($op->{fn} eq 'reap')
	{
		return $want_err->('22023') if $op->{bad};
		return "unexpected error $err" if $err ne '';
		return 'idem_reap returned nothing' unless $r;
		my $n = $r->[0];
		my $max = $op->{max} // 1000;
		my $eligible = sub {
			my ($row, $now) = @_;
			return $row->{expires} <= $now && !($row->{state} eq 'pending' && $row->{locked} > $now);
		};
		my @gone = grep { !$res->{rows}{$_} } sort keys %$v;
		my @sure = grep { $eligible->($v->{$_}, $t0) } keys %$v;    # eligible whatever the clock
		my %maybe = map { $_ => 1 } grep { $eligible->($v->{$_}, $t1) } keys %$v;
		my %gone = map { $_ => 1 } @gone;
		return "idem_reap returned $n, but " . scalar(@gone) . " rows went" if $n != @gone;
		return "idem_reap($max) deleted $n rows" if $n > $max;
		for my $g (@gone) { return "idem_reap deleted a row that was not expired: " . row_text($v->{$g}) unless $maybe{$g} }
		if ($n < $max)
		{
			for my $s (@sure) { return "idem_reap left an expired row: " . row_text($v->{$s}) unless $gone{$s} }
		}
		# (no order is promised among the expired rows: any max_rows of them may go)
		delete $v->{$_} for @gone;
		$stats{'reap: rows deleted'} += $n;
		$stats{'reap: calls'}++;
		return undef;
	}
	die "unknown op $op->{fn}";
}

# ---------------------------------------------------------------------------------------------
# Random calls
# ---------------------------------------------------------------------------------------------
sub pick { return $_[ int(rand(@_)) ]; }

# A ttl or lease argument: (sql, µs, invalid).  Mostly short, so that leases run out and keys
# expire during the run; long ones are rare, since a key that got one stays until the end.
sub interval_choice
{
	my ($kind, $si) = @_;
	my $default = $sessions[$si]{$kind};
	my $x = rand();
	my $null = $default > 60_000_000 ? ($kind eq 'ttl' ? 0.01 : 0.10) : 0.30;    # session 0: server defaults
	return ('NULL', $default, 0) if $x < $null;
	$x = rand();
	return ("'1 hour'", 3_600_000_000, 0) if $x < ($kind eq 'ttl' ? 0.003 : 0.08);
	return ("'1 millisecond'", 1000, 0) if $x < 0.15;
	if ($x < 0.90)
	{
		my $us = $kind eq 'lease' ? 5000 + int(rand(295_000)) : 5000 + int(rand(395_000));
		return ("'$us microseconds'", $us, 0);
	}
	if ($x < 0.98)
	{
		my $us = 500_000 + int(rand(1_500_000));
		return ("'$us microseconds'", $us, 0);
	}
	return (pick("'0 seconds'", "'-5 seconds'", "'101 years'"), undef, 1);
}

# A wait argument: (sql, µs, invalid); sql undef for none.  Short, so that a call waiting on a
# lease nobody finishes costs little.
sub wait_choice
{
	my $x = rand();
	return (undef, undef, 0) if $x < 0.75;
	return ('NULL', undef, 0) if $x < 0.78;
	return ("'0'", 0, 0) if $x < 0.83;
	return (pick("'-1 millisecond'", "'61 minutes'"), undef, 1) if $x < 0.84;
	my $us = 1000 + int(rand(39_000));
	return ("'$us microseconds'", $us, 0);
}

# A claim, complete, fail, extend, release, forget, lookup or reap from session $si on a view $v.
# Options: avoid / prefer (sets of ids), no_reap; fn, id (this call on this key), valid (no
# invalid argument), identity (a claim with the key's usual request), wait ([sql, µs]: a claim's).
sub random_call
{
	my ($si, $v, %opt) = @_;
	my $x = rand();
	my $fn = $x < 0.36 ? 'claim' : $x < 0.50 ? 'complete' : $x < 0.60 ? 'fail' : $x < 0.67 ? 'extend'
	  : $x < 0.72 ? 'release' : $x < 0.76 ? 'forget' : $x < 0.86 ? 'lookup' : 'reap';
	$fn = 'lookup' if $fn eq 'reap' && $opt{no_reap};
	$fn = $opt{fn} if $opt{fn};
	my %op = (fn => $fn);
	if ($fn eq 'reap')
	{
		my $y = rand();
		if ($y < 0.05) { $op{max} = 0; $op{bad} = 1; $op{may_fail} = 1; $op{sql} = 'SELECT idem_reap(0)' }
		elsif ($y < 0.45) { $op{sql} = pick('SELECT idem_reap()', 'SELECT idem_reap(NULL)') }
		else { $op{max} = 1 + int(rand(4)); $op{sql} = "SELECT idem_reap($op{max})" }
		$op{sql} = "SELECT 'R' || chr(31) || n FROM ($op{sql}) r(n)";
		return \%op;
	}
	my @choices = grep { !$opt{avoid}{$_} } @ids;
	my @preferred = grep { !$opt{avoid}{$_} } keys %{ $opt{prefer} // {} };
	my $id = $op{id} = $opt{id} // (@preferred && rand() < 0.4 ? pick(sort @preferred) : pick(@choices));
	my ($scope, $key) = split /\0/, $id, -1;
	my $row = $v->{$id};
	my $args_key = lit($key);
	my $args_scope = $scope eq '' && rand() < 0.5 ? '' : ', scope => ' . lit($scope);
	if ($fn eq 'claim')
	{
		my $ident = $identity{$id};
		my $y = $opt{identity} ? 0 : rand();
		if ($y < 0.88)
		{
			if (defined $ident->{req}) { $op{req} = pick(@{ $requests[ $ident->{req} ] }) }
			else { $op{fp} = $ident->{fp} }
		}
		elsif ($y < 0.94) { $op{req} = pick(map { @$_ } @requests) }
		elsif ($y < 0.97) { $op{fp} = pick(@fingerprints) }
		# else: neither
		my ($ttl_sql, $ttl, $ttl_bad) = interval_choice('ttl', $si);
		my ($lease_sql, $lease, $lease_bad) = interval_choice('lease', $si);
		@op{qw(ttl lease)} = ($ttl, $lease);
		my ($wait_sql, $wait, $wait_bad) = $opt{wait} ? @{ $opt{wait} } : wait_choice();
		$op{wait} = $wait;
		my $fp_sql = defined $op{fp} ? "'\\x$op{fp}'::bytea" : 'NULL';
		if (rand() < 0.02)    # an invalid fingerprint
		{
			$fp_sql = pick(q{'\x'::bytea}, "'\\x" . ('ab' x 65) . "'::bytea");
			$op{bad} = 1;
		}
		$op{bad} = 1 if $ttl_bad || $lease_bad || $wait_bad;
		$op{may_fail} = 1;    # IK001, 22023
		my @args = ($args_key);
		push @args, 'request => ' . (defined $op{req} ? lit($op{req}) : 'NULL') if defined $op{req} || rand() < 0.3;
		push @args, "ttl => $ttl_sql" if $ttl_sql ne 'NULL' || rand() < 0.3;
		push @args, "lease => $lease_sql" if $lease_sql ne 'NULL' || rand() < 0.3;
		push @args, "fingerprint => $fp_sql" if $fp_sql ne 'NULL' || rand() < 0.3;
		push @args, "wait => $wait_sql" if defined $wait_sql;
		my $args = join(', ', @args) . $args_scope;
		$op{sql} = "SELECT concat_ws(chr(31), 'R', outcome, inserted::text, coalesce(attempt::text, '\\N'), "
		  . "coalesce(state::text, '\\N'), coalesce(response::text, '\\N'), "
		  . "coalesce(response_code::text, '\\N'), coalesce(usi(retry_after)::text, '\\N'), "
		  . "coalesce(us(expires_at)::text, '\\N'), "
		  . "coalesce(retry_after_s::text, '\\N'), coalesce(encode(response_body, 'hex'), '\\N'), "
		  . "coalesce(response_headers::text, '\\N')) "
		  . "FROM idem_claim($args)";
		return \%op;
	}
	if ($fn eq 'lookup')
	{
		$op{sql} = "SELECT 'R' || chr(31) || CASE WHEN r.key IS NULL THEN 'NULL' ELSE fmt(r) END FROM idem_lookup($args_key$args_scope) r";
		return \%op;
	}
	if ($fn eq 'forget')
	{
		$op{may_fail} = 1;    # IK005
		$op{force} = rand() < 0.3 ? 1 : 0;
		my $force = $op{force} ? ', force => true' : rand() < 0.3 ? ', force => false' : '';
		$op{sql} = "SELECT 'R' || chr(31) || r::text FROM idem_forget($args_key$args_scope$force) r";
		return \%op;
	}
	# complete / fail / extend / release
	$op{may_fail} = 1;    # IK002, IK003, IK004
	my $y = rand();
	my $cur = $row ? $row->{attempt} : 1 + int(rand(2));
	$op{attempt} = $y < 0.25 ? undef : $y < 0.70 ? $cur : $y < 0.85 ? $cur - 1 : $y < 0.95 ? $cur + 1 : 0;
	# the owner's heartbeat and release always name their attempt
	$op{attempt} //= $cur if $fn eq 'extend' || $fn eq 'release';
	my @args = ($args_key);
	if ($fn eq 'extend' || $fn eq 'release')
	{
		push @args, "attempt => $op{attempt}";
		if ($fn eq 'extend')
		{
			my ($lease_sql, $lease, $lease_bad) = interval_choice('lease', $si);
			($lease_sql, $lease) = ("'$sessions[$si]{lease} microseconds'", $sessions[$si]{lease}) if $lease_sql eq 'NULL';
			$op{lease} = $lease;
			$op{bad} = 1 if $lease_bad;
			push @args, "lease => $lease_sql";
		}
		$op{sql} = "SELECT 'R' || chr(31) || fmt(r) FROM idem_$fn(" . join(', ', @args) . "$args_scope) r";
		return \%op;
	}
	if ($fn eq 'complete')
	{
		$op{response} = rand() < 0.1 ? undef : pick(@responses);
		push @args, defined $op{response} ? lit($op{response}) : 'NULL';
		if (rand() < 0.6) { $op{code} = pick(200, 201, 202, 204, 409); push @args, "response_code => $op{code}" }
	}
	else
	{
		if (rand() < 0.7) { $op{response} = pick(@responses); push @args, 'response => ' . lit($op{response}) }
		if (rand() < 0.6) { $op{code} = pick(402, 500, 502, 503); push @args, "response_code => $op{code}" }
		my $z = rand();
		if ($z < 0.4) { $op{retryable} = 1; push @args, 'retryable => true' }
		elsif ($z < 0.8) { $op{retryable} = 0; push @args, 'retryable => false' }
	}
	push @args, "attempt => $op{attempt}" if defined $op{attempt};
	# 1.2: the result's own ttl, a byte-exact body, headers
	if (rand() < 0.3)
	{
		my ($ttl_sql, $ttl, $ttl_bad) = interval_choice('ttl', $si);
		if ($ttl_sql ne 'NULL') { $op{ttl} = $ttl; $op{bad} = 1 if $ttl_bad; push @args, "ttl => $ttl_sql" }
	}
	if (rand() < 0.3) { $op{body} = pick(@bodies); push @args, "body => '\\x$op{body}'::bytea" }
	if (rand() < 0.3)
	{
		if (rand() < 0.1) { $op{bad} = 1; push @args, "headers => '[]'" }
		else { $op{headers} = pick(@headers); push @args, 'headers => ' . lit($op{headers}) }
	}
	$op{sql} = "SELECT 'R' || chr(31) || fmt(r) FROM idem_$fn(" . join(', ', @args) . "$args_scope) r";
	return \%op;
}

# ---------------------------------------------------------------------------------------------
# Running and checking
# ---------------------------------------------------------------------------------------------
my $CLOCK = "SELECT 'T' || chr(31) || us(clock_timestamp());";
my $last_clock = 0;      # the latest database clock reading seen
my $DUMP = "SELECT 'D' || chr(31) || fmt(k) FROM idem_keys k;";

# parses the output of a batch: T lines (t0, t1), the R line, D lines, the error
sub parse_output
{
	my ($out, $err) = @_;
	my %res = (rows => {}, err => '');
	my @t;
	for my $line (split /\n/, $out)
	{
		my ($tag, $rest) = split /$US/, $line, 2;
		if ($tag eq 'T') { push @t, $rest }
		elsif ($tag eq 'R') { $res{r} = [ split /$US/, $rest, -1 ] }
		elsif ($tag eq 'D') { my $row = parse_row($rest); $res{rows}{"$row->{scope}\0$row->{key}"} = $row }
		else { $res{junk} .= "$line\n" }
	}
	@res{qw(t0 t1)} = @t;
	$last_clock = $_ for grep { $_ > $last_clock } @t;
	if ($err =~ /ERROR:\s+(\S{5})/) { $res{err} = $1 }
	elsif ($err ne '') { $res{junk} .= $err }
	return \%res;
}

sub compare_views
{
	my ($v, $rows) = @_;
	for my $id (sort(keys %$v), sort(keys %$rows))
	{
		my ($m, $d) = (row_text($v->{$id}), row_text($rows->{$id}));
		return "row " . ($id =~ s/\0/\//r) . ":\n  model:    $m\n  database: $d" if $m ne $d;
	}
	return undef;
}

sub fail_with
{
	my ($what, $si, $op, $out, $err, $v) = @_;
	return if $failure;
	$failure = "operation $opno (session $si" . ($tx && $tx->{sess} == $si ? ', in a transaction' : '') . "): $what\n"
	  . "  call: " . ($op ? $op->{sql} : '-') . "\n"
	  . "  output: $out\n  stderr: $err\n"
	  . "  model view:\n" . join('', map { '    ' . row_text($v->{$_}) . "\n" } sort keys %$v);
	return;
}

# an autocommit call (or, with $in_tx, one in the open transaction, under a savepoint)
sub do_call
{
	my ($si, $op) = @_;
	my $s = $sessions[$si]{s};
	my $in_tx = $tx && $tx->{sess} == $si;
	my ($out, $err);
	if ($in_tx)
	{
		# the call and the rows right after it; then release, or roll back to, the savepoint
		my ($o1, $e1) = $s->run("$CLOCK SAVEPOINT sp; $op->{sql}; $DUMP");
		my $errored = $e1 =~ /ERROR:/;
		my $undo = !$errored && !$async && rand() < 0.1;
		my ($o2, $e2) = $s->run(($errored || $undo ? 'ROLLBACK TO SAVEPOINT sp;' : 'RELEASE SAVEPOINT sp;') . " $CLOCK $DUMP");
		($out, $err) = ($o1 . $o2, $e1 . $e2);
		my $res = parse_output($o1, $e1);
		my $after = parse_output($o2, $e2);
		$res->{t1} = $after->{t0};
		$res->{junk} = ($res->{junk} // '') . ($after->{junk} // '') || undef;
		my $before = { view => copy_rows($tx->{view}), own => { %{ $tx->{own} } }, written => { %{ $tx->{written} } } };
		my $v = $tx->{view};
		my %w0 = %$v;
		$opno++;
		my $e = $res->{junk} ? "unexpected output: $res->{junk}" : check_call($op, $v, $tx->{own}, $res);
		return fail_with($e, $si, $op, $out, $err, $before->{view}) if $e;
		# the keys this call wrote
		for my $id (keys %{ { %w0, %$v } })
		{
			$tx->{written}{$id} = 1 if !exists $v->{$id} || !exists $w0{$id} || row_text($v->{$id}) ne row_text($before->{view}{$id});
		}
		if ($undo)
		{
			@$tx{qw(view own written)} = @$before{qw(view own written)};
			$stats{'transaction: successful call rolled back to its savepoint'}++;
		}
		$e = compare_views($tx->{view}, $after->{rows});
		return fail_with("after the call, idem_keys differs from the model: $e", $si, $op, $out, $err, $before->{view}) if $e;
		return;
	}
	($out, $err) = $s->run("$CLOCK $op->{sql}; $CLOCK $DUMP");
	my $res = parse_output($out, $err);
	my $before = copy_rows(\%committed);
	$opno++;
	my $e = $res->{junk} ? "unexpected output: $res->{junk}" : check_call($op, \%committed, undef, $res);
	return fail_with($e, $si, $op, $out, $err, $before) if $e;
	propagate($before);
	$e = compare_views(\%committed, $res->{rows});
	return fail_with("after the call, idem_keys differs from the model: $e", $si, $op, $out, $err, $before) if $e;
	return;
}

# a committed change by another session shows in the open transaction's view (READ COMMITTED),
# for the keys the transaction has not written
sub propagate
{
	my ($before) = @_;
	return unless $tx;
	for my $id (keys %{ { %$before, %committed } })
	{
		next if $tx->{written}{$id};
		if (exists $committed{$id}) { $tx->{view}{$id} = { %{ $committed{$id} } } }
		else { delete $tx->{view}{$id} }
	}
	return;
}

sub end_tx
{
	my $s = $sessions[ $tx->{sess} ]{s};
	my $si = $tx->{sess};
	if ($async && $sessions[ $async->{sess} ]{s}->ready)
	{
		fail_with('a call on a key written by an open transaction returned before the transaction ended: it did not wait',
			$async->{sess}, $async->{op}, $sessions[ $async->{sess} ]{s}{out}, $sessions[ $async->{sess} ]{s}{err}, \%committed);
	}
	my $commit = rand() < 0.7;
	my ($out, $err) = $s->run($commit ? 'COMMIT;' : 'ROLLBACK;');
	fail_with("COMMIT/ROLLBACK failed", $si, undef, $out, $err, $tx->{view}) if $err ne '';
	if ($commit)
	{
		for my $id (keys %{ $tx->{written} })
		{
			if (exists $tx->{view}{$id}) { $committed{$id} = $tx->{view}{$id} }
			else { delete $committed{$id} }
		}
		$stats{'transaction: committed'}++;
	}
	else { $stats{'transaction: rolled back'}++ }
	$tx = undef;
	if ($async)
	{
		my $a = $async;
		$async = undef;
		my $as = $sessions[ $a->{sess} ]{s};
		my ($o, $e) = $as->wait;
		my $res = parse_output($o, $e);
		my $before = copy_rows(\%committed);
		$opno++;
		my $msg = $res->{junk} ? "unexpected output: $res->{junk}" : check_call($a->{op}, \%committed, undef, $res);
		return fail_with("(a call that waited for the transaction) $msg", $a->{sess}, $a->{op}, $o, $e, $before) if $msg;
		$msg = compare_views(\%committed, $res->{rows});
		return fail_with("after a call that waited, idem_keys differs from the model: $msg", $a->{sess}, $a->{op}, $o, $e, $before)
		  if $msg;
		$stats{'call that waited for a transaction: ' . ($commit ? 'after COMMIT' : 'after ROLLBACK')}++;
	}
	return;
}

# With no transaction open: a claim with a wait of a minute on a key held by a committed lease that
# lasts well beyond the scenario, sent in the background; a few calls of the other sessions on
# other keys (the claim must still be waiting); then one of them finishes, releases or forgets
# the key, and the woken claim must answer from what that left.  False when no key qualifies.
sub lease_waiter
{
	my @held = grep {
		my $r = $committed{$_};
		$r->{state} eq 'pending' && $r->{locked} > $last_clock + 30_000_000
	} sort keys %committed;
	return 0 unless @held;
	my $id = pick(@held);
	my $row = $committed{$id};
	my $bi = int(rand(@sessions));
	my $op;
	for (1 .. 50)
	{
		$op = random_call($bi, \%committed, fn => 'claim', id => $id, identity => 1,
			wait => [ "'1 minute'", 60_000_000, 0 ]);
		last if !$op->{bad} && fingerprint_of($id, $op) eq $row->{fp};
		$op = undef;
	}
	return 0 unless $op;
	my $b = $sessions[$bi]{s};
	$b->send("$CLOCK $op->{sql}; $CLOCK $DUMP");
	$stats{'claim sent to wait on a live lease'}++;
	my @others = grep { $_ != $bi } 0 .. $#sessions;
	for (1 .. int(rand(4)))
	{
		my $si = pick(@others);
		do_call($si, random_call($si, \%committed, avoid => { $id => 1 }, no_reap => 1));
		return 1 if $failure;
	}
	if ($b->ready)
	{
		fail_with('a claim waiting on a live lease returned before anyone finished the key', $bi, $op, $b->{out},
			$b->{err}, \%committed);
		return 1;
	}
	my $ri = pick(@others);
	my $resolve;
	for (1 .. 1000)
	{
		$resolve = random_call($ri, \%committed, fn => pick('complete', 'fail', 'release', 'forget'), id => $id);
		last if !$resolve->{bad} && (!defined $resolve->{attempt} || $resolve->{attempt} == $row->{attempt})
		  && ($resolve->{fn} ne 'forget' || $resolve->{force});
		$resolve = undef;
	}
	die 'no call to finish the key' unless $resolve;
	# no dump of idem_keys after it: the woken claim may already have written
	my ($ro, $re) = $sessions[$ri]{s}->run("$CLOCK $resolve->{sql}; $CLOCK");
	my $resolved = parse_output($ro, $re);
	my $before = copy_rows(\%committed);
	$opno++;
	my $msg = $resolved->{junk} ? "unexpected output: $resolved->{junk}" : check_call($resolve, \%committed, undef, $resolved);
	return fail_with($msg, $ri, $resolve, $ro, $re, $before) || 1 if $msg;
	# the claim decides after that call began: its clock lies after that call's t0
	my ($o, $e) = $b->wait;
	my $res = parse_output($o, $e);
	$res->{t0} = $resolved->{t0} if defined $res->{t0} && $resolved->{t0} > $res->{t0};
	$before = copy_rows(\%committed);
	$opno++;
	$msg = $res->{junk} ? "unexpected output: $res->{junk}" : check_call($op, \%committed, undef, $res);
	return fail_with("(a claim woken by idem_$resolve->{fn} of its key) $msg", $bi, $op, $o, $e, $before) || 1 if $msg;
	$msg = compare_views(\%committed, $res->{rows});
	return fail_with("after a woken claim, idem_keys differs from the model: $msg", $bi, $op, $o, $e, $before) || 1
	  if $msg;
	$stats{"claim: a waiter woken by idem_$resolve->{fn}"}++;
	$stats{'claim: a waiter woken by another session'}++;
	return 1;
}

my $started = time;
while ($opno < $nops && !$failure)
{
	if (!$tx)
	{
		next if rand() < 0.01 && lease_waiter();
		my $si = int(rand(@sessions));
		if (rand() < 0.06)
		{
			my ($out, $err) = $sessions[$si]{s}->run('BEGIN;');
			die "BEGIN failed: $err" if $err ne '';
			$tx = { sess => $si, view => copy_rows(\%committed), written => {}, own => {}, left => 2 + int(rand(7)) };
			next;
		}
		do_call($si, random_call($si, \%committed));
		next;
	}
	# a transaction is open
	if ($tx->{left} <= 0)
	{
		end_tx();
		next;
	}
	if (rand() < 0.55)
	{
		# the transaction's session; not the key a waiting call waits on, no reap while one waits
		my %avoid = $async ? ($async->{op}{id} => 1) : ();
		do_call($tx->{sess},
			random_call($tx->{sess}, $tx->{view}, avoid => \%avoid, no_reap => !!$async, prefer => $tx->{written}));
		$tx->{left}--;
		next;
	}
	# another session: never a reap (it would skip the rows the transaction holds)
	my @others = grep { $_ != $tx->{sess} && !($async && $async->{sess} == $_) } 0 .. $#sessions;
	my $si = pick(@others);
	my %avoid = $async ? ($async->{op}{id} => 1) : ();
	my $op = random_call($si, \%committed, avoid => \%avoid, no_reap => 1, prefer => $async ? {} : $tx->{written});
	# (an invalid argument is an error before anything is read: no wait)
	if ($op->{fn} ne 'lookup' && !$op->{bad} && $tx->{written}{ $op->{id} })
	{
		if ($op->{fn} eq 'claim' && defined $op->{wait})
		{
			# a bounded wait: it runs out while the transaction stays open
			$op->{held} = 1;
			do_call($si, $op);
			next;
		}
		next if $async;    # at most one waiting call
		# must wait for the transaction: send it and check it when the transaction has ended
		$sessions[$si]{s}->send("$CLOCK $op->{sql}; $CLOCK $DUMP");
		$async = { sess => $si, op => $op };
		$stats{'call sent to wait for a transaction'}++;
		next;
	}
	do_call($si, $op);
}
end_tx() if $tx && !$failure;
my $elapsed = time - $started;

note sprintf('%d operations in %.1f s', $opno, $elapsed);
note "  $_: $stats{$_}" for sort keys %stats;
diag $failure if $failure;
ok(!$failure, "model and database agree on all $opno operations (seed $seed)");
# a step can finish two operations (a call that waited ends with the transaction), so the
# count may pass $nops by one
cmp_ok($opno, '>=', $nops, "all $nops operations ran");

# the run exercised what it is meant to (each of these happens hundreds of times per 10k)
if ($nops >= 10000 && !$failure)
{
	for my $what ('claim: inserted', 'claim: replay', 'claim: in_progress', 'claim: re-entrant',
		'claim: takeover of a lapsed lease', 'claim: takeover of a retryable failure',
		'claim: an expired key, claimed anew', 'claim: wait ran out on a live lease',
		'claim: waited for the lease to end, took over', 'claim: wait ran out on an uncommitted write',
		'claim: a waiter woken by another session', 'complete: done', 'fail: done', 'extend: done',
		'release: done', 'forget: deleted', 'forget: no key', 'lookup: row', 'lookup: NULL',
		'lookup: NULL (expired)', 'reap: rows deleted',
		'error IK001', 'error IK002', 'error IK003', 'error IK004', 'error IK005', 'error 22023',
		'transaction: committed', 'transaction: rolled back', 'call that waited for a transaction: after COMMIT')
	{
		cmp_ok($stats{$what} // 0, '>', 0, "covered: $what (" . ($stats{$what} // 0) . ')');
	}
}

if ($failure) { $_->{s}{h}->kill_kill for @sessions }    # one may be waiting for another
else { $_->{s}->quit for @sessions }
$node->stop;
done_testing();
