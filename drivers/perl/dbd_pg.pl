#!/usr/bin/perl
# The SQL API from Perl with DBD::Pg (Debian's libdbd-pg-perl): binding jsonb, bytea and arrays,
# reading results and enums, catching SQLSTATEs and a batch error's failing key.
# It connects with the libpq environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE), prints
# one line per check and exits 1 if any failed.
use strict;
use warnings;
use DBI;
use DBD::Pg qw(:pg_types);

my $failures = 0;

sub check {
    my ($ok, $what, $got) = @_;
    if ($ok) { print "ok: $what\n"; return }
    $failures++;
    print "FAILED: $what; got: ", (defined $got ? $got : 'undef'), "\n";
}

my $dbh = DBI->connect('dbi:Pg:', undef, undef, { RaiseError => 1, PrintError => 0, AutoCommit => 1 });
my $all_bytes = join '', map { chr } 0 .. 255;

# jsonb: a plain placeholder (the server takes it as jsonb); enums come back as strings.
my $r = $dbh->selectrow_hashref('SELECT outcome, state, attempt FROM idem_claim(?, request => ?)',
                                undef, 'order-1', '{"sku": "A-1", "qty": 2}');
check($r->{outcome} eq 'claimed' && $r->{state} eq 'pending' && $r->{attempt} == 1,
      'claim: outcome claimed, state pending, attempt 1 (enums read as text)',
      "$r->{outcome} $r->{state} $r->{attempt}");

# A body bound as a plain string goes as text: it is cut at its first NUL byte, with no error.
for my $sent ("ab\0cd\xff", $all_bytes) {
    my $key = 'plain-' . length $sent;
    $dbh->do('SELECT * FROM idem_claim(?)', undef, $key);
    $dbh->do('SELECT * FROM idem_complete(?, NULL, 200, body => ?)', undef, $key, $sent);
    my ($stored) = $dbh->selectrow_array('SELECT response_body FROM idem_lookup(?)', undef, $key);
    check($stored ne $sent && length($stored) == index($sent, "\0"),
          sprintf('a %d-byte body bound as a plain string is stored cut at its first NUL (%d bytes)',
                  length $sent, length $stored), length $stored);
}

# bytea: bind_param with { pg_type => PG_BYTEA } keeps every byte; results come back decoded.
my $sth = $dbh->prepare('SELECT state FROM idem_complete(?, ?, 201, attempt => ?, body => ?)');
$sth->bind_param(1, 'order-1');
$sth->bind_param(2, '{"order": 42}');
$sth->bind_param(3, $r->{attempt});
$sth->bind_param(4, $all_bytes, { pg_type => PG_BYTEA });
$sth->execute;
my ($state) = $sth->fetchrow_array;
$sth->finish;
check($state eq 'succeeded', 'complete with a jsonb response and a bytea body of all 256 byte values', $state);

$r = $dbh->selectrow_hashref('SELECT outcome, state, response, response_code, response_body
                                FROM idem_claim(?, request => ?)', undef, 'order-1', '{"qty": 2, "sku": "A-1"}');
check($r->{outcome} eq 'replay' && $r->{state} eq 'succeeded' && $r->{response} eq '{"order": 42}'
      && $r->{response_code} == 201,
      'replay: outcome replay, state succeeded, the jsonb response and code 201',
      "$r->{outcome} $r->{state} $r->{response} $r->{response_code}");
check($r->{response_body} eq $all_bytes, 'replay: response_body byte for byte (256 values)',
      length $r->{response_body});

my ($body) = $dbh->selectrow_array('SELECT response_body FROM idem_lookup(?)', undef, 'order-1');
check($body eq $all_bytes, 'idem_lookup: response_body byte for byte', length $body);

# IK001: the same key with another request. $dbh->state is the SQLSTATE.
eval { $dbh->do('SELECT * FROM idem_claim(?, request => ?)', undef, 'order-1', '{"sku": "B-2"}'); 1 }
    and check(0, 'same key, another request: SQLSTATE IK001', 'no error');
check($dbh->state eq 'IK001', 'same key, another request: SQLSTATE IK001', $dbh->state) if $@;

# IK004: the finished key completed again; 22023: a key with a newline.
for my $call (['SELECT * FROM idem_complete(?, NULL)', 'order-1', 'IK004', 'the finished key completed again'],
              ['SELECT * FROM idem_claim(?)', "bad\nkey", '22023', 'a key with a newline']) {
    my ($sql, $key, $want, $what) = @$call;
    my $ok = eval { $dbh->do($sql, undef, $key); 1 };
    check(!$ok && $dbh->state eq $want, "$what: SQLSTATE $want", $ok ? 'no error' : $dbh->state);
}

# Arrays: an array reference binds as an array literal (DBD::Pg quotes and escapes the elements).
# bytea[] elements as hex text ('\x...'): raw bytes in an array would be cut at a NUL too.
my $batch_key = 'b-2 {"x\y"}';    # quotes, braces, a backslash and a space
my $rows = $dbh->selectall_arrayref('SELECT key, outcome FROM idem_claim_batch(?, requests => ?)', undef,
                                    ['b-1', $batch_key], ['{"n": 1}', '{"n": 2}']);
my $got = join ',', map { "$_->[0]=$_->[1]" } @$rows;
check($got eq "b-1=claimed,$batch_key=claimed",
      'batch claim with text[] keys and jsonb[] requests: both claimed, in key order', $got);

my @fingerprints = ("\x00\xff\\\"", substr($all_bytes, 0, 64));
$dbh->do('SELECT * FROM idem_claim_batch(?, fingerprints => ?)', undef,
         ['f-1', 'f-2'], [map { '\x' . unpack('H*', $_) } @fingerprints]);
my @stored = $dbh->selectrow_array("SELECT (idem_lookup('f-1')).fingerprint, (idem_lookup('f-2')).fingerprint");
check($stored[0] eq $fingerprints[0] && $stored[1] eq $fingerprints[1],
      'batch claim with bytea[] fingerprints: stored byte for byte', unpack('H*', $stored[0]));

# A batch error names the failing key in the column-name field: $dbh->pg_error_field('column'),
# read at once (the next statement resets it).
eval {
    $dbh->do('SELECT * FROM idem_claim_batch(?, requests => ?)', undef,
             ['b-3', $batch_key], ['{"n": 3}', '{"n": 4}']);
    1;
} and check(0, 'batch with a reused key: IK001, the column field is the failing key', 'no error');
if ($@) {
    my ($sqlstate, $column) = ($dbh->state, $dbh->pg_error_field('column'));
    check($sqlstate eq 'IK001' && defined $column && $column eq $batch_key,
          'batch with a reused key: IK001, the column field is the failing key', "$sqlstate " . ($column // 'undef'));
}

$dbh->disconnect;
exit($failures ? 1 : 0);
