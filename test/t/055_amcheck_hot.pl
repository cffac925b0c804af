# HOT updates of idem_keys leave its indexes sound. idem_extend, idem_complete and idem_fail update
# a key in place; when no indexed column changes the update is HOT and the primary key gets no new
# entry (an entry for a heap-only tuple would corrupt it). From PostgreSQL 16 an update that changes
# only expires_at (complete with ttl) is HOT as well, and only the summarizing index, the BRIN on
# expires_at, gets an entry; on 15 it is an ordinary update. The test proves HOT happened
# (pg_stat_user_tables.n_tup_hot_upd, heap-only tuples on the page), that no primary-key entry
# points to a heap-only tuple (pageinspect), that amcheck finds the b-tree, its heap and (17 on)
# its uniqueness sound, and that the BRIN summary covers the new expiry (a BRIN-only scan finds
# the keys). amcheck up to 19 has no BRIN check of its own, and its b-tree checks do not notice a
# primary-key entry for a heap-only tuple (a build of the extension that wrote one for every
# summarizing-only update passed them all on 18; only the pageinspect check failed): hence both.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('amcheck_hot');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
autovacuum = off
});
$node->start;
sub sql { return $node->safe_psql('postgres', shift) }
sql('CREATE EXTENSION idempotency; CREATE EXTENSION amcheck; CREATE EXTENSION pageinspect');
my $major = int(sql('SHOW server_version_num') / 10000);
note "PostgreSQL $major";

# Six keys, one heap page, with a lease and a ttl of an hour; the first BRIN range has a summary
# (made when the index was built on the empty table, widened by the inserts), so that a later
# expiry outside [min, max] must widen it again.
sql(q{SELECT count(idem_claim('k' || g, ttl => '1 hour', lease => '1 hour')) FROM generate_series(1, 6) g});
is(sql(q{SELECT pg_relation_size('idem_keys') / current_setting('block_size')::int}), 1,
	'the keys fill one heap page');
sql(q{SELECT brin_summarize_range('idem_keys_expires_at_idx', 0)});
my $summary = q{SELECT value FROM brin_page_items(get_raw_page('idem_keys_expires_at_idx', 2), 'idem_keys_expires_at_idx')
	WHERE blknum = 0 AND NOT placeholder};
my $summary_before = sql($summary);
like($summary_before, qr/^\{.+ \.\. .+\}$/, "the BRIN range of the keys is summarized: $summary_before");

# Runs the updates and returns (updates, HOT updates) that pg_stat_user_tables counted for them,
# read in the same session after forcing the statistics out (no waiting on another backend).
sub counted
{
	my ($updates) = @_;
	my $read = q{SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'idem_keys'::regclass};
	my @lines = split /\n/, sql(qq{
		SELECT pg_stat_force_next_flush();
		$read;
		$updates;
		SELECT pg_stat_force_next_flush();
		$read;
	});
	my ($upd0, $hot0) = split / /, $lines[1];
	my ($upd1, $hot1) = split / /, $lines[-1];
	return ($upd1 - $upd0, $hot1 - $hot0);
}

my ($upd, $hot) = counted(q{SELECT count(idem_extend('k' || g, 1, '2 hours')) FROM generate_series(1, 6) g});
is($upd, 6, 'idem_extend updated the six keys');
cmp_ok($hot, '>', 0, "idem_extend's updates were HOT ($hot of 6)");

($upd, $hot) = counted(q{
	SELECT count(idem_complete('k' || g, '{"ok": true}', attempt => 1)) FROM generate_series(1, 2) g;
	SELECT count(idem_fail('k' || g, '{"error": 1}', 503, retryable => false, attempt => 1)) FROM generate_series(3, 4) g});
is($upd, 4, 'idem_complete and idem_fail (no ttl) updated four keys');
cmp_ok($hot, '>', 0, "idem_complete's and idem_fail's updates were HOT ($hot of 4)");

# expires_at is the BRIN's column: HOT from 16 (a BRIN entry only), an ordinary update on 15
($upd, $hot) = counted(q{SELECT count(idem_complete('k' || g, '{"ok": true}', attempt => 1, ttl => '300 days')) FROM generate_series(5, 6) g});
is($upd, 2, 'idem_complete with a ttl updated two keys');
if ($major >= 16)
{
	cmp_ok($hot, '>', 0, "from 16, changing only expires_at is HOT ($hot of 2)");
}
else
{
	is($hot, 0, 'on 15, changing expires_at (indexed by the BRIN) is never HOT');
}

