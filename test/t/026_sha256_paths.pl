# SHA-256 of the request fingerprint (src/common/sha256.cpp: OpenSSL's EVP behind a 128-byte
# buffer), checked against Perl's Digest::SHA.
#
# test/unit/sha256_paths.cpp, built with the library's source: every message length from 0 to
# 300 bytes, 1,000 and 65,539, each fed whole, in pieces at the block edges (55, 56, 63, 64, 65)
# and the buffer's (127, 128, 129), in uneven pieces and in short-then-long ones, and after a hash
# abandoned half-way; then, in a fresh process each, every allocation OpenSSL makes for the first
# hash fails in turn: the hash fails cleanly (named call, no crash, no wrong digest) or succeeds.
#
# Then the extension in a server: fingerprints of requests whose canonical text reaches the hash in
# pieces crossing the buffer at many offsets (quotes, escapes, keys, multi-byte text); the
# library links the server's libcrypto and defines no symbol outside its own names; and a server
# whose OpenSSL offers no SHA-256 answers a claim with XX000 and writes nothing.
# sql/fingerprint.sql checks fingerprints against PostgreSQL's sha256().
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Digest::SHA qw(sha256_hex);
use FindBin;
use IPC::Run;

my $root = "$FindBin::RealBin/../..";
my $program = PostgreSQL::Test::Utils::tempdir() . '/sha256_paths';
my ($out, $err) = ('', '');
my $built = IPC::Run::run(
	[ $ENV{CXX} // 'g++', qw(-std=c++17 -O2 -Wall -Wextra -Werror), "-I$root/src",
	  "$root/test/unit/sha256_paths.cpp", "$root/src/common/sha256.cpp", '-lcrypto', '-o', $program ],
	'>', \$out, '2>', \$err);
ok($built, 'the test program builds') or diag($err);
ok(IPC::Run::run([$program], '>', \$out, '2>', \$err), 'the test program runs') or diag($err);

sub message
{
	my ($n) = @_;
	return join '', map { chr(($_ * 131 + $n) % 256) } 0 .. $n - 1;
}

