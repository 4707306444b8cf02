// Command coredns is CoreDNS (github.com/coredns/coredns) with only the plugins the local
// cluster's DNS uses: kubernetes (Service and pod records from the API server), bind, errors
// and ready. No forward plugin: names outside the cluster domain are refused, never sent on.
// Built by e2e/cluster/build-dns.sh; never imported, never published.
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
