// Command coredns: CoreDNS from the pinned github.com/coredns/coredns module with only the plugins the
// two Corefiles this project runs use: the real node's (controlplane/node.py: bind, errors,
// kubernetes, cache) and the one kubeadm writes for the kind node (errors, health, ready, kubernetes,
// prometheus, forward, cache, loop, reload, loadbalance). CoreDNS's own main package imports all 70
// of its plugins (core/plugin), with the cloud providers' SDKs, tracing and QUIC behind them; a
// Corefile naming a plugin left out here fails at start ("no action found for directive").
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