my (%checked, %wrong, @alloc, $allocations, @other);
for my $line (split /\n/, $out)
{
	my @f = split / /, $line;
	if ($f[0] eq 'digest')
	{
		my (undef, $way, $n, $digest) = @f;
		$checked{$way}++;
		my $expected = sha256_hex(message($n));
		if ($digest ne $expected)
		{
			$wrong{$way}++;
			diag("$way, $n bytes: $digest, expected $expected");
		}
	}
	elsif ($f[0] eq 'alloc') { push @alloc, [ @f[ 1 .. $#f ] ]; }
	elsif ($f[0] eq 'allocations') { $allocations = $f[1]; }
	else { push @other, $line; }
}
is_deeply(\@other, [], 'the program prints nothing else');

my @ways = qw(whole 1 55 56 63 64 65 127 128 129 uneven short-long short-blocks after-abandoned);
is_deeply([ sort keys %checked ], [ sort @ways ], 'every way of feeding a message ran');
for my $way (@ways)
{
	is($checked{$way} // 0, 303, "$way: 303 lengths hashed");
	is($wrong{$way} // 0, 0, "$way: every digest agrees with Digest::SHA");
}

# Allocation failures. A hash either succeeds with the right digest or fails in one of the
# OpenSSL calls, named, with a kind; after a failure the next hash is right or fails the same
# clean way (OpenSSL 3.0 stays unable to fetch the digest when its method construction was cut
# short: the backend then raises an error at each fingerprint).
my %ours = map { $_ => 1 }
  qw(EVP_MD_fetch EVP_MD_CTX_new EVP_DigestInit_ex2 EVP_DigestUpdate EVP_DigestFinal_ex);
ok(defined $allocations && $allocations > 0, 'the first hash of a process allocates')
  or diag('allocations: ' . ($allocations // 'none'));
is(scalar @alloc, $allocations // 0, 'each allocation failed in turn in a process of its own');
my $right_200 = sha256_hex(message(200));
my ($clean, $failures, %failed_in) = (0, 0);
for my $a (@alloc)
{
	my ($k, $failed, $kind, $call, $then, $then_kind, $then_call, $n, $digest) = @$a;
	my $ok;
	if (!defined $failed || $failed eq 'crashed')
	{
		$ok = 0;
	}
	elsif ($failed == 0)
	{
		$ok = $kind eq 'none' && $then == 1 && $digest eq $right_200;
	}
	else
	{
		$failures++;
		$failed_in{"$call $kind"}++;
		$ok = $kind ne 'none' && $ours{$call}
		  && ($then == 1 ? $digest eq $right_200 : $then_kind ne 'none' && $ours{$then_call});
	}
	$clean++ if $ok;
	diag('allocation ' . join(' ', @$a)) unless $ok;
}
is($clean, scalar @alloc, 'no crash, no wrong digest: every failure is reported with its call');
ok($failures > 0, 'some allocation failures make the hash fail') or diag(explain \%failed_in);
ok($failed_in{'EVP_MD_CTX_new out_of_memory'}, 'the context allocation failing is out of memory')
  or diag(explain \%failed_in);

# The extension in a server.
my $node = PostgreSQL::Test::Cluster->new('sha256');
$node->init;
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# Requests (numbers without trailing fraction zeros: their canonical text is jsonb's text) and
# scopes of many lengths, so that the buffer fills at many offsets and in the middle of pieces.
$node->safe_psql('postgres', q{
	CREATE TABLE corpus (scope text, key text, request jsonb);
	INSERT INTO corpus
	SELECT repeat('s', n % 67), 'string-' || n, to_jsonb(repeat('x', n)) FROM generate_series(0, 300) n
	UNION ALL
	SELECT repeat('t', n % 5), 'array-' || n,
	       jsonb_build_array(repeat('a', n % 29), repeat('b', n * 7 % 131), n, repeat('c', n % 5), NULL)
	FROM generate_series(0, 300) n
	UNION ALL
	SELECT 'POST /payments', 'object-' || n,
	       jsonb_build_object(repeat('k', n % 13), repeat('v', n % 140), 'é' || repeat('ü', n % 50), n % 2 = 0,
	                          'nested', jsonb_build_object('id', n, 'list', jsonb_build_array(n, -n)))
	FROM generate_series(0, 300) n
	UNION ALL
	SELECT 'escapes', 'escapes-' || n, to_jsonb(repeat(E'ab"\\\\\n' || chr(1 + n % 31), n % 40) || repeat('z', n % 9))
	FROM generate_series(0, 300) n;
});
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM corpus, idem_claim(key, request, scope) c WHERE c.outcome = 'claimed'}),
	'1204', 'every request claimed');
my $rows = $node->safe_psql('postgres', q{
	SELECT c.key, encode(convert_to(c.scope, 'UTF8'), 'hex'), encode(convert_to(c.request::text, 'UTF8'), 'hex'),
	       encode(k.fingerprint, 'hex')
	FROM corpus c JOIN idem_keys k USING (scope, key) ORDER BY c.key});
my ($compared, $agree) = (0, 0);
for my $row (split /\n/, $rows)
{
	my ($key, $scope, $request, $fingerprint) = split /\|/, $row;
	my $expected = sha256_hex(pack('H*', $scope) . "\0" . pack('H*', $request));
	$compared++;
	if ($fingerprint eq $expected) { $agree++; }
	else { diag("$key: $fingerprint, expected $expected"); }
}
is($compared, 1204, 'every fingerprint read');
is($agree, 1204, 'every fingerprint is SHA-256 of the scope, 0x00 and the canonical text');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM corpus, idem_claim(key, request, scope) c WHERE c.outcome = 'in_progress'}),
	'1204', 'every request recognised as itself');

# The library uses the libcrypto the server is linked with, and its dynamic symbols are only its
# own: SQL functions, the module's magic and _PG_init, and C++ names in namespace idem.
my $library = $node->config_data('--pkglibdir') . '/idempotency.so';
my $postgres = $node->config_data('--bindir') . '/postgres';
sub libcrypto
{
	my ($object) = @_;
	my $ldd = `ldd '$object'`;
	return $ldd =~ /^\s*libcrypto\.so\.\S+ => (\S+)/m ? $1 : 'none';
}
like(libcrypto($library), qr{/libcrypto\.so\.3$}, 'the library links libcrypto');
is(libcrypto($library), libcrypto($postgres), 'the same libcrypto as the server');
my @defined = map { (split ' ')[-1] } grep { /\s[TDBVWiu]\s/ } split /\n/, `nm -D --defined-only '$library'`;
ok(@defined > 0, 'the library defines dynamic symbols');
my @foreign = grep { !/^(idem_[a-z_]+|pg_finfo_idem_[a-z_]+|Pg_magic_func|_PG_init|_ZZ?N4idem.*)$/ } @defined;
is_deeply(\@foreign, [], 'no symbol outside the library\'s own names');

# A server whose OpenSSL offers no SHA-256 (a configuration asking for FIPS implementations where
# no FIPS provider is installed): a claim with a request gets a clear XX000 naming the failed call,
# writes nothing, and the backend goes on; claims without a request work.
my $conf = PostgreSQL::Test::Utils::tempdir() . '/openssl.cnf';
open my $fh, '>', $conf or die "$conf: $!";
print $fh <<'CONF';
openssl_conf = openssl_init

[openssl_init]
alg_section = evp_properties
random = random_section

[evp_properties]
default_properties = "fips=yes"

[random_section]
properties = "fips=no"
CONF
close $fh;
my $no_sha = PostgreSQL::Test::Cluster->new('no_sha256');
$no_sha->init;
{
	local $ENV{OPENSSL_CONF} = $conf;
	$no_sha->start;
}
$no_sha->safe_psql('postgres', 'CREATE EXTENSION idempotency');
my ($stdout, $stderr) = ('', '');
$no_sha->psql('postgres', q{
	\set VERBOSITY verbose
	SELECT idem_claim('k', '{"amount": 1}');
	SELECT idem_claim('k', '{"amount": 1}');
	SELECT outcome FROM idem_claim('no-request')},
	stdout => \$stdout, stderr => \$stderr, on_error_stop => 0);
my @errors = $stderr =~ /^(?:psql:\S+: )?ERROR:\s+XX000: idempotency: OpenSSL could not compute the request fingerprint$/mg;
is(scalar @errors, 2, 'a claim with a request: XX000, in the same backend each time') or diag($stderr);
like($stderr, qr/^DETAIL:\s+EVP_MD_fetch failed: unsupported\.$/m, 'the detail names the call and the reason');
is($stdout, 'claimed', 'a claim without a request works in that backend');
is($no_sha->safe_psql('postgres', q{SELECT string_agg(key, ',') FROM idem_keys}), 'no-request',
	'nothing written by the failed claims');
$no_sha->stop;

done_testing();
