#!/usr/bin/perl
# bench/report.pl META RESULTS: the Markdown report of a bench/run run (standard output).
# META: "name<TAB>value" lines. RESULTS: one line per measurement (bench/run writes them):
#   tps     pass workload variant round tps transactions wal_bytes_per_transaction clients
#   hot     pass hot_key variant round claims transactions clients
#   wait    pass workload variant round clients event average_backends
#   reap    on reap variant round keys_per_second ms
#   size    - bytes_per_key variant - keys heap_bytes index_bytes total_bytes
#   memory  - memory ext - claims context_before context_after rss_anon_kb_before rss_anon_kb_after
# Medians over the rounds; ratios extension / reference of the medians; PASS/FAIL against the
# targets of issue 4 (reported, never asserted).
use strict;
use warnings;
use utf8;
binmode STDOUT, ':encoding(UTF-8)';

my ($meta_file, $res_file) = @ARGV;
die "usage: report.pl META RESULTS\n" unless defined $res_file;

my %meta;
open my $mf, '<', $meta_file or die "$meta_file: $!\n";
while (<$mf>) { chomp; my ($k, $v) = split /\t/, $_, 2; $meta{$k} = $v; }
close $mf;

my (%tps, %hot, %waits, %reap, %size, %sizeidx, @memory, %seen_clients);
open my $rf, '<', $res_file or die "$res_file: $!\n";
while (<$rf>) {
	chomp;
	my @f = split /\t/;
	if ($f[0] eq 'tps') {
		my $c = $f[8] // $meta{clients};
		$seen_clients{$c} = 1;
		push @{ $tps{ $f[1] }{$c}{ $f[2] }{ $f[3] } }, [ $f[4], $f[5], $f[7] // 'NA' ];
	}
	elsif ($f[0] eq 'hot') { push @{ $hot{ $f[1] }{ $f[7] // $meta{clients} }{ $f[3] } }, $f[6] ? $f[5] / $f[6] : 'NA'; }
	elsif ($f[0] eq 'wait') {
		# summed over the rounds; divided by the rounds when printed
		$waits{ $f[1] }{ $f[5] }{ $f[2] }{ $f[3] }{events}{ $f[6] } += $f[7];
		$waits{ $f[1] }{ $f[5] }{ $f[2] }{ $f[3] }{rounds}{ $f[4] } = 1;
	}
	elsif ($f[0] eq 'reap') { push @{ $reap{ $f[3] } }, [ $f[4], $f[5] ]; }
	elsif ($f[0] eq 'size') { $size{ $f[3] } = { keys => $f[5], heap => $f[6], idx => $f[7], total => $f[8] }; }
	elsif ($f[0] eq 'sizeidx') { push @{ $sizeidx{ $f[3] } }, [ $f[5], $f[6] ]; }
	elsif ($f[0] eq 'memory') { @memory = @f[ 5 .. 9 ]; }
}
close $rf;

my %label = (
	ext    => 'extension',
	a      => '(a) PL/pgSQL state machine',
	b      => '(b) ON CONFLICT DO UPDATE',
	c      => '(c) raw prepared SQL',
	insert => '(d) plain INSERT',
	select => '(d) primary-key SELECT',
	ref    => 'hand-written batched DELETE',
	null   => 'floor: null cycle (no write)',
	wal    => 'floor: WAL only (~650 bytes and the commit)',
);
my @workloads = (
	[ claim_new => [qw(ext a b insert)] ],
	[ cycle     => [qw(ext a c null wal)] ],
	[ replay    => [qw(ext a select)] ],
	[ hot_key   => [qw(ext a)] ],
);
# the targets of issue 4: workload, reference variant, comparison, bound
my %target = (
	'claim_new/insert' => [ '>=', 0.90 ],
	'claim_new/b'      => [ '>=', 1.20 ],
	'cycle/c'          => [ '>=', 1.10 ],
	'cycle/a'          => [ '>=', 1.50 ],
	'replay/select'    => [ '>=', 0.80 ],
	'reap/ref'         => [ '>=', 2.0 ],
	'bytes_per_key/ref' => [ '<=', 0.80 ],
);

sub median {
	my @v = sort { $a <=> $b } grep { defined && $_ ne 'NA' } @_;
	return 'NA' unless @v;
	my $m = int(@v / 2);
	return @v % 2 ? $v[$m] : ($v[ $m - 1 ] + $v[$m]) / 2;
}
sub ratio { my ($x, $y) = @_; return ($x eq 'NA' || $y eq 'NA' || $y == 0) ? 'NA' : $x / $y; }
sub fmt_ratio { my $r = shift; return $r eq 'NA' ? 'n/a' : sprintf('%.2f', $r); }
sub fmt_num { my $n = shift; return $n eq 'NA' ? 'n/a' : sprintf('%.0f', $n); }
sub target_text { my $t = shift; return $t ? ($t->[0] eq '>=' ? '≥ ' : '≤ ') . sprintf('%.2f', $t->[1]) : '—'; }
sub verdict {
	my ($r, $t) = @_;
	return '—' unless $t;
	return 'n/a' if $r eq 'NA';
	my $ok = $t->[0] eq '>=' ? $r >= $t->[1] - 1e-9 : $r <= $t->[1] + 1e-9;
	return $ok ? 'PASS' : 'FAIL';
}
# extension / variant in each round (pairs measured minutes apart): shows how noisy a ratio is
sub round_ratios {
	my ($ext_runs, $var_runs) = @_;
	my %e = map { $_->[0] => $_->[1] } @$ext_runs;
	return join(' ', map { exists $e{ $_->[0] } ? fmt_ratio(ratio($e{ $_->[0] }, $_->[1])) : 'n/a' }
		  sort { $a->[0] <=> $b->[0] } @$var_runs);
}
sub mib { return sprintf('%.2f MB', $_[0] / 1048576); }

my @passes = split ' ', ($meta{passes} // 'on off');
my @client_counts = sort { $a <=> $b } keys %seen_clients;
my $sweep = @client_counts > 1;
my %pass_title = (
	on  => 'synchronous_commit = on (default durability)',
	off => 'synchronous_commit = off (CPU cost shows)',
);
# ratios: $summary{measure}{pass}{clients} (clients '' for the measures that have no count)
my %summary;

print "# idempotency benchmark results\n\n";
printf "- date: %s\n", $meta{date};
printf "- command: `%s`\n", $meta{command};
printf "- machine: %s\n", $meta{machine};
printf "- PostgreSQL: %s\n", $meta{postgres};
printf "- extension: commit %s\n", $meta{commit};
printf "- runs: %s round(s), interleaved (the order of the variants rotates each round); "
  . "%s per pgbench run, `-M prepared`, %s clients (`-j %s`), hot_key %s; "
  . "medians over the rounds; wait events sampled from pg_stat_activity every 50 ms\n",
  $meta{rounds}, $meta{run_length} // "$meta{duration} s", join(', ', @client_counts), $meta{jobs},
  $meta{hot_clients} eq 'same' ? 'the same' : "$meta{hot_clients} clients";
printf "- cluster: bench/run's own (unix socket), fsync on, shared_buffers %s, "
  . "idempotency.reaper_enabled off, a CHECKPOINT before every run, each table emptied before "
  . "each of its runs (replay: %s preloaded keys)\n",
  $meta{shared_buffers}, $meta{replay_keys};
printf "- elapsed: %d min %02d s%s\n", int($meta{elapsed} / 60), $meta{elapsed} % 60,
  $meta{failures} ? ", $meta{failures} run(s) FAILED" : '';
print "\n";

# ---- throughput, one table per pass
# The wait events of one run (averaged over its rounds): the busiest first, as
# "CPU 5.1, LWLock:WALWrite 1.2" (average number of active backends in each).
sub wait_summary {
	my ($w) = @_;
	# no line recorded: the sampler never saw a backend of the run active
	return 'none sampled' unless $w && $w->{events};
	my $rounds = scalar keys %{ $w->{rounds} };
	my $ev = $w->{events};
	my @top = sort { $ev->{$b} <=> $ev->{$a} || $a cmp $b } keys %$ev;
	splice(@top, 5) if @top > 5;
	return join(', ', map { sprintf('%s %.1f', $_, $ev->{$_} / $rounds) } @top);
}

for my $pass (@passes) {
for my $clients (@client_counts) {
	next unless $tps{$pass}{$clients};
	my %tps_p = %{ $tps{$pass}{$clients} };
	my $hot_clients = $meta{hot_clients} eq 'same' ? $clients : $meta{hot_clients};
	print "## Throughput: $pass_title{$pass}, $clients clients",
	  ($hot_clients eq $clients ? '' : " (hot_key $hot_clients)"), "\n\n";
	print "| workload | variant | median tps | tps per round | extension / variant | per round | target | result | WAL bytes / transaction |\n";
	print "|---|---|---:|---|---:|---|---|---|---:|\n";
	for my $w (@workloads) {
		my ($wl, $vars) = @$w;
		next unless $tps_p{$wl};    # not run (IDEMPOTENCY_BENCH_WORKLOADS)
		my $ext = median(map { $_->[1] } @{ $tps_p{$wl}{ext} // [] });
		for my $v (@$vars) {
			my $runs = $tps_p{$wl}{$v} // [];
			my @sorted = map { $_->[1] } sort { $a->[0] <=> $b->[0] } @$runs;
			my $med = median(@sorted);
			my ($r, $t) = ('', undef);
			if ($v ne 'ext') {
				$r = ratio($ext, $med);
				$t = $target{"$wl/$v"};
				$summary{"$wl/$v"}{$pass}{$clients} = $r;
			}
			printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $wl, $label{$v}, fmt_num($med),
			  join(' ', map { fmt_num($_) } @sorted),
			  $v eq 'ext' ? '' : fmt_ratio($r),
			  $v eq 'ext' ? '' : round_ratios($tps_p{$wl}{ext} // [], $runs),
			  $v eq 'ext' ? '' : target_text($t),
			  $v eq 'ext' ? '' : ($t ? verdict($r, $t) : 'info'),
			  fmt_num(median(map { $_->[2] } @$runs));
		}
	}
	my @shares;
	for my $v (qw(ext a)) {
		next unless $hot{$pass}{$clients}{$v};
		my $share = median(@{ $hot{$pass}{$clients}{$v} });
		push @shares, sprintf('%s %.0f%%', $label{$v}, 100 * $share) unless $share eq 'NA';
	}
	print "\nhot_key: share of the transactions that claimed a key (the others replayed it): ",
	  join(', ', @shares), ".\n" if @shares;
	# the floors bound what any implementation of the cycle can reach against (a) in this pass
	my %cyc = map { $_ => median(map { $_->[1] } @{ $tps_p{cycle}{$_} // [] }) } qw(ext a null wal);
	if ($cyc{a} ne 'NA' && $cyc{wal} ne 'NA' && $cyc{null} ne 'NA') {
		printf "\ncycle floors: a cycle that does nothing runs %s tps (%s times (a)); one that only writes and\n"
		  . "commits about the extension's WAL runs %s tps (%s times (a)): no implementation that writes\n"
		  . "that much WAL per cycle can exceed %s times (a) in this pass. The extension runs at %.0f%% of that floor.\n",
		  fmt_num($cyc{null}), fmt_ratio(ratio($cyc{null}, $cyc{a})), fmt_num($cyc{wal}),
		  fmt_ratio(ratio($cyc{wal}, $cyc{a})), fmt_ratio(ratio($cyc{wal}, $cyc{a})),
		  100 * ratio($cyc{ext}, $cyc{wal});
	}
	if ($waits{$pass}{$clients}) {
		print "\nWait events (average active backends per event over the run; CPU: waiting for nothing):\n\n";
		print "| workload | variant | wait events |\n|---|---|---|\n";
		for my $w (@workloads) {
			my ($wl, $vars) = @$w;
			printf "| %s | %s | %s |\n", $wl, $label{$_}, wait_summary($waits{$pass}{$clients}{$wl}{$_})
			  for grep { $tps_p{$wl}{$_} } @$vars;
		}
	}
	print "\n";
}
}

# ---- the sweep: every throughput ratio at every client count
if ($sweep) {
	for my $pass (grep { $tps{$_} } @passes) {
		print "## Ratios by client count: $pass_title{$pass}\n\n";
		print "| extension / variant |", join('', map { " $_ clients |" } @client_counts), " target |\n";
		print "|---|", join('', map { "---:|" } @client_counts), "---|\n";
		for my $w (@workloads) {
			my ($wl, $vars) = @$w;
			next unless grep { $tps{$pass}{$_}{$wl} } @client_counts;
			for my $v (grep { $_ ne 'ext' } @$vars) {
				my $t = $target{"$wl/$v"};
				print "| $wl / $label{$v} |",
				  join('', map {
					  my $r = $summary{"$wl/$v"}{$pass}{$_} // 'NA';
					  ' ' . fmt_ratio($r) . ($t && $r ne 'NA' && verdict($r, $t) eq 'FAIL' ? ' ✗' : '') . ' |'
				  } @client_counts), ' ', target_text($t), " |\n";
			}
		}
		print "\n";
	}
}

# ---- reaping
if (%reap) {
	print "## Reaping: $meta{reap_keys} expired keys, batches of 1000, a COMMIT per batch\n\n";
	print "`CALL idem_reap_all()` against `CALL ref.reap_all(1000)` (bench/references.sql), the same keys\n";
	print "loaded into both tables before each round; keys per second.\n\n";
	print "| workload | variant | median keys/s | keys/s per round | extension / variant | per round | target | result |\n";
	print "|---|---|---:|---|---:|---|---|---|\n";
	my $ext = median(map { $_->[1] } @{ $reap{ext} // [] });
	for my $v (qw(ext ref)) {
		my @sorted = map { $_->[1] } sort { $a->[0] <=> $b->[0] } @{ $reap{$v} // [] };
		my $med = median(@sorted);
		my $r = $v eq 'ext' ? '' : ratio($ext, $med);
		$summary{'reap/ref'}{on}{''} = $r if $v ne 'ext';
		printf "| reap | %s | %s | %s | %s | %s | %s | %s |\n", $label{$v}, fmt_num($med),
		  join(' ', map { fmt_num($_) } @sorted), $v eq 'ext' ? '' : fmt_ratio($r),
		  $v eq 'ext' ? '' : round_ratios($reap{ext} // [], $reap{$v} // []),
		  $v eq 'ext' ? '' : target_text($target{'reap/ref'}),
		  $v eq 'ext' ? '' : verdict($r, $target{'reap/ref'});
	}
	print "\n";
}

# ---- bytes per key
if (%size) {
	my $n = $size{ext}{keys};
	print "## Bytes per key: $meta{size_keys} completed keys, after VACUUM\n\n";
	print "UUID keys, ~60-byte JSON requests and responses; each key claimed and completed in its own\n";
	print "transaction (extension: idem_claim + idem_complete; reference: ref.claim_a + ref.complete_a);\n";
	print "pg_total_relation_size (heap, indexes, TOAST, free space and visibility maps).\n\n";
	print "| workload | table | keys | heap | indexes | total | bytes/key | extension / reference | target | result |\n";
	print "|---|---|---:|---:|---:|---:|---:|---:|---|---|\n";
	my $per = sub { my $s = shift; return $s && $s->{keys} ? $s->{total} / $s->{keys} : 'NA'; };
	my $r = ratio($per->($size{ext}), $per->($size{ref}));
	$summary{'bytes_per_key/ref'}{on}{''} = $r;
	for my $v (qw(ext ref)) {
		my $s = $size{$v} or next;
		printf "| bytes_per_key | %s | %d | %s | %s | %s | %.1f | %s | %s | %s |\n",
		  $v eq 'ext' ? 'idem_keys (extension)' : 'ref.keys_a (reference)', $s->{keys},
		  mib($s->{heap}), mib($s->{idx}), mib($s->{total}), $per->($s),
		  $v eq 'ext' ? '' : fmt_ratio($r), $v eq 'ext' ? '' : target_text($target{'bytes_per_key/ref'}),
		  $v eq 'ext' ? '' : verdict($r, $target{'bytes_per_key/ref'});
	}
	print "\n";
	for my $v (qw(ext ref)) {
		next unless $sizeidx{$v} && $size{$v} && $size{$v}{keys};
		printf "%s: heap %.1f bytes/key; %s.\n", $v eq 'ext' ? 'idem_keys' : 'ref.keys_a',
		  $size{$v}{heap} / $size{$v}{keys},
		  join(', ', map { sprintf('%s %.1f bytes/key', $_->[0], $_->[1] / $size{$v}{keys}) } @{ $sizeidx{$v} });
	}
	print "\n" if %sizeidx;
}

# ---- memory
my $mem_verdict;
if (@memory) {
	my ($claims, $cb, $ca, $rb, $ra) = @memory;
	my $dctx = $ca - $cb;
	my $drss = ($ra - $rb) * 1024;
	my $worst = $dctx > $drss ? $dctx : $drss;
	$mem_verdict = [ $worst, $worst < 1048576 ? 'PASS' : 'FAIL' ];
	print "## Backend memory: $claims claims in one session\n\n";
	print "One pgbench client (`-c 1`, prepared, autocommit, synchronous_commit = off to keep it short)\n";
	print "claims new keys; the backend's memory is read after a warm-up and again at the end:\n";
	print "pg_backend_memory_contexts (sum of total_bytes: palloc) and RssAnon of /proc/self/status\n";
	print "(private memory, palloc or malloc). Target: growth < 1 MB (both).\n\n";
	print "| workload | measure | after warm-up | after $claims claims | growth | target | result |\n";
	print "|---|---|---:|---:|---:|---|---|\n";
	printf "| memory | memory contexts | %s | %s | %s | < 1 MB | %s |\n", mib($cb), mib($ca), mib($dctx),
	  $dctx < 1048576 ? 'PASS' : 'FAIL';
	printf "| memory | RssAnon | %s | %s | %s | < 1 MB | %s |\n", mib($rb * 1024), mib($ra * 1024),
	  mib($drss), $drss < 1048576 ? 'PASS' : 'FAIL';
	print "\n";
}

# ---- the targets
print "## Targets (issue 4)\n\n";
my @passes_shown = grep { $tps{$_} } @passes;
print "| measure | target |", join('', map { " $pass_title{$_} | result |" } @passes_shown), "\n";
print "|---|---|", join('', map { "---:|---|" } @passes_shown), "\n";
my @rows = (
	[ 'claim_new/insert',  'claim (new key, autocommit) / plain INSERT of the same row' ],
	[ 'claim_new/b',       'claim / reference (b)' ],
	[ 'cycle/c',           'transactional cycle / raw prepared SQL cycle (c)' ],
	[ 'cycle/a',           'transactional cycle / PL/pgSQL reference (a)' ],
	[ 'replay/select',     'replay / plain primary-key SELECT' ],
	[ 'reap/ref',          'reaping rate / hand-written batched DELETE' ],
	[ 'bytes_per_key/ref', 'bytes per key / reference table with the same data' ],
);
for my $row (@rows) {
	my ($k, $text) = @$row;
	my $t = $target{$k};
	my $per_count = grep { exists $summary{$k}{$_} && !exists $summary{$k}{$_}{''} } @passes_shown;
	for my $c ($per_count ? @client_counts : ('')) {
		print "| $text", ($sweep && $c ne '' ? ", $c clients" : ''), ' | ', target_text($t), " |";
		for my $p (@passes_shown) {
			my $r = $summary{$k}{$p}{$c};
			if (!defined $r || $r eq '') { print " — | — |"; next; }
			print ' ', fmt_ratio($r), ' | ', verdict($r, $t), ' |';
		}
		print "\n";
	}
}
if ($mem_verdict) {
	print "| backend memory growth over $memory[0] claims | < 1 MB | ", mib($mem_verdict->[0]), " | $mem_verdict->[1] |",
	  join('', map { " — | — |" } @passes_shown[ 1 .. $#passes_shown ]), "\n";
}
print "\nRatios are extension / reference of the medians of the same run (for bytes per key: smaller\n";
print "is better). Reaping, bytes per key and memory run in the default-durability pass only.\n";
