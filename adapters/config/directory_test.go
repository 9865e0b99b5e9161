package config_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/adapters/config"
	"iop/domain"
)

func sampleRecords() []domain.NodeRecord {
	return []domain.NodeRecord{
		{
			ID: "a", Token: "token-aaaa",
			Adapters: []domain.AdapterConfig{{
				Name: "exec", Type: domain.AdapterExec, Models: []string{"m"},
				Targets: map[string]domain.ExecTarget{"t": {Command: []string{"echo"}, Env: map[string]string{"K": "V"}, Timeout: time.Second}},
			}},
			Providers: []domain.ProviderConfig{{Name: "p", Type: domain.ProviderOllama, BaseURL: "http://x", Models: []string{"m"}}},
		},
		{ID: "b", Token: "token-bbbb-longer"},
		{ID: "c", Token: ""}, // a record that must never authenticate
	}
}

func TestDirectoryAuthenticate(t *testing.T) {
	d := config.NewDirectory(sampleRecords())
	tests := []struct {
		name    string
		token   string
		wantID  string
		wantErr bool
	}{
		{"first", "token-aaaa", "a", false},
		{"second, other length", "token-bbbb-longer", "b", false},
		{"unknown", "token-cccc", "", true},
		{"prefix of a token", "token-aaa", "", true},
		{"token with suffix", "token-aaaaX", "", true},
		{"empty matches no empty record", "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := d.Authenticate(tt.token)
			if tt.wantErr {
				if !errors.Is(err, domain.ErrUnknownToken) {
					t.Fatalf("Authenticate err = %v, want ErrUnknownToken", err)
				}
				if domain.CodeOf(err) != domain.CodeUnknownToken {
					t.Errorf("CodeOf = %q", domain.CodeOf(err))
				}
				if tt.token != "" && strings.Contains(err.Error(), tt.token) {
					t.Errorf("error %q reveals the presented token", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Authenticate: %v", err)
			}
			if r.ID != tt.wantID {
				t.Errorf("ID = %q, want %q", r.ID, tt.wantID)
			}
		})
	}
}

func TestDirectoryCopies(t *testing.T) {
	in := sampleRecords()
	d := config.NewDirectory(in)
	in[0].Adapters[0].Targets["t"].Env["K"] = "mutated input"

	r, err := d.Authenticate("token-aaaa")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Adapters[0].Targets["t"].Env["K"]; got != "V" {
		t.Fatalf("directory shares maps with its input: K = %q", got)
	}
	r.Adapters[0].Targets["t"].Command[0] = "mutated"
	r.Adapters[0].Models[0] = "mutated"
	r.Providers[0].Models[0] = "mutated"

	recs := d.Records()
	recs[0].ID = "mutated"
	recs[0].Adapters[0].Targets["t"] = domain.ExecTarget{}

	l, ok := d.Lookup("a")
	if !ok {
		t.Fatal("Lookup(a) not found")
	}
	if l.Adapters[0].Targets["t"].Command[0] != "echo" || l.Adapters[0].Models[0] != "m" || l.Providers[0].Models[0] != "m" {
		t.Errorf("directory was changed through a returned record: %+v", l)
	}
	if got := d.Records(); got[0].ID != "a" || len(got) != 3 {
		t.Errorf("Records() = %+v", got)
	}
}

func TestDirectoryLookup(t *testing.T) {
	d := config.NewDirectory(sampleRecords())
	if r, ok := d.Lookup("b"); !ok || r.ID != "b" {
		t.Errorf("Lookup(b) = %+v, %v", r, ok)
	}
	if _, ok := d.Lookup("zzz"); ok {
		t.Error("Lookup(zzz) found a record")
	}
}

func TestDirectoryReplace(t *testing.T) {
	d := config.NewDirectory(sampleRecords())
	d.Replace([]domain.NodeRecord{{ID: "b", Token: "rotated-token"}, {ID: "d", Token: "token-dddd"}})

	if _, err := d.Authenticate("token-aaaa"); !errors.Is(err, domain.ErrUnknownToken) {
		t.Errorf("removed node still authenticates: %v", err)
	}
	if _, err := d.Authenticate("token-bbbb-longer"); !errors.Is(err, domain.ErrUnknownToken) {
		t.Errorf("old token still authenticates: %v", err)
	}
	if r, err := d.Authenticate("rotated-token"); err != nil || r.ID != "b" {
		t.Errorf("rotated token: %+v, %v", r, err)
	}
	if r, err := d.Authenticate("token-dddd"); err != nil || r.ID != "d" {
		t.Errorf("added node: %+v, %v", r, err)
	}
	if _, ok := d.Lookup("a"); ok {
		t.Error("Lookup finds a removed node")
	}
	if n := len(d.Records()); n != 2 {
		t.Errorf("len(Records()) = %d, want 2", n)
	}

	d.Replace(nil)
	if _, err := d.Authenticate("token-dddd"); !errors.Is(err, domain.ErrUnknownToken) {
		t.Errorf("empty directory authenticates: %v", err)
	}
}

func TestDirectoryConcurrentReplace(t *testing.T) {
	d := config.NewDirectory(sampleRecords())
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 200 {
				if i == 0 {
					d.Replace([]domain.NodeRecord{{ID: "a", Token: "token-aaaa"}, {ID: fmt.Sprint("n", j), Token: fmt.Sprint("token-", j, "-xxxx")}})
					continue
				}
				if r, err := d.Authenticate("token-aaaa"); err != nil || r.ID != "a" {
					t.Errorf("Authenticate during Replace: %+v, %v", r, err)
					return
				}
				_ = d.Records()
				_, _ = d.Lookup("a")
			}
		})
	}
	wg.Wait()
}

