package edge_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

const (
	ucTokAlpha = "tok-alpha-0123456789abcdef"
	ucTokBeta  = "tok-beta-0123456789abcdef"
	ucTokBad   = "tok-bad-config-0123456789"
	ucTokWrong = "tok-wrong-9876543210fedcba"
)

func ucRegisterDir() *ucDir {
	return &ucDir{recs: []domain.NodeRecord{
		{ID: "alpha", Token: ucTokAlpha, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 0, "upper")}},
		{ID: "beta", Token: ucTokBeta, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 2, "upper")}},
		{ID: "broken", Token: ucTokBad, Adapters: []domain.AdapterConfig{{Name: "x", Type: "teleport"}}},
	}}
}

func TestRegisterUseCase(t *testing.T) {
	tests := []struct {
		name string
		// first, when set, registers with this token on another link first.
		first      string
		token      string
		remote     string
		wantCode   string // "" means accepted
		wantReason func(string) bool
		wantNode   string // node id on the published event
	}{
		{name: "accepted", token: ucTokAlpha, remote: "10.0.0.1:5000", wantNode: "alpha"},
		{name: "unknown token", token: ucTokWrong, remote: "10.0.0.2:5000", wantCode: domain.CodeUnknownToken,
			wantReason: func(r string) bool { return r == "unknown_token" }},
		{name: "empty token", token: "", remote: "10.0.0.2:5001", wantCode: domain.CodeUnknownToken,
			wantReason: func(r string) bool { return r == "unknown_token" }},
		{name: "duplicate connection", first: ucTokAlpha, token: ucTokAlpha, remote: "10.0.0.3:5000", wantCode: domain.CodeDuplicateConn,
			wantReason: func(r string) bool { return r == "duplicate_connection" }, wantNode: "alpha"},
		{name: "config error", token: ucTokBad, remote: "10.0.0.4:5000", wantCode: domain.CodeConfigError,
			wantReason: func(r string) bool { return strings.HasPrefix(r, "config_error") && strings.Contains(r, "teleport") }, wantNode: "broken"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir, reg, bus := ucRegisterDir(), edge.NewRegistry(), newUCBus()
			versions := &edge.ConfigVersions{}
			h := edge.NewRegisterHandler(dir, reg, bus, versions, nil)

			var firstLink *ucLink
			var firstCfg domain.NodeConfig
			if tc.first != "" {
				firstLink = &ucLink{id: "first"}
				var err error
				if firstCfg, err = h.Register(context.Background(), tc.first, domain.NodeInfo{}, "10.9.9.9:1", firstLink); err != nil {
					t.Fatalf("first register: %v", err)
				}
			}
			before := versions.Next()
			link := &ucLink{id: "second"}
			cfg, err := h.Register(context.Background(), tc.token, domain.NodeInfo{Version: "1.2.3", Hostname: "h", AdapterTypes: []string{"exec", "ollama"}}, tc.remote, link)

			if got := ucCode(err); got != tc.wantCode {
				t.Fatalf("Register error = %v (code %q), want code %q", err, got, tc.wantCode)
			}
			evs := bus.all()
			last := evs[len(evs)-1]
			if tc.wantCode == "" {
				if cfg.NodeID != "alpha" || len(cfg.Adapters) != 1 || cfg.Adapters[0].MaxConcurrency != domain.DefaultMaxConcurrency {
					t.Fatalf("config = %+v, want alpha's exec adapter with the default concurrency", cfg)
				}
				if cfg.Version <= before {
					t.Fatalf("config version %d is not above the last handed out (%d)", cfg.Version, before)
				}
				n, ok := reg.Get("alpha")
				if !ok || n.Link != link || n.Remote != tc.remote || n.Info.Version != "1.2.3" || n.Config.Version != cfg.Version {
					t.Fatalf("registry entry = %+v, %v; want alpha on the new link with the pushed config", n, ok)
				}
				if last.Type != domain.BusNodeRegistered || last.Node != "alpha" || last.Remote != tc.remote {
					t.Fatalf("last bus event = %+v, want node.registered for alpha from %s", last, tc.remote)
				}
			} else {
				if cfg.NodeID != "" || len(cfg.Adapters) != 0 {
					t.Fatalf("rejected register returned config %+v", cfg)
				}
				if last.Type != domain.BusNodeRejected || last.Node != tc.wantNode || last.Remote != tc.remote || !tc.wantReason(last.Reason) {
					t.Fatalf("last bus event = %+v, want node.rejected for %q from %s with the reason", last, tc.wantNode, tc.remote)
				}
				if !tc.wantReason(err.Error()) {
					t.Fatalf("error text %q does not carry the reason", err.Error())
				}
				if n, ok := reg.Get(tc.wantNode); firstLink == nil && ok {
					t.Fatalf("rejected node is in the registry: %+v", n)
				}
			}
			if firstLink != nil {
				n, ok := reg.Get("alpha")
				if !ok || n.Link != firstLink || n.Config.Version != firstCfg.Version {
					t.Fatalf("live connection was disturbed: %+v, %v", n, ok)
				}
				if _, _, _, _, _, closes := firstLink.snapshot(); len(closes) != 0 {
					t.Fatalf("live link was closed: %v", closes)
				}
				if got := len(reg.List()); got != 1 {
					t.Fatalf("registry has %d nodes, want 1", got)
				}
			}
			// Tokens never leave the directory: not on the bus, not in errors.
			for _, tok := range []string{ucTokAlpha, ucTokBeta, ucTokBad, ucTokWrong} {
				for _, ev := range evs {
					if s := fmt.Sprintf("%#v", ev); strings.Contains(s, tok) {
						t.Fatalf("bus event carries a token: %s", s)
					}
				}
				if err != nil && strings.Contains(err.Error(), tok) {
					t.Fatalf("error carries a token: %v", err)
				}
			}
		})
	}
}

