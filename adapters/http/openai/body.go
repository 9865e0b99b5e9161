package openaiapi

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"strings"
)

// Limits of the routing read of a request body.
const (
	// MaxDepth is the deepest nesting of objects and arrays the scan for the
	// model accepts; deeper is invalid_request (400).
	MaxDepth = 128
	// blockSize is the largest unit the read prefix grows by: bytes are
	// read straight into the block that keeps them, so the prefix costs its
	// own size and never a copy of it.
	blockSize = 64 << 10
	// firstBlock is the first block of a body of unknown length; blocks
	// then double up to blockSize. (A body of known length gets one block
	// of its size.) Most request bodies are a few KiB: a 64 KiB block per
	// request cost more in allocation and zeroing than the scan itself.
	firstBlock = 1 << 10
	// maxKey bounds what of a key is kept, by the scan and the guard
	// alike: the longest routing key (followsKey) written entirely in \u escapes, six bytes a character, as JSON
	// allows and every provider's decoder reads. A key longer than that
	// cannot be a routing key; a shorter bound let a caller hide one from
	// the edge (and from the ownership check of a follow-up) by escaping
	// it. TestRoutingKeysFitMaxKey keeps it in step with the routes.
	maxKey = 6 * len(followsKey)
	// maxModel bounds what of a model value is kept.
	maxModel = 4 << 10
)

// errTooDeep is the scan's answer to nesting beyond MaxDepth.
var errTooDeep = fmt.Errorf("request body nests objects or arrays deeper than %d levels", MaxDepth)

// prefix is the part of a request body read to find where it goes. What it
// holds, followed by what is left of src, is the body byte for byte.
type prefix struct {
	src    io.Reader
	blocks [][]byte
	err    error // the read error that ended the body (io.EOF at its end)
	// length is the body's declared length (Content-Length), 0 if unknown.
	length int64
}

// newPrefix starts the prefix of a body of the declared length (<= 0:
// unknown).
func newPrefix(src io.Reader, length int64) *prefix {
	return &prefix{src: src, length: max(length, 0)}
}

// nextBlock is the capacity of the block after the last one.
func (p *prefix) nextBlock() int {
	if len(p.blocks) == 0 {
		if p.length > 0 {
			// One spare byte, so the read that sees the end fits too.
			return int(min(p.length+1, blockSize))
		}
		return firstBlock
	}
	return min(2*cap(p.blocks[len(p.blocks)-1]), blockSize)
}

// more reads the next bytes of the body into the prefix and returns them;
// at the end or on a failure it returns nil and p.err says which.
func (p *prefix) more() []byte {
	if p.err != nil {
		return nil
	}
	if n := len(p.blocks); n == 0 || len(p.blocks[n-1]) == cap(p.blocks[n-1]) {
		p.blocks = append(p.blocks, make([]byte, 0, p.nextBlock()))
	}
	last := &p.blocks[len(p.blocks)-1]
	for {
		n, err := p.src.Read((*last)[len(*last):cap(*last)])
		if n > 0 {
			start := len(*last)
			*last = (*last)[:start+n]
			if err != nil {
				p.err = err
			}
			return (*last)[start:]
		}
		if err != nil {
			p.err = err
			return nil
		}
	}
}

// body returns the request body to forward: the first block as bytes and
// the rest as a reader (nil when the prefix is the whole body).
func (p *prefix) body() ([]byte, io.Reader) {
	var head []byte
	if len(p.blocks) > 0 {
		head = p.blocks[0]
	}
	var rs []io.Reader
	for _, b := range p.blocks[1:] {
		rs = append(rs, &sliceReader{b: b})
	}
	if !errors.Is(p.err, io.EOF) {
		rs = append(rs, p.src) // more to come (or a failure the reader repeats)
	}
	p.blocks = nil // each block is freed once it has been sent
	switch len(rs) {
	case 0:
		return head, nil
	case 1:
		return head, rs[0]
	}
	return head, io.MultiReader(rs...)
}

