// Java's own HTTPS client (java.net.http.HttpClient over JSSE, TLS in Java
// itself: no library the observer can probe) making --requests GET requests
// on one kept-alive connection to https://127.0.0.1:PORT/, trusting any
// certificate. -Djdk.tls.client.protocols=TLSv1.2 holds it to TLS 1.2.
//
// Prints one JSON line per request: {"path", "ms"}: a timer around the call
// (System.nanoTime, from just before send() to its return, body read), the
// first call's including the connect and the handshake.
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.security.SecureRandom;
import java.security.cert.X509Certificate;
import java.net.Socket;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.TrustManager;
import javax.net.ssl.X509ExtendedTrustManager;

public class TlsClient {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        int requests = Integer.parseInt(args[1]);
        String prefix = args[2];
        // An extended trust manager: JSSE then checks no host name either.
        TrustManager[] any = {
            new X509ExtendedTrustManager() {
                public void checkClientTrusted(X509Certificate[] c, String a) {}

                public void checkServerTrusted(X509Certificate[] c, String a) {}

                public void checkClientTrusted(X509Certificate[] c, String a, Socket s) {}

                public void checkServerTrusted(X509Certificate[] c, String a, Socket s) {}

                public void checkClientTrusted(X509Certificate[] c, String a, SSLEngine e) {}

                public void checkServerTrusted(X509Certificate[] c, String a, SSLEngine e) {}

                public X509Certificate[] getAcceptedIssuers() {
                    return new X509Certificate[0];
                }
            }
        };
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(null, any, new SecureRandom());
        HttpClient client = HttpClient.newBuilder()
                .sslContext(ctx)
                .version(HttpClient.Version.HTTP_1_1)
                .build();
        for (int i = 0; i < requests; i++) {
            String path = "/" + prefix + "/" + i;
            HttpRequest req = HttpRequest.newBuilder(URI.create("https://127.0.0.1:" + port + path)).build();
            long t0 = System.nanoTime();
            HttpResponse<String> r = client.send(req, HttpResponse.BodyHandlers.ofString());
            double ms = (System.nanoTime() - t0) / 1e6;
            if (r.statusCode() != 200) {
                throw new RuntimeException(path + ": status " + r.statusCode());
            }
            System.out.println("{\"path\": \"" + path + "\", \"ms\": " + ms + "}");
        }
    }
}
