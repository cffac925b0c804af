# The cluster of the pg_cron tests (test/t/012, 043): pg_cron and idempotency preloaded, pg_cron
# in database postgres running its jobs as background workers, and the extension's own reaper off
# so that whatever is reaped, pg_cron's job reaped.
package IdemCronNode;

use strict;
use warnings;
use Exporter 'import';
use PostgreSQL::Test::Cluster;
use Test::More;

our @EXPORT = qw(start_cron_node);

sub start_cron_node
{
	my ($name) = @_;
	# A major whose chroot could not build pg_cron says so (scripts/pg-chroot's not-built list,
	# passed on by scripts/test, which reports the skip in its summary): nothing to test there.
	plan skip_all => 'pg_cron is not built for this PostgreSQL major (see scripts/test\'s summary)'
	  if grep { $_ eq 'pg-cron' } split ' ', ($ENV{IDEMPOTENCY_NOT_BUILT} // '');
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'pg_cron,idempotency'
cron.database_name = 'postgres'
cron.use_background_workers = on
max_worker_processes = 20
idempotency.reaper_enabled = off
});
	$node->start;
	return $node;
}

1;
