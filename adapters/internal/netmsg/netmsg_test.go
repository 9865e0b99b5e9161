package netmsg_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/adapters/internal/netmsg"
)

// Real failures from real sockets: the description names the failure and
// never the address.
func TestDescribeHidesTheAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/models", nil)
	_, err = http.DefaultClient.Do(req)
	if err == nil {
		t.Fatal("request to a closed port succeeded")
	}
	if !strings.Contains(err.Error(), port) {
		t.Fatalf("the raw error should name the port, else this test proves nothing: %v", err)
	}
	got := netmsg.Describe(err)
	if got != "provider unreachable: connection refused" || strings.Contains(got, port) || strings.Contains(got, "127.0.0.1") {
		t.Fatalf("Describe = %q", got)
	}

	// A server that closes the connection without answering.
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.Addr().String()+"/", nil)
	_, err = http.DefaultClient.Do(req)
	if err == nil {
		t.Fatal("request to a closing server succeeded")
	}
	if got := netmsg.Describe(err); strings.Contains(got, "127.0.0.1") || !strings.Contains(got, "provider") {
		t.Fatalf("Describe(%v) = %q", err, got)
	}
}
