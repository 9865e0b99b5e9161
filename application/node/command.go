package node

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"iop/domain"
	"iop/domain/nodecmd"
	"iop/internal/jsonwords"
	"iop/ports"
)

// The built-in node commands (the contract is domain/nodecmd).
const (
	CmdCapabilities    = nodecmd.CmdCapabilities
	CmdTransportStatus = nodecmd.CmdTransportStatus
	CmdUsageStatus     = nodecmd.CmdUsageStatus
	CmdSessionList     = nodecmd.CmdSessionList
	CmdRuns            = nodecmd.CmdRuns
	CmdRunGet          = nodecmd.CmdRunGet
)

// BuiltinCommands lists the commands every node answers.
var BuiltinCommands = nodecmd.Builtin

// CommandHandler answers node commands. Commands run beside runs and take
// no run slot; those that read the store share its one connection with the
// runs' records (usage_status reads every run).
type CommandHandler struct {
	rt        *Runtime
	runs      *RunManager
	sessions  *SessionHandler
	store     ports.RunStore
	transport ports.TransportStatus
	version   string
}

// NewCommandHandler refuses nil dependencies; transport may be set later
// with SetTransport because the transport itself needs this handler.
func NewCommandHandler(rt *Runtime, runs *RunManager, sessions *SessionHandler, store ports.RunStore, version string) *CommandHandler {
	if rt == nil || runs == nil || sessions == nil || store == nil {
		panic("node.NewCommandHandler: nil dependency")
	}
	return &CommandHandler{rt: rt, runs: runs, sessions: sessions, store: store, version: version}
}

// SetTransport supplies the link status source.
func (h *CommandHandler) SetTransport(t ports.TransportStatus) { h.transport = t }

// RunCommand runs one command and returns its JSON result.
func (h *CommandHandler) RunCommand(ctx context.Context, name string, args []byte, progress func([]byte) error) ([]byte, error) {
	switch name {
	case CmdCapabilities:
		return json.Marshal(h.capabilities())
	case CmdTransportStatus:
		return h.transportStatus()
	case CmdUsageStatus:
		return h.usageStatus(ctx)
	case CmdSessionList:
		return h.listSessions(ctx, args)
	case CmdRuns:
		return h.listRuns(ctx, args)
	case CmdRunGet:
		return h.getRun(ctx, args)
	}
	return h.adapterCommand(ctx, name, args, progress)
}

// adapterCommand routes a command to the adapter that declares it. When
// several do, args may name one: {"adapter": "..."}; or a provider that
// serves the command: {"provider": "..."}, which then answers alone — a
// named provider or adapter is never replaced by another (a delete meant
// for one Ollama must not reach another).
func (h *CommandHandler) adapterCommand(ctx context.Context, name string, args []byte, progress func([]byte) error) ([]byte, error) {
	var sel nodecmd.Selector
	if len(args) > 0 {
		// Arguments of another shape are the command's to refuse; a
		// selector that is not a string must not be taken for none.
		var te *json.UnmarshalTypeError
		if err := json.Unmarshal(args, &sel); errors.As(err, &te) && (te.Field == "adapter" || te.Field == "provider") {
			return nil, domain.Errorf(domain.CodeInvalidRequest, "%s", argsProblem(err))
		}
	}
	if sel.Adapter != "" && sel.Provider != "" {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "command arguments name adapter %q and provider %q: name one", sel.Adapter, sel.Provider)
	}
	if sel.Provider != "" {
		if cr, ok := h.rt.providerRunnerFor(name, sel.Provider); ok {
			return cr.RunCommand(ctx, name, args, progress)
		}
		if _, ok := h.rt.Provider(sel.Provider); !ok {
			return nil, domain.Errorf(domain.CodeProviderNotFound, "provider %q is not configured on this node", sel.Provider)
		}
		return nil, domain.Errorf(domain.CodeCommandUnsupported, "provider %q does not serve %q", sel.Provider, name)
	}
	family := name
	if i := strings.IndexByte(name, '.'); i > 0 {
		family = name[:i]
	}
	familyKnown, adapterKnown := false, false
	for _, in := range h.rt.instances() {
		if sel.Adapter != "" && in.cfg.Name != sel.Adapter {
			continue
		}
		adapterKnown = true
		for _, c := range in.caps.Commands {
			if strings.HasPrefix(c, family+".") {
				familyKnown = true
			}
		}
		if !slices.Contains(in.caps.Commands, name) {
			continue
		}
		cr, ok := in.adapter.(ports.CommandRunner)
		if !ok {
			continue
		}
		return cr.RunCommand(ctx, name, args, progress)
	}
	if sel.Adapter != "" && !adapterKnown {
		return nil, domain.Errorf(domain.CodeAdapterNotFound, "adapter %q is not configured on this node", sel.Adapter)
	}
	if sel.Adapter == "" {
		if cr, ok := h.rt.providerRunnerFor(name, ""); ok {
			return cr.RunCommand(ctx, name, args, progress)
		}
	}
	if familyKnown || strings.Contains(name, ".") {
		if sel.Adapter != "" {
			return nil, domain.Errorf(domain.CodeCommandUnsupported, "adapter %q does not serve %q", sel.Adapter, name)
		}
		return nil, domain.Errorf(domain.CodeCommandUnsupported, "no adapter or provider on this node serves %q", name)
	}
	return nil, domain.Errorf(domain.CodeUnknownCommand, "unknown command %q (built-in: %s)", name, strings.Join(BuiltinCommands, ", "))
}

