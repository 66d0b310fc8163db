#!/usr/bin/perl
# Cache::Memcached (Debian's libcache-memcached-perl) driven by the matrix:
# reads driver-protocol requests on stdin (see tests/clients/driver.py),
# answers one line each. Usage: driver.pl HOST PORT
use strict;
use warnings;
use Cache::Memcached;

my ($host, $port) = @ARGV;
my $server = "$host:$port";
# select_timeout defaults to 1 s: a get q/t=5000 would be cut short.
my $mc = Cache::Memcached->new({servers => [$server], select_timeout => 10,
                                connect_timeout => 10});
$| = 1;

sub unhex { return pack("H*", $_[0] // "") }
sub value { return "value " . unpack("H*", $_[0]) }

sub answer {
    my ($op, @args) = @_;
    if ($op eq "set") {
        return $mc->set(unhex($args[0]), unhex($args[1])) ? "ok" : "error set returned false";
    } elsif ($op eq "get") {
        my $data = $mc->get(unhex($args[0]));
        return defined $data ? value($data) : "none";
    } elsif ($op eq "stat") {
        my $stats = $mc->stats(["misc"]);
        my $data = $stats->{hosts}{$server}{misc}{unhex($args[0])};
        return defined $data ? value($data) : "none";
    } elsif ($op eq "delete") {
        return $mc->delete(unhex($args[0])) ? "ok" : "error delete returned false";
    } elsif ($op eq "flush") {
        # run_command sends a line the client has no call for and reads up to END
        my @lines = $mc->run_command($mc->sock_to_host($server),
                                     "flush " . unhex($args[0]) . "\r\n");
        return "@lines" eq "END\r\n" ? "ok" : "error flush answered @lines";
    } elsif ($op eq "flush_all") {
        return $mc->flush_all ? "ok" : "error flush_all returned false";
    } elsif ($op eq "quit") {
        $mc->disconnect_all;
        return "ok";
    }
    return "error unknown request $op";
}

while (my $line = <STDIN>) {
    chomp $line;
    my ($op, @args) = split / /, $line;
    my $reply = eval { answer($op, @args) };
    $reply = "error " . ($@ =~ s/\s+/ /gr) unless defined $reply;
    print "$reply\n";
    last if $op eq "quit";
}
