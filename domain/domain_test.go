package domain_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/domain"
)

// A run, session or node id is also a URL path segment: "." and ".." are
// refused there, and allowed where an id never is one.
func TestCheckPathID(t *testing.T) {
	for _, id := range []string{".", ".."} {
		err := domain.CheckPathID("session id", id)
		if domain.CodeOf(err) != domain.CodeInvalidRequest || !strings.HasPrefix(domain.MessageOf(err), "session id ") {
			t.Errorf("CheckPathID(%q) = %v", id, err)
		}
		if err := domain.CheckID("adapter", id); err != nil {
			t.Errorf("CheckID(%q) = %v", id, err)
		}
	}
	for _, id := range []string{"", "...", ".x", "a..b", "s1"} {
		if err := domain.CheckPathID("run id", id); err != nil {
			t.Errorf("CheckPathID(%q) = %v", id, err)
		}
	}
	if err := domain.CheckPathIDs("node", "n1", "session_id", ".."); domain.CodeOf(err) != domain.CodeInvalidRequest {
		t.Errorf("CheckPathIDs: %v", err)
	}
	if err := domain.CheckPathID("node", "a\x00"); domain.CodeOf(err) != domain.CodeInvalidRequest {
		t.Errorf("CheckPathID with a NUL: %v", err)
	}
}

func TestErrorsMatchByCode(t *testing.T) {
	wire := &domain.Error{Code: domain.CodeRunNotFound, Message: "run r1 is not known"}
	wrapped := fmt.Errorf("cancel: %w", wire)
	if !errors.Is(wrapped, domain.ErrRunNotFound) || errors.Is(wrapped, domain.ErrRunFinished) {
		t.Fatal("errors.Is must match by code only")
	}
	if domain.CodeOf(wrapped) != domain.CodeRunNotFound || domain.MessageOf(wrapped) != "run r1 is not known" {
		t.Fatalf("CodeOf/MessageOf = %q/%q", domain.CodeOf(wrapped), domain.MessageOf(wrapped))
	}
	if domain.CodeOf(errors.New("plain")) != domain.CodeInternal {
		t.Fatal("a plain error is internal")
	}
	if got := (&domain.Error{Code: domain.CodeUnknownToken}).Error(); got != "unknown_token" {
		t.Fatalf("bare code renders as %q", got)
	}
	if got := domain.Errorf(domain.CodeConfigError, "adapter %q", "x").Error(); got != `config_error: adapter "x"` {
		t.Fatalf("Errorf renders as %q", got)
	}
}

func TestRunLifecycle(t *testing.T) {
	now := time.Unix(100, 0)
	if _, err := domain.NewRun(domain.RunRequest{RunID: "r1"}, now); !errors.Is(err, domain.ErrInvalidRequest) {
		t.Fatalf("run without adapter: %v", err)
	}
	r, err := domain.NewRun(domain.RunRequest{RunID: "r1", Adapter: "exec", Target: "t", SessionID: "s", Background: true}, now)
	if err != nil || r.Status() != domain.RunQueued {
		t.Fatalf("NewRun: %v %v", r, err)
	}
	if err := r.Start(now.Add(time.Second)); err != nil || r.Status() != domain.RunRunning {
		t.Fatalf("Start: %v", err)
	}
	if err := r.Finish(domain.RunEvent{Type: domain.EventDelta}, now); err == nil {
		t.Fatal("finishing with a non-terminal event must fail")
	}
	u := &domain.Usage{PromptTokens: 3, CompletionTokens: 4}
	if err := r.Finish(domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "run_failed", Message: "boom"}, Usage: u}, now.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	u.PromptTokens = 99 // the run keeps its own copy
	s := r.Snapshot()
	if s.Status != domain.RunFailed || s.ErrorCode != "run_failed" || s.ErrorMessage != "boom" || s.Usage.PromptTokens != 3 ||
		!s.FinishedAt.Equal(now.Add(2*time.Second)) || !s.Background || s.SessionID != "s" {
		t.Fatalf("snapshot = %+v", s)
	}
	if err := r.Finish(domain.RunEvent{Type: domain.EventComplete}, now); !errors.Is(err, domain.ErrRunAlreadyFinished) {
		t.Fatalf("second Finish: %v", err)
	}
	if err := r.Start(now); !errors.Is(err, domain.ErrRunAlreadyFinished) {
		t.Fatalf("Start after finish: %v", err)
	}
	back, err := domain.RehydrateRun(s)
	if err != nil || back.Snapshot().Status != domain.RunFailed {
		t.Fatalf("rehydrate: %v", err)
	}
	if _, err := domain.RehydrateRun(domain.RunSnapshot{ID: "x", Status: "weird"}); err == nil {
		t.Fatal("rehydrating an unknown status must fail")
	}
	for typ, want := range map[domain.EventType]domain.RunStatus{domain.EventComplete: domain.RunSucceeded, domain.EventCancelled: domain.RunCancelled, domain.EventError: domain.RunFailed} {
		if domain.StatusFor(typ) != want || !typ.Terminal() {
			t.Fatalf("%s maps to %s", typ, domain.StatusFor(typ))
		}
	}
}

