package main

import "testing"

// TestFlagErrorsAreUsageErrors: a flag a command cannot run with exits 2
// (a usage error) with one line naming the flag, before anything connects:
// the --nats URL below has nothing listening, so a command that got past
// its flags would fail differently (or retry, for a daemon).
func TestFlagErrorsAreUsageErrors(t *testing.T) {
	bin := buildBinary(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"worker", "run", "--parallelism", "0"}, "--parallelism 0"},
		{[]string{"worker", "run", "--endpoint", "nope"}, `endpoint "nope"`},
		{[]string{"logstore", "--restart-grace", "-5s"}, "--restart-grace -5s"},
		{[]string{"logstore", "--raft-addr", "nope"}, "nope"},
		{[]string{"nats", "--port", "70000"}, "--port 70000"},
		{[]string{"up", "--metas", "0"}, "--metas must be >= 1"},
		{[]string{"up", "--logdb", "x"}, `--logdb "x"`},
		{[]string{"meta", "run", "--metrics-addr", "nope"}, `--metrics-addr "nope"`},
		{[]string{"replay", "--html", "r.html", "--history", "bogus:1"}, "--history"},
		{[]string{"replay", "--html", "r.html", "--json"}, "does not go with --json"},
		{[]string{"auth", "nats-context", "--role", "king"}, "--role"},
	} {
		args := append(tc.args, "--nats", "nats://127.0.0.1:1", "--timeout", "2s")
		r := runEnv(t, bin, nil, args...)
		wantCodeOneLine(t, tc.args[0]+" "+tc.want, r, 2, tc.want)
	}
}
