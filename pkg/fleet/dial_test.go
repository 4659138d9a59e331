package fleet_test

import (
	"net"
	"time"
)

func netDialer() net.Dialer { return net.Dialer{Timeout: time.Second} }
