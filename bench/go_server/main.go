// go_server: the Go HTTPS server of the bench's go_https_keepalive workload
// (xtask/src/bench/go_server.rs), the Go counterpart of the bench's nginx:
// HTTP/1.1 over TLS 1.3 from net/http and crypto/tls, answering every
// request at once with nginx's body ("ok\n"), so the load is the same and
// only the server's TLS stack differs. Standard library only: built with
// `GO111MODULE=off go build -o go_server main.go`.
//
// go_server -port P -cert C -key K
//
//	Serves on 127.0.0.1:P until killed. GOMAXPROCS is left as Go sets it.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net/http"
)

var body = []byte("ok\n")

func main() {
	port := flag.Int("port", 18445, "port to listen on (127.0.0.1)")
	cert := flag.String("cert", "", "certificate (PEM)")
	key := flag.String("key", "", "private key (PEM)")
	flag.Parse()
	srv := &http.Server{
		Addr: fmt.Sprintf("127.0.0.1:%d", *port),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Set here, or net/http sniffs the body on every answer.
			w.Header().Set("Content-Type", "text/plain")
			w.Write(body)
		}),
		// TLS 1.3 only, as the bench's nginx.
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS13},
		// An empty map turns HTTP/2 off: HTTP/1.1 only, like nginx's
		// HTTPS port (wrk speaks nothing else anyway).
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	log.Fatal(srv.ListenAndServeTLS(*cert, *key))
}
