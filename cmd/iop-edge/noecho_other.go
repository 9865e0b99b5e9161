//go:build !linux

package main

// withoutEcho is not implemented here: the token is echoed as typed.
func withoutEcho(uintptr) (restore func(), ok bool) { return nil, false }
