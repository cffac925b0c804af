# Smoke test of the benchmark suite (bench/run, issue 4; docs/benchmarks.md): a --quick run
# (its own throwaway cluster, every workload once, small data sets, 100 transactions per client
# and run) exits 0, prints a table row for every workload and variant, their wait events, the
# targets table, and no ERROR.
# It proves that the suite works; it asserts nothing about speed. Then bench/plot redraws the
# pictures of docs/benchmarks.md from the committed runs (docs/img/data) into a directory of its
# own: every picture is written, is a PNG of a readable size, and holds more than a blank canvas.
# The extension is installed already (scripts/test runs `make install` first): --no-install.
use strict;
use warnings;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use IPC::Run qw(run timeout);
use Test::More;

my $root = abs_path(dirname(__FILE__) . '/../..');
my $dir  = tempdir('bench_smoke_XXXXXX', TMPDIR => 1, CLEANUP => 1);
my $report_file = "$dir/report.md";

my ($out, $err) = ('', '');
my $ok = run [ 'bash', "$root/bench/run", '--quick', '--no-install', '--output', $report_file ],
  '<', \undef, '>', \$out, '2>', \$err, timeout(600);
my $rc = $? >> 8;
is($rc, 0, 'bench/run --quick --no-install exits 0')
  or diag("stdout:\n$out\nstderr:\n$err");