func TestRegisterDirectoryFailureIsUnknownToken(t *testing.T) {
	dir := ucRegisterDir()
	dir.authErr = errors.New("directory unavailable")
	bus := newUCBus()
	h := edge.NewRegisterHandler(dir, edge.NewRegistry(), bus, &edge.ConfigVersions{}, nil)
	_, err := h.Register(context.Background(), ucTokAlpha, domain.NodeInfo{}, "r", &ucLink{})
	if !errors.Is(err, domain.ErrUnknownToken) {
		t.Fatalf("err = %v, want unknown_token", err)
	}
	if got := bus.ofType(domain.BusNodeRejected); len(got) != 1 || got[0].Reason != "unknown_token" {
		t.Fatalf("rejections = %+v", got)
	}
}

func TestRegisterConfigVersionsIncrease(t *testing.T) {
	dir, reg, bus := ucRegisterDir(), edge.NewRegistry(), newUCBus()
	h := edge.NewRegisterHandler(dir, reg, bus, &edge.ConfigVersions{}, nil)
	var last uint64
	for i := range 3 {
		link := &ucLink{id: fmt.Sprint(i)}
		cfg, err := h.Register(context.Background(), ucTokAlpha, domain.NodeInfo{}, "r", link)
		if err != nil {
			t.Fatalf("register #%d: %v", i, err)
		}
		if cfg.Version <= last {
			t.Fatalf("register #%d got version %d after %d", i, cfg.Version, last)
		}
		last = cfg.Version
		h.Disconnected("alpha", link, "bye")
	}
}

// ucStep is one lifecycle call in a Disconnected scenario: register the
// link numbered link, or report it disconnected.
type ucStep struct {
	register bool
	link     int
}

