// Package rediserr tells the Redis error replies that mean "try again later" — the server is
// loading its data set, busy with a script, a replica without its primary, a demoted primary,
// a Cluster resharding (a slot moved or moving: MOVED, ASK, TRYAGAIN) or down, too few replicas for a write — from the replies that mean the
// command itself was wrong. The session store and the request-slot leases answer the first
// kind as the store being unavailable (503 StoreUnavailable with Retry-After), never as an
// internal error.
package rediserr

import (
	"strings"

	"github.com/redis/rueidis"
)

// transient are the error prefixes of the replies that mean "try again later". MOVED and ASK
// reach a caller only from a dedicated connection (rueidis follows them otherwise): the slot
// moved or is moving to another Cluster node, and the client's next attempt goes there.
var transient = []string{"LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS", "MOVED ", "ASK "}

// Transient reports whether err is a Redis error reply of the "try again later" kind.
func Transient(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	if !ok || re == nil {
		return false
	}
	msg := re.Error()
	for _, p := range transient {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
