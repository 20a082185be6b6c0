package events

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// The package doc's field reference names every kind and every field of
// its data, so it cannot fall behind the types.
func TestDocFieldReference(t *testing.T) {
	src, err := os.ReadFile("events.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := strings.Cut(string(src), "package events")
	_, ref, ok := strings.Cut(doc, "// # Event kinds and their fields")
	if !ok {
		t.Fatal("no field reference in the package doc")
	}
	// Blocks: a line "//\t<kind>[, .<kind>...] (<Type>...)" and its
	// indented field lines "//\t    <field>[, <field>] ...".
	head := regexp.MustCompile(`^//\t([a-z.]+(?:, \.[a-z]+)*) \(`)
	blocks := map[string]*[]string{}
	var cur *[]string
	for _, l := range strings.Split(ref, "\n") {
		if m := head.FindStringSubmatch(l); m != nil {
			cur = &[]string{}
			names := strings.Split(m[1], ", ")
			family := names[0][:strings.LastIndex(names[0], ".")]
			for i, n := range names {
				if i > 0 { // ".added" continues the first kind's family
					n = family + n
				}
				blocks[n] = cur
			}
			continue
		}
		if f, ok := strings.CutPrefix(l, "//\t    "); ok && cur != nil && !strings.HasPrefix(f, " ") {
			words, _, _ := strings.Cut(f, "  ")
			for _, w := range strings.Split(words, ", ") {
				*cur = append(*cur, strings.TrimSpace(w))
			}
		}
	}
	for _, typ := range Types() {
		fp, ok := blocks[typ]
		if !ok {
			t.Errorf("the field reference has no entry for %s", typ)
			continue
		}
		p, err := decoders[typ]([]byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		fields := *fp
		rt := reflect.TypeOf(p)
		for i := range rt.NumField() {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			found := false
			for _, f := range fields {
				found = found || f == name
			}
			if !found {
				t.Errorf("the field reference of %s lacks field %q (has %v)", typ, name, fields)
			}
		}
	}
}