func TestRegisterDisconnected(t *testing.T) {
	tests := []struct {
		name             string
		steps            []ucStep
		wantLink         int // link serving alpha at the end; 0: none
		wantDisconnected int // node.disconnected events published
	}{
		{name: "disconnect removes the node",
			steps: []ucStep{{true, 1}, {false, 1}}, wantLink: 0, wantDisconnected: 1},
		{name: "a second disconnect of the same link is silent",
			steps: []ucStep{{true, 1}, {false, 1}, {false, 1}}, wantLink: 0, wantDisconnected: 1},
		{name: "a link that never registered evicts nothing",
			steps: []ucStep{{true, 1}, {false, 2}}, wantLink: 1, wantDisconnected: 0},
		{name: "stale disconnect after a reconnect keeps the new link",
			steps: []ucStep{{true, 1}, {false, 1}, {true, 2}, {false, 1}}, wantLink: 2, wantDisconnected: 1},
		{name: "the rejected duplicate's disconnect keeps the live link",
			steps: []ucStep{{true, 1}, {true, 2}, {false, 2}}, wantLink: 1, wantDisconnected: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg, bus := edge.NewRegistry(), newUCBus()
			h := edge.NewRegisterHandler(ucRegisterDir(), reg, bus, &edge.ConfigVersions{}, nil)
			links := map[int]*ucLink{}
			link := func(i int) *ucLink {
				if links[i] == nil {
					links[i] = &ucLink{id: fmt.Sprint(i)}
				}
				return links[i]
			}
			for _, s := range tc.steps {
				if s.register {
					_, _ = h.Register(context.Background(), ucTokAlpha, domain.NodeInfo{}, "r", link(s.link))
				} else {
					h.Disconnected("alpha", link(s.link), fmt.Sprintf("link %d lost", s.link))
				}
			}
			n, ok := reg.Get("alpha")
			switch {
			case tc.wantLink == 0 && ok:
				t.Fatalf("alpha still registered on %v", n.Link)
			case tc.wantLink != 0 && (!ok || n.Link != link(tc.wantLink)):
				t.Fatalf("alpha registered = %v on %v, want link %d", ok, n.Link, tc.wantLink)
			}
			got := bus.ofType(domain.BusNodeDisconnected)
			if len(got) != tc.wantDisconnected {
				t.Fatalf("node.disconnected published %d times, want %d: %s", len(got), tc.wantDisconnected, ucDescribe(bus.all()))
			}
			for _, ev := range got {
				if ev.Node != "alpha" || ev.Reason != "link 1 lost" {
					t.Fatalf("disconnect event = %+v, want alpha with the first link's reason", ev)
				}
			}
			// The node list says the same of an offline alpha; a stale
			// disconnect changes nothing.
			for _, e := range edge.NewListNodesHandler(ucRegisterDir(), reg).ListAs(domain.Anonymous()) {
				if e.View.ID != "alpha" {
					continue
				}
				switch {
				case e.Connected && e.DisconnectReason != "":
					t.Fatalf("connected alpha lists a disconnect reason %q", e.DisconnectReason)
				case !e.Connected && tc.wantDisconnected > 0 && (e.DisconnectReason != "link 1 lost" || e.DisconnectedAt.IsZero()):
					t.Fatalf("offline alpha: left %v, reason %q; want the first link's", e.DisconnectedAt, e.DisconnectReason)
				}
			}
		})
	}
}

func TestRegisterHandshakeFailed(t *testing.T) {
	reg, bus := edge.NewRegistry(), newUCBus()
	h := edge.NewRegisterHandler(ucRegisterDir(), reg, bus, &edge.ConfigVersions{}, nil)
	h.HandshakeFailed("192.0.2.7:4444", "malformed frame")
	got := bus.all()
	if len(got) != 1 || got[0].Type != domain.BusNodeRejected || got[0].Remote != "192.0.2.7:4444" || got[0].Reason != "malformed frame" || got[0].Node != "" {
		t.Fatalf("bus = %+v, want one node.rejected with the remote and reason", got)
	}
	if len(reg.List()) != 0 {
		t.Fatal("a failed handshake admitted a node")
	}
}