func (h *CommandHandler) capabilities() nodecmd.Capabilities {
	nodeID, ver := h.rt.Version()
	host, _ := os.Hostname()
	out := nodecmd.Capabilities{NodeID: nodeID, ConfigVersion: ver, Version: h.version, OS: runtime.GOOS, Arch: runtime.GOARCH, Hostname: host, Commands: slices.Clone(BuiltinCommands)}
	for _, in := range h.rt.instances() {
		a := nodecmd.Adapter{Name: in.cfg.Name, Type: in.cfg.Type, MaxConcurrency: in.caps.MaxConcurrency, InFlight: in.inFlight, Sessions: in.caps.Sessions, Commands: in.caps.Commands}
		out.Adapters = append(out.Adapters, a)
		out.Commands = append(out.Commands, in.caps.Commands...)
	}
	out.Commands = append(out.Commands, h.rt.providerCommandNames()...)
	sort.Strings(out.Commands)
	out.Commands = slices.Compact(out.Commands)
	return out
}

func (h *CommandHandler) transportStatus() ([]byte, error) {
	if h.transport == nil {
		return nil, domain.Errorf(domain.CodeCommandUnsupported, "transport status is not available")
	}
	s := h.transport.TransportStatus()
	dto := nodecmd.TransportStatus{
		Connected: s.Connected, Reconnects: s.Reconnects, LastRTTMillis: float64(s.LastRTTNanos) / 1e6,
		FramesIn: s.FramesIn, FramesOut: s.FramesOut, BytesIn: s.BytesIn, BytesOut: s.BytesOut, Edge: s.Edge,
		RunsInFlight: h.runs.InFlight(),
	}
	if s.ConnectedSince > 0 {
		t := time.Unix(0, s.ConnectedSince).UTC()
		dto.ConnectedSince = &t
	}
	return json.Marshal(dto)
}

func (h *CommandHandler) usageStatus(ctx context.Context) ([]byte, error) {
	sums, err := h.store.UsageByAdapter(ctx)
	if err != nil {
		return nil, err
	}
	out := nodecmd.UsageStatus{Adapters: []nodecmd.AdapterUsage{}}
	for _, s := range sums {
		out.Adapters = append(out.Adapters, nodecmd.AdapterUsage{
			Adapter: s.Adapter, RunsTotal: s.RunsTotal, Succeeded: s.Succeeded, Failed: s.Failed, Cancelled: s.Cancelled, Running: s.Running,
			PromptTokens: s.PromptTokens, CompletionTokens: s.CompletionTokens, TotalTokens: s.TotalTokens, CostUSD: s.CostUSD,
		})
	}
	return json.Marshal(out)
}

