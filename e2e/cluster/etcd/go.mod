// Build-only helper module: pins the etcd server that e2e/cluster/build.sh
// compiles (Debian's etcd 3.4 is below kube-apiserver's watch-progress gate).
module llmop.invalid/e2e/cluster/etcd

go 1.26.0

tool go.etcd.io/etcd/server/v3

require go.etcd.io/etcd/server/v3 v3.6.11
