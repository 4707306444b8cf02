// Command pause is the pod sandbox ("pause") process of the llmop real node: it holds the pod's
// namespaces open, sleeps until SIGTERM or SIGINT, and reaps children re-parented to it (it is
// PID 1 of the pod when the pod shares its PID namespace). It replaces registry.k8s.io/pause,
// which cannot be pulled on machines without a registry. Built static (CGO_ENABLED=0) into a
// FROM-scratch image named localhost/pause:3.10 (see Dockerfile and e2e/images/images.py).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-v" || os.Args[1] == "--version") {
		os.Stdout.WriteString("pause (llmop) 3.10\n")
		return
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		// Like the upstream pause: a clean exit on SIGTERM/SIGINT so the runtime sees 0.
		os.Exit(0)
	}
}

// reap collects every exited child without blocking; one SIGCHLD may stand for several exits.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