func TestBuildConfig(t *testing.T) {
	exec := func(name string) domain.AdapterConfig {
		return domain.AdapterConfig{Name: name, Type: domain.AdapterExec, Targets: map[string]domain.ExecTarget{"t": {Command: []string{"cat"}}}}
	}
	cfg, err := domain.NodeRecord{ID: "n1", Token: "secret-token", Adapters: []domain.AdapterConfig{exec("a")}}.BuildConfig(7)
	if err != nil || cfg.NodeID != "n1" || cfg.Version != 7 || cfg.Adapters[0].MaxConcurrency != domain.DefaultMaxConcurrency {
		t.Fatalf("BuildConfig = %+v, %v", cfg, err)
	}
	for name, rec := range map[string]domain.NodeRecord{
		"no type":          {ID: "n", Adapters: []domain.AdapterConfig{{Name: "x"}}},
		"duplicate name":   {ID: "n", Adapters: []domain.AdapterConfig{exec("a"), exec("a")}},
		"no name":          {ID: "n", Adapters: []domain.AdapterConfig{{Type: domain.AdapterExec}}},
		"empty argv":       {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterExec, Targets: map[string]domain.ExecTarget{"t": {}}}}},
		"ollama no url":    {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterOllama}}},
		"url no scheme":    {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterOllama, BaseURL: "127.0.0.1:11435"}}},
		"url ftp":          {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterOpenAI, BaseURL: "ftp://gpu:8000"}}},
		"url no host":      {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterOpenAI, BaseURL: "http://"}}},
		"ollama key":       {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterOllama, BaseURL: "http://x", APIKeyEnv: "K"}}},
		"ollama prefix":    {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterOllama, BaseURL: "http://x", PathPrefix: "/x"}}},
		"negative conc":    {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterCodex, MaxConcurrency: -1}}},
		"huge conc":        {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterCodex, MaxConcurrency: 1<<32 + 1}}},
		"long name":        {ID: "n", Adapters: []domain.AdapterConfig{{Name: strings.Repeat("a", 129), Type: domain.AdapterCodex}}},
		"negative timeout": {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterClaudeCode, Timeout: -time.Second}}},
		"target timeout":   {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterExec, Targets: map[string]domain.ExecTarget{"t": {Command: []string{"echo"}, Timeout: -time.Second}}}}},
		"empty program":    {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterExec, Targets: map[string]domain.ExecTarget{"t": {Command: []string{""}}}}}},
		"negative history": {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterOpenAI, BaseURL: "http://x", MaxHistoryBytes: -1}}},
		"tiny history":     {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterOllama, BaseURL: "http://x", MaxHistoryBytes: 1023}}},
		"huge history":     {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterOpenAI, BaseURL: "http://x", MaxHistoryBytes: 64<<20 + 1}}},
		"history on exec":  {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterExec, MaxHistoryBytes: 1 << 20}}},
		"history on agent": {ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterClaudeCode, MaxHistoryBytes: 1 << 20}}},
		"provider type":    {ID: "n", Providers: []domain.ProviderConfig{{Name: "p", Type: "grpc", BaseURL: "http://x"}}},
		"provider no url":  {ID: "n", Providers: []domain.ProviderConfig{{Name: "p", Type: domain.ProviderOpenAI}}},
		"provider twice":   {ID: "n", Providers: []domain.ProviderConfig{{Name: "p", Type: "openai", BaseURL: "http://x"}, {Name: "p", Type: "openai", BaseURL: "http://y"}}},
		"provider no name": {ID: "n", Providers: []domain.ProviderConfig{{Type: "openai", BaseURL: "http://x"}}},
	} {
		_, err := rec.BuildConfig(1)
		if !errors.Is(err, domain.ErrConfig) {
			t.Errorf("%s: %v, want config_error", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret-token") {
			t.Errorf("%s: token in error", name)
		}
	}
}

