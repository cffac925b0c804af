# `wait` without shared_preload_libraries (docs/contract.md §9.3; docs/design.md, "Waiting"): no condition
# variables, so nothing can wake a lease-mode waiter. It then waits only for a lease that ends
# within `wait`, and otherwise answers in_progress at once; same-transaction mode (a lock wait)
# works as with the library preloaded.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('wait_no_preload');
$node->init;
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

sub sql { return $node->safe_psql('postgres', $_[0]); }

# lease mode, a lease longer than the wait: in_progress, without sleeping out the wait (a wait of
# ten minutes that slept would time this test out)
sql(q{SELECT idem_claim('long', '{"a": 1}', lease => '1 hour')});
is( sql(q{SELECT outcome || ' ' || attempt || ' ' || state FROM idem_claim('long', '{"a": 1}', wait => '10 min')}),
	'in_progress 1 pending', 'a lease that outlives the wait: in_progress at once');

# lease mode, a lease that ends within the wait: the waiter sleeps until its end and takes over
sql(q{SELECT idem_claim('short', '{"a": 1}', lease => '300 ms')});
is( sql(q{SELECT outcome || ' ' || inserted || ' ' || attempt FROM idem_claim('short', '{"a": 1}', wait => '1 min')}),
	'claimed false 2', 'a lease that ends within the wait: taken over at its end');

# ... or finds the owner's result at the lease's end (a lease long enough for the waiter to start
# and the owner to finish within it, even on a slow machine)
sql(q{SELECT idem_claim('done', '{"a": 1}', lease => '15 s')});
my $waiter = $node->background_psql('postgres');
# (without the NOTICE that the library is not preloaded, test 015's: query_safe takes any output on
# stderr for an error)
$waiter->query_until(qr/started/, q{
SET client_min_messages = warning;
\echo started
SELECT outcome || ' ' || attempt || ' ' || coalesce(response ->> 'ok', '-') AS answer
  FROM idem_claim('done', '{"a": 1}', wait => '1 min') \gset
});
sql(q{SELECT idem_complete('done', '{"ok": 1}', attempt => 1)});
is($waiter->query_safe(q{SELECT :'answer'}), 'replay 1 1', 'a key finished during the lease: replayed at its end');
$waiter->quit;

# same-transaction mode: a lock wait, bounded without shared memory too
my $owner = $node->background_psql('postgres');
$owner->query_safe(q{BEGIN; SELECT idem_claim('tx', '{"a": 1}')});
is( sql(q{SELECT outcome || ' ' || (attempt IS NULL) FROM idem_claim('tx', '{"a": 1}', wait => '0')}),
	'in_progress true', 'wait => 0 against an uncommitted claim: in_progress, no row');
is( sql(q{SELECT outcome || ' ' || (attempt IS NULL) FROM idem_claim('tx', '{"a": 1}', wait => '100 ms')}),
	'in_progress true', 'a bounded wait on an uncommitted claim runs out: in_progress, no row');
$owner->query_safe('ROLLBACK');
$owner->quit;
is( sql(q{SELECT outcome || ' ' || inserted FROM idem_claim('tx', '{"a": 1}', wait => '0')}),
	'claimed true', 'after the rollback the key is free');

$node->stop;
done_testing();