// sliceReader reads a block once and lets go of it.
type sliceReader struct{ b []byte }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		s.b = nil
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// scanJSONModel reads a JSON object body only as far as needed to learn the
// value of the first of keys present at its top level with a non-empty
// string value, scanning byte by byte: it keeps the prefix read so far and a
// depth counter, never a parse tree, so a hostile body costs its prefix and
// nothing more. Nesting deeper than MaxDepth is refused at once. It returns
// "" when the object ends without any of keys. Keys match as routingKey
// says (escapes decoded, case folded), so the scan reads the key a Go
// provider would. The scan is structural, not a validator: the provider
// judges the rest.
//
// With also set, the scan also returns the string value of the top-level
// key also (a string or null, "" when absent or null), and so reads on
// past the model until it has seen that key or the object ends.
func scanJSONModel(p *prefix, keys []string, also string) (model, alsoValue string, err error) {
	var (
		s        scanState
		found    = make([]string, len(keys))
		keyBuf   = make([]byte, 0, maxKey)
		valBuf   []byte
		offset   int64
		captured = -1 // index in keys of the value being captured; len(keys) for also
		alsoKeys []string
		alsoSeen = also == "" // nothing to wait for
	)
	if also != "" {
		alsoKeys = []string{also}
	}
	name := func(i int) string {
		if i == len(keys) {
			return also
		}
		return keys[i]
	}
	// done: the preferred key names a model and also was seen, so the rest
	// of the body need not be read before it is routed.
	done := func() bool { return len(keys) > 0 && found[0] != "" && alsoSeen }
	s.state = stTop
	for {
		chunk := p.more()
		if chunk == nil {
			if errors.Is(p.err, io.EOF) {
				return "", "", errors.New("request body ended before its JSON object did")
			}
			return "", "", p.err
		}
		for i, c := range chunk {
			switch s.state {
			case stTop:
				if isSpace(c) {
					continue
				}
				if c != '{' {
					return "", "", fmt.Errorf("request body is not a JSON object (byte %d)", offset+int64(i))
				}
				s.depth, s.state = 1, stKey
			case stKey:
				switch {
				case isSpace(c):
				case c == '"':
					keyBuf, s.keyLong, s.state = keyBuf[:0], false, stKeyStr
				case c == '}':
					return cmp.Or(found...), alsoValue, nil // the first key of keys that was found
				default:
					return "", "", fmt.Errorf("request body is not valid JSON (byte %d)", offset+int64(i))
				}
			case stKeyStr:
				switch {
				case s.esc:
					s.esc = false
				case c == '\\':
					s.esc = true
				case c == '"':
					s.state = stColon
					continue
				}
				if len(keyBuf) < maxKey {
					keyBuf = append(keyBuf, c)
				} else {
					s.keyLong = true
				}
			case stColon:
				switch {
				case isSpace(c):
				case c == ':':
					s.state = stValue
					captured = -1
					if !s.keyLong {
						captured = routingKey(keyBuf, keys)
						if captured < 0 && routingKey(keyBuf, alsoKeys) == 0 {
							captured = len(keys)
						}
					}
				default:
					return "", "", fmt.Errorf("request body is not valid JSON (byte %d)", offset+int64(i))
				}
			case stValue:
				if isSpace(c) {
					continue
				}
				if captured == len(keys) && c == 'n' {
					// also: null, as clients that send every field write an
					// absent one; skipped as the scalar it is.
					alsoSeen = true
					if done() {
						return found[0], alsoValue, nil
					}
					captured = -1
				}
				if captured >= 0 {
					if c != '"' {
						return "", "", fmt.Errorf("%q must be a string", name(captured))
					}
					valBuf, s.state = append(valBuf[:0], c), stCapture
					continue
				}
				s.state = stSkip
				s.inner = 0
				if err := s.skip(c); err != nil {
					return "", "", err
				}
			case stCapture:
				if len(valBuf) >= maxModel {
					return "", "", fmt.Errorf("%q is longer than %d bytes", name(captured), maxModel)
				}
				valBuf = append(valBuf, c)
				switch {
				case s.esc:
					s.esc = false
				case c == '\\':
					s.esc = true
				case c == '"':
					var v string
					if err := json.Unmarshal(valBuf, &v); err != nil {
						return "", "", fmt.Errorf("%q: %v", name(captured), err)
					}
					switch {
					case captured == len(keys):
						alsoValue, alsoSeen = v, true
					case found[captured] == "":
						found[captured] = v
					}
					if done() {
						return found[0], alsoValue, nil // stop reading here
					}
					s.state = stAfter
				}
			case stSkip:
				if err := s.skip(c); err != nil {
					return "", "", err
				}
				if s.state == stKey { // a scalar ended at ',' — the skip saw it
					continue
				}
				if s.state == stDone {
					return cmp.Or(found...), alsoValue, nil // the first key of keys that was found
				}
			case stAfter:
				switch {
				case isSpace(c):
				case c == ',':
					s.state = stKey
				case c == '}':
					return cmp.Or(found...), alsoValue, nil // the first key of keys that was found
				default:
					return "", "", fmt.Errorf("request body is not valid JSON (byte %d)", offset+int64(i))
				}
			}
		}
		offset += int64(len(chunk))
	}
}

