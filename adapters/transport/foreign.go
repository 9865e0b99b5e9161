package transport

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
)

// A connection's first bytes tell a browser from a node. Any web page can
// make the operator's browser send HTTP to the transport port (a no-cors
// fetch, a form, an image, a CORS preflight, a WebSocket) and STUN (a
// WebRTC connection given the port as its TURN server) many times a
// second, from the browser's own address: the address of a node on the
// same machine, or of every node behind the same NAT. Charging those to
// that address's budget of failed registrations would let any page keep
// those nodes from registering. They guess no token and cost the edge no
// crypto, so they are closed without a charge; the connection caps
// (admission) still bound how many are under way. Real token guesses (a
// register request with a wrong token) and any other garbage are still
// charged.

// headSize is how many of a connection's first bytes are kept to recognise
// a browser's: the longest standard HTTP method ("OPTIONS", "CONNECT") and
// its space fit, and a STUN header's magic cookie.
const headSize = 16

// headReader keeps the first headSize bytes read through it.
type headReader struct {
	rd   io.Reader
	head [headSize]byte
	n    int
}

func (h *headReader) Read(p []byte) (int, error) {
	n, err := h.rd.Read(p)
	if h.n < len(h.head) && n > 0 {
		h.n += copy(h.head[h.n:], p[:n])
	}
	return n, err
}

func (h *headReader) bytes() []byte { return h.head[:h.n] }

// browserStart names what a browser sent when b, a connection's first
// bytes, is what a web page can make it send (httpRequestStart,
// stunStart); "" otherwise. Nothing is refused for looking like this: it
// only tells apart connections that already failed, before any token was
// checked (a frame that decodes as a register request is judged by its
// token, whatever its first bytes).
func browserStart(b []byte) string {
	switch {
	case httpRequestStart(b):
		return "an HTTP request (HTTP clients belong on the edge's http.listen)"
	case stunStart(b):
		return "a STUN request (a web page's WebRTC)"
	}
	return ""
}

// stunStart reports whether b starts like a STUN message (RFC 8489), the
// first thing a WebRTC client sends to a TURN server over TCP: a type whose
// two top bits are zero, a length that is a multiple of 4, and the magic
// cookie 0x2112A442 at byte 4 (only its first byte when b is a TLS record
// header, 5 bytes long).
func stunStart(b []byte) bool {
	if len(b) < 5 || b[0]&0xC0 != 0 || b[3]%4 != 0 {
		return false
	}
	if len(b) < 8 {
		return b[4] == 0x21
	}
	return b[4] == 0x21 && b[5] == 0x12 && b[6] == 0xA4 && b[7] == 0x42
}

// httpRequestStart reports whether b, a connection's first bytes, starts
// like an HTTP/1 request line: a method (at least 3 upper-case letters)
// followed by a space, or upper-case letters up to the end of b when b is
// cut short (a TLS record header holds only 5 bytes: "OPTIO", "DELET").
// No TLS record starts with a letter (record types are 20 to 24).
func httpRequestStart(b []byte) bool {
	n := 0
	for n < len(b) && b[n] >= 'A' && b[n] <= 'Z' {
		n++
	}
	return n >= 3 && (n == len(b) || b[n] == ' ')
}

// browserTLSFailure reports a failed TLS handshake that a web page can
// cause through the operator's browser and that guessed nothing:
//   - plain HTTP (http://edge:7700) or STUN (turn:edge:7700?transport=tcp)
//     sent to the TLS port: its record header is how those start;
//   - an https:// request whose browser refused the edge's certificate (the
//     edge's own CA is not one it trusts) and said so with an alert. The
//     client presented no credential; the same client hanging up instead of
//     sending the alert is not charged either (slowOrGone), so the alert
//     must not make the difference. A client certificate the edge refuses
//     (mutual TLS) is the edge's own verdict, not a remote alert, and stays
//     charged.
func browserTLSFailure(err error) bool {
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) {
		return browserStart(rh.RecordHeader[:]) != ""
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}
