# The SQLSTATE a query raises on a node, for TAP tests that check errors by code.
package IdemSqlstate;

use strict;
use warnings;
use Exporter 'import';

our @EXPORT = qw(sqlstate_of);

# The five-character SQLSTATE of the query's error, or "no error: <output>".
sub sqlstate_of
{
	my ($node, $query) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY sqlstate\n$query");
	return $err =~ /ERROR:\s+(\S{5})/ ? $1 : "no error: $out";
}

1;
