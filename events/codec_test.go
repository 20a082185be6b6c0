package events

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// filled returns a payload of the kind at decoderList[i] with every field
// set: numbers, (non-ASCII) strings, times, maps and slices.
func filled(t testing.TB, i int) Payload {
	zero, err := decoderList[i].dec([]byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	v := reflect.New(reflect.TypeOf(zero)).Elem()
	for f := range v.NumField() {
		fv := v.Field(f)
		switch fv.Interface().(type) {
		case uint64:
			fv.SetUint(uint64(1000*i + f + 1))
		case int:
			fv.SetInt(-int64(f + 1))
		case bool:
			fv.SetBool(true)
		case string:
			fv.SetString(fmt.Sprintf("%s-é-%d", v.Type().Field(f).Name, f))
		case time.Time:
			fv.Set(reflect.ValueOf(time.Date(2026, 11, 30, 3, 0, f, 123456789, time.FixedZone("", 3600))))
		case map[uint64]string:
			fv.Set(reflect.ValueOf(map[uint64]string{1: "s1", 20: "s20", 300: ""}))
		case []string:
			fv.Set(reflect.ValueOf([]string{"remove 2", "add 3", ""}))
		default:
			t.Fatalf("%s.%s: the test cannot fill a %s", v.Type(), v.Type().Field(f).Name, fv.Type())
		}
	}
	return v.Interface().(Payload)
}

// sampleEvents is every kind twice: every field set, and every field zero.
func sampleEvents(t testing.TB) []Event {
	var out []Event
	at := time.Date(2026, 11, 30, 3, 0, 0, 123000000, time.UTC)
	for i := range decoderList {
		zero, err := decoderList[i].dec([]byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out,
			Event{Seq: uint64(2*i + 1), Term: uint64(i + 7), Writer: "meta-2", At: at.Add(time.Duration(i) * time.Second), Data: filled(t, i)},
			Event{Seq: uint64(2*i + 2), Data: zero})
	}
	return out
}

// sampleBodies is the stored body and the JSONL line of every sample event.
func sampleBodies(t testing.TB) (bodies, lines [][]byte) {
	for _, ev := range sampleEvents(t) {
		b, err := Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		l, err := EncodeLine(ev)
		if err != nil {
			t.Fatal(err)
		}
		bodies, lines = append(bodies, b), append(lines, l)
	}
	return bodies, lines
}

// agree checks that Decode and DecodeLine give exactly what the two-pass
// decoder gives for in: the same event and the same error.
func agree(t *testing.T, seq uint64, in []byte) {
	t.Helper()
	got, gotErr := Decode(seq, in)
	want, wantErr := decodeTwoPass(seq, in)
	same(t, "Decode", in, got, gotErr, want, wantErr)
	got, gotErr = DecodeLine(in)
	want, wantErr = decodeLineTwoPass(in)
	same(t, "DecodeLine", in, got, gotErr, want, wantErr)
}

func same(t *testing.T, what string, in []byte, got Event, gotErr error, want Event, wantErr error) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s(%q):\n got  %#v\n want %#v", what, in, got, want)
	}
	if !reflect.DeepEqual(gotErr, wantErr) {
		t.Fatalf("%s(%q): error\n got  %v\n want %v", what, in, gotErr, wantErr)
	}
	if gotErr != nil {
		var de *DecodeError
		if !errors.As(gotErr, &de) {
			t.Fatalf("%s(%q): %T is not a *DecodeError", what, in, gotErr)
		}
	}
}

// TestOnePassEveryKind: what Encode writes, for every kind with every field
// set or every field zero, takes the one pass and decodes to the event
// encoded (a field added to a payload type without teaching the one pass
// fails here, rather than silently taking the slow path).
func TestOnePassEveryKind(t *testing.T) {
	bodies, lines := sampleBodies(t)
	for i, ev := range sampleEvents(t) {
		want := ev
		want.At = ev.At.UTC()
		got, ok := decodeOnePass(ev.Seq, bodies[i], false)
		if !ok {
			t.Fatalf("%s: the one pass gave up on %s", ev.Type(), bodies[i])
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: one pass of %s\n got  %#v\n want %#v", ev.Type(), bodies[i], got, want)
		}
		if got, ok = decodeOnePass(0, lines[i], true); !ok || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: one pass of line %s: ok %v\n got  %#v\n want %#v", ev.Type(), lines[i], ok, got, want)
		}
		agree(t, ev.Seq, bodies[i])
		agree(t, ev.Seq, lines[i])
	}
}

