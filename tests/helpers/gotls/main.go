// gotls: an HTTPS server and client in Go's own crypto/tls (net/http), for
// the Go TLS tests (tests/tests/tls_go.rs). Standard library only: built
// with `GO111MODULE=off go build -o gotls main.go`.
//
// gotls server -port P -cert C -key K -hs-delay-ms H -answer-delay-ms A
//
//	[-reply TEXT] [-set-cookie VALUE]
//
//	HTTP/2 over TLS by default, HTTP/1.1 to clients that offer only that.
//	Sleeps H ms inside each handshake (in tls.Config.GetConfigForClient,
//	which runs once the ClientHello is read), and A ms before each answer's
//	header. GET (any path): {"path": "...", "server_name": the SNI it got}. POST /v1/chat/completions: an
//	OpenAI-style chat completion (not streamed) for the body's "model",
//	answered as model + "-served", usage prompt_tokens = the body's length
//	% 1000, completion_tokens = 7. Prints "PORT <n>" once listening (what
//	tests/src/lib.rs HelperServer reads); serves until killed. -reply: the
//	completion's text (default "hello from go"); -set-cookie: a Set-Cookie
//	header on every answer (tests/tests/secrets.rs).
//
// gotls client -url URL -n N [-h1] [-prefix /p] [-path P] [-post-json BODY]
//
//	[-connect HOST:PORT] [-pause-ms M] [-stop-file F] [-header "Name: value"]...
//	[-expect TEXT]
//	N sequential requests on one kept-alive connection (http.Transport,
//	any certificate trusted; HTTP/2 unless -h1). Paths: prefix + "/0",
//	"/1", ...; -path: that path for every request. -post-json: POST that
//	body (application/json) instead of GET. -connect: dial that address
//	whatever the URL's host (which still goes out as the SNI and the
//	Host/:authority). -pause-ms: a wait after each request. -stop-file:
//	stop before a request once that file exists. -header (repeatable): a
//	request header. -expect: each line also says whether the answer's body
//	held TEXT ("replied").
//
//	One JSON line per request, its times (ns) by Go's monotonic clock:
//	{"path", "proto", "status", "tls_handshake_ns" (TLSHandshakeStart to
//	TLSHandshakeDone; 0 on a reused connection), "wrote_to_first_byte_ns"
//	(WroteRequest to GotFirstResponseByte), "call_ns" (the whole call, from
//	before RoundTrip to the body read and closed), "reused", "local_port",
//	"pid", "start_unix_ns" (the wall clock as the call began)}, and for a
//	chat completion answer "response_model", "input_tokens",
//	"output_tokens", "finish_reason".
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gotls server|client [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "server":
		server(os.Args[2:])
	case "client":
		client(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "gotls: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

const completionTokens = 7

func server(args []string) {
	fs := flag.NewFlagSet("server", flag.ExitOnError)
	port := fs.Int("port", 0, "port to listen on (0: any)")
	cert := fs.String("cert", "", "certificate (PEM)")
	key := fs.String("key", "", "private key (PEM)")
	hsDelay := fs.Int("hs-delay-ms", 0, "wait inside each handshake (ms)")
	answerDelay := fs.Int("answer-delay-ms", 0, "wait before each answer (ms)")
	reply := fs.String("reply", "hello from go", "the chat completion's text")
	setCookie := fs.String("set-cookie", "", "a Set-Cookie header on every answer")
	fs.Parse(args)

	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		time.Sleep(time.Duration(*answerDelay) * time.Millisecond)
		var out []byte
		if r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions" {
			out = completion(body, *reply)
		} else {
			sni := ""
			if r.TLS != nil {
				sni = r.TLS.ServerName
			}
			out, _ = json.Marshal(map[string]string{"path": r.URL.Path, "server_name": sni})
		}
		if *setCookie != "" {
			w.Header().Set("Set-Cookie", *setCookie)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		w.WriteHeader(http.StatusOK)
		w.Write(out)
	})
	srv := &http.Server{
		Handler: mux,
		TLSConfig: &tls.Config{
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				time.Sleep(time.Duration(*hsDelay) * time.Millisecond)
				return nil, nil
			},
		},
		// A client that goes away mid-handshake is no news here.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", *port))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("PORT %d\n", ln.Addr().(*net.TCPAddr).Port)
	// ServeTLS offers h2 and http/1.1 (ALPN) as net/http does by default.
	log.Fatal(srv.ServeTLS(ln, *cert, *key))
}

// completion answers an OpenAI chat completion request body.
func completion(body []byte, reply string) []byte {
	var req struct {
		Model string `json:"model"`
	}
	json.Unmarshal(body, &req)
	prompt := len(body) % 1000
	out, _ := json.Marshal(map[string]interface{}{
		"id":      "chatcmpl-go",
		"object":  "chat.completion",
		"created": 1700000000,
		"model":   req.Model + "-served",
		"choices": []interface{}{map[string]interface{}{
			"index":         0,
			"message":       map[string]string{"role": "assistant", "content": reply},
			"finish_reason": "stop",
		}},
		"usage": map[string]int{
			"prompt_tokens":     prompt,
			"completion_tokens": completionTokens,
			"total_tokens":      prompt + completionTokens,
		},
	})
	return out
}

