<?php
/**
 * A stock-style PHPMQ client on plain stream sockets, as php-mq/client talks (pre-TTL dialect):
 * each message is one fwrite; a 003 is read as one fread of the 8-byte message header, then
 * each packet by its 32-byte header's 29-digit length.
 *
 * Usage: php stock_client.php HOST PORT QUEUE CONTENT...
 * Sends each CONTENT to QUEUE (001), asks for them (002), reads one 003 per content, acks
 * each (004), prints each content on a line, then "ids: ID ID ...". Exit status 1 on error.
 */

declare(strict_types=1);

function fail(string $message): void
{
    fwrite(STDERR, "stock_client.php: $message\n");
    exit(1);
}

function packet(int $type, string $content): string
{
    return sprintf('P%02d%029d', $type, strlen($content)) . $content;
}

function write_all($stream, string $data): void
{
    // One fwrite, as the stock client does for a message of at most 1024 bytes.
    $written = fwrite($stream, $data);
    if ($written !== strlen($data)) {
        fail('short write: ' . var_export($written, true) . ' of ' . strlen($data));
    }
}

function read_exactly($stream, int $length): string
{
    $data = '';
    while (strlen($data) < $length) {
        $chunk = fread($stream, $length - strlen($data));
        if ($chunk === false || ($chunk === '' && feof($stream))) {
            fail('connection closed inside a message');
        }
        if ($chunk === '' && stream_get_meta_data($stream)['timed_out']) {
            fail('timed out inside a message');
        }
        $data .= $chunk;
    }
    return $data;
}

if ($argc < 5) {
    fail('usage: php stock_client.php HOST PORT QUEUE CONTENT...');
}
[, $host, $port, $queue] = $argv;
$contents = array_slice($argv, 4);

$stream = stream_socket_client("tcp://$host:$port", $errno, $errstr, 5.0);
if ($stream === false) {
    fail("cannot connect to $host:$port: $errstr ($errno)");
}
stream_set_timeout($stream, 5);

foreach ($contents as $content) {
    write_all($stream, 'H0100102' . packet(1, $queue) . packet(2, $content));
}
write_all($stream, 'H0100202' . packet(1, $queue) . packet(4, (string) count($contents)));

$ids = [];
foreach ($contents as $_) {
    $header = fread($stream, 8);  // one fread, like the stock client
    if ($header === false || strlen($header) !== 8) {
        fail('message header not read whole: ' . var_export($header, true));
    }
    if ($header !== 'H0100303') {
        fail("expected a pre-TTL 003, got header $header");
    }
    $packets = [];
    for ($i = 0; $i < 3; $i++) {
        $packetHeader = read_exactly($stream, 32);
        if ($packetHeader[0] !== 'P') {
            fail("bad packet header $packetHeader");
        }
        $packets[(int) substr($packetHeader, 1, 2)] = read_exactly(
            $stream,
            (int) substr($packetHeader, 3, 29)
        );
    }
    if (($packets[1] ?? null) !== $queue || !isset($packets[2], $packets[3])) {
        fail('unexpected packets: ' . var_export($packets, true));
    }
    echo $packets[2], "\n";
    $ids[] = $packets[3];
}

// Acks go out back to back after the batch, as the stock client sends them.
foreach ($ids as $id) {
    write_all($stream, 'H0100402' . packet(1, $queue) . packet(3, $id));
}
echo 'ids: ', implode(' ', $ids), "\n";
stream_socket_shutdown($stream, STREAM_SHUT_RDWR);
fclose($stream);