// TestOnePassAgrees: hand-picked bodies on the edges of what the one pass
// reads (it must read them as encoding/json does, or give up).
func TestOnePassAgrees(t *testing.T) {
	const head = `{"v":1,"term":3,"writer":"meta-1","at":"2026-11-30T03:00:00.5Z",`
	reg := func(data string) string { return head + `"type":"worker.registered","data":` + data + `}` }
	cases := []string{
		``, ` `, `null`, `{}`, `[]`, `"x"`, `1`, `{"v":1}`,
		reg(`{"id":1,"endpoint":"a:1"}`),
		reg(`{"id":1,"endpoint":"a:1"}`) + ` `,
		reg(`{"id":1,"endpoint":"a:1"}`) + ` x`,
		reg(`{"id":1,"endpoint":"a:1"}`) + `{}`,
		" \t\r\n" + strings.ReplaceAll(reg(`{ "id" : 1 , "endpoint" : "a:1" }`), ",", " ,\n"),
		reg(`{}`), reg(`null`), reg(`"x"`), reg(`[]`), reg(`{"id":null}`), reg(`{"endpoint":null}`),
		reg(`{"ID":1}`), reg(`{"Id":1,"id":2}`), reg(`{"id":1,"id":2}`), reg(`{"id":1,"other":{"a":[1,2]}}`),
		reg(`{"id":1.0}`), reg(`{"id":1e2}`), reg(`{"id":-1}`), reg(`{"id":-0}`), reg(`{"id":01}`), reg(`{"id":0}`),
		reg(`{"id":18446744073709551615}`), reg(`{"id":18446744073709551616}`), reg(`{"id":99999999999999999999}`),
		reg(`{"parallelism":-9223372036854775808}`), reg(`{"parallelism":-9223372036854775809}`),
		reg(`{"parallelism":9223372036854775807}`), reg(`{"parallelism":9223372036854775808}`),
		reg(`{"parallelism":-0}`), reg(`{"parallelism":-}`), reg(`{"parallelism":--1}`), reg(`{"parallelism":"4"}`),
		reg(`{"id":"1"}`), reg(`{"id":true}`), reg(`{"id":1,}`), reg(`{"id":1`), reg(`{"id" 1}`), reg(`{,"id":1}`),
		reg(`{"endpoint":"a\"b"}`), reg(`{"endpoint":"a\u0041"}`), reg(`{"endpoint":"\ud800"}`), reg(`{"endpoint":"é"}`),
		reg("{\"endpoint\":\"a\xffb\"}"), reg("{\"endpoint\":\"a\tb\"}"), reg("{\"endpoint\":\"a\x00\"}"),
		reg("{\"endpoint\":\"\xed\xa0\x80\"}"), reg(`{"endpoint":"a`),
		head + `"data":{"id":1},"type":"worker.registered"}`,
		head + `"type":"worker.registered","type":"worker.activated","data":{"id":1}}`,
		head + `"type":"worker.registered","data":{"id":1},"data":{"id":2}}`,
		head + `"type":"worker.promoted","data":{}}`,
		head + `"type":"Worker.Registered","data":{}}`,
		head + `"type":"worker.registered"}`,
		head + `"type":"worker.registered","data":{"id":1},"seq":5}`,
		head + `"type":"worker.registered","data":{"id":1},"seq":0}`,
		head + `"type":"worker.registered","data":{"id":1},"seq":-5}`,
		head + `"type":"worker.registered","data":{"id":1},"Seq":5}`,
		head + `"type":"worker.registered","data":{"id":1},"extra":null}`,
		`{"v":2,"type":"worker.registered","data":{}}`, `{"v":1.0,"type":"worker.registered","data":{}}`,
		`{"v":"1","type":"worker.registered","data":{}}`, `{"V":1,"type":"worker.registered","data":{}}`,
		`{"v":1,"type":"worker.registered","data":{}}`, `{"v":1,"term":null,"type":"worker.registered","data":{}}`,
		`{"v":1,"at":null,"type":"worker.registered","data":{}}`, `{"v":1,"at":"","type":"worker.registered","data":{}}`,
		`{"v":1,"at":"2026-11-30T03:00:00+01:00","type":"worker.registered","data":{}}`,
		`{"v":1,"at":"2026-11-30T03:00:00+25:00","type":"worker.registered","data":{}}`,
		`{"v":1,"at":"2026-11-30 03:00:00Z","type":"worker.registered","data":{}}`,
		`{"v":1,"at":"2026-11-30T03:00:00\u005a","type":"worker.registered","data":{}}`,
		`{"v":1,"at":1,"type":"worker.registered","data":{}}`, `{"v":1,"at":{},"type":"worker.registered","data":{}}`,
		`{"v":1,"writer":"\u00e9","type":"worker.registered","data":{}}`,
		`{"v":1,"type":"store.state","data":{"until":"9999-12-31T23:59:59-23:59"}}`,
		`{"v":1,"type":"store.state","data":{"until":"2026-11-30T03:00:00.999999999Z","state":"draining"}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":null}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"1":"a","01":"b","2":"c"}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"1":"a","1":"b"}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"1":"a"},"replicas":{"2":"b"}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"":"a"}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"+1":"a"}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"-1":"a"}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"x":"a"}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"1":null}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"1":2}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"18446744073709551616":"a"}}}`,
		`{"v":1,"type":"shard.created","data":{"replicas":{"\u0031":"a"}}}`,
		`{"v":1,"type":"shard.observed","data":{"shard":1,"ccid":2,"replicas":{"1":"a"},"leader":1}}`,
		`{"v":1,"type":"operator.started","data":{"steps":[]}}`,
		`{"v":1,"type":"operator.started","data":{"steps":null}}`,
		`{"v":1,"type":"operator.started","data":{"steps":["a", "b" ,"c"]}}`,
		`{"v":1,"type":"operator.started","data":{"steps":["a",]}}`,
		`{"v":1,"type":"operator.started","data":{"steps":["a",null]}}`,
		`{"v":1,"type":"operator.started","data":{"steps":[1]}}`,
		`{"v":1,"type":"operator.started","data":{"steps":"a"}}`,
		`{"v":1,"type":"operator.failed","data":{"op":"o","shard":1,"reason":"timeout"}}`,
		`{"v":1,"type":"shard.replica.adding","data":{"shard":1,"replica":2,"store":"s","ccid":3,"op":"o"}}`,
		`{"v":1,"type":"worker.expired","data":{"id":1,"epoch":2}}`,
		`{"v":1,"type":"worker.deregistered","data":{"id":1,"epoch":2}}`,
		`{"v":1,"type":"worker.activated","data":{"id":1,"epoch":2}}`,
		`{"v":1,"type":"term.started","data":{"term":1,"leader":"m"}}`,
		`{"v":1,"type":"store.registered","data":{"store":"s","incarnation":"i","raft_addr":"r"}}`,
	}
	for _, c := range cases {
		for _, seq := range []uint64{0, 9} {
			agree(t, seq, []byte(c))
			agree(t, seq, []byte(`{"seq":4,`+c[min(1, len(c)):]))
		}
	}
}