// line is what the client prints per request.
type line struct {
	Path               string `json:"path"`
	Proto              string `json:"proto"`
	Status             int    `json:"status"`
	TLSHandshakeNs     int64  `json:"tls_handshake_ns"`
	WroteToFirstByteNs int64  `json:"wrote_to_first_byte_ns"`
	CallNs             int64  `json:"call_ns"`
	Reused             bool   `json:"reused"`
	LocalPort          int    `json:"local_port"`
	Pid                int    `json:"pid"`
	StartUnixNs        int64  `json:"start_unix_ns"`
	ResponseModel      string `json:"response_model,omitempty"`
	InputTokens        *int   `json:"input_tokens,omitempty"`
	OutputTokens       *int   `json:"output_tokens,omitempty"`
	FinishReason       string `json:"finish_reason,omitempty"`
	Replied            *bool  `json:"replied,omitempty"`
}

// headerFlags collects repeated -header flags.
type headerFlags []string

func (h *headerFlags) String() string     { return fmt.Sprint(*h) }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

func client(args []string) {
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	base := fs.String("url", "", "https://host:port")
	n := fs.Int("n", 1, "requests, one after another on one connection")
	h1 := fs.Bool("h1", false, "HTTP/1.1 only (no h2 offered)")
	prefix := fs.String("prefix", "", "paths: prefix/0, prefix/1, ...")
	fixed := fs.String("path", "", "this path for every request (instead of prefix/i)")
	postJSON := fs.String("post-json", "", "POST this JSON body instead of GET")
	connect := fs.String("connect", "", "dial this host:port instead of the URL's")
	pause := fs.Int("pause-ms", 0, "wait after each request (ms)")
	stopFile := fs.String("stop-file", "", "stop before a request once this file exists")
	var headers headerFlags
	fs.Var(&headers, "header", "a request header, \"Name: value\" (repeatable)")
	expect := fs.String("expect", "", "say whether each answer held this text")
	fs.Parse(args)

	// The common start of every time printed (monotonic: time.Since).
	t0 := time.Now()
	since := func() int64 { return int64(time.Since(t0)) }

	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		ForceAttemptHTTP2: !*h1,
		// One connection, kept alive whatever the pauses.
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     0,
	}
	if *h1 {
		// A non-nil, empty map: no h2, ALPN not offered.
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	if *connect != "" {
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, *connect)
		}
	}
	c := &http.Client{Transport: tr}
	out := json.NewEncoder(os.Stdout)
	failed := false

	for i := 0; i < *n; i++ {
		if *stopFile != "" {
			if _, err := os.Stat(*stopFile); err == nil {
				break
			}
		}
		path := *prefix + "/" + strconv.Itoa(i)
		if *fixed != "" {
			path = *fixed
		}
		method, body := http.MethodGet, io.Reader(nil)
		if *postJSON != "" {
			method, body = http.MethodPost, bytes.NewReader([]byte(*postJSON))
		}
		var hsStart, hsDone, wrote, firstByte int64
		l := line{Path: path, Pid: os.Getpid()}
		trace := &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				l.Reused = info.Reused
				if a, ok := info.Conn.LocalAddr().(*net.TCPAddr); ok {
					l.LocalPort = a.Port
				}
			},
			TLSHandshakeStart: func() { hsStart = since() },
			TLSHandshakeDone: func(tls.ConnectionState, error) {
				hsDone = since()
			},
			WroteRequest:         func(httptrace.WroteRequestInfo) { wrote = since() },
			GotFirstResponseByte: func() { firstByte = since() },
		}
		req, err := http.NewRequestWithContext(
			httptrace.WithClientTrace(context.Background(), trace), method, *base+path, body)
		if err != nil {
			log.Fatal(err)
		}
		if *postJSON != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for _, h := range headers {
			name, value, _ := strings.Cut(h, ":")
			req.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		}
		l.StartUnixNs = time.Now().UnixNano()
		start := since()
		resp, err := c.Do(req)
		if err != nil {
			log.Fatalf("%s: %v", path, err)
		}
		answer, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		l.CallNs = since() - start
		if err != nil {
			log.Fatalf("%s: reading the answer: %v", path, err)
		}
		l.Proto, l.Status = resp.Proto, resp.StatusCode
		if hsStart != 0 && hsDone >= hsStart {
			l.TLSHandshakeNs = hsDone - hsStart
		}
		if wrote != 0 && firstByte >= wrote {
			l.WroteToFirstByteNs = firstByte - wrote
		}
		if *expect != "" {
			replied := bytes.Contains(answer, []byte(*expect))
			l.Replied = &replied
		}
		var chat struct {
			Model   string `json:"model"`
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(answer, &chat) == nil && chat.Usage != nil {
			l.ResponseModel = chat.Model
			l.InputTokens = &chat.Usage.PromptTokens
			l.OutputTokens = &chat.Usage.CompletionTokens
			if len(chat.Choices) > 0 {
				l.FinishReason = chat.Choices[0].FinishReason
			}
		}
		out.Encode(l)
		if resp.StatusCode != http.StatusOK {
			failed = true
		}
		if *pause > 0 && i+1 < *n {
			time.Sleep(time.Duration(*pause) * time.Millisecond)
		}
	}
	if failed {
		fmt.Fprintln(os.Stderr, "gotls client: an answer was not 200")
		os.Exit(1)
	}
}
