# A redis-server for the router gateway's tests and benches (its shared store): Debian's packages
# unpacked into ~/.cache/llmop, nothing installed on the machine (e2e/redis/redis.sh; ~3 s cold,
# ~10 ms warm). tests/support/redis.py runs the same script, or takes $LLMOP_REDIS_SERVER.
# The chart's Redis on the real node is the local stand-in image docker.io/library/redis:7.0.15,
# built from the same packages (e2e/images/redis/, `make image-redis`).

.PHONY: redis image-redis
redis:
	@e2e/redis/redis.sh ensure >/dev/null

image-redis:
	@$(IMAGES_PY) build redis

# Cheap, and the gateway's tests need it from their first test: made in the open, before pytest.
test-prereqs-first: redis
