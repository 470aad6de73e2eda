#!/bin/sh
# usage: lstopo-check.sh LSTOPO FILE
# Passes when lstopo draws FILE and HWLOC_XML_VERBOSE=1 has nothing to say about it (hwloc names
# every attribute or object it would otherwise ignore silently).
lstopo=$1
xml=$2
out=$(HWLOC_XML_VERBOSE=1 "$lstopo" --input "$xml" --of console 2>&1 >/dev/null) || {
  echo "lstopo cannot load $xml: $out"
  exit 1
}
if [ -n "$out" ]; then
  echo "lstopo loads $xml with complaints:"
  echo "$out"
  exit 1
fi
"$lstopo" --input "$xml" --of console | head -n 3