func (h *CommandHandler) listRuns(ctx context.Context, args []byte) ([]byte, error) {
	var a nodecmd.RunsArgs
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	st := domain.RunStatus(a.Status)
	if a.Status != "" && !st.Valid() {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "unknown status %q (queued, running, succeeded, failed, cancelled)", a.Status)
	}
	page := a.Limit
	switch {
	case page <= 0:
		page = domain.DefaultRunPage
	case page > domain.MaxRunPage:
		page = domain.MaxRunPage
	}
	// One more than the page, to tell whether more follow it.
	f := domain.RunFilter{Status: st, Adapter: a.Adapter, Limit: page + 1}
	nodeID, _ := h.rt.Version()
	if a.Cursor != "" {
		k, err := decodeRunCursor(nodeID, a.Cursor)
		if err != nil {
			return nil, err
		}
		f.After = &k
	}
	runs, err := h.store.ListRuns(ctx, f)
	if err != nil {
		return nil, err
	}
	more := len(runs) > page
	runs = runs[:min(len(runs), page)]
	out := nodecmd.RunList{Runs: make([]nodecmd.Run, 0, len(runs))}
	for _, r := range runs {
		out.Runs = append(out.Runs, RunRecord(r.Snapshot()))
	}
	if more {
		out.NextCursor = encodeRunCursor(nodeID, runs[len(runs)-1].Snapshot().Key())
	}
	return json.Marshal(out)
}

// runCursorTag opens every runs cursor, so one of another listing (a
// session_list cursor, an edge's GET /v1/runs one) is refused, not taken
// for a position.
const runCursorTag = "runs"

// A runs cursor is the last listed run's key, as the JSON array ["runs",
// node id, creation time in RFC 3339 with the store's own precision, run
// id] in unpadded base64url: opaque to callers, exact for any time a store
// keeps, and a run id may hold any character. The node id makes another
// node's cursor an error rather than a position in this node's runs,
// which would skip the newer ones unseen.
func encodeRunCursor(node string, k domain.RunKey) string {
	b, _ := json.Marshal([]string{runCursorTag, node, k.CreatedAt.UTC().Format(time.RFC3339Nano), k.ID})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeRunCursor(node, c string) (domain.RunKey, error) {
	bad := domain.Errorf(domain.CodeInvalidRequest, "cursor %q is not one this node's runs listing returned", clipCursor(c))
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return domain.RunKey{}, bad
	}
	var parts []string
	if json.Unmarshal(b, &parts) != nil || len(parts) != 4 || parts[0] != runCursorTag || parts[1] != node ||
		parts[3] == "" || domain.CheckID("run_id", parts[3]) != nil {
		return domain.RunKey{}, bad
	}
	at, err := time.Parse(time.RFC3339Nano, parts[2])
	if err != nil {
		return domain.RunKey{}, bad
	}
	return domain.RunKey{CreatedAt: at.UTC(), ID: parts[3]}, nil
}

// clipCursor is c as an error message quotes it: a cursor is short, but
// a caller may send anything.
func clipCursor(c string) string {
	const most = 200
	if len(c) <= most {
		return c
	}
	return strings.ToValidUTF8(c[:most], "") + "…"
}

// listSessions answers session_list: one page of the node's sessions,
// newest first, and a cursor to the next (nodecmd.SessionListArgs).
func (h *CommandHandler) listSessions(ctx context.Context, args []byte) ([]byte, error) {
	var a nodecmd.SessionListArgs
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	q := domain.SessionQuery{Limit: a.Limit}
	switch {
	case a.Limit < 0:
		return nil, domain.Errorf(domain.CodeInvalidRequest, "limit must not be negative")
	case a.Limit == 0:
		q.Limit = domain.DefaultSessionPage
	case a.Limit > domain.MaxSessionPage:
		q.Limit = domain.MaxSessionPage
	}
	if a.Cursor != "" {
		k, err := decodeSessionCursor(a.Cursor)
		if err != nil {
			return nil, err
		}
		q.After = &k
	}
	ss, more, err := h.sessions.ListSessions(ctx, a.Adapter, q)
	if err != nil {
		return nil, err
	}
	out := nodecmd.SessionList{Sessions: make([]nodecmd.Session, 0, len(ss))}
	for _, s := range ss {
		out.Sessions = append(out.Sessions, nodecmd.Session{Adapter: s.Adapter, Target: s.Target, SessionID: s.SessionID, Turns: s.Turns, LastUsed: s.LastUsed.UTC(), AgentSessionID: s.AgentSessionID})
	}
	if more {
		out.NextCursor = encodeSessionCursor(ss[len(ss)-1].Key())
	}
	return json.Marshal(out)
}