func TestUsageTotal(t *testing.T) {
	if (domain.Usage{PromptTokens: 2, CompletionTokens: 3}).Total() != 5 || (domain.Usage{TotalTokens: 9, PromptTokens: 1}).Total() != 9 {
		t.Fatal("Total")
	}
	// Counts near the int64 maximum saturate rather than wrap negative.
	if got := (domain.Usage{PromptTokens: math.MaxInt64 - 7, CompletionTokens: 100}).Total(); got != math.MaxInt64 {
		t.Fatalf("Total of absurd counts = %d, want MaxInt64", got)
	}
}

func TestAddTokensSaturates(t *testing.T) {
	for _, tc := range []struct{ a, b, want int64 }{
		{2, 3, 5},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64 - 7, math.MaxInt64 - 7, math.MaxInt64},
		{math.MinInt64, -1, math.MinInt64},
		{math.MaxInt64, math.MinInt64, -1},
		{-5, 3, -2},
	} {
		if got := domain.AddTokens(tc.a, tc.b); got != tc.want {
			t.Errorf("AddTokens(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestUsageBounded(t *testing.T) {
	got := domain.Usage{PromptTokens: math.MaxInt64 - 7, CompletionTokens: -4, TotalTokens: math.MinInt64 + 93, CostUSD: 1e308,
		DurationMS: 5, Model: "m"}.Bounded()
	want := domain.Usage{PromptTokens: domain.MaxUsageTokens, TotalTokens: 0, CostUSD: domain.MaxUsageCostUSD, DurationMS: 5, Model: "m"}
	if got != want {
		t.Fatalf("Bounded = %+v, want %+v", got, want)
	}
	for _, c := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -0.5} {
		if b := domain.BoundCost(c); b != 0 {
			t.Errorf("BoundCost(%v) = %v, want 0", c, b)
		}
	}
	if b := (domain.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7, CostUSD: 0.25}).Bounded(); b.TotalTokens != 7 || b.CostUSD != 0.25 {
		t.Fatalf("Bounded changed a sane usage: %+v", b)
	}
}

func TestPrincipalScopesAndNodes(t *testing.T) {
	anon := domain.PrincipalFrom(context.Background())
	if anon.Name != domain.AnonymousName || !anon.Allows(domain.ScopeAdmin) || !anon.SeesNode("any") {
		t.Fatalf("no principal in context must be anonymous with every right, got %+v", anon)
	}
	p := domain.Principal{Name: "ci", Scopes: []string{domain.ScopeRead, domain.ScopeRuns}, Nodes: []string{"n1"}}
	ctx := domain.WithPrincipal(context.Background(), p)
	got := domain.PrincipalFrom(ctx)
	if got.Name != "ci" || !got.Allows(domain.ScopeRead) || !got.Allows(domain.ScopeRuns) || got.Allows(domain.ScopeInference) || got.Allows(domain.ScopeAdmin) {
		t.Fatalf("scopes wrong: %+v", got)
	}
	if !got.SeesNode("n1") || got.SeesNode("n2") || !got.Limited() {
		t.Fatal("node limit not applied")
	}
	if err := got.Require(domain.ScopeAdmin); !errors.Is(err, domain.ErrForbidden) || !strings.Contains(err.Error(), "ci") {
		t.Fatalf("Require(admin) = %v", err)
	}
	admin := domain.Principal{Name: "ops", Scopes: []string{domain.ScopeAdmin}}
	for _, s := range domain.KnownScopes {
		if !admin.Allows(s) {
			t.Fatalf("admin must imply %s", s)
		}
	}
}

func TestBuildConfigChecksChildEnvironment(t *testing.T) {
	for name, a := range map[string]domain.AdapterConfig{
		"env on a provider adapter": {Name: "o", Type: domain.AdapterOllama, BaseURL: "http://x", InheritEnv: []string{"K"}},
		"bad env name":              {Name: "c", Type: domain.AdapterClaudeCode, Env: map[string]string{"A=B": "v"}},
		"bad inherit name":          {Name: "c", Type: domain.AdapterCodex, InheritEnv: []string{""}},
		"bad target inherit name": {Name: "e", Type: domain.AdapterExec, Targets: map[string]domain.ExecTarget{
			"t": {Command: []string{"env"}, InheritEnv: []string{"X\x00"}}}},
		// No process can be given a NUL: every run would fail, opaquely.
		"NUL in an env value": {Name: "c", Type: domain.AdapterGemini, Env: map[string]string{"K": "a\x00b"}},
		"NUL in a target's env value": {Name: "e", Type: domain.AdapterExec, Targets: map[string]domain.ExecTarget{
			"t": {Command: []string{"env"}, Env: map[string]string{"K": "\x00"}}}},
		"NUL in a command argument": {Name: "e", Type: domain.AdapterExec, Targets: map[string]domain.ExecTarget{
			"t": {Command: []string{"echo", "a\x00b"}}}},
	} {
		_, err := domain.NodeRecord{ID: "n", Adapters: []domain.AdapterConfig{a}}.BuildConfig(1)
		if !errors.Is(err, domain.ErrConfig) {
			t.Errorf("%s: BuildConfig = %v, want config_error", name, err)
		}
	}
	ok := domain.AdapterConfig{Name: "c", Type: domain.AdapterClaudeCode, Env: map[string]string{"ANTHROPIC_BASE_URL": "http://127.0.0.1:1"}, InheritEnv: []string{"ANTHROPIC_API_KEY"}}
	if _, err := (domain.NodeRecord{ID: "n", Adapters: []domain.AdapterConfig{ok}}).BuildConfig(1); err != nil {
		t.Fatalf("valid env refused: %v", err)
	}
}

