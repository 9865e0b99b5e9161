// Package lines reads newline-delimited records (NDJSON, SSE, JSONL) from a
// stream that may deliver them in pieces of any size: a record split across
// reads, in the middle of a UTF-8 sequence or of a JSON value, is
// reassembled before it is returned.
package lines

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"unicode/utf8"
)

// DefaultMax is the longest line Reader returns unless told otherwise.
const DefaultMax = 16 << 20

// Reader returns one line at a time. Lines longer than its maximum are
// skipped whole (counted in Skipped), so one oversized record cannot
// exhaust memory or end the stream.
type Reader struct {
	br      *bufio.Reader
	max     int
	buf     []byte
	skipped int
	err     error
}

// NewReader reads lines from r; max <= 0 means DefaultMax.
func NewReader(r io.Reader, max int) *Reader {
	if max <= 0 {
		max = DefaultMax
	}
	return &Reader{br: bufio.NewReaderSize(r, 64<<10), max: max}
}

// Next returns the next line without its "\n" or "\r\n". A last line
// without a newline is returned before io.EOF. The slice is valid until the
// next call. Errors other than io.EOF are the underlying reader's.
func (r *Reader) Next() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	r.buf = r.buf[:0]
	tooLong := false
	for {
		chunk, err := r.br.ReadSlice('\n')
		if !tooLong {
			if len(r.buf)+len(chunk) > r.max+2 { // +2: the line ending
				tooLong, r.buf = true, r.buf[:0]
			} else {
				r.buf = append(r.buf, chunk...)
			}
		}
		switch {
		case err == nil:
			if tooLong {
				r.skipped++
				tooLong = false
				continue
			}
			return trimEOL(r.buf), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			r.err = err
			if tooLong {
				r.skipped++
				return nil, err
			}
			if len(r.buf) > 0 {
				return trimEOL(r.buf), nil
			}
			return nil, err
		}
	}
}

// Skipped returns how many lines were too long and were dropped.
func (r *Reader) Skipped() int { return r.skipped }

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

// ValidText is the tail of a byte stream (a stderr tail) as text: the
// continuation bytes of a rune cut at its start are dropped, and any other
// byte that is not UTF-8 becomes U+FFFD, as the output's are.
func ValidText(b []byte) string {
	for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
		b = b[1:]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
