# SHA-256 of the request fingerprint (src/common/sha256.cpp), checked against Perl's Digest::SHA
# for every message length from 0 to 300 bytes (every padding and block edge), 1,000 and 65,539
# bytes: each compression function this CPU runs (the portable one, and the SHA extensions' one
# where the CPU has them, which is then also the one the extension uses) and the buffered
# sha256_update/sha256_final fed in uneven pieces. sql/fingerprint.sql checks the fingerprints
# the extension stores against PostgreSQL's sha256().
use strict;
use warnings;

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
	  "$root/test/unit/sha256_paths.cpp", "$root/src/common/sha256.cpp", '-o', $program ],
	'>', \$out, '2>', \$err);
ok($built, 'the test program builds') or diag($err);
ok(IPC::Run::run([$program], '>', \$out, '2>', \$err), 'the test program runs') or diag($err);

my (%checked, %wrong);
for my $line (split /\n/, $out)
{
	my ($path, $n, $digest) = split / /, $line;
	my $message = join '', map { chr(($_ * 131 + $n) % 256) } 0 .. $n - 1;
	$checked{$path}++;
	if (sha256_hex($message) ne $digest)
	{
		$wrong{$path}++;
		diag("$path, $n bytes: $digest, expected " . sha256_hex($message));
	}
}
for my $path (qw(portable api))
{
	is($checked{$path} // 0, 303, "$path: 303 lengths hashed");
	is($wrong{$path} // 0, 0, "$path: every digest agrees with Digest::SHA");
}

# The SHA extensions are used exactly where the CPU reports them.
my $cpu_has_sha = 0;
if (open my $cpuinfo, '<', '/proc/cpuinfo')
{
	$cpu_has_sha = grep { /^flags\s*:.*\bsha_ni\b/ } <$cpuinfo>;
	close $cpuinfo;
}
SKIP:
{
	skip 'this CPU has no SHA extensions: only the portable code runs here', 2 unless $cpu_has_sha;
	is($checked{hardware} // 0, 303, 'SHA extensions: 303 lengths hashed');
	is($wrong{hardware} // 0, 0, 'SHA extensions: every digest agrees with Digest::SHA');
}
is(exists $checked{hardware} ? 1 : 0, $cpu_has_sha ? 1 : 0,
	'the SHA extensions are chosen exactly where /proc/cpuinfo lists sha_ni');

done_testing();
