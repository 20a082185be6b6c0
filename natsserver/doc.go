// Package natsserver runs the embedded NATS JetStream server termlog's
// processes use (up, nats and the tests): one node or a node of a 3-node
// cluster on 127.0.0.1, its sync policy, and readiness checks. It also
// holds what a secure server needs: the roles (admin, meta, worker, store,
// observer) with the subject permissions each gets, built from the names in
// internal/wire; the NKey files of each role; and the CA and server
// certificate generation for TLS.
//
// The event stream itself (events.Log on JetStream) is package
// events/natslog, which every replica and store needs; this package is
// needed only by the commands that run a server and by the tests.
package natsserver
