#!/usr/bin/env bash
# Host discovery hook for elastic-run --host-discovery-script.
#
# elastic-run runs this every --discovery-interval seconds and reads one host per line:
#   HOST          a host with --slots-per-host slots
#   HOST:SLOTS    a host with SLOTS worker slots
# Blank lines and '#' comments are ignored. Exit non-zero (or hang) to report a failure:
# at start that stops the job, later the last good host list is kept.
#
# This one reads the list from a file (default: hosts.txt next to it, or $ELASTIC_HOSTS_FILE),
# so you grow or shrink a running job by editing that file. Replace the body with a query
# of your cluster manager, cloud API or scheduler.
set -euo pipefail
hosts_file="${ELASTIC_HOSTS_FILE:-$(dirname "$0")/hosts.txt}"
if [ ! -r "$hosts_file" ]; then
  echo "discover_hosts.sh: cannot read $hosts_file" >&2
  exit 1
fi
grep -v '^[[:space:]]*\(#\|$\)' "$hosts_file" || true
