# `make dev`: the whole stack on the local cluster, from a fresh clone (logic in e2e/dev.sh).

##@ Dev loop

.PHONY: dev
dev: install ## Virtualenv, local cluster, CRD, operator, simulator samples; waits until they are Ready.
	@VENV=$(VENV) e2e/dev.sh up

.PHONY: dev-down
dev-down: install ## Stop the dev operator and delete the local cluster.
	@e2e/dev.sh down
