package openaiapi

import (
	"bytes"
	"errors"
	"io"
	"mime/multipart"
	"strings"
	"testing"
)

// oneByte hands out one byte per Read, the worst split of a body.
type oneByte struct{ r io.Reader }

func (o oneByte) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}

func TestScanJSONModel(t *testing.T) {
	deepArr := `{"x":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `,"model":"m"}`
	okDepth := `{"x":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `,"model":"m"}`
	cases := []struct {
		name, body string
		keys       []string
		want       string
		err        string
	}{
		{"first", `{"model":"qwen","messages":[]}`, modelKeys, "qwen", ""},
		{"last", `{"messages":[{"role":"user","content":"a \"quoted\" } ] {"}],"n":1,"t":true,"z":null,"model":"qwen"}`, modelKeys, "qwen", ""},
		{"escaped value", `{"model":"a\u00e9\"b"}`, modelKeys, "aé\"b", ""},
		{"whitespace", " \n{ \"temperature\" : 0.5 ,\t\"model\" :\r\n \"m\" }", modelKeys, "m", ""},
		{"nested model key ignored", `{"meta":{"model":"inner"},"model":"outer"}`, modelKeys, "outer", ""},
		{"legacy name", `{"name":"llama3.2","stream":false}`, ollamaKeys, "llama3.2", ""},
		{"model beats name", `{"name":"a","model":"b"}`, ollamaKeys, "b", ""},
		{"empty model falls back to name", `{"model":"","name":"a"}`, ollamaKeys, "a", ""},
		{"none", `{"prompt":"x","n":2}`, modelKeys, "", ""},
		{"empty object", `{}`, modelKeys, "", ""},
		{"scalar last", `{"model":"m2","n":12}`, []string{"n", "model"}, "", "must be a string"},
		{"depth within limit", okDepth, modelKeys, "m", ""},
		{"too deep array", deepArr, modelKeys, "", "deeper than 128"},
		{"too deep objects", strings.Repeat(`{"a":`, 300), modelKeys, "", "deeper than 128"},
		{"not an object", `["model"]`, modelKeys, "", "not a JSON object"},
		{"truncated", `{"messages":[1,2`, modelKeys, "", "ended before"},
		{"mismatched", `{"x":[1,2},"model":"m"}`, modelKeys, "", "mismatched"},
		{"model not a string", `{"model":7}`, modelKeys, "", "must be a string"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, split := range []bool{false, true} {
				var src io.Reader = strings.NewReader(c.body)
				if split {
					src = oneByte{src}
				}
				p := &prefix{src: src}
				got, err := scanJSONModel(p, c.keys)
				if c.err != "" {
					if err == nil || !strings.Contains(err.Error(), c.err) {
						t.Fatalf("split=%v: err = %v, want %q", split, err, c.err)
					}
					continue
				}
				if err != nil || got != c.want {
					t.Fatalf("split=%v: got %q, %v; want %q", split, got, err, c.want)
				}
				// What was read plus the rest is the body, byte for byte.
				head, rest := p.body()
				all := append([]byte(nil), head...)
				if rest != nil {
					b, _ := io.ReadAll(rest)
					all = append(all, b...)
				}
				if string(all) != c.body {
					t.Fatalf("split=%v: relayed %q, want %q", split, all, c.body)
				}
			}
		})
	}
}

// countingReader serves a body of n bytes built from a repeated pattern
// without holding it, and counts what was read.
type countingReader struct {
	head, unit []byte
	n, read    int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.read >= c.n {
		return 0, io.EOF
	}
	i := 0
	for i < len(p) && c.read < c.n {
		if c.read < int64(len(c.head)) {
			p[i] = c.head[c.read]
		} else {
			p[i] = c.unit[(c.read-int64(len(c.head)))%int64(len(c.unit))]
		}
		i++
		c.read++
	}
	return i, nil
}

func TestHostileNestingIsRefusedEarly(t *testing.T) {
	for _, form := range []struct{ head, unit string }{{`{"x":`, "["}, {`{"a":`, `{"a":`}} {
		src := &countingReader{head: []byte(form.head), unit: []byte(form.unit), n: 60 << 20}
		p := &prefix{src: src}
		_, err := scanJSONModel(p, modelKeys)
		if !errors.Is(err, errTooDeep) {
			t.Fatalf("%s…: err = %v", form.unit, err)
		}
		if src.read > blockSize {
			t.Fatalf("%s…: read %d bytes of a 60 MB body before refusing it", form.unit, src.read)
		}
	}
}

func TestScanMultipartModel(t *testing.T) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	fw, _ := mw.CreateFormFile("file", "a.wav")
	fw.Write(bytes.Repeat([]byte{0, 1, 2, '-', '-', '\r', '\n'}, 50000))
	mw.WriteField("response_format", "json")
	mw.WriteField("model", "whisper-1")
	mw.WriteField("language", "en")
	mw.Close()
	body := b.Bytes()
	p := &prefix{src: oneByte{bytes.NewReader(body)}}
	got, err := scanMultipartModel(p, mw.FormDataContentType(), "model")
	if err != nil || got != "whisper-1" {
		t.Fatalf("got %q, %v", got, err)
	}
	head, rest := p.body()
	all := append([]byte(nil), head...)
	if rest != nil {
		r, _ := io.ReadAll(rest)
		all = append(all, r...)
	}
	if !bytes.Equal(all, body) {
		t.Fatalf("relayed %d bytes, want the %d of the body", len(all), len(body))
	}
	if _, err := scanMultipartModel(&prefix{src: strings.NewReader("x")}, "application/json", "model"); err == nil {
		t.Fatal("a non-multipart body was accepted")
	}
	var nb bytes.Buffer
	mw2 := multipart.NewWriter(&nb)
	mw2.WriteField("language", "en")
	mw2.Close()
	if got, err := scanMultipartModel(&prefix{src: &nb}, mw2.FormDataContentType(), "model"); err != nil || got != "" {
		t.Fatalf("form without model: %q, %v", got, err)
	}
}