func TestDirectoryStringHasNoTokens(t *testing.T) {
	d := config.NewDirectory(sampleRecords())
	for _, s := range []string{d.String(), fmt.Sprint(d), fmt.Sprintf("%+v", d)} {
		if strings.Contains(s, "token-") {
			t.Errorf("%q reveals a token", s)
		}
	}
	if got := d.String(); got != `Directory["a" "b" "c"]` {
		t.Errorf("String() = %s", got)
	}
}

func TestDirectoryFromEdgeConfig(t *testing.T) {
	t.Setenv("IOP_TEST_DIR_TOKEN", "from-environment")
	c, err := config.ParseEdge("edge.yaml", []byte("nodes:\n  - {id: a, token: literal-token}\n  - {id: b, token_env: IOP_TEST_DIR_TOKEN}\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := config.NewDirectory(c.Records())
	for tok, id := range map[string]string{"literal-token": "a", "from-environment": "b"} {
		if r, err := d.Authenticate(tok); err != nil || r.ID != id {
			t.Errorf("Authenticate(%s…) = %+v, %v; want node %s", tok[:3], r.ID, err, id)
		}
	}
}

// token_sha256 authenticates the token it is the digest of, like a literal
// token, and the edge holds no secret for that node.
func TestDirectoryTokenSHA256(t *testing.T) {
	digest := config.TokenHash("hashed-token-123")
	c, err := config.ParseEdge("edge.yaml", []byte("nodes:\n  - {id: a, token: literal-token}\n  - {id: h, token_sha256: "+strings.ToUpper(digest)+"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	recs := c.Records()
	if recs[1].Token != "" || recs[1].TokenSHA256 != digest {
		t.Fatalf("record of the hashed node = %+v, want only the (lower-case) digest", recs[1])
	}
	d := config.NewDirectory(recs)
	if r, err := d.Authenticate("hashed-token-123"); err != nil || r.ID != "h" {
		t.Fatalf("Authenticate(hashed token) = %q, %v; want node h", r.ID, err)
	}
	for _, wrong := range []string{"", digest, "hashed-token-124"} {
		if r, err := d.Authenticate(wrong); err == nil {
			t.Fatalf("Authenticate(%q) matched node %s", wrong, r.ID)
		}
	}
}

// A node's token read from token_env, given literally, or given as its
// token_sha256 (either case, with or without key_sha256's "sha256:"
// prefix) makes records that accept the same token, so a reload that
// switches between these forms keeps the node (NodeRecord.SameToken).
func TestRecordsOfOneTokenGivenThreeWaysMatch(t *testing.T) {
	const tok = "env-token-0123456789"
	t.Setenv("IOP_TEST_NODE_TOKEN", tok)
	var recs []domain.NodeRecord
	for _, entry := range []string{
		"{id: a, token: " + tok + "}",
		"{id: a, token_env: IOP_TEST_NODE_TOKEN}",
		"{id: a, token_sha256: " + strings.ToUpper(config.TokenHash(tok)) + "}",
		"{id: a, token_sha256: sha256:" + config.TokenHash(tok) + "}",
		"{id: a, token_sha256: SHA256:" + strings.ToUpper(config.TokenHash(tok)) + "}",
	} {
		c, err := config.ParseEdge("edge.yaml", []byte("nodes:\n  - "+entry+"\n"))
		if err != nil {
			t.Fatalf("%s: %v", entry, err)
		}
		recs = append(recs, c.Records()[0])
	}
	for i := range recs {
		for j := range recs {
			if !recs[i].SameToken(recs[j]) {
				t.Fatalf("records %+v and %+v of one token do not match", recs[i], recs[j])
			}
		}
		if _, err := config.NewDirectory(recs[i : i+1]).Authenticate(tok); err != nil {
			t.Fatalf("record %+v does not authenticate its token: %v", recs[i], err)
		}
	}
}

// A NodeEntry built in code, not parsed from YAML, takes token_sha256 with
// the "sha256:" prefix too: the prefix is dropped where the digest is read,
// not by a rewrite only ParseEdge did.
func TestNodeEntryBuiltInCodeTakesSHA256Prefix(t *testing.T) {
	const tok = "code-built-token-0123"
	c := &config.EdgeConfig{Nodes: []config.NodeEntry{{ID: "a", TokenSHA256: "SHA256:" + strings.ToUpper(config.TokenHash(tok))}}}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	recs := c.Records()
	if recs[0].TokenSHA256 != config.TokenHash(tok) {
		t.Fatalf("record digest = %q, want the bare lower-case %q", recs[0].TokenSHA256, config.TokenHash(tok))
	}
	if r, err := config.NewDirectory(recs).Authenticate(tok); err != nil || r.ID != "a" {
		t.Fatalf("Authenticate = %q, %v; want node a", r.ID, err)
	}
}
