package broker

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestCheckJSON(t *testing.T) {
	nul, _ := json.Marshal("a\x00b")
	for _, tc := range []struct {
		raw  string
		want string // "" for accepted, else a word of the error
	}{
		{`{"a":1}`, ""},
		{`"plain \n \" \\ \u00e9 \ud83d\ude00"`, ""},
		{`"\\u0000 is text, not an escape"`, ""},
		{`"ends with an escaped backslash \\"`, ""},
		{string(nul), "NUL"},
		{`{"k":"x\u0000"}`, "NUL"},
		{`["\ud83d"]`, "high surrogate"},
		{`["\ud83d\u0041"]`, "high surrogate"},
		{`"\ude00"`, "low surrogate"},
		{`{"a":`, "not valid JSON"},
		{"\"\xff\"", "UTF-8"},
	} {
		err := CheckJSON([]byte(tc.raw))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckJSON(%s) = %v, want nil", tc.raw, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckJSON(%s) = %v, want an error about %s", tc.raw, err, tc.want)
		}
	}
}

func TestCleanText(t *testing.T) {
	for in, want := range map[string]string{
		"fine":          "fine",
		"a\x00b":        "a\uFFFDb",
		"bad \xff byte": "bad \uFFFD byte",
		"":              "",
	} {
		if got := CleanText(in); got != want {
			t.Errorf("CleanText(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValidateTopicName(t *testing.T) {
	for _, ok := range []string{"default", "a/b", "50%off", "café", "m#n", ".."} {
		if err := ValidateNewTopicName(ok); err != nil {
			t.Errorf("ValidateNewTopicName(%q) = %v, want nil", ok, err)
		}
	}
	// Names earlier versions stored stay valid where they are used.
	for _, old := range []string{" padded ", "caf\xe9"} {
		if err := ValidateTopicName(old); err != nil {
			t.Errorf("ValidateTopicName(%q) = %v, want nil", old, err)
		}
	}
	for topic, want := range map[string]string{
		"":                                 "empty",
		"caf\xe9":                          "not valid UTF-8",
		"a\x00b":                           "control character",
		"line\nbreak":                      "control character",
		" ":                                "white space",
		"padded ":                          "white space",
		strings.Repeat("x", MaxTopicLen+1): "limit",
	} {
		if err := ValidateNewTopicName(topic); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateNewTopicName(%q) = %v, want ErrInvalid saying %q", topic, err, want)
		}
	}
}
