// BookKeeper 4.14's Java client with its TLS client settings (PEM files): creates a ledger (E3 W2 A2),
// writes N entries, closes it, reads them back, and prints "OK <ledgerId>"; on a failure prints "FAIL <error>".
// Used by tests/interop/test_bookkeeper_tls.py against quorumlog bookies.
// Args: metadataServiceUri cert key ca entries v2|v3
import java.util.Enumeration;
import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.LedgerEntry;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;

public class TlsClient {
    public static void main(String[] args) throws Exception {
        String uri = args[0], cert = args[1], key = args[2], ca = args[3];
        int n = Integer.parseInt(args[4]);
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(uri);
        conf.setProperty("tlsProviderFactoryClass", "org.apache.bookkeeper.tls.TLSContextFactory");
        conf.setProperty("tlsProvider", "JDK");
        conf.setProperty("tlsClientAuthentication", !cert.isEmpty());
        conf.setProperty("tlsKeyStoreType", "PEM");
        conf.setProperty("tlsKeyStore", key);
        conf.setProperty("tlsCertificatePath", cert);
        conf.setProperty("tlsTrustStoreType", "PEM");
        conf.setProperty("tlsTrustStore", ca);
        conf.setUseV2WireProtocol(args[5].equals("v2"));
        conf.setAddEntryTimeout(10);
        conf.setReadEntryTimeout(10);
        BookKeeper bk = new BookKeeper(conf);
        int code = 0;
        try {
            byte[] pw = "pw".getBytes();
            LedgerHandle lh = bk.createLedger(3, 2, 2, BookKeeper.DigestType.CRC32C, pw);
            for (int i = 0; i < n; i++) {
                lh.addEntry(("entry-" + i).getBytes());
            }
            lh.close();
            LedgerHandle rh = bk.openLedger(lh.getId(), BookKeeper.DigestType.CRC32C, pw);
            Enumeration<LedgerEntry> en = rh.readEntries(0, n - 1);
            int i = 0;
            while (en.hasMoreElements()) {
                String got = new String(en.nextElement().getEntry());
                if (!got.equals("entry-" + i)) {
                    throw new IllegalStateException("entry " + i + " read back as " + got);
                }
                i++;
            }
            if (i != n) {
                throw new IllegalStateException("read " + i + " entries of " + n);
            }
            rh.close();
            System.out.println("OK " + lh.getId());
        } catch (Exception e) {
            System.out.println("FAIL " + e);
            code = 1;
        } finally {
            bk.close();
        }
        System.exit(code);
    }
}