const (
	stTop = iota
	stKey
	stKeyStr
	stColon
	stValue
	stCapture
	stSkip
	stAfter
	stDone
)

// scanState is the scanner's position: state, string escapes and the nesting
// inside the value being skipped, with a bit per level for its kind so a
// mismatched closer is caught.
type scanState struct {
	state   int
	depth   int // 1 inside the top-level object
	inner   int // nesting inside the skipped value
	inStr   bool
	esc     bool
	keyLong bool
	scalar  bool
	kinds   [MaxDepth/64 + 1]uint64 // 1 = object, 0 = array, per inner level
}

// skip consumes one byte of a value being skipped. When the value ends it
// moves to stAfter; a scalar that ends at ',' or '}' also consumes that byte
// (to stKey or stDone).
func (s *scanState) skip(c byte) error {
	if s.inStr {
		switch {
		case s.esc:
			s.esc = false
		case c == '\\':
			s.esc = true
		case c == '"':
			s.inStr = false
			if s.inner == 0 {
				s.state = stAfter
			}
		}
		return nil
	}
	switch c {
	case '"':
		if s.scalar {
			return errors.New("request body is not valid JSON")
		}
		s.inStr = true
	case '{', '[':
		if s.scalar {
			return errors.New("request body is not valid JSON")
		}
		if s.depth+s.inner+1 > MaxDepth {
			return errTooDeep
		}
		w, b := s.inner/64, uint(s.inner%64)
		if c == '{' {
			s.kinds[w] |= 1 << b
		} else {
			s.kinds[w] &^= 1 << b
		}
		s.inner++
	case '}', ']':
		if s.inner == 0 {
			if s.scalar && c == '}' {
				s.scalar, s.state = false, stDone
				return nil
			}
			return errors.New("request body is not valid JSON")
		}
		s.inner--
		w, b := s.inner/64, uint(s.inner%64)
		if obj := s.kinds[w]&(1<<b) != 0; obj != (c == '}') {
			return errors.New("request body is not valid JSON: mismatched brackets")
		}
		if s.inner == 0 {
			s.state = stAfter
		}
	case ',':
		if s.inner == 0 {
			if !s.scalar {
				return errors.New("request body is not valid JSON")
			}
			s.scalar, s.state = false, stKey
		}
	case ' ', '\t', '\r', '\n':
		if s.inner == 0 && s.scalar {
			s.scalar, s.state = false, stAfter
		}
	default:
		if s.inner == 0 {
			s.scalar = true // a number, true, false or null
		}
	}
	return nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// scanMultipartModel reads a multipart/form-data body only as far as its
// form field named key and returns that field's value ("" if the form ends
// without it). Parts before it are read and kept in the prefix (the body
// cap bounds them), never parsed further.
func scanMultipartModel(p *prefix, contentType, key string) (string, error) {
	_, params, err := mime.ParseMediaType(contentType)
	if err != nil || params["boundary"] == "" {
		return "", errors.New("request body must be multipart/form-data with a boundary")
	}
	mr := multipart.NewReader(&prefixReader{p: p}, params["boundary"])
	for {
		part, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			return "", nil
		}
		if err != nil {
			if p.err != nil && !errors.Is(p.err, io.EOF) {
				return "", p.err
			}
			return "", fmt.Errorf("request body is not valid multipart/form-data: %v", err)
		}
		if part.FormName() == key && part.FileName() == "" {
			b, err := io.ReadAll(io.LimitReader(part, maxModel+1))
			if err != nil {
				if p.err != nil && !errors.Is(p.err, io.EOF) {
					return "", p.err
				}
				return "", fmt.Errorf("form field %q: %v", key, err)
			}
			if len(b) > maxModel {
				return "", fmt.Errorf("form field %q is longer than %d bytes", key, maxModel)
			}
			return strings.TrimSpace(string(b)), nil
		}
		if _, err := io.Copy(io.Discard, part); err != nil {
			if p.err != nil && !errors.Is(p.err, io.EOF) {
				return "", p.err
			}
			return "", fmt.Errorf("request body is not valid multipart/form-data: %v", err)
		}
	}
}

