# Polling a node that is going through a crash restart. PostgreSQL::Test::Cluster's psql and
# poll_query_until write the query to psql's stdin; a psql turned away while the server restarts
# can exit before reading it, and the write then kills the whole test with a broken pipe. Here the
# query is an argument (-c) and stdin is /dev/null, so a refused connection is just a try that
# failed.
package IdemCrash;

use strict;
use warnings;
use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(time sleep);

our @EXPORT = qw(poll_after_crash);

# True once $query on $db prints $expected (default 't'), within the harness's timeout.
sub poll_after_crash
{
	my ($node, $db, $query, $expected) = @_;
	$expected //= 't';
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		my ($out, $err) = ('', '');
		IPC::Run::run([ $node->installed_command('psql'), '-XAtq', '-d', $node->connstr($db), '-c', $query ],
			'<', '/dev/null', '>', \$out, '2>', \$err);
		chomp $out;
		return 1 if $out eq $expected;
		sleep 0.2;
	}
	return 0;
}

1;
