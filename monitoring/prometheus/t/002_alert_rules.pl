# alerts.yml under promtool (Debian package prometheus): `promtool check rules`, then each rule's
# unit tests in t/alerts/<alert>.yml with `promtool test rules`. Each rule's file must cover one
# server (fires; does not fire) and several servers exporting the same database (fires for some,
# not for the others). Last, the rule of the scale-out bug as it was (matching on datname and
# scope alone) must fail its several-server test: the tests catch what they were written for.
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Spec;
use File::Temp qw(tempdir);
use IPC::Run qw(run);
use Test::More;
use YAML::XS qw(LoadFile);

my $part = File::Spec->rel2abs(dirname(__FILE__) . '/..');
my $rules = "$part/alerts.yml";
my $tests_dir = "$part/t/alerts";

sub promtool
{
	my @args = @_;
	my $out;
	my $ok = run([ 'promtool', @args ], '>&', \$out);
	return ($ok, $out // '');
}

my ($ok, $out) = promtool('check', 'rules', $rules);
ok($ok, 'promtool check rules alerts.yml') or diag($out);

my @alerts = map { $_->{alert} } map { @{ $_->{rules} } } @{ LoadFile($rules)->{groups} };
cmp_ok(scalar @alerts, '>=', 10, 'alerts.yml has its rules');

# The servers a test's input series come from: distinct (job, instance, server) label sets.
sub servers_of
{
	my ($test) = @_;
	my %servers;
	for my $s (@{ $test->{input_series} })
	{
		my %l = $s->{series} =~ /(\w+)="([^"]*)"/g;
		$servers{ join('|', map { $l{$_} // '' } qw(job instance server)) } = 1;
	}
	return scalar keys %servers;
}

for my $alert (@alerts)
{
	my $file = "$tests_dir/$alert.yml";
	ok(-f $file, "$alert: unit tests in t/alerts/$alert.yml") or next;
	my $doc = LoadFile($file);
	is_deeply($doc->{rule_files}, ['../../alerts.yml'], "$alert: the tests load alerts.yml");

	my (%covers, @foreign);
	for my $test (@{ $doc->{tests} })
	{
		my $servers = servers_of($test);
		for my $case (@{ $test->{alert_rule_test} })
		{
			push @foreign, $case->{alertname} if $case->{alertname} ne $alert;
			my $fired = scalar @{ $case->{exp_alerts} // [] };
			if ($servers == 1)
			{
				$covers{one_fires} = 1 if $fired;
				$covers{one_silent} = 1 unless $fired;
			}
			elsif ($servers > 1 && $fired >= 1 && $fired < $servers)
			{
				$covers{several_some} = 1;
			}
		}
	}
	is("@foreign", '', "$alert: its file tests no other rule");
	ok($covers{one_fires}, "$alert: tested firing with one server");
	ok($covers{one_silent}, "$alert: tested not firing with one server");
	ok($covers{several_some}, "$alert: tested with several servers, firing for some and not the others");

	($ok, $out) = promtool('test', 'rules', $file);
	ok($ok, "$alert: promtool test rules passes") or diag($out);
}

# the scale-out bug: IdempotencyScopeStuckKey matching on (datname, scope) alone
my $dir = tempdir(CLEANUP => 1);
mkdir "$dir/t";
mkdir "$dir/t/alerts";
my $text = do { local (@ARGV, $/) = $rules; <> };
my $n = $text =~ s/\n(\s*)unless\n(\s*)\(20 \* idempotency_scope_work_p99_seconds >= /\n$1unless on (datname, scope)\n$2(20 * idempotency_scope_work_p99_seconds >= on (datname, scope) /;
is($n, 1, 'the old IdempotencyScopeStuckKey written back into a copy of alerts.yml');
open(my $fh, '>', "$dir/alerts.yml") or die $!;
print $fh $text;
close $fh;
my $stuck_tests = do { local (@ARGV, $/) = "$tests_dir/IdempotencyScopeStuckKey.yml"; <> };
open($fh, '>', "$dir/t/alerts/IdempotencyScopeStuckKey.yml") or die $!;
print $fh $stuck_tests;
close $fh;
($ok, $out) = promtool('test', 'rules', "$dir/t/alerts/IdempotencyScopeStuckKey.yml");
ok(!$ok && $out =~ /many-to-many matching not allowed/,
	'the old IdempotencyScopeStuckKey fails its several-server test (many-to-many)') or diag($out);

done_testing();
