//go:build !linux

package spawn

import (
	"errors"
	"syscall"
)

// Adopt is Linux only (prctl PR_SET_CHILD_SUBREAPER): elsewhere a process
// that left its child's process group is not found, and is reparented to
// init when its parent exits.
func Adopt() error { return errors.ErrUnsupported }

func (g *Group) signal(sig syscall.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.reaped {
		_ = syscall.Kill(-g.pgid, sig)
	}
}

// Without waitid's WNOWAIT the leader is reaped first; its group's id
// cannot be reused while the group has members. (Until reaped is set, a
// KillAll may still signal the group's id.)
func (g *Group) wait() error {
	err := g.cmd.Wait()
	close(g.exited)
	g.mu.Lock()
	g.reaped = true
	g.mu.Unlock()
	_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
	return err
}

type pinfo struct{}

func killAll([]*Group) []pinfo { return nil }

func awaitKilled([]pinfo) {}
