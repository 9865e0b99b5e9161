package node_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"iop/adapters/provider"
	"iop/application/node"
	"iop/domain"
)

// rawProvider answers one request on a raw socket with resp, so the
// response can hold what net/http's server would not write itself; it
// hands back the request head it read.
func rawProvider(t *testing.T, resp string) (url string, head <-chan []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(ucWait))
		br := bufio.NewReader(c)
		var h []byte
		for {
			line, err := br.ReadBytes('\n')
			h = append(h, line...)
			if err != nil || bytes.Equal(line, []byte("\r\n")) {
				break
			}
		}
		got <- h
		_, _ = c.Write([]byte(resp))
	}()
	return "http://" + ln.Addr().String(), got
}

// A provider's header value may hold bytes 0x80-0xFF (obs-text: legal
// HTTP, passed by Go's parsers) that are not UTF-8, and so may a caller's.
// The node relays both byte for byte, over either provider client path;
// carrying them on the link is the transport's part (Header.values are
// bytes, adapters/transport headers_test.go).
func TestTunnelRelaysHeaderBytesThatAreNotUTF8(t *testing.T) {
	for _, opt := range []provider.Options{{TransportOnly: false}, {TransportOnly: true}} {
		name := "lean client"
		if opt.TransportOnly {
			name = "net/http transport"
		}
		t.Run(name, func(t *testing.T) {
			url, head := rawProvider(t, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Upstream: caf\xe9\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			prov := domain.ProviderConfig{Name: "raw", Type: domain.ProviderOpenAI, BaseURL: url}
			rt := node.NewRuntime(tnFactory{}, nil)
			if err := rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 1, Providers: []domain.ProviderConfig{prov}}); err != nil {
				t.Fatal(err)
			}
			c := provider.New(opt)
			defer c.Close()
			sink := &tnSink{}
			req := domain.TunnelRequest{Provider: "raw", Method: http.MethodGet, Path: "/v1/models", Header: domain.Header{"X-Caller": {"caf\xe9"}}}
			node.NewTunnelHandler(rt, c, nil).OpenTunnel(context.Background(), req, nil, sink)
			if got, want := sink.kinds(), "status,header,body,end"; got != want {
				t.Fatalf("frames = %s, want %s (%+v)", got, want, sink.frames)
			}
			if v := sink.frames[1].Header["X-Upstream"]; len(v) != 1 || v[0] != "caf\xe9" {
				t.Errorf("X-Upstream relayed as %q, want %q", v, "caf\xe9")
			}
			if sink.body() != "ok" {
				t.Errorf("body %q", sink.body())
			}
			select {
			case h := <-head:
				if !bytes.Contains(h, []byte("\r\nX-Caller: caf\xe9\r\n")) {
					t.Errorf("provider got request head %q, without X-Caller: caf\\xe9", h)
				}
			case <-time.After(ucWait):
				t.Fatal("provider got no request")
			}
		})
	}
}

// An Anthropic stream states its prompt's tokens in message_start, which
// the provider bills whether or not the stream then ends well. When the
// provider's connection breaks mid-stream, the tunnel still reports the
// usage read so far before its error, so the edge records what was spent.
func TestTunnelBrokenStreamReportsUsageReadSoFar(t *testing.T) {
	event := "event: message_start\ndata: " +
		`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"usage":{"input_tokens":1200,"cache_read_input_tokens":300,"output_tokens":1}}}` + "\n\n"
	// A chunked body whose connection closes before its last chunk.
	resp := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(event), event)
	for _, opt := range []provider.Options{{TransportOnly: false}, {TransportOnly: true}} {
		url, _ := rawProvider(t, resp)
		prov := domain.ProviderConfig{Name: "claude", Type: domain.ProviderAnthropic, BaseURL: url}
		rt := node.NewRuntime(tnFactory{}, nil)
		if err := rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 1, Providers: []domain.ProviderConfig{prov}}); err != nil {
			t.Fatal(err)
		}
		c := provider.New(opt)
		sink := &tnSink{}
		req := domain.TunnelRequest{Provider: "claude", Method: http.MethodPost, Path: "/v1/messages", Body: []byte(`{"model":"claude-x","stream":true}`)}
		node.NewTunnelHandler(rt, c, nil).OpenTunnel(context.Background(), req, nil, sink)
		c.Close()
		if got, want := sink.kinds(), "status,header,body,usage,error"; got != want {
			t.Fatalf("transport only %v: frames = %s, want %s", opt.TransportOnly, got, want)
		}
		if u := sink.frames[3].Usage; u.PromptTokens != 1500 || u.Model != "claude-x" {
			t.Errorf("transport only %v: usage %+v, want 1500 prompt tokens of claude-x", opt.TransportOnly, u)
		}
		if e := sink.last().Error; e.Code != domain.CodeProviderError {
			t.Errorf("transport only %v: error %+v, want provider_error", opt.TransportOnly, e)
		}
	}
}
