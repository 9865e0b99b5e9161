package chat_test

import (
	"testing"

	"iop/adapters/runtime/internal/chat"
)

func TestAppendFields(t *testing.T) {
	for _, c := range [][3]string{
		{`{"a":1}`, `{"b":2,"c":[3]}`, `{"a":1,"b":2,"c":[3]}`},
		{`{"a":1}`, `{}`, `{"a":1}`},
		{`{}`, `{"b":2}`, `{"b":2}`},
		{`{}`, `{}`, `{}`},
	} {
		if got := string(chat.AppendFields([]byte(c[0]), []byte(c[1]))); got != c[2] {
			t.Errorf("AppendFields(%s, %s) = %s, want %s", c[0], c[1], got, c[2])
		}
	}
}
