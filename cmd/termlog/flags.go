package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// durationValue is a duration flag that must be > 0: a lease, a timeout or
// an interval of 0 means "never" (a lease that never expires, a loop that
// spins), which no flag of termlog wants. It is checked when the flag is
// parsed, before anything starts.
type durationValue time.Duration

func positiveDuration(p *time.Duration, def time.Duration) *durationValue {
	*p = def
	return (*durationValue)(p)
}

func (d *durationValue) String() string { return time.Duration(*d).String() }
func (d *durationValue) Type() string   { return "duration" }
func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q: want a duration such as 500ms, 3s or 2m", s)
	}
	if v <= 0 {
		return fmt.Errorf("%q: must be > 0", s)
	}
	*d = durationValue(v)
	return nil
}

// durationFlag registers a positive duration flag on f.
func durationFlag(f *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	f.Var(positiveDuration(p, def), name, usage)
}

// outputValue is -o/--output: table (the default, for people) or json (for
// machines). It shares its bool with --json, kept as an alias.
type outputValue struct{ json *bool }

func (o outputValue) String() string {
	if o.json != nil && *o.json {
		return "json"
	}
	return "table"
}
func (o outputValue) Type() string { return "table|json" }
func (o outputValue) Set(s string) error {
	switch s {
	case "table":
		*o.json = false
	case "json":
		*o.json = true
	default:
		return fmt.Errorf("%q: want table or json", s)
	}
	return nil
}

// outputFlags registers -o/--output and its alias --json on f, both
// setting asJSON.
func outputFlags(f *pflag.FlagSet, asJSON *bool) {
	f.VarP(outputValue{json: asJSON}, "output", "o", "output format: table or json")
	f.BoolVar(asJSON, "json", false, "print JSON (the same as -o json)")
}

// envPrefix prefixes the environment variable of every global flag:
// --auth-dir is TERMLOG_AUTH_DIR. A flag on the command line wins.
const envPrefix = "TERMLOG_"

// envName is the environment variable of flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// applyEnv sets each flag of f whose environment variable is set to its
// value (as its default, so the command line still wins) and names the
// variable in the flag's help. A value that does not parse is an error.
func applyEnv(f *pflag.FlagSet) error {
	var errs []error
	f.VisitAll(func(fl *pflag.Flag) {
		env := envName(fl.Name)
		fl.Usage += " [$" + env + "]"
		v, ok := os.LookupEnv(env)
		if !ok {
			return
		}
		if err := fl.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q (--%s): %w", env, v, fl.Name, err))
			return
		}
		fl.DefValue = fl.Value.String()
	})
	return errors.Join(errs...)
}

// lostQuorumFlag is --lost-quorum-after: how long a shard may run fewer
// members than a quorum before status says lost-quorum.
func lostQuorumFlag(f *pflag.FlagSet, p *time.Duration) {
	f.DurationVar(p, "lost-quorum-after", 0, "a shard with fewer members running than a quorum this long is lost-quorum: status exits 1 naming `termlog shard recover` (0: 3 * --store-timeout)")
}
