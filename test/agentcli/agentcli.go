// Package agentcli finds the real agent CLIs (claude, codex, gemini) that
// `make agent-clis` installs at pinned versions, and builds the settings
// that run each one offline against a stand-in model API on loopback: a
// temporary HOME, the stand-in as the only base URL, every quiet/offline
// setting the CLI has, every other endpoint (and an HTTP proxy, for
// anything that ignores them) pointed at a closed loopback port.
package agentcli

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

//go:embed versions
var versions string

// CLI is one pinned CLI.
type CLI struct {
	Package string // npm package
	Version string
	Command string // claude, codex, gemini
}

// Pinned returns the pinned CLIs.
func Pinned() []CLI {
	var out []CLI
	for _, l := range strings.Split(versions, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && !strings.HasPrefix(f[0], "#") {
			out = append(out, CLI{Package: f[0], Version: f[1], Command: f[2]})
		}
	}
	return out
}

// Root is where `make agent-clis` installs: $IOP_AGENT_CLIS, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/iop/agent-clis.
func Root() string {
	if d := os.Getenv("IOP_AGENT_CLIS"); d != "" {
		return d
	}
	cache, _ := os.UserCacheDir() // $XDG_CACHE_HOME, else $HOME/.cache, as the Makefile has it
	return filepath.Join(cache, "iop", "agent-clis")
}

// Path returns where the pinned command is installed, and whether it is.
func Path(command string) (string, bool) {
	for _, c := range Pinned() {
		if c.Command == command {
			name := c.Package[strings.LastIndexByte(c.Package, '/')+1:]
			p := filepath.Join(Root(), name+"-"+c.Version, "node_modules", ".bin", command)
			fi, err := os.Stat(p)
			return p, err == nil && !fi.IsDir()
		}
	}
	return "", false
}

// Find returns the installed pinned command, or skips tb with a plain
// message when it (or node, which runs it) is absent. With
// IOP_REQUIRE_AGENT_CLIS set (as .ci/run does), absence fails instead.
func Find(tb testing.TB, command string) string {
	tb.Helper()
	p, ok := Path(command)
	why := ""
	switch {
	case p == "":
		tb.Fatalf("agentcli: %q is not a pinned CLI", command)
	case !ok:
		why = fmt.Sprintf("the %s CLI is not installed at %s (run `make agent-clis`; it needs npm)", command, p)
	default:
		if _, err := exec.LookPath("node"); err != nil {
			why = fmt.Sprintf("node is not on PATH, and the %s CLI needs it (apt-get install -y nodejs npm)", command)
		}
	}
	if why != "" {
		if os.Getenv("IOP_REQUIRE_AGENT_CLIS") != "" {
			tb.Fatalf("IOP_REQUIRE_AGENT_CLIS is set but %s", why)
		}
		tb.Skip("skipping: " + why)
	}
	return p
}

// ClosedURL returns an http URL on loopback where nothing listens.
func ClosedURL(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// Env is a CLI's environment settings.
type Env map[string]string

// List returns the settings as sorted KEY=VALUE strings.
func (e Env) List() []string {
	out := make([]string, 0, len(e))
	for k, v := range e {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// base is what every CLI gets: its own HOME, PATH with node, and a dead
// proxy for anything not on loopback.
func base(tb testing.TB) (Env, string) {
	home := tb.TempDir()
	dead := ClosedURL(tb)
	path := "/usr/local/bin:/usr/bin:/bin"
	if node, err := exec.LookPath("node"); err == nil {
		path = filepath.Dir(node) + ":" + path
	}
	return Env{
		"HOME":            home,
		"PATH":            path,
		"XDG_CONFIG_HOME": filepath.Join(home, ".config"),
		"XDG_CACHE_HOME":  filepath.Join(home, ".cache"),
		"HTTPS_PROXY":     dead, "HTTP_PROXY": dead, "ALL_PROXY": dead,
		"https_proxy": dead, "http_proxy": dead, "all_proxy": dead,
		"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
	}, dead
}

// Claude returns the settings that run Claude Code against an Anthropic
// Messages stand-in at baseURL.
func Claude(tb testing.TB, baseURL string) Env {
	tb.Helper()
	e, dead := base(tb)
	e["ANTHROPIC_BASE_URL"] = baseURL
	e["ANTHROPIC_API_KEY"] = "sk-ant-standin"
	e["DISABLE_TELEMETRY"] = "1"
	e["DISABLE_ERROR_REPORTING"] = "1"
	e["DISABLE_AUTOUPDATER"] = "1"
	e["DISABLE_BUG_COMMAND"] = "1"
	e["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
	e["ANTHROPIC_BEDROCK_BASE_URL"] = dead
	e["ANTHROPIC_VERTEX_BASE_URL"] = dead
	return e
}

// Codex returns the settings that run Codex against an OpenAI Responses
// stand-in at baseURL: CODEX_HOME holds a config.toml whose only model
// provider is the stand-in (no retries, so a failure shows at once), with
// the update check and plugins off. The CLI also needs
// --skip-git-repo-check outside a git repository.
func Codex(tb testing.TB, baseURL, model string) Env {
	tb.Helper()
	e, dead := base(tb)
	home := filepath.Join(e["HOME"], ".codex")
	if err := os.MkdirAll(home, 0o700); err != nil {
		tb.Fatal(err)
	}
	config := fmt.Sprintf(`model = %q
model_provider = "standin"
check_for_update_on_startup = false

[features]
plugins = false

[model_providers.standin]
name = "standin"
base_url = %q
wire_api = "responses"
env_key = "STANDIN_API_KEY"
request_max_retries = 0
stream_max_retries = 0
`, model, strings.TrimSuffix(baseURL, "/")+"/v1")
	if err := os.WriteFile(filepath.Join(home, "config.toml"), []byte(config), 0o600); err != nil {
		tb.Fatal(err)
	}
	e["CODEX_HOME"] = home
	e["STANDIN_API_KEY"] = "sk-standin"
	e["OPENAI_BASE_URL"] = dead + "/v1"
	return e
}

// Gemini returns the settings that run the Gemini CLI against a Gemini API
// stand-in at baseURL: HOME/.gemini/settings.json selects API-key auth and
// turns telemetry, usage statistics and auto-update off.
func Gemini(tb testing.TB, baseURL string) Env {
	tb.Helper()
	e, dead := base(tb)
	dir := filepath.Join(e["HOME"], ".gemini")
	settings := map[string]any{
		"security":  map[string]any{"auth": map[string]any{"selectedType": "gemini-api-key"}},
		"telemetry": map[string]any{"enabled": false},
		"general":   map[string]any{"disableAutoUpdate": true, "disableUpdateNag": true},
		"privacy":   map[string]any{"usageStatisticsEnabled": false},
	}
	b, _ := json.Marshal(settings)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "settings.json"), b, 0o600); err != nil {
		tb.Fatal(err)
	}
	e["GEMINI_API_KEY"] = "standin-key"
	e["GOOGLE_GEMINI_BASE_URL"] = baseURL
	e["GEMINI_CLI_TRUST_WORKSPACE"] = "true"
	e["GOOGLE_VERTEX_BASE_URL"] = dead
	e["CODE_ASSIST_ENDPOINT"] = dead
	e["NO_COLOR"] = "1"
	return e
}