// Which adapter types exist is the node's to say: a config is checked
// against the types the node reported, and not at all when it reported none.
func TestCheckAdapterTypes(t *testing.T) {
	cfg := domain.NodeConfig{NodeID: "n", Adapters: []domain.AdapterConfig{{Name: "x", Type: "teleport"}}}
	if err := cfg.CheckAdapterTypes(domain.NodeInfo{AdapterTypes: []string{"exec", "ollama"}}); !errors.Is(err, domain.ErrConfig) || !strings.Contains(err.Error(), "teleport") || !strings.Contains(err.Error(), "exec, ollama") {
		t.Fatalf("unsupported type: %v", err)
	}
	if err := cfg.CheckAdapterTypes(domain.NodeInfo{AdapterTypes: []string{"exec", "teleport"}}); err != nil {
		t.Fatalf("a type the node supports: %v", err)
	}
	if err := cfg.CheckAdapterTypes(domain.NodeInfo{}); err != nil {
		t.Fatalf("a node that reported no types: %v", err)
	}
}

// A record's token digest is the same whether the config gives the token
// or its SHA-256 in either case of hex; a record with neither (or a
// malformed digest) has none and matches no record.
func TestNodeRecordTokenDigest(t *testing.T) {
	const tok = "node-token-0123456789"
	sum := sha256.Sum256([]byte(tok))
	lower := hex.EncodeToString(sum[:])
	plain := domain.NodeRecord{ID: "a", Token: tok}
	for _, r := range []domain.NodeRecord{
		{ID: "a", TokenSHA256: lower},
		{ID: "a", TokenSHA256: strings.ToUpper(lower)},
		plain,
	} {
		if d, ok := r.TokenDigest(); !ok || d != sum {
			t.Fatalf("%+v: TokenDigest = %x, %v; want %x", r, d, ok, sum)
		}
		if !r.SameToken(plain) || !plain.SameToken(r) {
			t.Fatalf("%+v and %+v accept the same token, SameToken says not", r, plain)
		}
	}
	other := sha256.Sum256([]byte(tok + "x"))
	none := domain.NodeRecord{ID: "a"}
	for _, r := range []domain.NodeRecord{
		{ID: "a", TokenSHA256: hex.EncodeToString(other[:])},
		{ID: "a", TokenSHA256: lower[:62]},
		{ID: "a", TokenSHA256: "zz" + lower[2:]},
		none,
	} {
		if r.SameToken(plain) {
			t.Fatalf("%+v: SameToken(%+v) = true", r, plain)
		}
	}
	if _, ok := none.TokenDigest(); ok || none.SameToken(none) {
		t.Fatal("a record without a token has a digest, or matches itself")
	}
}

// Every stable code declared in the package is known to KnownCode (metrics
// label the others "other").
func TestKnownCodeListsEveryCode(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	decl := regexp.MustCompile(`\bCode[A-Z]\w*\s*=\s*"([^"]+)"`)
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			n++
			if !domain.KnownCode(m[1]) {
				t.Errorf("%s: code %q is not in knownCodes", f, m[1])
			}
			if domain.PeerCode(m[1]) != m[1] {
				t.Errorf("%s: code %q is not shaped like a code", f, m[1])
			}
		}
	}
	if n < 30 {
		t.Fatalf("found only %d codes", n)
	}
}

