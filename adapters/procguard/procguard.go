// Package procguard keeps a process's memory and environment from the
// other processes of its user, the children it starts included.
//
// The node runs exec targets and CLI agents as child processes of its own
// user, and an agent can be steered by its prompt. Each child gets a clean
// environment (adapters/runtime/internal/proc), but on Linux any process of
// the same user may read another's /proc/PID/environ and /proc/PID/mem, so
// without this a child could read the node's token and provider keys from
// /proc/$PPID/environ. The edge holds API keys, DSN passwords and its CA
// key, and is protected the same way.
package procguard
