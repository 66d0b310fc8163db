// spymemcached (Debian's libspymemcached-java) driven by the matrix: reads
// driver-protocol requests on stdin (see tests/clients/driver.py), answers one
// line each. Usage: java -cp spymemcached.jar:. Driver MODE HOST PORT, where MODE
// is text or binary, with "+default-timeout" to keep the 2.5 s operation timeout.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;

import net.spy.memcached.CachedData;
import net.spy.memcached.ConnectionFactoryBuilder;
import net.spy.memcached.MemcachedClient;
import net.spy.memcached.transcoders.Transcoder;

public final class Driver {
    /** Items as raw bytes with flags 0 (the default transcoder reads flags 0 as a String). */
    static final class Raw implements Transcoder<byte[]> {
        public boolean asyncDecode(CachedData data) {
            return false;
        }

        public CachedData encode(byte[] value) {
            return new CachedData(0, value, getMaxSize());
        }

        public byte[] decode(CachedData data) {
            return data.getData();
        }

        public int getMaxSize() {
            return CachedData.MAX_SIZE;
        }
    }

    static final HexFormat HEX = HexFormat.of();
    static final Raw RAW = new Raw();

    static String unhex(String hex) {
        return new String(HEX.parseHex(hex), StandardCharsets.ISO_8859_1);
    }

    static String value(String text) {
        return "value " + HEX.formatHex(text.getBytes(StandardCharsets.ISO_8859_1));
    }

    static String check(boolean ok, String op) {
        return ok ? "ok" : "error " + op + " returned false";
    }

    static String answer(MemcachedClient mc, SocketAddress server, String op, String[] args)
            throws Exception {
        switch (op) {
            case "set":
                return check(mc.set(unhex(args[0]), 0, HEX.parseHex(args[1]), RAW).get(), op);
            case "get": {
                byte[] data = mc.get(unhex(args[0]), RAW);
                return data == null ? "none" : "value " + HEX.formatHex(data);
            }
            case "stat": {
                Map<String, String> stats = mc.getStats().get(server);
                String data = stats == null ? null : stats.get(unhex(args[0]));
                return data == null ? "none" : value(data);
            }
            case "delete":
                return check(mc.delete(unhex(args[0])).get(), op);
            case "flush_all":
                return check(mc.flush().get(), op);
            case "version":
                return value(mc.getVersions().get(server));
            case "quit":
                mc.shutdown();
                return "ok";
            default:
                return "error unknown request " + op;
        }
    }

    public static void main(String[] argv) throws Exception {
        ConnectionFactoryBuilder.Protocol protocol = argv[0].startsWith("binary")
            ? ConnectionFactoryBuilder.Protocol.BINARY : ConnectionFactoryBuilder.Protocol.TEXT;
        InetSocketAddress server = new InetSocketAddress(argv[1], Integer.parseInt(argv[2]));
        ConnectionFactoryBuilder builder = new ConnectionFactoryBuilder().setProtocol(protocol);
        if (!argv[0].endsWith("+default-timeout")) {
            // The default operation timeout is 2.5 s: a get q/t=5000 would fail.
            builder.setOpTimeout(10_000);
        }
        MemcachedClient mc = new MemcachedClient(builder.build(), List.of(server));
        BufferedReader in = new BufferedReader(
            new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        String line;
        while ((line = in.readLine()) != null) {
            String[] fields = line.split(" ");
            String reply;
            try {
                reply = answer(mc, server, fields[0], Arrays.copyOfRange(fields, 1, fields.length));
            } catch (Exception e) {
                reply = "error " + String.valueOf(e).replace('\n', ' ');
            }
            System.out.println(reply);
            System.out.flush();
            if (fields[0].equals("quit")) {
                break;
            }
        }
        // stdin closed or quit: stop, whatever the client's threads still do
        System.exit(0);
    }
}