func TestPeerCode(t *testing.T) {
	for in, want := range map[string]string{
		"provider_error":        "provider_error",
		"newer_code_2":          "newer_code_2",
		"":                      domain.CodeProviderError,
		"Bad-Code":              domain.CodeProviderError,
		"x y":                   domain.CodeProviderError,
		strings.Repeat("a", 64): strings.Repeat("a", 64),
		strings.Repeat("a", 65): domain.CodeProviderError,
	} {
		if got := domain.PeerCode(in); got != want {
			t.Errorf("PeerCode(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPageSessions(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	all := []domain.SessionInfo{
		{Adapter: "a", SessionID: "s1", LastUsed: at},
		{Adapter: "b", SessionID: "s1", LastUsed: at},
		{Adapter: "a", SessionID: "s2", LastUsed: at},
		{Adapter: "a", SessionID: "new", LastUsed: at.Add(time.Second)},
		{Adapter: "a", SessionID: "old", LastUsed: at.Add(-time.Second)},
	}
	ids := func(l []domain.SessionInfo) string {
		var out []string
		for _, s := range l {
			out = append(out, s.Adapter+"/"+s.SessionID)
		}
		return strings.Join(out, " ")
	}
	if got := ids(domain.PageSessions(slices.Clone(all), domain.SessionQuery{})); got != "a/new b/s1 a/s2 a/s1 a/old" {
		t.Fatalf("listing order: %s", got)
	}
	k := domain.SessionKey{LastUsed: at, Adapter: "b", SessionID: "s1"}
	if got := ids(domain.PageSessions(slices.Clone(all), domain.SessionQuery{Limit: 2, After: &k})); got != "a/s2 a/s1" {
		t.Fatalf("after b/s1: %s", got)
	}
	// A cursor between listed sessions (one that is gone since).
	k = domain.SessionKey{LastUsed: at, Adapter: "a", SessionID: "s15"}
	if got := ids(domain.PageSessions(slices.Clone(all), domain.SessionQuery{After: &k})); got != "a/s1 a/old" {
		t.Fatalf("after a/s15: %s", got)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://user:hunter2@host:11434/v1": "http://user:xxxxx@host:11434/v1",
		"http://user:hun@ter2@host":         "http://user:xxxxx@host",
		"http://admin:9999#tail@host":       "http://admin:xxxxx@host",
		"http://a/b?c:hunter2@host":         "http://xxxxx@host",
		"http://user:hunter2@host:bad port": "http://user:xxxxx@host:bad port",
		"user:hunter2@host:11434":           "user:xxxxx@host:11434",
		"ftp://user:hunter2@host":           "ftp://user:xxxxx@host",
		"http://user@host":                  "http://user@host",
		"http://127.0.0.1:11434":            "http://127.0.0.1:11434",
		"127.0.0.1:11434":                   "127.0.0.1:11434",
		"http://host/v1?key=a":              "http://host/v1?key=a",
		"":                                  "",
	} {
		if got := domain.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://host/v1?key=a":               "http://host/v1?…",
		"https://u:p4ssw0rd@host/v1#k":       "https://u:xxxxx@host/v1?…",
		"http://a/b?c:hunter2@host/v1?key=z": "http://xxxxx@host/v1?…",
		"host:11434/api?key=z":               "host:11434/api?…",
		"http://127.0.0.1:11434":             "http://127.0.0.1:11434",
	} {
		if got := domain.RedactBaseURL(in); got != want {
			t.Errorf("RedactBaseURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A refused base_url is quoted without its password: the message reaches
// a start's error, a reload's config_error answer and the edge's log.
func TestBuildConfigRedactsBaseURL(t *testing.T) {
	for _, u := range []string{"ftp://user:hunter2@host", "user:hunter2@host:11434", "http://user:hunter2@host:bad port"} {
		for _, r := range []domain.NodeRecord{
			{ID: "n", Adapters: []domain.AdapterConfig{{Name: "a", Type: domain.AdapterOpenAI, BaseURL: u}}},
			{ID: "n", Providers: []domain.ProviderConfig{{Name: "p", Type: domain.ProviderOpenAI, BaseURL: u}}},
		} {
			_, err := r.BuildConfig(1)
			if err == nil || !strings.Contains(err.Error(), "must be an http(s) URL") {
				t.Fatalf("base_url %q: %v", u, err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("base_url %q: error shows the password: %v", u, err)
			}
		}
	}
}

func TestParseCount(t *testing.T) {
	for in, want := range map[string]int64{
		`11`: 11, `-5`: -5, `11.0`: 11, `3e2`: 300, `"11"`: 11, `" 7 "`: 7, `null`: 0, `"x"`: 0, `true`: 0,
		`"NaN"`: 0, `1234567890123456789`: 1234567890123456789, `1e30`: math.MaxInt64, `-1e30`: math.MinInt64,
	} {
		if got := domain.ParseCount([]byte(in)); got != want {
			t.Errorf("ParseCount(%s) = %d, want %d", in, got, want)
		}
	}
}
