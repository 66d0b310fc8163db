<?php
// php-memcached (Debian's php-memcached, on libmemcached) driven by the matrix:
// reads driver-protocol requests on stdin (see tests/clients/driver.py),
// answers one line each. Usage: php driver.php ascii|binary HOST PORT

[, $mode, $host, $port] = $argv;
$server = "$host:$port";
$mc = new Memcached();
$mc->setOption(Memcached::OPT_BINARY_PROTOCOL, $mode === "binary");
// libmemcached's poll timeout defaults to 1 s: a get q/t=5000 would be cut short.
$mc->setOption(Memcached::OPT_POLL_TIMEOUT, 10000);          // ms
$mc->setOption(Memcached::OPT_CONNECT_TIMEOUT, 10000);       // ms
$mc->setOption(Memcached::OPT_RECV_TIMEOUT, 10000000);       // microseconds
$mc->setOption(Memcached::OPT_SEND_TIMEOUT, 10000000);       // microseconds
$mc->setOption(Memcached::OPT_COMPRESSION, false);
$mc->addServer($host, (int) $port);

function failed(Memcached $mc, string $op): string
{
    return "error $op: " . $mc->getResultCode() . " " . $mc->getResultMessage();
}

function answer(Memcached $mc, string $server, string $op, array $args): string
{
    switch ($op) {
        case "set":
            return $mc->set(hex2bin($args[0]), hex2bin($args[1])) ? "ok" : failed($mc, $op);
        case "get":
            $data = $mc->get(hex2bin($args[0]));
            if ($data === false) {
                return $mc->getResultCode() === Memcached::RES_NOTFOUND ? "none"
                    : failed($mc, $op);
            }
            return "value " . bin2hex($data);
        case "stat":
            $stats = $mc->getStats();
            if ($stats === false) {
                return failed($mc, $op);
            }
            $name = hex2bin($args[0]);
            return isset($stats[$server][$name]) ? "value " . bin2hex((string) $stats[$server][$name])
                : "none";
        case "delete":
            return $mc->delete(hex2bin($args[0])) ? "ok" : failed($mc, $op);
        case "flush_all":
            return $mc->flush() ? "ok" : failed($mc, $op);
        case "version":
            $versions = $mc->getVersion();
            return $versions === false ? failed($mc, $op) : "value " . bin2hex($versions[$server]);
        case "quit":
            $mc->quit();
            return "ok";
    }
    return "error unknown request $op";
}

while (($line = fgets(STDIN)) !== false) {
    $args = explode(" ", rtrim($line, "\n"));
    $op = array_shift($args);
    try {
        $reply = answer($mc, $server, $op, $args);
    } catch (Throwable $e) {
        $reply = "error " . str_replace("\n", " ", $e->getMessage());
    }
    fwrite(STDOUT, "$reply\n");
    fflush(STDOUT);
    if ($op === "quit") {
        break;
    }
}
