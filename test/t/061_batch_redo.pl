# A consumer redoing a batch whose COMMIT got no answer (docs/consumers.md, "Redoing a transaction
# whose COMMIT got no answer"): the redo is the same transaction again, one statement that claims
# the ids with applied => true and applies the claimed ones. While the first session still holds
# its ids (the server has not yet noticed the dropped client), the redo waits for it; then it
# replays them if that transaction committed, or claims and applies them if it ended without
# committing (its session terminated). Either way each message is applied once: the business
# table has no unique constraint, so a double apply would show as a second row.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('batch_redo');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
-- deliberately not unique
CREATE TABLE shipments (message_id text NOT NULL);
});

sub query { return $node->safe_psql('postgres', shift); }

# The consumer's transaction for a batch of ids, without its COMMIT.
sub batch
{
	my $ids = join(', ', map { "'$_'" } @_);
	return qq{BEGIN; INSERT INTO shipments
SELECT key FROM idem_claim_batch(ARRAY[$ids], 'consumer:shipping', applied => true)
 WHERE outcome = 'claimed';};
}

# Starts the redo of the batch (with its COMMIT) in a session of its own and waits until it blocks
# on the first session's ids.
sub redo_waiting
{
	my @ids = @_;
	my $redo = $node->background_psql('postgres', on_error_stop => 1);
	my $pid = $redo->query_safe('SELECT pg_backend_pid()');
	$redo->{stdin} .= batch(@ids) . " COMMIT;\n";
	$redo->{run}->pump_nb;
	ok( $node->poll_query_until(
			'postgres', qq{SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $pid}),
		"the redo of @ids waits for the first session's transaction");
	return $redo;
}

# ---- the first COMMIT went through: the redo replays, applies nothing
my $first = $node->background_psql('postgres', on_error_stop => 1);
$first->query_safe(batch('m1', 'm2', 'm3'));
my $redo = redo_waiting('m1', 'm2', 'm3');
$first->query_safe('COMMIT');
$redo->query_safe('SELECT 1');    # after the redo's COMMIT: psql runs its input in order
$_->quit for ($first, $redo);
is(query(q{SELECT count(*) || '/' || count(DISTINCT message_id) FROM shipments WHERE message_id IN ('m1', 'm2', 'm3')}),
	'3/3', 'committed first: each message applied once (the redo replayed)');

# ---- the first session ends without committing: the redo claims and applies
$first = $node->background_psql('postgres', on_error_stop => 0);
my $first_pid = $first->query_safe('SELECT pg_backend_pid()');
$first->query_safe(batch('m4', 'm5', 'm6'));
$redo = redo_waiting('m4', 'm5', 'm6');
is(query(qq{SELECT pg_terminate_backend($first_pid)}), 't', 'the first session is terminated before its COMMIT');
$redo->query_safe('SELECT 1');
$redo->quit;
$first->{run}->kill_kill;
is(query(q{SELECT count(*) || '/' || count(DISTINCT message_id) FROM shipments WHERE message_id IN ('m4', 'm5', 'm6')}),
	'3/3', 'not committed first: the redo applied each message once');

is(query(q{SELECT string_agg(key || ' ' || state || ' ' || attempt, ', ' ORDER BY key) FROM idem_keys}),
	'm1 succeeded 1, m2 succeeded 1, m3 succeeded 1, m4 succeeded 1, m5 succeeded 1, m6 succeeded 1',
	'every id recorded as applied, once');

$node->stop;
done_testing();