// A session_list cursor is the last listed session's key, as the JSON
// array [last use in Unix microseconds, adapter, session id] in unpadded
// base64url: opaque to callers, and a session id may hold any character.
func encodeSessionCursor(k domain.SessionKey) string {
	b, _ := json.Marshal([]any{k.LastUsed.UnixMicro(), k.Adapter, k.SessionID})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeSessionCursor(c string) (domain.SessionKey, error) {
	bad := domain.Errorf(domain.CodeInvalidRequest, "cursor %q is not one this node returned", c)
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return domain.SessionKey{}, bad
	}
	var parts []json.RawMessage
	var k domain.SessionKey
	var us int64
	if json.Unmarshal(b, &parts) != nil || len(parts) != 3 ||
		json.Unmarshal(parts[0], &us) != nil || json.Unmarshal(parts[1], &k.Adapter) != nil || json.Unmarshal(parts[2], &k.SessionID) != nil || us <= 0 ||
		domain.CheckIDs("adapter", k.Adapter, "session_id", k.SessionID) != nil {
		return domain.SessionKey{}, bad
	}
	k.LastUsed = time.UnixMicro(us).UTC()
	return k, nil
}

func (h *CommandHandler) getRun(ctx context.Context, args []byte) ([]byte, error) {
	var a nodecmd.RunGetArgs
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	if a.RunID == "" {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "run_id is required")
	}
	r, err := h.store.GetRun(ctx, a.RunID)
	if err != nil {
		if errors.Is(err, domain.ErrRunNotFound) {
			// Executing, its record not stored (the store could not take
			// it): running, not unknown, or the edge would write it lost.
			if s, ok := h.runs.Running(a.RunID); ok {
				return json.Marshal(RunRecord(s))
			}
			return nil, domain.Errorf(domain.CodeRunNotFound, "run %s is not known on this node", a.RunID)
		}
		return nil, err
	}
	return json.Marshal(RunRecord(r.Snapshot()))
}

func decodeArgs(args []byte, v any) error {
	if len(args) == 0 || string(args) == "null" {
		return nil
	}
	if err := json.Unmarshal(args, v); err != nil {
		return domain.Errorf(domain.CodeInvalidRequest, "%s", argsProblem(err))
	}
	return nil
}

// argsProblem words why command arguments do not decode in JSON's terms,
// as the edge's API words a request body's: encoding/json's message named
// Go's types ("cannot unmarshal array into Go value of type
// nodecmd.RunsArgs"), which mean nothing to the caller.
func argsProblem(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field == "":
		return "command arguments must be a JSON object, not " + jsonwords.WithArticle(te.Value)
	case errors.As(err, &te):
		return fmt.Sprintf("command arguments: %s: expected %s, got %s", te.Field, jsonwords.Kind(te.Type), jsonwords.WithArticle(te.Value))
	case errors.As(err, &se):
		return fmt.Sprintf("command arguments are not valid JSON (at byte %d)", se.Offset)
	}
	return "command arguments are not valid JSON"
}

// RunRecord converts a stored run to its contract shape.
func RunRecord(s domain.RunSnapshot) nodecmd.Run {
	d := nodecmd.Run{RunID: s.ID, Adapter: s.Adapter, Target: s.Target, SessionID: s.SessionID, Background: s.Background, Status: string(s.Status), CreatedAt: s.CreatedAt.UTC()}
	if !s.StartedAt.IsZero() {
		t := s.StartedAt.UTC()
		d.StartedAt = &t
	}
	if !s.FinishedAt.IsZero() {
		t := s.FinishedAt.UTC()
		d.FinishedAt = &t
	}
	if s.ErrorCode != "" || s.ErrorMessage != "" {
		// Cut as a new run's is (sendable): a store written by an older
		// node may hold a message of megabytes.
		d.Error = &nodecmd.Error{Code: s.ErrorCode, Message: clipMessage(strings.ToValidUTF8(s.ErrorMessage, "\uFFFD"))}
	}
	if u := s.Usage; u != nil {
		d.Usage = &nodecmd.Tokens{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens, CostUSD: u.CostUSD}
	}
	return d
}
