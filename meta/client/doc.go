// Package client is what a worker or a log store embeds to talk to meta: the
// RPC messages and their strict decoders, a worker client that follows the
// leader, the control-stream agent, and the store's check of a config change
// (CheckExec). The projection of the stream is package view.
package client