// prefixReader reads the body through the prefix, so every byte the
// multipart reader consumes (or buffers ahead) stays in it.
type prefixReader struct {
	p   *prefix
	buf []byte
}

func (r *prefixReader) Read(b []byte) (int, error) {
	if len(r.buf) == 0 {
		r.buf = r.p.more()
		if r.buf == nil {
			return 0, r.p.err
		}
	}
	n := copy(b, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// keyGuard passes a JSON request body through while watching its top-level
// keys, and fails the read — so the body never reaches the provider whole —
// at the first of:
//
//   - a routing key (keys) named twice, also when a spelling uses escapes
//     ("mod\u0065l") or another case ("MODEL"): the edge routes on the
//     first, while most providers' parsers keep the last (Go's
//     encoding/json also matches keys case-insensitively), so such a body
//     could reach a model no catalog lists;
//   - two routing keys (Ollama's "model" and legacy "name") naming
//     different non-empty models: the edge routes on "model" (else
//     "name"), as Ollama does, but a server that preferred "name" would run
//     the other, so the body is refused rather than guessed at;
//   - the other key the route reads (also: "previous_response_id") named
//     twice, spelled as above: the edge would route to where the first
//     lives and the provider look up the last.
//
// Nested keys (in messages, tools) do not count.
type keyGuard struct {
	r    io.Reader
	keys []string
	// state holds, by index in keys, what the body said of each key.
	state []keyState
	// also, when set, is a key that may appear once; alsoSeen says it did.
	also     []string
	alsoOne  [1]string // also's backing array
	alsoSeen bool

	depth     int
	inStr     bool
	esc       bool
	expectKey bool // the next string at depth 1 is a key
	isKey     bool // the string being read is a top-level key
	key       []byte
	keyLong   bool

	// The value of the routing key just read, when it is a string.
	valueOf int  // index in keys of the key whose value comes next, or -1
	inVal   bool // the string being read is that value
	val     []byte
	valLong bool

	// err is the refusal, returned by every later Read: the prefix hands
	// the rest of the body on to the relay, which must not read past it
	// (reading on would skip the bytes of the failed read and stream the
	// rest, out of step with the guard).
	err error
}

// keyState is what a body said of one routing key: seen (named as a key),
// named (a non-empty value), its decoded value, odd when it could not be
// read (too long, bad escape).
type keyState struct {
	seen, named, odd bool
	value            string
}

// keyGuardBuf is the room a guard's key and value buffers start with, for
// the keys and model names of most bodies: the guard runs on every request,
// and buffers grown byte by byte would allocate several times each.
const keyGuardBuf = 64

func newKeyGuard(r io.Reader, keys []string, also string) *keyGuard {
	buf := make([]byte, 0, 2*keyGuardBuf)
	g := &keyGuard{r: r, keys: keys, state: make([]keyState, len(keys)), valueOf: -1,
		key: buf[:0:keyGuardBuf], val: buf[keyGuardBuf:keyGuardBuf]}
	if also != "" {
		g.alsoOne[0] = also
		g.also = g.alsoOne[:]
	}
	return g
}

func (g *keyGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(p)
	for i, c := range p[:n] {
		if err := g.step(c); err != nil {
			g.err = err
			return i, err
		}
	}
	return n, err
}

// step takes one byte; it fails on a routing key seen for the second time
// or on routing keys that disagree.
func (g *keyGuard) step(c byte) error {
	if g.inStr {
		if g.inVal {
			if len(g.val) < maxModel+2 {
				g.val = append(g.val, c)
			} else {
				g.valLong = true
			}
		}
		switch {
		case g.esc:
			g.esc = false
		case c == '\\':
			g.esc = true
		case c == '"':
			g.inStr = false
			switch {
			case g.isKey:
				if dup := g.keyDone(); dup != "" {
					return fmt.Errorf("request body names %q more than once", dup)
				}
			case g.inVal:
				g.inVal = false
				return g.valueDone()
			}
			return nil
		}
		if g.isKey {
			if len(g.key) < maxKey {
				g.key = append(g.key, c)
			} else {
				g.keyLong = true
			}
		}
		return nil
	}
	switch c {
	case '"':
		g.inStr, g.isKey = true, g.depth == 1 && g.expectKey
		g.inVal = g.depth == 1 && !g.expectKey && g.valueOf >= 0
		g.expectKey, g.key, g.keyLong = false, g.key[:0], false
		if g.inVal {
			g.val, g.valLong = append(g.val[:0], c), false
		}
	case '{':
		g.depth++
		g.expectKey, g.valueOf = g.depth == 1, -1
	case '[':
		g.depth++
		g.valueOf = -1
	case '}', ']':
		g.depth--
	case ',':
		g.expectKey, g.valueOf = g.depth == 1, -1
	}
	return nil
}

func (g *keyGuard) keyDone() string {
	g.valueOf = -1
	if g.keyLong {
		return ""
	}
	i := routingKey(g.key, g.keys)
	if i < 0 {
		if routingKey(g.key, g.also) == 0 {
			if g.alsoSeen {
				return g.also[0]
			}
			g.alsoSeen = true
		}
		return ""
	}
	if g.state[i].seen {
		return g.keys[i]
	}
	g.state[i].seen, g.valueOf = true, i
	return ""
}

// valueDone takes the string value of routing key g.valueOf, just read.
func (g *keyGuard) valueDone() error {
	i := g.valueOf
	g.valueOf = -1
	var v string
	ok := false
	if !g.valLong {
		if v, ok = plainJSONString(g.val); !ok {
			ok = json.Unmarshal(g.val, &v) == nil
		}
	}
	if ok && v == "" {
		return nil // names nothing: the provider, like the scan, falls back to the other key
	}
	for j, st := range g.state {
		if j != i && st.named && (!ok || st.odd || st.value != v) {
			return fmt.Errorf("request body names different models in %q and %q", g.keys[j], g.keys[i])
		}
	}
	g.state[i] = keyState{seen: true, named: true, odd: !ok, value: v}
	return nil
}

// plainJSONString decodes the JSON string q (quotes included) when it is
// printable ASCII without escapes, as most model names are, which needs no
// decoder: its value is the bytes between the quotes. ok is false for any
// other q, which json.Unmarshal decodes (or refuses).
func plainJSONString(q []byte) (s string, ok bool) {
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return "", false
	}
	in := q[1 : len(q)-1]
	for _, c := range in {
		if c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
			return "", false
		}
	}
	return string(in), true
}