is(sql(q{SELECT count(*) FROM heap_page_items(get_raw_page('idem_keys', 0)) WHERE t_infomask2 & 32768 <> 0}) > 0 ? 1 : 0,
	1, 'the heap page holds heap-only tuples');

# The rule itself: no primary-key entry points to a heap-only tuple (HEAP_ONLY_TUPLE, 0x8000).
is(sql(q{
	WITH entries AS (
		SELECT unnest(coalesce(i.tids, ARRAY[i.htid])) AS tid
		FROM generate_series(1, pg_relation_size('idem_keys_pkey') / current_setting('block_size')::int - 1) b,
		     bt_page_stats('idem_keys_pkey', b::int) s,
		     bt_page_items('idem_keys_pkey', b::int) i
		WHERE s.type = 'l' AND i.htid IS NOT NULL),
	heaponly AS (
		SELECT ('(0,' || h.lp || ')')::tid AS tid FROM heap_page_items(get_raw_page('idem_keys', 0)) h
		WHERE h.t_infomask2 & 32768 <> 0)
	SELECT count(*) FROM entries e JOIN heaponly h ON e.tid = h.tid}),
	0, 'no primary-key entry points to a heap-only tuple');

# amcheck: every heap tuple that must be indexed is (heapallindexed), the tree is sound with its
# parent links, each entry is found again from the root (rootdescend), and (17 on, amcheck 1.4)
# no key has two visible entries (checkunique).
my $checkunique = sql(q{SELECT count(*) FROM pg_proc WHERE proname = 'bt_index_check' AND pronargs = 3});
is($checkunique, $major >= 17 ? 1 : 0, 'amcheck offers checkunique from 17 on');
my $unique = $checkunique ? ', checkunique => true' : '';
for my $index (split /\n/, sql(q{SELECT indexrelid::regclass FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_am a ON a.oid = c.relam WHERE indrelid = 'idem_keys'::regclass AND a.amname = 'btree' ORDER BY 1}))
{
	my ($rc, $out, $err) = $node->psql('postgres',
		"SELECT bt_index_check('$index', heapallindexed => true$unique)");
	is($rc . $err, '0', "bt_index_check($index, heapallindexed$unique)");
	($rc, $out, $err) = $node->psql('postgres',
		"SELECT bt_index_parent_check('$index', heapallindexed => true, rootdescend => true$unique)");
	is($rc . $err, '0', "bt_index_parent_check($index, heapallindexed, rootdescend$unique)");
}
is(sql(q{SELECT count(*) FROM verify_heapam('idem_keys')}), 0, 'verify_heapam finds nothing wrong with idem_keys');

# BRIN: amcheck's own check where the major has one, and in any case a scan through the BRIN alone
# finds the two keys whose expiry moved 300 days out: a summary not widened by the update
# (the summarizing-only entry of a HOT update from 16) would skip the page.
if (sql(q{SELECT count(*) FROM pg_proc WHERE proname = 'brin_index_check'}) > 0)
{
	my ($rc, $out, $err) = $node->psql('postgres', q{SELECT brin_index_check('idem_keys_expires_at_idx', true, true)});
	is($rc . $err, '0', 'brin_index_check(idem_keys_expires_at_idx)');
}
else
{
	note "amcheck on $major has no brin_index_check";
}
my $brin_scan = q{SET enable_seqscan = off; SET enable_indexscan = off;
	SELECT string_agg(key, ',' ORDER BY key) FROM idem_keys WHERE expires_at > now() + interval '200 days'};
like(sql("SET enable_seqscan = off; SET enable_indexscan = off; EXPLAIN (COSTS OFF) SELECT key FROM idem_keys WHERE expires_at > now() + interval '200 days'"),
	qr/Bitmap Index Scan on idem_keys_expires_at_idx/, 'the scan goes through the BRIN');
is(sql($brin_scan), 'k5,k6', 'the BRIN summary covers the expiry the HOT updates wrote');
my $summary_after = sql($summary);
isnt($summary_after, $summary_before, "the summary was widened: $summary_after");

# The keys answer as their updates left them.
is(sql(q{SELECT string_agg(key || ' ' || state || ' ' || attempt, ',' ORDER BY key) FROM idem_keys}),
	'k1 succeeded 1,k2 succeeded 1,k3 failed 1,k4 failed 1,k5 succeeded 1,k6 succeeded 1',
	'every key is as its last update left it');
is(sql(q{SELECT (idem_claim('k3')).outcome || ' ' || (idem_claim('k5')).outcome}), 'replay replay',
	'finished keys replay through the primary key');

$node->stop;
done_testing();
