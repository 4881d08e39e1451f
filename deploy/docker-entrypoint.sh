#!/bin/sh
# Starts the adaps executable named by ADAPS_ROLE (scheduler, server or worker). Its flags
# come from ADAPS_<FLAG> environment variables, a config file (ADAPS_CONFIG) or the
# container's command arguments.
set -e
case "${ADAPS_ROLE:-}" in
  scheduler|server|worker) exec "adaps-${ADAPS_ROLE}" "$@" ;;
  *) echo "adaps-entrypoint: set ADAPS_ROLE to scheduler, server or worker" >&2; exit 2 ;;
esac