# every workload and variant has its row in both synchronous_commit passes
my %variants = (
	claim_new => [ 'extension', '(a) PL/pgSQL state machine', '(b) ON CONFLICT DO UPDATE', '(d) plain INSERT' ],
	cycle     => [ 'extension', '(a) PL/pgSQL state machine', '(c) raw prepared SQL',
	               'floor: null cycle (no write)', 'floor: WAL only (~650 bytes and the commit)' ],
	replay    => [ 'extension', '(a) PL/pgSQL state machine', '(d) primary-key SELECT' ],
	hot_key   => [ 'extension', '(a) PL/pgSQL state machine' ],
);
for my $wl (sort keys %variants) {
	for my $v (@{ $variants{$wl} }) {
		my @rows = $out =~ /^\| \Q$wl\E \| \Q$v\E \| [0-9]+ \|/mg;
		is(scalar @rows, 2, "$wl / $v: a row with a median in each synchronous_commit pass");
	}
}
# the WAL each run wrote, per transaction: the writing variants write, the null floor does not
# (what it shows is the cluster's background, e.g. autovacuum, spread over --quick's few
# transactions: well under a quarter of the extension's cycle)
my @ext = $out =~ /^\| cycle \| extension \|(?:[^|]*\|){6} ([0-9]+) \|$/mg;
my @null_wal = $out =~ /^\| cycle \| floor: null cycle \(no write\) \|(?:[^|]*\|){6} ([0-9]+) \|$/mg;
for my $pass (1, 2) {
	ok(@ext == 2 && $ext[ $pass - 1 ] > 100, "cycle / extension: WAL bytes per transaction measured (pass $pass)");
	ok(@ext == 2 && @null_wal == 2 && $null_wal[ $pass - 1 ] < $ext[ $pass - 1 ] / 4,
		"cycle / null floor: no WAL of its own per transaction (pass $pass: "
		  . ($null_wal[ $pass - 1 ] // 'none') . ' bytes)');
}
like($out, qr/^cycle floors: .* runs [0-9]+ tps/m, 'the cycle floors are summarised');
like($out, qr/^\| reap \| extension \| [0-9]+ \|/m, 'reap: extension row');
like($out, qr/^\| reap \| hand-written batched DELETE \| [0-9]+ \|/m, 'reap: reference row');
like($out, qr/^\| bytes_per_key \| idem_keys \(extension\) \| [0-9]+ \|/m, 'bytes_per_key: extension row');
like($out, qr/^\| bytes_per_key \| ref\.keys_a \(reference\) \| [0-9]+ \|/m, 'bytes_per_key: reference row');
like($out, qr/^\| memory \| memory contexts \|/m, 'memory: memory contexts row');
like($out, qr/^\| memory \| RssAnon \|/m, 'memory: RssAnon row');

# wait events sampled during every pgbench run, summarised under each throughput table (an
# extension's LWLock tranche name may contain spaces: LWLock:idempotency scope stats)
my @wait_tables = $out =~ /^Wait events \(average active backends/mg;
is(scalar @wait_tables, 2, 'a wait-event summary under each throughput table');
for my $wl (sort keys %variants) {
	for my $v (@{ $variants{$wl} }) {
		my @rows = $out =~ /^\| \Q$wl\E \| \Q$v\E \| ((?:[A-Za-z]+(?::[^,|]+?)? [0-9.]+(?:, )?)+|none sampled) \|$/mg;
		is(scalar @rows, 2, "$wl / $v: its wait events in each synchronous_commit pass");
	}
}

# the targets table names every target of issue 4 with a ratio and a verdict (whichever it is)
my @verdicts = $out =~ /^\| [^|]+ \| (?:≥|≤|<) [0-9.]+(?: MB)? \| [0-9.]+(?: MB)? \| (?:PASS|FAIL) \|/mg;
is(scalar @verdicts, 8, 'the targets table: 8 targets, each with a measured value and PASS or FAIL');

unlike($out . $err, qr/ERROR/, 'no ERROR anywhere in the output');
unlike($out, qr/FAILED|n\/a/, 'no failed run, no missing measurement');
like($out, qr/^- machine: .+CPUs/m, 'the report names the machine');
# the server bench/run starts: $PG_CONFIG's (as for the build), else 15's
my $pg_config = $ENV{PG_CONFIG} // '/usr/lib/postgresql/15/bin/pg_config';
my ($major) = `$pg_config --version` =~ /PostgreSQL ([0-9]+)/;
# (a release candidate calls itself e.g. "PostgreSQL 19rc1")
like($out, qr/^- PostgreSQL: PostgreSQL \Q$major\E(?![0-9])/m, 'the report names the PostgreSQL version');

ok(-s $report_file, 'the report was written to --output');
ok(-s "$dir/report.tsv", 'the raw results were written next to it');

# bench/plot: the pictures from the committed data. The pictures are drawn on the host
# (PostgreSQL 15's run, where scripts/deps --all installs matplotlib); the 17 and 18 chroots carry
# PostgreSQL and its build tools only, and the plots do not depend on the major.
SKIP: {
	skip 'bench/plot: drawn in the run on the host, not in the ' . "$ENV{IDEMPOTENCY_IN_CHROOT}" . ' chroot', 19
	  if $ENV{IDEMPOTENCY_IN_CHROOT};
	my $img = "$dir/img";
	my ($plot_out, $plot_err) = ('', '');
	run [ '/usr/bin/python3', "$root/bench/plot", '--out', $img ], '<', \undef, '>', \$plot_out,
	  '2>', \$plot_err, timeout(300);
	is($? >> 8, 0, 'bench/plot exits 0') or diag("stdout:\n$plot_out\nstderr:\n$plot_err");
	for my $png (qw(sweep reap_growth batch versions)) {
		my $file = "$img/$png.png";
		ok(-f $file, "bench/plot wrote $png.png") or next;
		open my $fh, '<:raw', $file or die "$file: $!";
		read $fh, my $head, 24;
		close $fh;
		is(substr($head, 0, 8), "\x89PNG\r\n\x1a\n", "$png.png is a PNG");
		my ($w, $h) = unpack('NN', substr($head, 16, 8));
		ok($w >= 600 && $h >= 300, "$png.png is ${w}x$h pixels (at least 600x300)");
		# an empty canvas of that size is about 3 kB as a PNG, empty axes 8 kB; lines, bars and text more
		ok(-s $file > 20_000, "$png.png holds a drawing (" . (-s $file) . ' bytes)');
	}

	# The footers name the command as a reader types it in a checkout, not the paths of the
	# machine that ran it: the sweep's run recorded as if its --output was in this checkout.
	my $data = "$dir/data";
	mkdir $data or die "$data: $!";
	for my $tsv (glob "$root/docs/img/data/*.tsv") {
		open my $in, '<', $tsv or die "$tsv: $!";
		my $text = do { local $/; <$in> };
		close $in;
		$text =~ s{^command\t.*$}{command\tbench/run --sync-off --output $root/bench/results/sweep.md}m
		  if $tsv =~ m{/sweep\.meta\.tsv$};
		open my $outf, '>', "$data/" . ($tsv =~ s{.*/}{}r) or die "$data: $!";
		print $outf $text;
		close $outf;
	}
	($plot_out, $plot_err) = ('', '');
	run [ '/usr/bin/python3', "$root/bench/plot", '--results', $data, '--out', "$dir/img2" ], '<', \undef,
	  '>', \$plot_out, '2>', \$plot_err, timeout(300);
	like($plot_out, qr{^\Q$dir/img2/sweep.png\E: .*; bench/run --sync-off --output bench/results/sweep\.md;}m,
		'sweep.png footer: the command with its --output relative to the repository')
	  or diag("stdout:\n$plot_out\nstderr:\n$plot_err");
	unlike($plot_out, qr{\Q$root\E/}, "no footer names the checkout's absolute path");
}

done_testing();
