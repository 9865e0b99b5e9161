package exec

import (
	"bytes"
	"io"
	"os"
	"testing"
)

func TestPrefilledStdinHoldsTheInputThenEOF(t *testing.T) {
	for _, n := range []int{0, 1, 100, pipeAtomic} {
		input := bytes.Repeat([]byte{'x'}, n)
		f, err := prefilledStdin(input)
		if err != nil || f == nil {
			t.Fatalf("%d bytes: %v, %v", n, f, err)
		}
		got, err := io.ReadAll(f) // ends: the write end is closed
		_ = f.Close()
		if err != nil || !bytes.Equal(got, input) {
			t.Fatalf("%d bytes: read %d bytes, %v", n, len(got), err)
		}
	}
	if f, err := prefilledStdin(make([]byte, pipeAtomic+1)); f != nil || err != nil {
		t.Fatalf("more than a pipe's smallest capacity: %v, %v; want nil, nil (os/exec copies it)", f, err)
	}
}

// BenchmarkStdin sets up a run's stdin for a short input: what os/exec does
// for an io.Reader (a pipe both ends of which go to the poller, and a
// goroutine copying into it; before) against a pipe filled before the fork.
// The child's side (reading it) is the same for both and left out.
func BenchmarkStdin(b *testing.B) {
	input := []byte("hello from the caller\n")
	b.Run("os-exec-copy", func(b *testing.B) {
		b.ReportAllocs()
		reportCPU(b, func() {
			for b.Loop() {
				pr, pw, err := os.Pipe()
				if err != nil {
					b.Fatal(err)
				}
				done := make(chan struct{})
				go func() {
					_, _ = io.Copy(pw, bytes.NewReader(input))
					_ = pw.Close()
					close(done)
				}()
				<-done
				_ = pr.Close()
			}
		})
	})
	b.Run("prefilled", func(b *testing.B) {
		b.ReportAllocs()
		reportCPU(b, func() {
			for b.Loop() {
				f, err := prefilledStdin(input)
				if err != nil {
					b.Fatal(err)
				}
				_ = f.Close()
			}
		})
	})
}
