// Package sipdecide is the HTTP decision endpoint a SIP proxy calls for each initial SIP
// request: it hands the raw request (Kamailio's $mb) to the affinity engine and answers the
// SIP URI of the chosen instance, which the proxy puts into its destination URI ($du) before
// relaying. In-dialog requests never come here: the proxy record-routes initial requests and
// in-dialog requests follow the route set to the instance that took the dialog.
//
// See Handler for the wire protocol and examples/converged for a Kamailio configuration that
// uses it.
package sipdecide