// routingKey is the index in keys of the JSON object key raw (its bytes
// between the quotes, escapes and all), or -1. Escapes are decoded and
// case is folded the way Go's encoding/json matches a key to a struct
// field (Ollama's request binding, many servers): "MODEL", "Model" and
// "mod\u0065l" all set the model there, and strings.EqualFold folds as
// its foldName does (the Kelvin sign K is k, the long ſ is s).
//
// It runs for every top-level key of every request body, so a key with no
// escape is matched as it is: its name does not escape, and the compiler
// keeps the conversion off the heap (a key of up to 32 bytes).
func routingKey(raw []byte, keys []string) int {
	if bytes.IndexByte(raw, '\\') >= 0 {
		var name string
		if json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &name) != nil {
			return -1 // not a valid key: the provider refuses the body
		}
		return foldIndex(name, keys)
	}
	return foldIndex(string(raw), keys)
}

// foldIndex is the index in keys of name, case folded, or -1.
func foldIndex(name string, keys []string) int {
	for i, k := range keys {
		if strings.EqualFold(name, k) {
			return i
		}
	}
	return -1
}

// formGuard passes a multipart/form-data request body through while
// watching its parts' headers, and fails the read — so the body never
// reaches the provider whole — at the second non-file field named "model".
// The edge routes on the first, while Starlette (vLLM, most OpenAI-style
// audio servers) keeps the last, so such a body could reach a model no
// catalog lists. Names are compared case-insensitively: Starlette and Go
// compare them exactly, but some frameworks (ASP.NET binding) do not, and
// no client sends "model" and "Model" both. Like the scan, a part is a
// file when its Content-Disposition has a non-empty filename.
//
// It works on lines, as every multipart parser does: a line starting with
// "--" and the boundary opens a part's headers, which end at an empty
// line. Only the start of a body line is kept (to tell a boundary), and a
// part's headers are bounded by maxPartHeader.
type formGuard struct {
	r        io.Reader
	boundary []byte // "--" + boundary; nil: not a form (the scan refuses it)
	line     []byte
	inHeader bool
	header   []byte // the part's header lines, each ending in "\n"
	models   int
	err      error // the refusal, returned by every later Read (see keyGuard)
}

