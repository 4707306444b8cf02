#!/bin/sh
# Entrypoint of the local redis stand-in (e2e/images/redis/Dockerfile), after the official
# image's docker-entrypoint.sh: options alone run redis-server with them; as root it drops to
# the redis user (setpriv: the stand-in has no gosu); a 0022 umask becomes 0077.
#
# One addition: the official image compiles Redis with protected mode off (its clients come from
# other containers, not loopback); Debian's binary has it on, so `--protected-mode no` is passed
# unless the configuration file given sets protected-mode. Later arguments still override it.
set -e

# first arg is `-f` or `--some-option`, or a `something.conf`
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
	set -- redis-server "$@"
fi

if [ "$1" = 'redis-server' ] && [ "$(id -u)" = '0' ]; then
	find . \! -user redis -exec chown redis '{}' +
	exec setpriv --reuid=999 --regid=999 --init-groups "$0" "$@"
fi

if [ "$1" = 'redis-server' ]; then
	shift
	conf=
	if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
		conf="$1"
		shift
	fi
	if [ -n "$conf" ] && grep -qs '^[[:space:]]*protected-mode' "$conf"; then
		set -- redis-server "$conf" "$@"
	else
		set -- redis-server ${conf:+"$conf"} --protected-mode no "$@"
	fi
fi

um="$(umask)"
if [ "$um" = '0022' ]; then
	umask 0077
fi

exec "$@"