// TestOnePassAgreesOnMutations: the body and the line of every kind, every
// field set, with each byte deleted, replaced by or preceded by each of a
// set of JSON-significant bytes decode as the two-pass decoder decodes them (Decode and DecodeLine
// on bodies and lines alike: agree tries both).
func TestOnePassAgreesOnMutations(t *testing.T) {
	bodies, lines := sampleBodies(t)
	subst := []byte(" \"\\0-.e{}],1n\x80\x1f")
	n := 0
	for k, b := range append(bodies, lines...) {
		if k%2 == 1 {
			continue // zero payloads: their fields are a subset of the filled ones
		}
		for i := range b {
			agree(t, 5, append(append([]byte(nil), b[:i]...), b[i+1:]...))
			n++
			for _, c := range subst {
				m := append([]byte(nil), b...)
				m[i] = c
				agree(t, 5, m)
				agree(t, 5, append(append(append([]byte(nil), b[:i]...), c), b[i:]...))
				n += 2
			}
		}
	}
	t.Logf("%d mutations agree", n)
}

// FuzzDecode: on any input, Decode and DecodeLine give exactly the event
// and the error the two-pass decoder gives, and never panic.
func FuzzDecode(f *testing.F) {
	bodies, lines := sampleBodies(f)
	for i := range bodies {
		f.Add(bodies[i])
		f.Add(lines[i])
	}
	f.Add([]byte(`{"v":1,"type":"shard.created","data":{"replicas":{"01":"a","1":"b"}}}`))
	f.Add([]byte(`{"v":1,"type":"operator.started","data":{"steps":["a",null]}}`))
	f.Add([]byte(`{"v":1,"at":"2026-11-30T03:00:00+01:00","type":"worker.registered","data":{"ID":1}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		agree(t, 3, in)
		agree(t, 3, bytes.TrimSpace(in))
	})
}

func BenchmarkDecodeOnePass(b *testing.B) {
	bodies, _ := sampleBodies(b)
	b.ReportAllocs()
	for i := range b.N {
		if _, err := Decode(1, bodies[i%len(bodies)]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeTwoPass(b *testing.B) {
	bodies, _ := sampleBodies(b)
	b.ReportAllocs()
	for i := range b.N {
		if _, err := decodeTwoPass(1, bodies[i%len(bodies)]); err != nil {
			b.Fatal(err)
		}
	}
}

// Seal encodes once: Encode of the sealed event returns Seal's body (the
// same bytes, not a new encoding), which decodes to the event.
func TestSealEncodesOnce(t *testing.T) {
	ev := Event{Term: 3, Writer: "meta-1", At: time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC), Data: WorkerExpired{ID: 4, Epoch: 9}}
	sealed, body, err := Seal(ev)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Encode(sealed)
	if err != nil || &again[0] != &body[0] {
		t.Fatalf("Encode of a sealed event encoded it again (err %v)", err)
	}
	plain, err := Encode(ev)
	if err != nil || string(plain) != string(body) {
		t.Fatalf("sealed body %s, plain encoding %s (err %v)", body, plain, err)
	}
	got, err := Decode(7, body)
	if err != nil || got.Term != 3 || got.Writer != "meta-1" || got.Data != (WorkerExpired{ID: 4, Epoch: 9}) {
		t.Fatalf("decoded %+v, %v", got, err)
	}
}
