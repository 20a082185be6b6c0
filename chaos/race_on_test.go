//go:build race

package chaos

// raceEnabled: the suite runs with -race, so it builds the binary with -race too.
const raceEnabled = true