// maxPartHeader bounds one part's header block; a form field's is about
// 100 bytes.
const maxPartHeader = 16 << 10

func newFormGuard(r io.Reader, contentType string) *formGuard {
	g := &formGuard{r: r}
	if _, params, err := mime.ParseMediaType(contentType); err == nil && params["boundary"] != "" {
		g.boundary = []byte("--" + params["boundary"])
	}
	return g
}

func (g *formGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(p)
	if g.boundary == nil {
		return n, err
	}
	for i, c := range p[:n] {
		if err := g.step(c); err != nil {
			g.err = err
			return i, err
		}
	}
	return n, err
}

func (g *formGuard) step(c byte) error {
	if c != '\n' {
		switch {
		case g.inHeader:
			if len(g.header)+len(g.line) >= maxPartHeader {
				return fmt.Errorf("a multipart part's headers are longer than %d bytes", maxPartHeader)
			}
			g.line = append(g.line, c)
		case len(g.line) < len(g.boundary):
			g.line = append(g.line, c)
		}
		return nil
	}
	line := bytes.TrimSuffix(g.line, []byte{'\r'})
	g.line = g.line[:0]
	switch {
	case !g.inHeader:
		// A boundary line (the closing one too: what follows it is read
		// the same way, in case a server reads on).
		g.inHeader = bytes.HasPrefix(line, g.boundary) && !bytes.HasPrefix(line[len(g.boundary):], []byte("--"))
		g.header = g.header[:0]
	case len(line) > 0:
		g.header = append(append(g.header, line...), '\n')
	default:
		g.inHeader = false
		return g.partDone()
	}
	return nil
}

// partDone reads the headers of a part whose body starts.
func (g *formGuard) partDone() error {
	var disposition string
	for l := range strings.Lines(string(g.header)) {
		if l[0] == ' ' || l[0] == '\t' { // a folded line continues the last header
			if disposition != "" {
				disposition += " " + strings.TrimSpace(l)
			}
			continue
		}
		if disposition != "" {
			if err := g.disposition(disposition); err != nil {
				return err
			}
		}
		name, value, _ := strings.Cut(l, ":")
		disposition = ""
		if strings.EqualFold(strings.TrimSpace(name), "Content-Disposition") {
			disposition = strings.TrimSpace(value)
		}
	}
	if disposition != "" {
		return g.disposition(disposition)
	}
	return nil
}

// disposition counts a part's Content-Disposition that names a "model"
// field; one that cannot be read is refused, since a lenient server might
// read a model from it.
func (g *formGuard) disposition(v string) error {
	_, params, err := mime.ParseMediaType(v)
	if err != nil {
		return fmt.Errorf("a multipart part's Content-Disposition is malformed: %v", err)
	}
	if params["filename"] != "" || !strings.EqualFold(params["name"], "model") {
		return nil
	}
	if g.models++; g.models > 1 {
		return errors.New(`request body names the form field "model" more than once`)
	}
	return nil
}