// With BindIdentity the verified client certificate must name the node the
// token belongs to; the transport hands the names over as plain data.
func TestRegisterBindsCertificateIdentity(t *testing.T) {
	tests := []struct {
		name     string
		peer     domain.PeerIdentity
		wantCode string
	}{
		{"cn names the node", domain.PeerIdentity{Encrypted: true, CertNames: []string{"alpha"}}, ""},
		{"dns san names the node", domain.PeerIdentity{Encrypted: true, CertNames: []string{"something", "alpha"}}, ""},
		{"certificate for another node", domain.PeerIdentity{Encrypted: true, CertNames: []string{"beta"}}, domain.CodeIdentityMismatch},
		{"no client certificate", domain.PeerIdentity{Encrypted: true}, domain.CodeIdentityMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg, bus := edge.NewRegistry(), newUCBus()
			h := edge.NewRegisterHandler(ucRegisterDir(), reg, bus, &edge.ConfigVersions{}, nil)
			h.BindIdentity = true
			_, err := h.Register(context.Background(), ucTokAlpha, domain.NodeInfo{Peer: tc.peer}, "10.0.0.9:1", &ucLink{id: "l"})
			if got := ucCode(err); got != tc.wantCode {
				t.Fatalf("Register = %v (code %q), want code %q", err, got, tc.wantCode)
			}
			_, admitted := reg.Get("alpha")
			if admitted != (tc.wantCode == "") {
				t.Fatalf("admitted = %v, want %v", admitted, tc.wantCode == "")
			}
			if tc.wantCode != "" {
				evs := bus.all()
				last := evs[len(evs)-1]
				if last.Type != domain.BusNodeRejected || last.Node != "alpha" || !strings.HasPrefix(last.Reason, domain.CodeIdentityMismatch) {
					t.Fatalf("last bus event = %+v, want node.rejected alpha identity_mismatch", last)
				}
			}
		})
	}
	// Without BindIdentity a certificate naming another node does not matter.
	h := edge.NewRegisterHandler(ucRegisterDir(), edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}, nil)
	if _, err := h.Register(context.Background(), ucTokAlpha, domain.NodeInfo{Peer: domain.PeerIdentity{CertNames: []string{"beta"}}}, "10.0.0.9:2", &ucLink{id: "l"}); err != nil {
		t.Fatalf("Register without BindIdentity: %v", err)
	}
}

// ucOversizedLink is a link whose register response could not carry the
// node's config (transport's edgeLink.ConfigFits).
type ucOversizedLink struct{ *ucLink }

func (ucOversizedLink) ConfigFits(domain.NodeConfig) error {
	return domain.Errorf(domain.CodeConfigError, "the node's config does not fit in one link frame: raise transport.max_frame_size")
}

// A config the link cannot send refuses the registration as a
// config_error, before the node is admitted: it used to be admitted,
// counted and announced as registered, then cut off, at every retry.
func TestRegisterRefusesAConfigTheLinkCannotSend(t *testing.T) {
	dir, reg, bus := ucRegisterDir(), edge.NewRegistry(), newUCBus()
	h := edge.NewRegisterHandler(dir, reg, bus, &edge.ConfigVersions{}, nil)
	_, err := h.Register(context.Background(), ucTokAlpha, domain.NodeInfo{AdapterTypes: []string{"exec", "ollama"}}, "10.0.0.1:5000", ucOversizedLink{&ucLink{id: "big"}})
	if ucCode(err) != domain.CodeConfigError || !strings.Contains(err.Error(), "max_frame_size") {
		t.Fatalf("Register = %v, want the link's config_error", err)
	}
	if _, ok := reg.Get("alpha"); ok {
		t.Fatal("the node was admitted")
	}
	for _, ev := range bus.all() {
		if ev.Type == domain.BusNodeRegistered {
			t.Fatalf("announced as registered: %+v", ev)
		}
	}
}

// A node whose link ends after it said it was stopping left as it meant
// to, and its disconnect reason says so; one that did not say so — a
// reload's drain mark is not its word — keeps the link's reason alone. A
// routine restart read as a crash did.
func TestRegisterDisconnectedAfterDraining(t *testing.T) {
	reg, bus := edge.NewRegistry(), newUCBus()
	h := edge.NewRegisterHandler(ucRegisterDir(), reg, bus, &edge.ConfigVersions{}, nil)
	for i, mark := range []string{"node", "none", "reload"} {
		link := &ucLink{id: fmt.Sprint(i)}
		if _, err := h.Register(context.Background(), ucTokAlpha, domain.NodeInfo{}, "r", link); err != nil {
			t.Fatal(err)
		}
		switch mark {
		case "node":
			h.Draining("alpha", link)
		case "reload":
			reg.MarkDraining("alpha", link)
		}
		h.Disconnected("alpha", link, "peer closed the connection: EOF")
		got := bus.ofType(domain.BusNodeDisconnected)
		want := "peer closed the connection: EOF"
		if mark == "node" {
			want = edge.StoppedReason + ": " + want
		}
		if len(got) != i+1 || got[i].Reason != want {
			t.Fatalf("drain mark %s: node.disconnected events %+v, want the last with reason %q", mark, got, want)
		}
	}
}
