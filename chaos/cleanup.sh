#!/usr/bin/env bash
# Removes what a chaos run left behind (make chaos runs it on exit, whatever
# happened): the processes in the suite's network namespaces, the
# namespaces and veths (names starting with chx-), and its temporary
# directories (taskhost-chaos-* in $TMPDIR). Only the suite's own names.
set -u
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^chx-/ {print $1}'); do
	for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
	ip netns del "$ns" 2>/dev/null && echo "chaos cleanup: removed namespace $ns"
done
for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^chx-'); do
	ip link del "$l" 2>/dev/null && echo "chaos cleanup: removed link $l"
done
if [ "${CHAOS_KEEP:-0}" != 1 ]; then
	rm -rf "${TMPDIR:-/tmp}"/taskhost-chaos-*
fi
exit 0
